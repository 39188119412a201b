// Congestion control in the engine, on the simulated wire: CE marks make
// CNPs, the sender's DCQCN cuts its pacer's rate and climbs back to line
// rate once the marks stop; the requester's RTT samples; a Swift window
// caps the packets in flight; the per-QP choice and its refusals.
#include <gtest/gtest.h>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

constexpr std::uint64_t kLine = 10'000'000'000;

std::function<void(int, EngineConfig&)> line_rate(const char* cc = "none") {
  return [cc](int, EngineConfig& c) {
    c.line_rate_bps = kLine;
    c.cc = cc;
  };
}

/// Posts `n` WRITEs of `len` bytes from A and runs until all complete.
void stream(Pair& p, const QpPair& q, int n, std::uint32_t len) {
  Sge s = p.sge(0, 0, len);
  for (int i = 0; i < n; ++i) ASSERT_EQ(p.A().post_send(q.a, p.write_to(1, s, 1u << 20, i)), 0);
  std::vector<ibv_wc> wc;
  ASSERT_TRUE(p.wire.run_until([&] {
    p.poll(0, wc);
    return wc.size() >= static_cast<std::size_t>(n);
  }, 2'000'000'000));
  for (const ibv_wc& w : wc) ASSERT_EQ(w.status, IBV_WC_SUCCESS);
}

TEST(CcEngine, DcqcnSlowsDownOnCnpsAndRecoversWhenTheMarksStop) {
  Pair p(1, 4u << 20, 64, false, line_rate());
  const QpPair q = p.connect();
  ASSERT_EQ(p.A().set_cc(q.a, "dcqcn"), 0);
  EXPECT_EQ(p.A().cc_report(*q.a).pace_bps, 0u) << "at line rate, unpaced";
  // A congested switch: CE on every data frame from A.
  sim::Impairments imp;
  imp.ce = 1.0;
  const auto mac = p.A().config().mac;
  imp.filter = [mac](const TxFrame& f) { return std::memcmp(f.hdr + 6, mac.data(), 6) == 0; };
  p.wire.set_impairments(imp);
  stream(p, q, 64, 16384);
  const CcReport hot = p.A().cc_report(*q.a);
  EXPECT_GT(q.a->ctr[QpCounter::cnp_received], 3u);
  EXPECT_EQ(q.a->ctr[QpCounter::cnp_received], q.b->ctr[QpCounter::cnp_sent]);
  EXPECT_EQ(hot.algorithm, "dcqcn");
  EXPECT_GT(hot.pace_bps, 0u);
  EXPECT_LT(hot.pace_bps, kLine / 4) << "several cuts by alpha/2";
  EXPECT_GT(hot.state.alpha, 0.0);
  EXPECT_LE(hot.state.alpha, 1.0);
  EXPECT_LT(hot.state.rate_bps, hot.state.target_bps + 1) << "the target is where the last cut started";
  // Marks stop: the rate climbs back and, at the line, the timers stop.
  p.wire.set_impairments(sim::Impairments{});
  std::uint64_t seen_rate = hot.pace_bps;
  bool rose = false;
  ASSERT_TRUE(p.wire.run_until([&] {
    const std::uint64_t r = p.A().cc_report(*q.a).pace_bps;
    rose = rose || r > seen_rate;
    return q.a->cc->next_timer() == 0;
  }, 1'000'000'000));
  EXPECT_TRUE(rose);
  const CcReport cool = p.A().cc_report(*q.a);
  EXPECT_EQ(cool.pace_bps, 0u);
  EXPECT_EQ(cool.state.rate_bps, static_cast<double>(kLine));
  stream(p, q, 4, 4096);  // still works, unpaced
  EXPECT_EQ(q.a->ctr[QpCounter::cnp_received], q.b->ctr[QpCounter::cnp_sent]);
}

TEST(CcEngine, TheRequesterTakesRoundTripSamples) {
  Pair p;
  const QpPair q = p.connect();
  stream(p, q, 32, 4096);
  const CcReport r = p.A().cc_report(*q.a);
  EXPECT_EQ(r.algorithm, "none");
  EXPECT_GE(r.rtt_samples, 16u) << "one per probe (16 at a time; each message's last packet asks for an ACK)";
  EXPECT_LE(r.rtt_samples, 128u) << "at most one per packet";
  EXPECT_GE(r.rtt_min_ns, 2000u) << "two 1 us link delays";
  EXPECT_GE(r.rtt_mean_ns, r.rtt_min_ns);
  EXPECT_GE(r.rtt_p99_ns, r.rtt_mean_ns);
  EXPECT_EQ(p.B().cc_report(*q.b).rtt_samples, 0u) << "B sent no requests";
}

TEST(CcEngine, ALossVoidsTheProbeAndStillSamples) {
  Pair p(3);
  const QpPair q = p.connect();
  sim::Impairments imp;
  imp.loss = 0.05;
  p.wire.set_impairments(imp);
  stream(p, q, 64, 8192);
  EXPECT_GT(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
  EXPECT_GT(q.a->ctr[QpCounter::retransmitted_bytes], q.a->ctr[QpCounter::retransmitted_pkts] * 1000);
  const CcReport r = p.A().cc_report(*q.a);
  EXPECT_GT(r.rtt_samples, 0u);
  EXPECT_LT(r.rtt_min_ns, 20'000u) << "no sample spans a retransmit timeout";
}

/// The most request packets of A's QP in flight when one left.
std::uint32_t max_in_flight(Pair& p, const QpPair& q, int n) {
  std::uint32_t most = 0;
  const auto mac = p.A().config().mac;
  p.wire.tap = [&](wire::ConstBytes f, std::uint64_t) {
    if (std::memcmp(f.data() + 6, mac.data(), 6) == 0)
      most = std::max(most, static_cast<std::uint32_t>(distance(q.a->req.una, q.a->req.sent_hi)));
  };
  stream(p, q, n, 65536);
  p.wire.tap = nullptr;
  return most;
}

/// A fourth algorithm, as a researcher would write one: a fixed window.
class FixedWindow final : public cc::Algorithm {
 public:
  explicit FixedWindow(std::uint32_t w) { limits.window = w; }
  std::string_view name() const override { return "fixed"; }
  cc::State state() const override { return {0, 0, 0, static_cast<double>(limits.window)}; }
};

TEST(CcEngine, TheRequesterHonoursAnAlgorithmsWindow) {
  Pair p;
  sim::Impairments imp;
  imp.delay_ns = 50'000;  // a long path: without a cap, the engine's 512 packets fill it
  p.wire.set_impairments(imp);
  const QpPair q = p.connect();
  EXPECT_GE(max_in_flight(p, q, 8), 256u);
  q.a->cc = std::make_unique<FixedWindow>(6);  // taken at its first hook
  const std::uint32_t capped = max_in_flight(p, q, 4);
  EXPECT_LE(capped, 6u + 1) << "the window, and the first packet that applied it";
  EXPECT_GE(capped, 6u);
  EXPECT_EQ(q.a->window, 6u);
}

TEST(CcEngine, SwiftCutsItsWindowWhenTheDelayRises) {
  Pair p(1, 4u << 20, 64, false, line_rate("swift"));
  PairOptions o;
  o.timeout = 14;  // 67 ms: a window cut below one packet paces slowly
  const QpPair q = p.connect(o);
  sim::Impairments imp;
  imp.delay_ns = 2'000;
  p.wire.set_impairments(imp);
  EXPECT_EQ(q.a->window, 16u) << "Swift's initial window";
  stream(p, q, 2, 65536);  // the base round trip: about 4 us, under the target: the window grows
  const std::uint32_t grown = q.a->window;
  EXPECT_GT(grown, 16u);
  imp.delay_ns = 40'000;  // 80 us now: 76 us of "queueing", over the 10 us allowance
  p.wire.set_impairments(imp);
  stream(p, q, 1, 65536);  // 64 packets over several round trips of a shrinking window
  EXPECT_LE(q.a->window * 4, grown) << "at least two halvings";
  EXPECT_LT(p.A().cc_report(*q.a).state.window, grown / 4.0);
  EXPECT_GE(p.A().cc_report(*q.a).rtt_min_ns, 4'000u);
}

TEST(CcEngine, TheChoiceIsPerQpAndBadChoicesAreRefused) {
  Pair p(1, 4u << 20, 64, false, line_rate("dcqcn"));
  const QpPair q = p.connect();
  EXPECT_EQ(p.A().cc_report(*q.a).algorithm, "dcqcn");
  EXPECT_EQ(p.A().set_cc(q.a, "cubic"), EINVAL);
  EXPECT_EQ(p.A().cc_report(*q.a).algorithm, "dcqcn") << "a refusal changes nothing";
  EXPECT_EQ(p.A().set_cc(nullptr, "none"), EINVAL);
  EXPECT_EQ(p.A().set_cc(q.a, "none"), 0);
  EXPECT_EQ(q.a->cc, nullptr);
  EXPECT_EQ(p.B().cc_report(*q.b).algorithm, "dcqcn");
  PairOptions ud;
  ud.type = IBV_QPT_UD;
  const QpPair u = p.connect(ud);
  EXPECT_EQ(p.A().cc_report(*u.a).algorithm, "none") << "UD QPs start without";
  EXPECT_EQ(p.A().set_cc(u.a, "swift"), EOPNOTSUPP) << "it needs ACKs, which UD has none of";
  EXPECT_EQ(p.A().set_cc(u.a, "dcqcn"), 0) << "CNPs alone drive it";
  EXPECT_EQ(p.A().set_cc(u.a, "none"), 0);
  // set_rate and the algorithm: the lower rate wins.
  ASSERT_EQ(p.A().set_cc(q.a, "dcqcn"), 0);
  ASSERT_EQ(p.A().set_rate(q.a, 1'000'000'000), 0);
  EXPECT_EQ(q.a->rate_bps, 1'000'000'000u);
  q.a->cc->on_cnp(p.wire.now());  // 10 G -> 5 G: above the limit, which stays
  ASSERT_EQ(p.A().set_rate(q.a, 1'000'000'000), 0);
  EXPECT_EQ(q.a->rate_bps, 1'000'000'000u);
  ASSERT_EQ(p.A().set_rate(q.a, 0), 0);
  EXPECT_EQ(q.a->rate_bps, 5'000'000'000u) << "the algorithm's rate alone";
}

}  // namespace
}  // namespace uroce::testing
