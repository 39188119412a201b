// The congestion-control algorithms on their own, on a virtual clock:
// DCQCN's reaction point against a trace computed by hand (an independent
// model of the paper's rules, exact fractions, in the comments' numbers),
// Swift's window, the RTT statistics and the registry.
#include <gtest/gtest.h>

#include <cmath>

#include "stack/cc/dcqcn.h"
#include "stack/cc/swift.h"

namespace uroce::cc {
namespace {

constexpr std::uint64_t kLine = 10'000'000'000;  // 10 Gb/s
constexpr std::uint64_t t0 = 1'000'000;

void expect_state(const Dcqcn& d, double alpha, double rc, double rt, const char* where) {
  const State s = d.state();
  EXPECT_NEAR(s.alpha, alpha, 1e-9) << where;
  EXPECT_NEAR(s.rate_bps, rc, 1e-3) << where;
  EXPECT_NEAR(s.target_bps, rt, 1e-3) << where;
}

TEST(Dcqcn, FollowsAHandComputedTrace) {
  // Small F and B so that one short trace passes through fast recovery,
  // additive increase and hyper increase; the other parameters are the
  // defaults (g = 1/256, K = T = 55 us, R_AI = 40 Mb/s, R_HAI = 50 Mb/s).
  DcqcnParams p;
  p.fast_recovery = 2;
  p.byte_counter = 4000;
  Dcqcn d(Path{kLine, 1024, 512}, p);
  expect_state(d, 1.0, 1e10, 1e10, "start: line rate, alpha 1");
  EXPECT_EQ(d.limits.rate_bps, 0u) << "unpaced at line rate";
  EXPECT_EQ(d.next_timer(), 0u) << "no timer before the first CNP";

  d.on_cnp(t0);  // Rt = Rc; Rc = Rc (1 - 1/2); alpha = (1-g) 1 + g = 1
  expect_state(d, 1.0, 5e9, 1e10, "first CNP");
  EXPECT_EQ(d.limits.rate_bps, 5'000'000'000u);
  EXPECT_EQ(d.next_timer(), t0 + 55'000);

  d.on_cnp(t0 + 2'000);  // within 4 us of the cut: ignored
  expect_state(d, 1.0, 5e9, 1e10, "CNP within the reduce period");
  EXPECT_EQ(d.cnps_ignored(), 1u);

  d.on_timer(t0 + 55'000);  // alpha = 255/256; timer stage 1 < F: fast recovery, Rc = (10 + 5) / 2
  expect_state(d, 0.99609375, 7.5e9, 1e10, "alpha and increase timers");

  d.on_cnp(t0 + 60'000);  // Rt = 7.5 G; Rc = 7.5 G (1 - 0.99609375 / 2); alpha = 0.99609375^2 + 1/256
  expect_state(d, 0.9961090087890625, 3764648437.5, 7.5e9, "second CNP");
  EXPECT_EQ(d.timer_stage(), 0u);

  d.on_tx(t0 + 61'000, 4000);  // byte stage 1: fast recovery
  expect_state(d, 0.9961090087890625, 5632324218.75, 7.5e9, "byte counter 1");
  d.on_timer(t0 + 115'000);  // timer stage 1: fast recovery
  expect_state(d, 0.9922179579734802, 6566162109.375, 7.5e9, "timer 1");
  d.on_tx(t0 + 116'000, 4000);  // (1, 2): max = F, min < F: additive, Rt + 40 M
  expect_state(d, 0.9922179579734802, 7053081054.6875, 7.54e9, "additive 1");
  d.on_timer(t0 + 170'000);  // (2, 2): additive
  expect_state(d, 0.9883421066, 7316540527.34375, 7.58e9, "additive 2");
  d.on_tx(t0 + 171'000, 4000);  // (2, 3): additive
  expect_state(d, 0.9883421066, 7468270263.671875, 7.62e9, "additive 3");
  d.on_timer(t0 + 225'000);  // (3, 3): both past F: hyper, Rt + 1 x 50 M
  expect_state(d, 0.9844813952, 7569135131.8359375, 7.67e9, "hyper 1");
  d.on_tx(t0 + 226'000, 4000);  // (3, 4): hyper, min - F = 1
  expect_state(d, 0.9844813952, 7644567565.91796875, 7.72e9, "hyper 2");
  d.on_timer(t0 + 280'000);  // (4, 4): hyper, 2 x 50 M
  expect_state(d, 0.9806357648, 7732283782.958984375, 7.82e9, "hyper 3");
  EXPECT_EQ(d.limits.rate_bps, static_cast<std::uint64_t>(7732283782.958984375));
}

TEST(Dcqcn, RecoversToLineRateAndStopsItsTimers) {
  Dcqcn d(Path{kLine, 1024, 512});
  d.on_cnp(t0);
  ASSERT_NE(d.limits.rate_bps, 0u);
  std::uint64_t now = t0;
  for (int i = 0; i < 100'000 && d.next_timer() != 0; ++i) {
    now = d.next_timer();
    d.on_timer(now);
  }
  EXPECT_EQ(d.next_timer(), 0u) << "both timers stop once the rate is back and alpha has decayed";
  EXPECT_EQ(d.limits.rate_bps, 0u) << "back at line rate: unpaced";
  EXPECT_LT(d.state().alpha, 1.0 / 1024);
  EXPECT_LT(now - t0, 200'000'000u) << "within 200 ms of simulated time";
}

TEST(Dcqcn, NeverFallsBelowTheMinimumRateAndCatchesUpAfterIdling) {
  Dcqcn d(Path{kLine, 1024, 512});
  for (int i = 0; i < 200; ++i) d.on_cnp(t0 + std::uint64_t(i) * 5'000);
  EXPECT_GE(d.state().rate_bps, 1e6);
  EXPECT_LE(d.state().rate_bps, 1e6 * 1.01);
  // A QP that was not polled for a second catches up in one call, bounded.
  d.on_timer(t0 + 1'000'000'000);
  EXPECT_GT(d.state().rate_bps, 1e9) << "4096 stages: fast recovery, then additive and hyper increase";
  EXPECT_TRUE(d.next_timer() == 0 || d.next_timer() > t0 + 1'000'000'000) << "no timer left in the past";
}

TEST(Swift, GrowsBelowTheTargetAndShrinksAboveItOncePerRoundTrip) {
  SwiftParams p;
  p.initial_window = 10;
  Swift s(Path{kLine, 1024, 512}, p);
  EXPECT_EQ(s.limits.window, 10u);
  s.on_rtt(t0, 10'000);  // the base: the target is 10 + 10 us
  for (int i = 0; i < 10; ++i) s.on_ack(t0, 1);  // one window's worth: + ai (about 1)
  EXPECT_NEAR(s.state().window, 11.0, 0.1);
  // 40 us: over the 20 us target by half; factor max(1 - 0.8 x 0.5, 0.5) = 0.6.
  const double before = s.state().window;
  s.on_rtt(t0 + 1'000, 40'000);
  EXPECT_NEAR(s.state().window, before * 0.6, 1e-9);
  s.on_rtt(t0 + 2'000, 40'000);  // within a round trip of the last cut
  EXPECT_NEAR(s.state().window, before * 0.6, 1e-9);
  s.on_rtt(t0 + 501'000, 400'000);  // far over, a round trip later: the cut is capped at max_mdf
  EXPECT_NEAR(s.state().window, before * 0.6 * 0.5, 1e-9);
  s.on_rtt(t0 + 600'000, 400'000);  // within 400 us of that cut: none
  EXPECT_NEAR(s.state().window, before * 0.6 * 0.5, 1e-9);
  s.on_ack(t0 + 610'000, 5);  // above the target: no growth
  EXPECT_NEAR(s.state().window, before * 0.3, 1e-9);
}

TEST(Swift, BelowOnePacketItPacesAndATimeoutResetsTheWindow) {
  SwiftParams p;
  p.initial_window = 4;
  Swift s(Path{kLine, 1000, 512}, p);
  std::uint64_t now = t0;
  s.on_rtt(now, 1'000);  // a 1 us base
  for (int i = 0; i < 20; ++i) s.on_rtt(now += 1'000'000, 1'000'000);  // 1 ms: halved each time
  EXPECT_NEAR(s.state().window, 0.01, 1e-12) << "held at the floor";
  EXPECT_EQ(s.limits.window, 1u);
  // 0.01 x (1000 + 58) bytes x 8 per 1 ms.
  EXPECT_NEAR(static_cast<double>(s.limits.rate_bps), 0.01 * 1058 * 8 * 1e3, 1.0);
  SwiftParams q;
  q.initial_window = 50;
  Swift t(Path{kLine, 1024, 512}, q);
  t.on_timeout(t0);
  EXPECT_EQ(t.state().window, 1.0);
  EXPECT_EQ(t.limits.window, 1u);
}

TEST(RttStats, MinMeanAndPercentiles) {
  RttStats r;
  EXPECT_EQ(r.quantile(0.99), 0u);
  for (std::uint64_t us = 1; us <= 1000; ++us) r.add(us * 1000);
  EXPECT_EQ(r.count(), 1000u);
  EXPECT_EQ(r.min(), 1000u);
  EXPECT_EQ(r.max(), 1'000'000u);
  EXPECT_EQ(r.mean(), 500'500u);
  const double p99 = static_cast<double>(r.quantile(0.99));
  EXPECT_GE(p99, 990'000.0);
  EXPECT_LE(p99, 990'000.0 * 1.19);
  const double p50 = static_cast<double>(r.quantile(0.5));
  EXPECT_GE(p50, 500'000.0);
  EXPECT_LE(p50, 500'000.0 * 1.19);
  EXPECT_EQ(r.quantile(1.0), 1'000'000u);
}

TEST(Registry, NamesEveryAlgorithmNoneFirst) {
  const auto reg = registry();
  ASSERT_GE(reg.size(), 3u);
  EXPECT_EQ(reg[0].name, "none");
  EXPECT_EQ(reg[0].make, nullptr);
  for (const char* n : {"dcqcn", "swift"}) {
    const Entry* e = find(n);
    ASSERT_NE(e, nullptr) << n;
    auto a = e->make(Path{});
    EXPECT_EQ(a->name(), n);
  }
  EXPECT_EQ(find("cubic"), nullptr);
}

TEST(Registry, SaysWhichAlgorithmsAUdQpTakes) {
  // A UD QP gets no ACKs: only algorithms that need none serve it.
  EXPECT_TRUE(find("dcqcn")->ud);
  EXPECT_FALSE(find("swift")->ud);
  EXPECT_EQ(ud_refusal("swift"), "swift needs ACKs, which a UD QP does not get (a UD QP takes none, dcqcn)");
}

}  // namespace
}  // namespace uroce::cc
