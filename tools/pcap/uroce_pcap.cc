// uroce-pcap: decodes RoCEv2 frames in pcap/pcapng files, verifies their
// ICRC, and summarises each QP.
//
//   uroce-pcap [--json] [--strict] [--mtu N] [--quiet] FILE...
//
// Exit status: 0 on success; 1 with --strict if any RoCE frame was malformed
// or had a bad ICRC; 2 on usage or I/O errors.

#include <getopt.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "drivers/pcap/pcap_io.h"
#include "tools/pcap/decode.h"

namespace {

using namespace uroce;

struct Options {
  bool json = false;
  bool strict = false;
  bool quiet = false;  // summary only
  std::uint32_t mtu = 0;
  std::vector<std::string> files;
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: uroce-pcap [--json] [--strict] [--mtu N] [--quiet] FILE...\n"
               "  Decodes RoCEv2 (UDP port 4791) frames in pcap or pcapng files.\n"
               "  --json     one JSON document per file, for machines\n"
               "  --strict   exit 1 on any malformed RoCE frame or bad ICRC\n"
               "  --mtu N    path MTU (256..4096), to follow PSNs across READ requests\n"
               "  --quiet    print only the per-QP summary\n");
}

bool parse_args(int argc, char** argv, Options& o) {
  static const option kLong[] = {
      {"json", no_argument, nullptr, 'j'},  {"strict", no_argument, nullptr, 's'},
      {"mtu", required_argument, nullptr, 'm'}, {"quiet", no_argument, nullptr, 'q'},
      {"help", no_argument, nullptr, 'h'},  {nullptr, 0, nullptr, 0},
  };
  int c;
  while ((c = getopt_long(argc, argv, "jsm:qh", kLong, nullptr)) != -1) {
    switch (c) {
      case 'j': o.json = true; break;
      case 's': o.strict = true; break;
      case 'q': o.quiet = true; break;
      case 'm': {
        char* end = nullptr;
        const unsigned long v = std::strtoul(optarg, &end, 10);
        if (end == optarg || *end != '\0' || (v != 256 && v != 512 && v != 1024 && v != 2048 && v != 4096)) {
          std::fprintf(stderr, "uroce-pcap: --mtu must be one of 256, 512, 1024, 2048, 4096 (got '%s')\n", optarg);
          return false;
        }
        o.mtu = static_cast<std::uint32_t>(v);
        break;
      }
      case 'h': usage(stdout); std::exit(0);
      default: usage(stderr); return false;
    }
  }
  for (int i = optind; i < argc; ++i) o.files.emplace_back(argv[i]);
  if (o.files.empty()) {
    usage(stderr);
    return false;
  }
  return true;
}


/// Decodes one file; returns false on I/O error. Sets `bad` on malformed frames.
bool decode_file(const Options& o, const std::string& path, bool& bad) {
  pcapio::Reader reader;
  if (!reader.open(path)) {
    std::fprintf(stderr, "uroce-pcap: %s: %s\n", path.c_str(), reader.error().c_str());
    return false;
  }
  tools::Decoder dec(o.mtu);
  pcapio::Frame f;
  wire::Packet pkt;
  std::uint64_t index = 0;
  // --json: one document per file, made by the JSON library and written
  // when the file is read.
  nlohmann::ordered_json doc = {{"file", path}, {"frames", nlohmann::ordered_json::array()}};
  if (!o.json && !o.quiet) std::printf("# %s\n", path.c_str());

  while (reader.next(f)) {
    ++index;
    const wire::ParseStatus st = dec.add(f.data, pkt);
    if (!st.ok() && !st.roce) continue;  // not RoCE
    const double t = static_cast<double>(f.ts_sec) + static_cast<double>(f.ts_usec) * 1e-6;
    if (o.json) {
      nlohmann::ordered_json fr = {{"frame", index}, {"time", std::round(t * 1e6) / 1e6}, {"status", st.to_string()}};
      if (st.reject == wire::Reject::kBadIcrc) fr["icrc_ok"] = false;
      else if (st.ok()) fr["icrc_ok"] = true;
      else fr["icrc_ok"] = nullptr;
      if (st.ok() || st.reject == wire::Reject::kBadIcrc) {
        // A bad-ICRC frame parsed completely before the check, so its fields are meaningful.
        fr.update(tools::packet_json(pkt));
      }
      doc["frames"].push_back(std::move(fr));
    } else if (!o.quiet) {
      if (st.ok() || st.reject == wire::Reject::kBadIcrc) {
        std::printf("%6" PRIu64 " %.6f %s > %s %s icrc=%s\n", index, t, pkt.src.to_string().c_str(),
                    pkt.dst.to_string().c_str(), tools::describe(pkt).c_str(), st.ok() ? "ok" : "BAD");
      } else {
        std::printf("%6" PRIu64 " %.6f MALFORMED: %s\n", index, t, st.to_string().c_str());
      }
    }
  }
  if (!reader.error().empty()) {
    std::fprintf(stderr, "uroce-pcap: %s: %s\n", path.c_str(), reader.error().c_str());
    return false;
  }

  const tools::Totals& tot = dec.totals();
  if (o.json) {
    doc["totals"] = {{"frames", tot.frames},       {"roce", tot.roce},         {"non_roce", tot.non_roce},
                     {"malformed", tot.malformed}, {"bad_icrc", tot.bad_icrc}};
    doc["qps"] = nlohmann::ordered_json::array();
    for (const auto& [key, s] : dec.qps()) doc["qps"].push_back(tools::summary_json(key, s));
    // Names from a capture file may hold any bytes: invalid UTF-8 is replaced.
    std::printf("%s\n", doc.dump(1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n%-16s %-8s %8s %10s %6s %5s %5s %6s %6s %4s %4s %4s\n", "dst", "destqp", "packets", "bytes",
                "msgs", "gaps", "reps", "acks", "naks", "rnr", "cnp", "ce");
    for (const auto& [key, s] : dec.qps()) {
      std::uint64_t naks = 0;
      for (auto n : s.naks) naks += n;
      std::printf("%-16s 0x%06x %8" PRIu64 " %10" PRIu64 " %6" PRIu64 " %5" PRIu64 " %5" PRIu64 " %6" PRIu64
                  " %6" PRIu64 " %4" PRIu64 " %4" PRIu64 " %4" PRIu64 "\n",
                  key.dst.to_string().c_str(), key.destqp, s.packets, s.payload_bytes, s.messages, s.psn_gaps,
                  s.psn_repeats, s.acks, naks, s.rnr_naks, s.cnps, s.ecn_ce);
      for (unsigned c = 0; c < 5; ++c)
        if (s.naks[c] != 0)
          std::printf("%27s NAK %s: %" PRIu64 "\n", "", std::string(tools::nak_name(c)).c_str(), s.naks[c]);
    }
    std::printf("frames %" PRIu64 ", RoCE %" PRIu64 ", other %" PRIu64 ", malformed %" PRIu64 ", bad ICRC %" PRIu64
                "\n",
                tot.frames, tot.roce, tot.non_roce, tot.malformed, tot.bad_icrc);
  }
  if (tot.malformed != 0) bad = true;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_args(argc, argv, o)) return 2;
  bool bad = false;
  for (const auto& f : o.files)
    if (!decode_file(o, f, bad)) return 2;
  return (o.strict && bad) ? 1 : 0;
}
