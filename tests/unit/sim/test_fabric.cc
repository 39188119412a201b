// The simulated fabric (drivers/sim/fabric) and the incast experiment on
// it (tools/sim/scenarios), on fixed seeds: exact and repeatable, so the
// qualitative results of docs/research.md are asserted here, not timed.
#include <gtest/gtest.h>

#include "tools/sim/scenarios.h"

namespace uroce::simx {
namespace {

constexpr double kLine = 10e9;
// A full 1 KiB packet's share of the wire: payload over payload, headers
// (Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH on the first only, ICRC 4) and
// the 20 bytes of preamble and gap.
constexpr double kEfficiency = 1024.0 / (1024 + 58 + 20);

IncastConfig incast(int n, const char* cc, bool pfc, std::uint64_t ms = 20) {
  IncastConfig c;
  c.senders = n;
  c.cc = cc;
  c.sw.pfc = pfc;
  c.sw.pmax = 0.1;
  c.duration_ns = ms * 1'000'000;
  return c;
}

TEST(Fabric, OneFlowRunsAtTheLinkRate) {
  const IncastResult r = run_incast(incast(1, "none", false, 5));
  EXPECT_NEAR(r.goodput_bps, kLine * kEfficiency, kLine * 0.01);
  EXPECT_EQ(r.drops, 0u);
  EXPECT_EQ(r.failed, 0u);
  EXPECT_GT(r.messages, 60u);
}

TEST(Fabric, IsDeterministicForASeedAndDiffersAcrossSeeds) {
  IncastConfig c = incast(8, "dcqcn", false, 5);
  const IncastResult a = run_incast(c), b = run_incast(c);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.flow_goodput_bps, b.flow_goodput_bps);
  EXPECT_EQ(a.ce_marks, b.ce_marks);
  c.seed = 2;
  const IncastResult d = run_incast(c);
  EXPECT_NE(a.ce_marks, d.ce_marks) << "RED's draws follow the seed";
}

TEST(Fabric, TailDropsAtTheBufferWithPfcOff) {
  const IncastResult r = run_incast(incast(8, "none", false, 5));
  EXPECT_GT(r.drops, 0u);
  EXPECT_LE(r.max_queue_bytes, 512u * 1024);
  EXPECT_GT(r.max_queue_bytes, 500u * 1024) << "it filled";
  EXPECT_GT(r.retransmitted_pkts, 0u) << "go-back-N resent what was dropped";
}

TEST(Fabric, PfcIsLossless) {
  const IncastResult r = run_incast(incast(16, "none", true, 5));
  EXPECT_EQ(r.drops, 0u);
  EXPECT_EQ(r.retransmitted_pkts, 0u);
  // Each ingress holds at most xoff plus what its link had in flight.
  EXPECT_LE(r.max_queue_bytes, 16u * (24 * 1024 + 4 * 1102));
  EXPECT_GT(r.goodput_bps, kLine * kEfficiency * 0.98);
}

TEST(Fabric, RedMarksOnlyAboveKmin) {
  IncastConfig c = incast(4, "none", true, 5);
  c.sw.kmin_bytes = 10u << 20;  // above anything the queue reaches
  c.sw.kmax_bytes = 20u << 20;
  EXPECT_EQ(run_incast(c).ce_marks, 0u);
  c.sw.kmin_bytes = 0;
  c.sw.kmax_bytes = 1;  // every frame that finds a queue is marked
  EXPECT_GT(run_incast(c).ce_marks, 1000u);
  c.sw.ecn = false;
  EXPECT_EQ(run_incast(c).ce_marks, 0u);
}

// The qualitative results the research page shows (docs/research.md).

TEST(Incast, WithoutCongestionControlTailDropStarvesFlowsAsNGrows) {
  const IncastResult r4 = run_incast(incast(4, "none", false)), r16 = run_incast(incast(16, "none", false));
  EXPECT_GT(r16.drops, r4.drops);
  EXPECT_GT(r16.retransmitted_pkts, r4.retransmitted_pkts);
  EXPECT_GT(r16.timeouts, 0u) << "go-back-N stalls on retransmit timeouts";
  EXPECT_LT(r16.jain, 0.5) << "a few flows take the link";
  const double fair = kLine * kEfficiency / 16;
  EXPECT_LT(*std::min_element(r16.flow_goodput_bps.begin(), r16.flow_goodput_bps.end()), 0.1 * fair)
      << "and some starve";
}

TEST(Incast, DcqcnConvergesToAFairShareWithABoundedQueue) {
  for (const int n : {4, 8, 16}) {
    const IncastResult r = run_incast(incast(n, "dcqcn", true));
    EXPECT_GE(r.jain, 0.95) << n;
    EXPECT_LT(r.mean_queue_bytes, 200'000) << n << ": below Kmax on average";
    EXPECT_GT(r.goodput_bps, 0.75 * kLine * kEfficiency) << n << ": no collapse";
    EXPECT_GT(r.cnps, 0u) << n;
    EXPECT_EQ(r.drops, 0u) << n;
  }
  // Without it, on the same lossless fabric, the queue is PFC's.
  const IncastResult none = run_incast(incast(16, "none", true));
  const IncastResult dcqcn = run_incast(incast(16, "dcqcn", true));
  EXPECT_GT(none.mean_queue_bytes, 2 * dcqcn.mean_queue_bytes);
}

TEST(Incast, SwiftKeepsTheQueueNearItsTarget) {
  for (const int n : {4, 8, 16}) {
    const IncastResult r = run_incast(incast(n, "swift", true));
    EXPECT_GE(r.jain, 0.95) << n;
    // 10 us of queueing at 10 Gb/s is 12.5 KB; allow the sub-microsecond
    // steps of the window.
    EXPECT_LT(r.mean_queue_bytes, 40'000) << n;
    EXPECT_GT(r.goodput_bps, 0.9 * kLine * kEfficiency) << n;
  }
}

TEST(Incast, JainIndex) {
  EXPECT_DOUBLE_EQ(jain_index({1, 1, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(jain_index({1, 0, 0, 0}), 0.25);
  EXPECT_DOUBLE_EQ(jain_index({0, 0}), 0.0);
}

}  // namespace
}  // namespace uroce::simx
