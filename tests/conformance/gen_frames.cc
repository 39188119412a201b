// Writes random valid RoCEv2 frames built by uroce's builder, and what was
// built, for the scapy and tshark oracles (see README.md for the format).
//
//   gen_frames --count N --v6-count M --seed S --out DIR

#include <getopt.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "drivers/pcap/pcap_io.h"
#include "stack/wire/parser.h"
#include "tests/support/random_frames.h"
#include "stack/wire/icrc.h"

using namespace uroce;

namespace {

/// What the builder was asked to build, in the README's JSON keys.
std::string spec_json(const wire::FrameSpec& s, std::size_t payload_len, std::uint32_t icrc) {
  const wire::OpcodeInfo& info = wire::opcode_info(s.opcode);
  const auto& e = s.ext;
  std::string r;
  char b[512];
  std::snprintf(b, sizeof b,
                "\"ipver\": %d, \"vlan\": %d, \"dscp\": %u, \"ecn\": %u, \"sport\": %u, \"opcode\": %u, "
                "\"se\": %d, \"migreq\": %d, \"fecn\": %d, \"becn\": %d, \"ackreq\": %d, \"pkey\": %u, "
                "\"destqp\": %u, \"psn\": %u, \"padcnt\": %u, \"payload_len\": %zu, \"icrc\": %u",
                s.ipver == wire::IpVersion::kV4 ? 4 : 6, s.vlan ? static_cast<int>(s.vlan_tci) : -1, s.dscp, s.ecn,
                s.udp_sport, s.opcode, s.se, s.migreq, s.fecn, s.becn, s.ackreq, s.pkey, s.destqp, s.psn.value(),
                wire::pad_for(payload_len), payload_len, icrc);
  r += b;
  if (info.off_deth) {
    std::snprintf(b, sizeof b, ", \"deth_qkey\": %u, \"deth_src_qp\": %u", e.deth_qkey, e.deth_src_qp);
    r += b;
  }
  if (info.off_xrceth) {
    std::snprintf(b, sizeof b, ", \"xrc_srqn\": %u", e.xrc_srqn);
    r += b;
  }
  if (info.off_feth) {
    std::snprintf(b, sizeof b, ", \"feth\": %u", e.feth);
    r += b;
  }
  if (info.off_reth) {
    std::snprintf(b, sizeof b, ", \"reth_va\": %" PRIu64 ", \"reth_rkey\": %u, \"reth_len\": %u", e.reth_va,
                  e.reth_rkey, e.reth_len);
    r += b;
  }
  if (info.off_atomic_eth) {
    std::snprintf(b, sizeof b,
                  ", \"atomic_va\": %" PRIu64 ", \"atomic_rkey\": %u, \"atomic_swap_add\": %" PRIu64
                  ", \"atomic_compare\": %" PRIu64,
                  e.atomic_va, e.atomic_rkey, e.atomic_swap_add, e.atomic_compare);
    r += b;
  }
  if (info.off_aeth) {
    std::snprintf(b, sizeof b, ", \"aeth_syndrome\": %u, \"aeth_msn\": %u", e.aeth_syndrome, e.aeth_msn);
    r += b;
  }
  if (info.off_atomic_ack) {
    std::snprintf(b, sizeof b, ", \"atomic_ack_orig\": %" PRIu64, e.atomic_ack_orig);
    r += b;
  }
  if (info.off_immdt) {
    std::snprintf(b, sizeof b, ", \"imm\": %u", e.imm);
    r += b;
  }
  if (info.off_ieth) {
    std::snprintf(b, sizeof b, ", \"ieth_rkey\": %u", e.ieth_rkey);
    r += b;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned long count = 10000, v6_count = 2000, seed = 1;
  std::string out, corpus;
  static const option kLong[] = {{"count", required_argument, nullptr, 'n'},
                                 {"v6-count", required_argument, nullptr, '6'},
                                 {"seed", required_argument, nullptr, 's'},
                                 {"out", required_argument, nullptr, 'o'},
                                 {"corpus", required_argument, nullptr, 'c'},
                                 {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "n:6:s:o:c:", kLong, nullptr)) != -1) {
    switch (c) {
      case 'n': count = std::strtoul(optarg, nullptr, 10); break;
      case '6': v6_count = std::strtoul(optarg, nullptr, 10); break;
      case 's': seed = std::strtoul(optarg, nullptr, 10); break;
      case 'o': out = optarg; break;
      case 'c': corpus = optarg; break;
      default: std::fprintf(stderr, "usage: gen_frames --count N --v6-count M --seed S --out DIR [--corpus DIR]\n"); return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "gen_frames: --out DIR is required\n");
    return 2;
  }
  pcapio::Writer writer;
  if (!writer.open(out + "/frames.pcap")) {
    std::fprintf(stderr, "gen_frames: %s\n", writer.error().c_str());
    return 2;
  }
  FILE* js = std::fopen((out + "/frames.jsonl").c_str(), "w");
  if (js == nullptr) {
    std::perror("gen_frames: frames.jsonl");
    return 2;
  }
  std::mt19937_64 rng(seed);
  const auto ops = testing::valid_opcodes();
  std::vector<std::uint8_t> buf(9000);
  for (unsigned long i = 0; i < count + v6_count; ++i) {
    const auto ipver = i < count ? wire::IpVersion::kV4 : wire::IpVersion::kV6;
    // Cycle through every opcode so each appears, then randomise the rest.
    const std::uint8_t opcode = ops[i % ops.size()];
    const auto rf = testing::random_frame(rng, opcode, ipver, /*allow_vlan=*/true);
    const std::size_t n = wire::build_frame(buf, rf.spec, rf.payload);
    wire::Packet pkt;
    const auto st = wire::parse_frame(wire::ConstBytes(buf.data(), n), wire::ParseOptions{}, pkt);
    if (n == 0 || !st.ok()) {
      std::fprintf(stderr, "gen_frames: frame %lu (opcode 0x%02x) did not round-trip: %s\n", i, opcode,
                   st.to_string().c_str());
      return 1;
    }
    writer.write(wire::ConstBytes(buf.data(), n), 1700000000 + static_cast<std::int64_t>(i / 1000000),
                 static_cast<std::int64_t>(i % 1000000));
    if (!corpus.empty() && i < 400) {  // a seed corpus for the fuzzer: one file per frame
      if (FILE* cf = std::fopen((corpus + "/frame" + std::to_string(i)).c_str(), "wb")) {
        std::fwrite(buf.data(), 1, n, cf);
        std::fclose(cf);
      }
    }
    const std::uint32_t icrc = wire::icrc_load(buf.data() + n - wire::kIcrcLen);
    std::fprintf(js, "{\"i\": %lu, %s}\n", i, spec_json(rf.spec, rf.payload.size(), icrc).c_str());
  }
  std::fclose(js);
  writer.close();
  return 0;
}
