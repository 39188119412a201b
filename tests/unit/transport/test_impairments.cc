// 10,000 mixed, verified messages under loss, duplication, reordering and
// corruption at 0, 1, 5 and 20%: nothing lost, nothing duplicated, every
// byte right.
#include <gtest/gtest.h>

#include "tests/support/gbn_checker.h"
#include "tests/support/impairment_case.h"
#include "tests/support/traffic.h"

namespace uroce::testing {
namespace {

class Impaired : public ::testing::TestWithParam<Case> {};

TEST_P(Impaired, TenThousandMixedMessagesArriveExactlyOnce) {
  const Case c = GetParam();
  Pair p(static_cast<std::uint64_t>(c.percent) * 10 + static_cast<std::uint64_t>(c.kind) + 1);
  const QpPair q = p.connect();
  p.wire.set_impairments(c.impairments());
  GbnChecker gbn(&p.B(), q.b->qpn, q.b->resp.epsn, q.b->mtu);
  gbn.attach(p.wire);
  TrafficOptions o;
  o.messages = 10000;
  o.seed = 7 + static_cast<std::uint64_t>(c.percent);
  Traffic t(p, q, o);
  const TrafficResult r = t.run();
  EXPECT_EQ(r.errors, 0u) << r.first_error;
  if (r.errors) std::printf("    first error: %s\n", r.first_error.c_str());
  EXPECT_EQ(r.completed, 10000u);
  // Go-back-N invariants on the whole trace.
  EXPECT_TRUE(gbn.violations().empty()) << gbn.violations().front();
  if (c.kind == Kind::kLoss && c.percent > 0) {
    EXPECT_GT(gbn.naks_seen(), 0u);
  }
  const auto& s = p.wire.stats();
  std::printf("    wire: sent %lu delivered %lu dropped %lu dup %lu reordered %lu corrupted %lu; bytes %lu; "
              "retransmitted %lu timeouts %lu seq-naks %lu dup-req %lu, virtual %.1f ms\n",
              (unsigned long)s.sent, (unsigned long)s.delivered, (unsigned long)s.dropped, (unsigned long)s.duplicated,
              (unsigned long)s.reordered, (unsigned long)s.corrupted, (unsigned long)r.bytes,
              (unsigned long)q.a->ctr[QpCounter::retransmitted_pkts], (unsigned long)q.a->ctr[QpCounter::timeouts],
              (unsigned long)q.b->ctr[QpCounter::sent_seq_naks], (unsigned long)q.b->ctr[QpCounter::duplicate_request],
              p.wire.now() / 1e6);
  if (c.percent > 0) {
    // The impairment really happened, and recovery really ran.
    const std::uint64_t hit = s.dropped + s.duplicated + s.reordered + s.corrupted;
    EXPECT_GT(hit, 0u);
  }
  if (c.kind == Kind::kLoss && c.percent > 0) {
    EXPECT_GT(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
  }
  if (c.kind == Kind::kCorrupt && c.percent > 0) {
    EXPECT_GT(p.A().counters()[PortCounter::rx_icrc_err] + p.B().counters()[PortCounter::rx_icrc_err] +
                  p.A().counters()[PortCounter::rx_malformed] + p.B().counters()[PortCounter::rx_malformed] +
                  p.A().counters()[PortCounter::rx_not_roce] + p.B().counters()[PortCounter::rx_not_roce],
              0u);
  }
  if (c.kind == Kind::kDup && c.percent > 0) {
    EXPECT_GT(q.b->ctr[QpCounter::duplicate_request], 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Impaired, ::testing::ValuesIn(matrix()), name);

}  // namespace
}  // namespace uroce::testing
