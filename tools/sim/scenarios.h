// Congestion-control experiments on the simulated fabric (drivers/sim):
// each builds hosts of real uroce engines around switches, drives RDMA
// WRITEs through them and measures what a researcher plots. Shared by
// uroce-sim (tables, time series, plots) and the tests that assert the
// qualitative results on fixed seeds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "drivers/sim/fabric.h"

namespace uroce::simx {

/// N senders, one receiver, one switch: every sender keeps long WRITEs
/// going to the receiver for the whole run.
struct IncastConfig {
  int senders = 8;
  std::string cc = "none";
  std::uint64_t link_bps = 10'000'000'000;
  std::uint64_t link_delay_ns = 1'000;
  sim::SwitchSpec sw{};
  ibv_mtu mtu = IBV_MTU_1024;
  std::uint32_t message = 64 * 1024;  // bytes per WRITE
  std::uint32_t depth = 4;            // WRITEs outstanding per sender
  std::uint64_t duration_ns = 10'000'000;
  std::uint64_t sample_ns = 10'000;
  double loss = 0;  // random loss on the switch's egress toward the receiver
  std::uint8_t timeout = 10;  // the QPs' retransmit timer: 4.096 us x 2^10 = 4.2 ms
  bool selective_repeat = false;  // IRN-style loss recovery on every QP (else go-back-N)
  std::uint64_t seed = 1;
};

struct FlowSample {
  std::uint64_t t_ns;
  int flow;
  double goodput_bps;  // acknowledged bytes over the last interval
  double pace_bps;     // the pacer's rate (0: unpaced)
  double alpha;
  std::uint32_t window;
  std::uint64_t rtt_ns;  // the last sample
};

struct QueueSample {
  std::uint64_t t_ns;
  std::uint64_t bytes;  // the switch's queue toward the receiver
};

struct IncastResult {
  std::vector<double> flow_goodput_bps;  // each flow over the second half of the run
  double jain = 0;                       // Jain's fairness index of those
  double goodput_bps = 0;                // their sum
  std::uint64_t drops = 0, ce_marks = 0, cnps = 0, retransmitted_pkts = 0, timeouts = 0;
  std::uint64_t max_queue_bytes = 0;
  double mean_queue_bytes = 0;  // over the second half
  std::uint64_t messages = 0;   // WRITEs completed
  /// Message completion times (post to completion, to the sampling
  /// interval's resolution): median and 99th percentile, ns.
  std::uint64_t mct_p50_ns = 0, mct_p99_ns = 0;
  std::uint64_t failed = 0;     // completions in error
  std::uint64_t events = 0;
};

/// Runs one incast; `flow` and `queue`, if given, see every sample.
IncastResult run_incast(const IncastConfig& c, const std::function<void(const FlowSample&)>& flow = {},
                        const std::function<void(const QueueSample&)>& queue = {});

/// A flow-size mix: `hosts` hosts on one switch, each starting flows (one
/// WRITE each) at Poisson times to a random other host, sizes drawn from
/// the web-search distribution of DCTCP (Alizadeh et al., SIGCOMM 2010),
/// at `load` of each host's link.
struct MixConfig {
  int hosts = 16;
  double load = 0.5;
  std::string cc = "none";
  bool selective_repeat = false;
  std::uint64_t link_bps = 10'000'000'000;
  std::uint64_t link_delay_ns = 1'000;
  sim::SwitchSpec sw{};
  std::uint64_t duration_ns = 50'000'000;  // flows start in the first 80%; the rest drains
  std::uint64_t short_bytes = 100'000;     // "short": below this
  std::uint64_t max_flow = 30'000'000;     // the distribution's largest
  std::uint64_t seed = 1;
};

struct MixResult {
  std::uint64_t flows = 0, finished = 0, short_flows = 0;
  std::uint64_t short_p50_ns = 0, short_p99_ns = 0, all_p50_ns = 0, all_p99_ns = 0;
  double short_slowdown_p50 = 0, short_slowdown_p99 = 0;  // completion time over an empty fabric's
  std::uint64_t drops = 0, retransmitted_pkts = 0, timeouts = 0;
  std::uint64_t events = 0;
};

MixResult run_mix(const MixConfig& c);

/// A size from the web-search distribution's CDF (linear between its points), for u in [0, 1).
std::uint64_t web_search_size(double u);

/// Jain's fairness index: (sum x)^2 / (n sum x^2); 1 is perfectly fair.
double jain_index(const std::vector<double>& x);

}  // namespace uroce::simx
