// QPN quarantine (TCP's TIME_WAIT for RC QPs): a QP destroyed in RTS keeps
// its number for about its retry budget and ACKs again a retry of a message
// it took, so a peer whose last ACK was lost still completes; the number is
// not reused meanwhile, and what the QP never took is dropped.
#include <gtest/gtest.h>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

/// A's WRITE reaches B, B's ACK is lost, B destroys its QP at once (a tool
/// that has all it needs and leaves), and A retries after its ACK timeout.
struct LostLastAck : ::testing::Test {
  Pair p{7, 64 * 1024};
  QpPair q;
  std::vector<ibv_wc> wa;
  void SetUp() override {
    q = p.connect();
    sim::Impairments imp;
    imp.loss = 1.0;
    std::uint32_t dropped = 0;
    imp.filter = [dropped](const TxFrame& f) mutable { return f.opcode == wire::op::kRcAck && dropped++ == 0; };
    p.wire.set_impairments(imp);  // the first ACK (B's) is lost, later ones pass
    Sge s = p.sge(0, 0, 64);
    ASSERT_EQ(p.A().post_send(q.a, p.write_to(1, s, 0)), 0);
    ASSERT_TRUE(p.wire.run_until([&] { return q.b->ctr[QpCounter::rcvd_pkts] >= 1; }, 1'000'000));
    p.wire.run_until([] { return false; }, 20'000);  // B's ACK goes out (and is lost)
    ASSERT_EQ(p.B().destroy_qp(q.b), 0);
  }
  bool wait_a() {
    return p.wire.run_until(
        [&] {
          p.poll(0, wa);
          return !wa.empty();
        },
        200'000'000);
  }
};

TEST_F(LostLastAck, TheRetryIsAckedFromQuarantine) {
  ASSERT_TRUE(wait_a());
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << "without quarantine the retry meets no QP: RETRY_EXC_ERR";
  EXPECT_GE(p.B().counters()[PortCounter::quarantine_acks], 1u);
  EXPECT_GE(q.a->ctr[QpCounter::timeouts], 1u) << "A did have to retry";
}

TEST_F(LostLastAck, TheNumberIsNotReusedWhileQuarantined) {
  const std::uint32_t old = q.a->dest_qp_num;
  auto more = p.connect();
  EXPECT_NE(more.b->qpn, old) << "a new QP took the quarantined number";
  EXPECT_EQ(p.B().find_qp(old), nullptr) << "a quarantined QP is not a live one";
}

TEST_F(LostLastAck, AfterTheQuarantineTheNumberIsFreeAndFramesAreUnknown) {
  ASSERT_TRUE(wait_a());
  const std::uint32_t old = q.a->dest_qp_num;
  // (retry_cnt 7 + 1) x ~1 ms ACK timeout is under the 100 ms floor. (The
  // wire only moves its clock towards events: a timer 150 ms on is one.)
  const std::uint64_t later = p.wire.now() + 150'000'000;
  p.wire.next_timer = [later] { return later; };
  p.wire.run_until([] { return false; }, 150'000'000);
  p.wire.next_timer = nullptr;
  // A new request from A for the old number: the slot is released.
  Sge s = p.sge(0, 0, 64);
  const auto unknown = p.B().counters()[PortCounter::rx_unknown_qp];
  ASSERT_EQ(p.A().post_send(q.a, p.write_to(1, s, 0, 2)), 0);
  p.wire.run_until([] { return false; }, 2'000'000);
  EXPECT_GT(p.B().counters()[PortCounter::rx_unknown_qp], unknown);
  EXPECT_EQ(p.B().find_qp(old), nullptr);
}

TEST_F(LostLastAck, AnExpiredQuarantineIsFreedByPollNotListedMeanwhile) {
  ASSERT_TRUE(wait_a());
  EXPECT_EQ(p.B().quarantined_count(), 1u);
  int listed = 0;
  p.B().for_each_qp([&](const Qp&) { ++listed; });
  EXPECT_EQ(listed, 0) << "a quarantined number is listed as a live QP";
  const std::uint64_t later = p.wire.now() + 150'000'000;
  p.wire.next_timer = [later] { return later; };
  p.wire.run_until([] { return false; }, 150'000'000);
  p.wire.next_timer = nullptr;
  // No frame comes for the number and no QP is created: polls alone free
  // it (a few slots each; the table has 64).
  for (int i = 0; i < 16; ++i) p.B().poll(p.wire.now());
  EXPECT_EQ(p.B().quarantined_count(), 0u) << "an expired quarantine stayed until the table filled";
}

TEST(Quarantine, AQpDestroyedInErrorIsFreedAtOnce) {
  Pair p(9, 64 * 1024);
  auto q = p.connect();
  const std::uint32_t n = q.b->qpn;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  p.B().modify_qp(q.b, a, IBV_QP_STATE);
  ASSERT_EQ(p.B().destroy_qp(q.b), 0);
  // The lowest free number again: no quarantine for a QP that answers nothing.
  auto more = p.connect();
  EXPECT_EQ(more.b->qpn, n);
}

TEST(Quarantine, ItsCqsAndPdCanGoRightAway) {
  Pair p(11, 64 * 1024);
  QpInitAttr ia;
  Cq* cq = p.B().create_cq(16);
  Pd* pd = p.B().alloc_pd();
  auto q = p.connect();
  (void)ia;
  (void)cq;
  (void)pd;
  ASSERT_EQ(p.B().destroy_qp(q.b), 0);
  // The node's CQ served the QP; once destroyed, nothing holds it.
  EXPECT_EQ(p.B().destroy_cq(p.node[1].cq), 0);
}

}  // namespace
}  // namespace uroce::testing
