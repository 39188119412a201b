// uroce-ctl: talks to a running uroced over its control socket.
//
//   uroce-ctl [--socket PATH] status          ports, pipelines, QPs and counters
//   uroce-ctl [--socket PATH] json            the raw status object
//   uroce-ctl [--socket PATH] watch [--interval MS] [--count N]
//                                            a live view, updated in place, with rates
//   uroce-ctl [--socket PATH] telemetry [--interval MS] [--count N]
//                                            each QP's congestion control and
//                                            counters, one JSON line per QP per interval
//   uroce-ctl [--socket PATH] fault rx|tx SPEC|off
//   uroce-ctl [--socket PATH] cc QPN none|dcqcn|swift
//   uroce-ctl [--socket PATH] stop
//
// Exit status: 0 ok, 1 the daemon refused the request, 2 usage or connection error.

#include <getopt.h>
#include <unistd.h>

#include <utility>  // boost 1.74's asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace asio = boost::asio;
using json = nlohmann::json;

namespace {

bool request(const std::string& path, const std::string& line, std::string& reply, std::string& err) {
  try {
    asio::io_context io;
    asio::local::stream_protocol::socket s(io);
    s.connect(asio::local::stream_protocol::endpoint(path));
    asio::write(s, asio::buffer(line + "\n"));
    asio::streambuf buf;
    asio::read_until(s, buf, '\n');
    std::istream is(&buf);
    std::getline(is, reply);
    return true;
  } catch (const std::exception& e) {
    err = "cannot talk to uroced at " + path + ": " + e.what();
    return false;
  }
}

/// The number at a dotted path ("limits.refused.sessions"), or 0 where
/// there is none: a status from an older or newer daemon still renders.
std::uint64_t num(const json& t, const std::string& path) {
  std::string ptr = "/" + path;
  for (char& c : ptr)
    if (c == '.') c = '/';
  const json::json_pointer p(ptr);
  if (!t.contains(p) || !t.at(p).is_number()) return 0;
  return t.at(p).get<std::uint64_t>();
}
std::string str(const json& t, const char* key) {
  const auto it = t.find(key);
  return it != t.end() && it->is_string() ? it->get<std::string>() : "?";
}
const json* child(const json& t, const std::string& key) {
  const auto it = t.find(key);
  return it != t.end() && !it->is_null() ? &*it : nullptr;
}

/// Human view of a status object. With `prev` and `secs`, rates too.
void render(const json& st, const json* prev, double secs) {
  const unsigned n = static_cast<unsigned>(num(st, "pipelines"));
  auto rate = [&](const std::string& key) -> std::string {
    if (!prev || secs <= 0) return "";
    const double r = (static_cast<double>(num(st, key)) - static_cast<double>(num(*prev, key))) / secs;
    char b[32];
    std::snprintf(b, sizeof b, " (%.0f/s)", r);
    return b;
  };
  std::printf("node: %u pipeline%s, stage %s\n", n, n == 1 ? "" : "s", str(st, "stage").c_str());
  if (const json* ss = child(st, "session_list"); ss && ss->is_array() && !ss->empty()) {
    std::printf("\nsessions:\n  %-6s %-8s %4s %4s %12s %4s  %s\n", "id", "pid", "PDs", "MRs", "MR bytes", "CQs", "QPs");
    for (const json& x : *ss) {
      std::string qpns;
      if (const json* q = child(x, "qpns"); q && q->is_array())
        for (const json& v : *q) {
          char b[16];
          std::snprintf(b, sizeof b, "%s0x%06x", qpns.empty() ? "" : " ", v.is_number() ? v.get<unsigned>() : 0u);
          qpns += b;
        }
      std::printf("  %-6lu %-8lu %4lu %4lu %12lu %4lu  %s\n", num(x, "id"), num(x, "pid"), num(x, "pds"), num(x, "mrs"),
                  num(x, "mr_bytes"), num(x, "cqs"), qpns.empty() ? "-" : qpns.c_str());
    }
  }
  if (const json* c = child(st, "cm"); c && !c->empty()) {
    std::printf("\nRDMA CM (QP1): %lu connections; MADs rx %lu tx %lu, resends %lu, duplicates %lu, rejects sent %lu, "
                "established %lu, disconnected %lu, bad %lu, unmatched %lu\n",
                num(*c, "connections"), num(*c, "mads_rx"), num(*c, "mads_tx"), num(*c, "resends"),
                num(*c, "duplicates"), num(*c, "rejects_sent"), num(*c, "established"), num(*c, "disconnected"),
                num(*c, "bad_mads"), num(*c, "unmatched"));
  }
  if (const json* l = child(st, "limits"); l && l->contains("max_sessions")) {
    std::printf("\nlimits: sessions %lu (%lu per uid), QPs %lu per session and %lu per uid, CQs %lu, MRs %lu, "
                "%lu connections awaiting hello (%lu ms)\n",
                num(*l, "max_sessions"), num(*l, "max_sessions_per_uid"), num(*l, "max_qps"), num(*l, "max_qps_per_uid"),
                num(*l, "max_cqs"), num(*l, "max_mrs"), num(*l, "max_unhelloed"), num(*l, "hello_timeout_ms"));
    std::printf("  refused: sessions %lu, per uid %lu, awaiting hello %lu, hello timeouts %lu, QPs per uid %lu, "
                "accept errors %lu (EMFILE drops %lu)\n",
                num(*l, "refused.sessions"), num(*l, "refused.sessions_per_uid"), num(*l, "refused.unhelloed"),
                num(*l, "refused.hello_timeouts"), num(*l, "refused.qps_per_uid"), num(*l, "refused.accept_errors"),
                num(*l, "refused.emfile_drops"));
    std::printf("  closed: sessions whose memory faulted %lu\n", num(*l, "closed.memory_faults"));
  }
  for (unsigned k = 0; k < n; ++k) {
    const std::string pre = k == 0 ? "" : "_" + std::to_string(k);
    const json* pp = child(st, "pipeline" + pre);
    if (!pp) continue;
    const json& p = *pp;
    std::printf("\npipeline %u: port %s shard %lu lcore %lu ip %s, %lu QPs\n", k, str(p, "port").c_str(), num(p, "shard"),
                num(p, "lcore"), str(p, "ip").c_str(), num(p, "qps"));
    std::printf("  rx %lu%s  roce %lu%s  tx %lu%s\n", num(st, "dataplane" + pre + ".rx_frames"),
                rate("dataplane" + pre + ".rx_frames").c_str(), num(st, "dataplane" + pre + ".rx_roce"),
                rate("dataplane" + pre + ".rx_roce").c_str(), num(st, "dataplane" + pre + ".tx_frames"),
                rate("dataplane" + pre + ".tx_frames").c_str());
    std::printf("  dropped: malformed %lu  bad ICRC %lu  unknown QP %lu  other %lu  ARP/ND %lu  idle sleeps %lu\n",
                num(st, "port" + pre + ".rx_malformed"), num(st, "port" + pre + ".rx_icrc_err"),
                num(st, "port" + pre + ".rx_unknown_qp"), num(st, "dataplane" + pre + ".rx_other"),
                num(st, "dataplane" + pre + ".rx_arp_nd"), num(st, "dataplane" + pre + ".idle_sleeps"));
    // Two lines a QP: its counters, then (indented) its congestion control,
    // each under its own header line.
    std::printf("  %-8s %-4s %-5s %-8s %-16s %12s %12s %8s %12s %8s %6s %6s %8s %7s %7s\n", "QPN", "type", "state",
                "dest", "peer", "sent", "rcvd", "retx", "retx bytes", "timeout", "naks", "rnr", "ce", "cnp tx", "cnp rx");
    std::printf("  %57s %-6s %9s %6s %6s %8s %8s %8s\n", "", "cc", "rate Mb/s", "window", "alpha", "rtt min", "rtt avg",
                "rtt p99");
    if (const json* qps = child(st, "qp_list" + pre); qps && qps->is_array()) {
      for (const json& q : *qps) {
        std::printf("  0x%06lx %-4s %-5s 0x%06lx %-16s %12lu %12lu %8lu %12lu %8lu %6lu %6lu %8lu %7lu %7lu\n",
                    num(q, "qpn"), str(q, "type").c_str(), str(q, "state").c_str(), num(q, "dest_qpn"),
                    str(q, "peer").c_str(), num(q, "sent_pkts"), num(q, "rcvd_pkts"), num(q, "retransmitted_pkts"),
                    num(q, "retransmitted_bytes"), num(q, "timeouts"), num(q, "sent_naks"), num(q, "send_rnr_err"),
                    num(q, "ce_marked"), num(q, "cnp_sent"), num(q, "cnp_received"));
        // Congestion control: the pacer's rate ("line" when unpaced), the
        // window, DCQCN's alpha, and the RTT in us.
        const json* c = child(q, "cc");
        if (!c) continue;
        const std::uint64_t pace = num(*c, "pace_bps");
        char rate[16], alpha[16];
        if (pace == 0) std::snprintf(rate, sizeof rate, "line");
        else std::snprintf(rate, sizeof rate, "%.1f", static_cast<double>(pace) / 1e6);
        const auto a = c->find("alpha");
        std::snprintf(alpha, sizeof alpha, "%.3f", a != c->end() && a->is_number() ? a->get<double>() : 0.0);
        std::printf("  %57s %-6s %9s %6lu %6s %8.1f %8.1f %8.1f\n", "", str(*c, "algorithm").c_str(), rate,
                    num(*c, "window"), alpha, static_cast<double>(num(*c, "rtt_min_ns")) / 1e3,
                    static_cast<double>(num(*c, "rtt_mean_ns")) / 1e3, static_cast<double>(num(*c, "rtt_p99_ns")) / 1e3);
      }
    }
  }
}

bool parse(const std::string& text, json& out, std::string& err) {
  out = json::parse(text, nullptr, false);  // no exceptions: a bad reply is a clear error
  if (out.is_discarded() || !out.is_object()) {
    err = "bad reply from uroced: not a JSON object";
    return false;
  }
  return true;
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: uroce-ctl [--socket PATH] status|json|watch|telemetry|reload|stop|fault rx|tx SPEC|off|cc QPN NAME\n"
               "       reload: re-read the configuration and apply what may change live\n"
               "       watch, telemetry: [--interval MS] [--count N]\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "/run/uroce/uroced.sock";
  unsigned interval = 1000, count = 0;
  static const option kLong[] = {{"socket", required_argument, nullptr, 's'},
                                 {"interval", required_argument, nullptr, 'i'},
                                 {"count", required_argument, nullptr, 'n'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "s:i:n:h", kLong, nullptr)) != -1) {
    switch (c) {
      case 's': path = optarg; break;
      case 'i': interval = static_cast<unsigned>(std::strtoul(optarg, nullptr, 10)); break;
      case 'n': count = static_cast<unsigned>(std::strtoul(optarg, nullptr, 10)); break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind >= argc) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[optind];
  std::string reply, err;
  if (cmd == "status" || cmd == "json") {
    if (!request(path, "status", reply, err)) return std::fprintf(stderr, "uroce-ctl: %s\n", err.c_str()), 2;
    if (cmd == "json") return std::printf("%s\n", reply.c_str()), 0;
    json st;
    if (!parse(reply, st, err)) return std::fprintf(stderr, "uroce-ctl: %s\n", err.c_str()), 2;
    render(st, nullptr, 0);
    return 0;
  }
  if (cmd == "watch") {
    json prev;
    bool have_prev = false;
    auto last = std::chrono::steady_clock::now();
    for (unsigned i = 0; count == 0 || i < count; ++i) {
      if (!request(path, "status", reply, err)) return std::fprintf(stderr, "uroce-ctl: %s\n", err.c_str()), 2;
      json st;
      if (!parse(reply, st, err)) return std::fprintf(stderr, "uroce-ctl: %s\n", err.c_str()), 2;
      const auto now = std::chrono::steady_clock::now();
      std::printf("\033[H\033[2J");  // home and clear: the view updates in place
      render(st, have_prev ? &prev : nullptr, std::chrono::duration<double>(now - last).count());
      std::fflush(stdout);
      prev = st;
      have_prev = true;
      last = now;
      if (count == 0 || i + 1 < count) std::this_thread::sleep_for(std::chrono::milliseconds(interval));
    }
    return 0;
  }
  if (cmd == "telemetry") {
    // A time series for plots: per interval, a line per QP with its
    // congestion control and the counters that go with it.
    const auto start = std::chrono::steady_clock::now();
    for (unsigned i = 0; count == 0 || i < count; ++i) {
      if (!request(path, "status", reply, err)) return std::fprintf(stderr, "uroce-ctl: %s\n", err.c_str()), 2;
      json st;
      if (!parse(reply, st, err)) return std::fprintf(stderr, "uroce-ctl: %s\n", err.c_str()), 2;
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const unsigned n = static_cast<unsigned>(num(st, "pipelines"));
      for (unsigned k = 0; k < n; ++k) {
        const json* qps = child(st, "qp_list" + (k == 0 ? std::string() : "_" + std::to_string(k)));
        if (!qps || !qps->is_array()) continue;
        for (const json& q : *qps) {
          json line = {{"t_s", t}, {"pipeline", k}, {"qpn", num(q, "qpn")}};
          if (const json* c = child(q, "cc")) line.update(*c);
          for (const char* key : {"sent_pkts", "ce_marked", "cnp_sent", "cnp_received", "retransmitted_pkts",
                                  "retransmitted_bytes", "timeouts"})
            line[key] = num(q, key);
          std::printf("%s\n", line.dump().c_str());
        }
      }
      std::fflush(stdout);
      if (count == 0 || i + 1 < count) std::this_thread::sleep_for(std::chrono::milliseconds(interval));
    }
    return 0;
  }
  std::string line;
  for (int i = optind; i < argc; ++i) line += (i > optind ? " " : "") + std::string(argv[i]);
  if (cmd != "stop" && cmd != "reload" && cmd != "fault" && cmd != "cc") {
    usage(stderr);
    return 2;
  }
  if (!request(path, line, reply, err)) return std::fprintf(stderr, "uroce-ctl: %s\n", err.c_str()), 2;
  std::printf("%s\n", reply.c_str());
  json r;
  if (!parse(reply, r, err)) return std::fprintf(stderr, "uroce-ctl: %s\n", err.c_str()), 2;
  return r.value("ok", false) ? 0 : 1;
}
