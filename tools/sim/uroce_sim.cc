// uroce-sim: congestion-control experiments on the simulated fabric, with
// uroce's own engines as the hosts.
//
//   uroce-sim incast --senders 16 --cc dcqcn [--ms 10] [--series FILE]
//       N:1 incast of long WRITEs through one switch; prints a JSON summary
//       (per-flow goodput, Jain's index, queue, drops, retransmissions) and,
//       with --series, writes JSON lines: one per flow per sample, and one
//       per sample for the switch queue.
//   uroce-sim loss --loss 0.01 [--delay-us 1] [--sr] ...
//       one flow through a lossy switch port: goodput, retransmissions and
//       message completion times, go-back-N or selective repeat.
//   uroce-sim mix --hosts 16 --load 0.5 --cc dcqcn ...
//       flows of the web-search size distribution between random hosts:
//       completion times of the short ones, median and p99.
//
// tools/sim/experiments.sh runs the matrices of docs/research.md and plots them.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "stack/cc/cc.h"
#include "tools/sim/scenarios.h"

namespace po = boost::program_options;
using json = nlohmann::ordered_json;

int main(int argc, char** argv) {
  using uroce::simx::IncastConfig;
  IncastConfig c;
  std::string mode, series, cc = c.cc;
  double ms = 10, delay_us = 1, link_gbps = 10, buffer_kb = 512, kmin_kb = 5, kmax_kb = 200;
  unsigned mtu = 1024, timeout = c.timeout;
  bool pfc = false, no_ecn = false;
  uroce::simx::MixConfig mix;
  po::options_description opts("uroce-sim options");
  opts.add_options()("help,h", "show this help")("mode", po::value(&mode), "incast or loss")
      ("senders", po::value(&c.senders), "incast: senders (default 8)")
      ("hosts", po::value(&mix.hosts), "mix: hosts (default 16)")("load", po::value(&mix.load), "mix: load of each host's link (default 0.5)")
      ("cc", po::value(&cc), "congestion control of every QP: none, dcqcn or swift (default none)")
      ("ms", po::value(&ms), "simulated milliseconds (default 10)")
      ("link-gbps", po::value(&link_gbps), "every link's rate (default 10)")
      ("delay-us", po::value(&delay_us), "every link's propagation delay (default 1)")
      ("buffer-kb", po::value(&buffer_kb), "switch buffer per output port (default 512)")
      ("kmin-kb", po::value(&kmin_kb), "RED Kmin (default 5, DCQCN's)")("kmax-kb", po::value(&kmax_kb), "RED Kmax (default 200)")
      ("pmax", po::value(&c.sw.pmax), "RED Pmax (default 0.01)")("no-ecn", po::bool_switch(&no_ecn), "the switch marks nothing")
      ("pfc", po::bool_switch(&pfc), "PFC on (no tail drop)")
      ("sr", po::bool_switch(&c.selective_repeat), "selective repeat (IRN-style) on every QP, else go-back-N")
      ("loss", po::value(&c.loss), "random loss toward the receiver (default 0)")
      ("mtu", po::value(&mtu), "path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)")
      ("message", po::value(&c.message), "bytes per WRITE (default 65536)")
      ("depth", po::value(&c.depth), "WRITEs outstanding per sender (default 4)")
      ("timeout", po::value(&timeout), "QP timeout exponent (default 10: 4.2 ms)")
      ("sample-us", po::value<double>()->default_value(10), "sampling interval")
      ("seed", po::value(&c.seed), "random seed (default 1)")
      ("series", po::value(&series), "write the time series here (JSON lines)");
  po::positional_options_description pos;
  pos.add("mode", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "uroce-sim: %s (see --help)\n", e.what());
    return 2;
  }
  if (vm.count("help") || mode.empty()) {
    std::cout << "usage: uroce-sim incast|loss|mix [options]\n" << opts;
    return mode.empty() && !vm.count("help") ? 2 : 0;
  }
  const auto bad = [](const std::string& why) {
    std::fprintf(stderr, "uroce-sim: %s\n", why.c_str());
    return 2;
  };
  if (mode != "incast" && mode != "loss" && mode != "mix") return bad("mode must be incast, loss or mix");
  if (mix.hosts < 2 || mix.hosts > 64 || !(mix.load > 0 && mix.load < 1)) return bad("--hosts must be 2..64, --load in (0, 1)");
  if (uroce::cc::find(cc) == nullptr) return bad("--cc must be none, dcqcn or swift");
  if (c.senders < 1 || c.senders > 1000) return bad("--senders must be 1..1000");
  if (!(ms > 0 && ms <= 10'000)) return bad("--ms must be in (0, 10000]");
  if (!(link_gbps > 0 && link_gbps <= 1000) || !(delay_us >= 0 && delay_us <= 10'000)) return bad("bad link");
  if (!(c.loss >= 0 && c.loss < 1)) return bad("--loss must be in [0, 1)");
  if (c.message == 0 || c.message > (1u << 20) || c.depth == 0 || c.depth > 32) return bad("bad --message or --depth");
  if (timeout > 31) return bad("--timeout must be 0..31");
  const ibv_mtu mtus[] = {IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096};
  bool mtu_ok = false;
  for (ibv_mtu m : mtus)
    if (mtu == (128u << m)) {
      c.mtu = m;
      mtu_ok = true;
    }
  if (!mtu_ok) return bad("--mtu must be 256, 512, 1024, 2048 or 4096");
  if (mode == "loss") c.senders = 1;
  c.cc = cc;
  c.duration_ns = static_cast<std::uint64_t>(ms * 1e6);
  c.link_bps = static_cast<std::uint64_t>(link_gbps * 1e9);
  c.link_delay_ns = static_cast<std::uint64_t>(delay_us * 1e3);
  c.sw.buffer_bytes = static_cast<std::uint64_t>(buffer_kb * 1024);
  c.sw.kmin_bytes = static_cast<std::uint64_t>(kmin_kb * 1000);
  c.sw.kmax_bytes = static_cast<std::uint64_t>(kmax_kb * 1000);
  c.sw.ecn = !no_ecn;
  c.sw.pfc = pfc;
  c.timeout = static_cast<std::uint8_t>(timeout);
  c.sample_ns = static_cast<std::uint64_t>(vm["sample-us"].as<double>() * 1e3);
  if (c.sample_ns == 0) return bad("--sample-us must be positive");

  if (mode == "mix") {
    mix.cc = cc;
    mix.selective_repeat = c.selective_repeat;
    mix.link_bps = c.link_bps;
    mix.link_delay_ns = c.link_delay_ns;
    mix.sw = c.sw;
    mix.duration_ns = c.duration_ns;
    mix.seed = c.seed;
    const auto t0 = std::chrono::steady_clock::now();
    const auto m = uroce::simx::run_mix(mix);
    const double cpu = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    json o = {{"mode", mode},
              {"hosts", mix.hosts},
              {"load", mix.load},
              {"cc", cc},
              {"recovery", c.selective_repeat ? "selective-repeat" : "go-back-N"},
              {"pfc", pfc},
              {"simulated_ms", ms},
              {"flows", m.flows},
              {"finished", m.finished},
              {"short_flows", m.short_flows},
              {"short_p50_us", static_cast<double>(m.short_p50_ns) / 1e3},
              {"short_p99_us", static_cast<double>(m.short_p99_ns) / 1e3},
              {"short_slowdown_p50", m.short_slowdown_p50},
              {"short_slowdown_p99", m.short_slowdown_p99},
              {"all_p50_us", static_cast<double>(m.all_p50_ns) / 1e3},
              {"all_p99_us", static_cast<double>(m.all_p99_ns) / 1e3},
              {"drops", m.drops},
              {"retransmitted_pkts", m.retransmitted_pkts},
              {"timeouts", m.timeouts},
              {"events", m.events},
              {"cpu_s", cpu}};
    std::printf("%s\n", o.dump().c_str());
    return 0;
  }
  std::ofstream out;
  if (!series.empty()) {
    out.open(series);
    if (!out) return bad("cannot write " + series);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = uroce::simx::run_incast(
      c,
      [&](const uroce::simx::FlowSample& s) {
        if (!out) return;
        out << json{{"t_s", static_cast<double>(s.t_ns) / 1e9}, {"flow", s.flow}, {"goodput_bps", s.goodput_bps},
                    {"pace_bps", s.pace_bps}, {"alpha", s.alpha}, {"window", s.window}, {"rtt_ns", s.rtt_ns}}
                   .dump()
            << '\n';
      },
      [&](const uroce::simx::QueueSample& q) {
        if (out) out << json{{"t_s", static_cast<double>(q.t_ns) / 1e9}, {"queue_bytes", q.bytes}}.dump() << '\n';
      });
  const double cpu = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json o = {{"mode", mode},
            {"senders", c.senders},
            {"cc", cc},
            {"loss", c.loss},
            {"link_gbps", link_gbps},
            {"delay_us", delay_us},
            {"mtu", mtu},
            {"pfc", pfc},
            {"recovery", c.selective_repeat ? "selective-repeat" : "go-back-N"},
            {"simulated_ms", ms},
            {"goodput_gbps", r.goodput_bps / 1e9},
            {"jain", r.jain},
            {"flow_goodput_gbps", json::array()},
            {"max_queue_kb", static_cast<double>(r.max_queue_bytes) / 1024},
            {"mean_queue_kb", r.mean_queue_bytes / 1024},
            {"drops", r.drops},
            {"ce_marks", r.ce_marks},
            {"cnps", r.cnps},
            {"retransmitted_pkts", r.retransmitted_pkts},
            {"timeouts", r.timeouts},
            {"messages", r.messages},
            {"mct_p50_us", static_cast<double>(r.mct_p50_ns) / 1e3},
            {"mct_p99_us", static_cast<double>(r.mct_p99_ns) / 1e3},
            {"failed", r.failed},
            {"events", r.events},
            {"cpu_s", cpu}};
  for (double g : r.flow_goodput_bps) o["flow_goodput_gbps"].push_back(g / 1e9);
  std::printf("%s\n", o.dump().c_str());
  return r.failed == 0 ? 0 : 1;
}
