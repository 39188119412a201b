// Error paths of the RC transport, end to end over the simulated wire:
// retry and RNR exhaustion, remote and local protection errors, invalid
// requests, ghost ACKs/NAKs, posting in the wrong state, unsignaled
// completions, SEND with invalidate, atomic replay and fences. Every case
// checks the completion status, the QP states afterwards and the counters,
// and bounds virtual time so nothing can hang.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "stack/wire/builder.h"
#include "stack/wire/parser.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

namespace op = wire::op;

/// One frame as an engine sent it (seen by the wire's tap, before impairment).
struct Seen {
  std::uint64_t t = 0;
  int from = -1;  // 0 = A, 1 = B
  std::uint8_t opcode = 0;
  std::uint32_t psn = 0;
  std::uint32_t destqp = 0;
  bool has_aeth = false;
  std::uint8_t syndrome = 0;
};

enum class Dead { kLoss, kPeerReset, kPeerDestroyed };

class Errors : public ::testing::Test {
 protected:
  void retry_exceeded_case(Dead how);

  void SetUp() override {
    p.wire.tap = [this](wire::ConstBytes f, std::uint64_t now) {
      wire::Packet pkt;
      if (!wire::parse_frame(f, wire::ParseOptions{}, pkt).ok()) return;
      Seen s;
      s.t = now;
      s.from = pkt.eth_src == p.A().config().mac ? 0 : pkt.eth_src == p.B().config().mac ? 1 : -1;
      s.opcode = pkt.opcode;
      s.psn = pkt.psn.value();
      s.destqp = pkt.destqp;
      if (const wire::Aeth* a = pkt.aeth()) {
        s.has_aeth = true;
        s.syndrome = a->syndrome;
      }
      seen.push_back(s);
    };
  }

  /// Runs until node i has at least n completions (appended to v), at most max_ns.
  bool wait(int i, std::vector<ibv_wc>& v, std::size_t n, std::uint64_t max_ns = 20'000'000) {
    return p.wire.run_until(
        [&] {
          p.poll(i, v);
          return v.size() >= n;
        },
        max_ns);
  }
  /// Runs for `ns` of virtual time, collecting completions of both nodes.
  void settle(std::uint64_t ns = 5'000'000) {
    p.wire.run_until(
        [&] {
          p.poll(0, wa);
          p.poll(1, wb);
          return false;
        },
        ns);
  }

  void fill(int i, std::uint64_t off, std::size_t len, std::uint8_t seed) {
    for (std::size_t k = 0; k < len; ++k) p.node[i].mem[off + k] = static_cast<std::uint8_t>(seed + k * 13);
  }
  std::uint64_t get64(int i, std::uint64_t off) {
    std::uint64_t v;
    std::memcpy(&v, &p.node[i].mem[off], 8);
    return v;
  }
  void put64(int i, std::uint64_t off, std::uint64_t v) { std::memcpy(&p.node[i].mem[off], &v, 8); }

  static SendWr send_wr(std::uint64_t id, const Sge* s, unsigned flags = IBV_SEND_SIGNALED,
                        ibv_wr_opcode opc = IBV_WR_SEND) {
    SendWr w;
    w.wr_id = id;
    w.opcode = opc;
    w.send_flags = flags;
    if (s) w.sg_list = {s, 1};
    return w;
  }
  static SendWr rdma_wr(std::uint64_t id, ibv_wr_opcode opc, const Sge* s, std::uint64_t raddr, std::uint32_t rkey,
                        unsigned flags = IBV_SEND_SIGNALED) {
    SendWr w = send_wr(id, s, flags, opc);
    w.remote_addr = raddr;
    w.rkey = rkey;
    return w;
  }
  int post_recv(Qp* qp, std::uint64_t id, std::uint64_t off, std::uint32_t len) {
    Sge s = p.sge(1, off, len);
    return p.B().post_recv(qp, RecvWr{id, {&s, 1}});
  }

  /// A frame as if sent by node `from` to node `to`'s QP `destqp`.
  std::vector<std::uint8_t> frame(int from, std::uint8_t opcode, std::uint32_t destqp, wire::Psn psn,
                                  const wire::ExtFields& ext = {}, std::size_t payload_len = 0) {
    const int to = 1 - from;
    wire::FrameSpec s;
    s.eth_src = p.node[from].eng->config().mac;
    s.eth_dst = p.node[to].eng->config().mac;
    s.ipver = wire::IpVersion::kV4;
    s.src = p.node[from].eng->config().ip;
    s.dst = p.node[to].eng->config().ip;
    s.udp_sport = 0xc123;
    s.opcode = opcode;
    s.destqp = destqp;
    s.psn = psn;
    s.ext = ext;
    std::vector<std::uint8_t> payload(payload_len, 0x5a);
    std::vector<std::uint8_t> out(8192);
    const std::size_t n = wire::build_frame(wire::Bytes(out.data(), out.size()), s,
                                            wire::ConstBytes(payload.data(), payload.size()));
    out.resize(n);
    return out;
  }
  /// An RC_ACKNOWLEDGE from B to A's QP with the given syndrome and PSN.
  std::vector<std::uint8_t> ack_to_a(const QpPair& q, wire::Psn psn, std::uint8_t syndrome) {
    wire::ExtFields e;
    e.aeth_syndrome = syndrome;
    e.aeth_msn = 0;
    return frame(1, op::kRcAck, q.a->qpn, psn, e);
  }

  std::vector<const Seen*> frames(int from, std::uint8_t opcode, std::uint32_t destqp) const {
    std::vector<const Seen*> r;
    for (const Seen& s : seen)
      if (s.from == from && s.opcode == opcode && s.destqp == destqp) r.push_back(&s);
    return r;
  }
  std::size_t frames_from(int from, std::uint32_t destqp) const {
    std::size_t n = 0;
    for (const Seen& s : seen) n += s.from == from && s.destqp == destqp;
    return n;
  }

  Pair p;
  std::vector<ibv_wc> wa, wb;
  std::vector<Seen> seen;
};

// ------------------------------------------------------------ 1. retry exceeded

void Errors::retry_exceeded_case(Dead how) {
  PairOptions o;
  o.timeout = 8;
  o.retry_cnt = 2;
  const QpPair q = p.connect(o);
  const std::uint32_t bqpn = q.b->qpn;
  switch (how) {
    case Dead::kLoss: {
      sim::Impairments imp;
      imp.loss = 1.0;
      p.wire.set_impairments(imp);
      break;
    }
    case Dead::kPeerReset: {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RESET;
      ASSERT_TRUE(p.B().modify_qp(q.b, a, IBV_QP_STATE));
      break;
    }
    case Dead::kPeerDestroyed: ASSERT_EQ(p.B().destroy_qp(q.b), 0); break;
  }
  Sge s = p.sge(0, 0, 100);
  SendWr w1;
  w1.wr_id = 1;
  w1.send_flags = IBV_SEND_SIGNALED;
  w1.sg_list = {&s, 1};
  SendWr w2 = w1;
  w2.wr_id = 2;
  w2.send_flags = 0;  // unsignaled: a flushed WQE still reports
  ASSERT_EQ(p.A().post_send(q.a, w1), 0);
  ASSERT_EQ(p.A().post_send(q.a, w2), 0);
  const std::uint64_t t0 = p.wire.now();
  const std::uint64_t T = timeout_ns(o.timeout);
  ASSERT_TRUE(wait(0, wa, 2, 10 * T)) << "no completion within 10 timeouts";
  const std::uint64_t took = p.wire.now() - t0;
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[0].wr_id, 1u);
  EXPECT_EQ(wa[0].status, IBV_WC_RETRY_EXC_ERR) << to_string(wa[0].status);
  EXPECT_EQ(wa[0].qp_num, q.a->qpn);
  EXPECT_EQ(wa[1].wr_id, 2u);
  EXPECT_EQ(wa[1].status, IBV_WC_WR_FLUSH_ERR) << to_string(wa[1].status);
  // The first transmission plus retry_cnt retries, each waiting one timeout.
  EXPECT_GE(took, (o.retry_cnt + 1u) * T);
  EXPECT_LT(took, (o.retry_cnt + 2u) * T);
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(q.a->ctr[QpCounter::retry_exceeded_err], 1u);
  EXPECT_EQ(q.a->ctr[QpCounter::timeouts], o.retry_cnt + 1u);
  EXPECT_GT(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
  // A WQE posted in ERR is flushed at once.
  SendWr w3 = w1;
  w3.wr_id = 3;
  ASSERT_EQ(p.A().post_send(q.a, w3), 0);
  std::vector<ibv_wc> more;
  p.poll(0, more);
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].wr_id, 3u);
  EXPECT_EQ(more[0].status, IBV_WC_WR_FLUSH_ERR);
  // Nothing is left armed, and nothing else happens.
  EXPECT_EQ(p.A().next_deadline(), 0u);
  const std::uint64_t sent = q.a->ctr[QpCounter::sent_pkts];
  p.wire.run_until([] { return false; }, 5 * T);
  p.poll(0, more);
  EXPECT_EQ(more.size(), 1u);
  EXPECT_EQ(q.a->ctr[QpCounter::sent_pkts], sent);
  p.poll(1, wb);
  EXPECT_TRUE(wb.empty());
  switch (how) {
    case Dead::kLoss: EXPECT_EQ(p.wire.stats().delivered, 0u); break;
    case Dead::kPeerReset:
      EXPECT_EQ(p.B().counters()[PortCounter::rx_bad_state], sent);
      EXPECT_EQ(p.B().find_qp(bqpn)->ctr[QpCounter::rcvd_pkts], 0u);
      break;
    case Dead::kPeerDestroyed:
      // The destroyed QP is in quarantine: requests it never took are
      // dropped, not ACKed (only retries of ones it took would be).
      EXPECT_EQ(p.B().counters()[PortCounter::rx_quarantined] + p.B().counters()[PortCounter::rx_unknown_qp], sent);
      EXPECT_EQ(p.B().counters()[PortCounter::quarantine_acks], 0u);
      break;
  }
}

TEST_F(Errors, RetryExceededAgainstLossyLink) {
  retry_exceeded_case(Dead::kLoss);
}

TEST_F(Errors, RetryExceededAgainstResetPeerQp) {
  retry_exceeded_case(Dead::kPeerReset);
}

TEST_F(Errors, RetryExceededAgainstDestroyedPeerQp) {
  retry_exceeded_case(Dead::kPeerDestroyed);
}

// ------------------------------------------------------------------- 2. RNR

TEST_F(Errors, RnrRetryExceeded) {
  for (const std::uint8_t rnr_retry : {std::uint8_t{0}, std::uint8_t{1}, std::uint8_t{3}}) {
    SCOPED_TRACE(static_cast<int>(rnr_retry));
    wa.clear();
    wb.clear();
    seen.clear();
    PairOptions o;
    o.rnr_retry = rnr_retry;
    o.min_rnr_timer = 1;  // 10 us
    const QpPair q = p.connect(o);
    Sge s = p.sge(0, 0, 64);
    ASSERT_EQ(p.A().post_send(q.a, send_wr(1, &s)), 0);
    const std::uint64_t t0 = p.wire.now();
    ASSERT_TRUE(wait(0, wa, 1, 20'000'000));
    EXPECT_EQ(wa[0].wr_id, 1u);
    EXPECT_EQ(wa[0].status, IBV_WC_RNR_RETRY_EXC_ERR) << to_string(wa[0].status);
    EXPECT_EQ(wa[0].opcode, IBV_WC_SEND);
    // rnr_retry retries, each after the RNR delay.
    EXPECT_GE(p.wire.now() - t0, rnr_retry * rnr_timer_ns(o.min_rnr_timer));
    EXPECT_EQ(q.a->state, IBV_QPS_ERR);
    EXPECT_EQ(q.b->state, IBV_QPS_RTS);  // RNR is no error for the responder
    // The first attempt and rnr_retry retries, all refused.
    EXPECT_EQ(q.a->ctr[QpCounter::rcvd_rnr_err], rnr_retry + 1u);
    EXPECT_EQ(q.b->ctr[QpCounter::send_rnr_err], rnr_retry + 1u);
    EXPECT_EQ(frames(0, op::kRcSendOnly, q.b->qpn).size(), rnr_retry + 1u);
    EXPECT_EQ(q.a->ctr[QpCounter::retry_rnr_exceeded_err], 1u);
    EXPECT_EQ(q.a->ctr[QpCounter::retry_exceeded_err], 0u);
    for (const Seen* f : frames(1, op::kRcAck, q.a->qpn)) {
      EXPECT_EQ(f->syndrome, 0x20 | o.min_rnr_timer);
    }
    settle(1'000'000);
    EXPECT_TRUE(wb.empty());
    EXPECT_EQ(wa.size(), 1u);
  }
}

TEST_F(Errors, RnrOnWriteWithImmediateLeavesMemoryUntouched) {
  // WRITE with immediate needs a receive WQE; without one it is refused with
  // an RNR NAK before any byte is written.
  PairOptions o;
  o.rnr_retry = 0;
  const QpPair q = p.connect(o);
  fill(0, 0, 200, 9);
  Sge s = p.sge(0, 0, 200);
  SendWr w = rdma_wr(1, IBV_WR_RDMA_WRITE_WITH_IMM, &s, p.addr(1, 50000), p.rkey(1));
  w.imm_data = 0x1234;
  ASSERT_EQ(p.A().post_send(q.a, w), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_RNR_RETRY_EXC_ERR) << to_string(wa[0].status);
  EXPECT_EQ(wa[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(q.b->ctr[QpCounter::send_rnr_err], 1u);
  for (std::size_t i = 50000; i < 50200; ++i) ASSERT_EQ(p.node[1].mem[i], 0) << i;
  EXPECT_EQ(q.b->state, IBV_QPS_RTS);
}

TEST_F(Errors, RnrRecoversWhenReceiveIsPostedLater) {
  PairOptions o;
  o.rnr_retry = 7;       // infinite
  o.min_rnr_timer = 14;  // 1.28 ms: longer than the 1 ms transport timeout
  o.timeout = 8;
  const QpPair q = p.connect(o);
  const std::uint64_t rnr = rnr_timer_ns(o.min_rnr_timer);
  ASSERT_GT(rnr, timeout_ns(o.timeout));
  fill(0, 0, 500, 9);
  Sge s = p.sge(0, 0, 500);
  ASSERT_EQ(p.A().post_send(q.a, send_wr(11, &s)), 0);
  ASSERT_TRUE(p.wire.run_until([&] { return q.b->ctr[QpCounter::send_rnr_err] >= 3; }, 20 * rnr));
  p.poll(0, wa);
  EXPECT_TRUE(wa.empty());
  ASSERT_EQ(post_recv(q.b, 5, 100000, 4096), 0);
  ASSERT_TRUE(wait(1, wb, 1, 10 * rnr));
  ASSERT_TRUE(wait(0, wa, 1, 10 * rnr));
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].wr_id, 5u);
  EXPECT_EQ(wb[0].byte_len, 500u);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[100000], 500));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa[0].wr_id, 11u);
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  EXPECT_EQ(q.b->state, IBV_QPS_RTS);
  const std::uint64_t naks = q.a->ctr[QpCounter::rcvd_rnr_err];
  EXPECT_GE(naks, 3u);
  EXPECT_EQ(naks, q.b->ctr[QpCounter::send_rnr_err]);
  EXPECT_EQ(q.a->ctr[QpCounter::retry_rnr_exceeded_err], 0u);
  // While waiting out an RNR NAK the transport timer is off.
  EXPECT_EQ(q.a->ctr[QpCounter::timeouts], 0u);
  // Every resend waited at least the RNR delay the NAK asked for.
  const auto sends = frames(0, op::kRcSendOnly, q.b->qpn);
  ASSERT_EQ(sends.size(), naks + 1);
  for (std::size_t i = 1; i < sends.size(); ++i) {
    EXPECT_GE(sends[i]->t - sends[i - 1]->t, rnr) << "resend " << i;
    EXPECT_EQ(sends[i]->psn, sends[0]->psn);
  }
  EXPECT_GE(sends.back()->t - sends.front()->t, naks * rnr);
  for (const Seen* f : frames(1, op::kRcAck, q.a->qpn)) {
    if (f->syndrome != 0x1f) {
      EXPECT_EQ(f->syndrome, 0x20 | o.min_rnr_timer);
    }
  }
}

// A multi-packet SEND that meets an empty receive queue gets an RNR NAK for
// its FIRST packet and, because the MIDDLE and LAST then arrive ahead of the
// expected PSN, a PSN-sequence NAK naming the same PSN. Nothing was lost: the
// RNR NAK already says "restart there after the delay", so the sequence NAK
// must not count as a transport retry (docs: "one loss costs one retry"; here
// there is no loss), and the transport timer must stay off while the RNR delay
// runs (the RNR handler turns it off). The single-packet case passes.
//
// DISABLED: engine bug. completer.cc, on_response(), kNak/kPsnSeqError calls
// retry_or_fail() even while req.rnr_until is set for that same PSN: it takes
// one from retry_left (so retry_cnt = 0 fails at once with RETRY_EXC_ERR), and
// its arm_retry() re-arms the timer during the RNR wait (so with an RNR delay
// longer than the timeout, a timeout fires inside the wait and takes another).
TEST_F(Errors, RnrOnMultiPacketSendCostsNoTransportRetry) {
  PairOptions o;
  o.retry_cnt = 0;  // no loss here, so no transport retry may be needed
  o.rnr_retry = 7;
  o.min_rnr_timer = 1;
  const QpPair q = p.connect(o);
  fill(0, 0, 3000, 5);
  Sge s = p.sge(0, 0, 3000);  // 3 packets at MTU 1024
  ASSERT_EQ(p.A().post_send(q.a, send_wr(1, &s)), 0);
  p.wire.run_until([&] { return q.b->ctr[QpCounter::send_rnr_err] >= 3 || q.a->state == IBV_QPS_ERR; }, 20'000'000);
  ASSERT_EQ(post_recv(q.b, 2, 100000, 4096), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(q.a->ctr[QpCounter::retry_exceeded_err], 0u);
  ASSERT_TRUE(wait(1, wb, 1));
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[100000], 3000));
}

TEST_F(Errors, TransportTimerIsOffDuringRnrWaitForMultiPacketSend) {
  PairOptions o;
  o.retry_cnt = 1;
  o.rnr_retry = 7;
  o.timeout = 8;         // ~1.05 ms
  o.min_rnr_timer = 14;  // 1.28 ms, longer than the timeout
  const QpPair q = p.connect(o);
  fill(0, 0, 3000, 5);
  Sge s = p.sge(0, 0, 3000);
  ASSERT_EQ(p.A().post_send(q.a, send_wr(1, &s)), 0);
  p.wire.run_until([&] { return q.b->ctr[QpCounter::send_rnr_err] >= 3 || q.a->state == IBV_QPS_ERR; }, 50'000'000);
  EXPECT_EQ(q.a->ctr[QpCounter::timeouts], 0u) << "the transport timer ran during an RNR wait";
  ASSERT_EQ(post_recv(q.b, 2, 100000, 4096), 0);
  ASSERT_TRUE(wait(0, wa, 1, 50'000'000));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(q.a->ctr[QpCounter::retry_exceeded_err], 0u);
}

TEST_F(Errors, RnrRecoversForMultiPacketSend) {
  // The same as above with the default retry budget: it does recover.
  PairOptions o;
  o.rnr_retry = 7;
  o.min_rnr_timer = 3;  // 30 us
  const QpPair q = p.connect(o);
  fill(0, 0, 3000, 5);
  Sge s = p.sge(0, 0, 3000);
  ASSERT_EQ(p.A().post_send(q.a, send_wr(1, &s)), 0);
  ASSERT_TRUE(p.wire.run_until([&] { return q.b->ctr[QpCounter::send_rnr_err] >= 3; }, 20'000'000));
  ASSERT_EQ(post_recv(q.b, 2, 100000, 4096), 0);
  ASSERT_TRUE(wait(1, wb, 1));
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].byte_len, 3000u);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[100000], 3000));
  EXPECT_EQ(q.a->ctr[QpCounter::retry_rnr_exceeded_err], 0u);
}

// ----------------------------------------------------- 3. rkey violations

TEST_F(Errors, WriteWithWrongRkey) {
  const QpPair q = p.connect();
  ASSERT_EQ(post_recv(q.b, 77, 200000, 1024), 0);
  fill(0, 0, 256, 1);
  fill(1, 4096, 256, 200);
  const std::vector<std::uint8_t> before(p.node[1].mem.begin() + 4096, p.node[1].mem.begin() + 4096 + 256);
  Sge s = p.sge(0, 0, 256);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(3, IBV_WR_RDMA_WRITE, &s, p.addr(1, 4096), p.rkey(1) ^ 0xff)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].wr_id, 3u);
  EXPECT_EQ(wa[0].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[0].status);
  EXPECT_EQ(wa[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);  // class C: the responder's QP fails too
  EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u);
  EXPECT_EQ(q.b->ctr[QpCounter::sent_naks], 1u);
  EXPECT_EQ(q.a->ctr[QpCounter::rcvd_naks], 1u);
  const auto naks = frames(1, op::kRcAck, q.a->qpn);
  ASSERT_EQ(naks.size(), 1u);
  EXPECT_EQ(naks[0]->syndrome, 0x62);
  // B's memory is untouched and its posted receive is flushed.
  EXPECT_TRUE(std::equal(before.begin(), before.end(), p.node[1].mem.begin() + 4096));
  ASSERT_TRUE(wait(1, wb, 1, 1'000'000));
  EXPECT_EQ(wb[0].wr_id, 77u);
  EXPECT_EQ(wb[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(Errors, ReadWithWrongRkey) {
  const QpPair q = p.connect();
  fill(1, 8192, 512, 3);
  Sge s = p.sge(0, 0, 512);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(4, IBV_WR_RDMA_READ, &s, p.addr(1, 8192), p.rkey(1) ^ 0xff)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].wr_id, 4u);
  EXPECT_EQ(wa[0].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[0].status);
  EXPECT_EQ(wa[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u);
  EXPECT_TRUE(frames(1, op::kRcReadRespOnly, q.a->qpn).empty());
  for (int i = 0; i < 512; ++i) ASSERT_EQ(p.node[0].mem[static_cast<std::size_t>(i)], 0) << i;
}

TEST_F(Errors, DeregisteredMrKeyIsRefused) {
  const QpPair q = p.connect();
  Mr* mr2 = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 65536, 4096,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr2, nullptr);
  const std::uint32_t old_rkey = mr2->rkey;
  fill(0, 0, 128, 5);
  Sge s = p.sge(0, 0, 128);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &s, p.addr(1, 65536), old_rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  ASSERT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[65536], 128));
  ASSERT_EQ(p.B().dereg_mr(mr2), 0);
  fill(0, 0, 128, 99);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_WRITE, &s, p.addr(1, 65536), old_rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].wr_id, 2u);
  EXPECT_EQ(wa[1].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[1].status);
  EXPECT_NE(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[65536], 128));
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u);
}

TEST_F(Errors, RkeyOfAnotherPdIsRefused) {
  const QpPair q = p.connect();
  Pd* pd2 = p.B().alloc_pd();
  ASSERT_NE(pd2, nullptr);
  Mr* other = p.B().reg_mr(pd2, p.node[1].mem.data() + 65536, 4096,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(other, nullptr);
  Sge s = p.sge(0, 0, 64);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &s, p.addr(1, 65536), other->rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[0].status);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u);
  EXPECT_EQ(p.B().dealloc_pd(pd2), EBUSY);
  EXPECT_EQ(p.B().dereg_mr(other), 0);
  EXPECT_EQ(p.B().dereg_mr(other), EINVAL);
  EXPECT_EQ(p.B().dealloc_pd(pd2), 0);
}

TEST_F(Errors, ZeroLengthRdmaDoesNotCheckRkey) {
  // IBTA C9-88: a zero-length RDMA WRITE or READ need not carry a valid
  // rkey or address, and the responder does not check them (rxe does the same).
  const QpPair q = p.connect();
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, nullptr, 0, 0)), 0);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_READ, nullptr, 0, 0)), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS) << to_string(wa[1].status);
  EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 0u);
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  EXPECT_EQ(q.b->state, IBV_QPS_RTS);
}

TEST_F(Errors, AccessErrorAfterAGoodWriteFailsOnlyTheBadOne) {
  // Two WRITEs back to back, the second with a bad rkey: the NAK for the
  // second acknowledges the first, which completes successfully.
  const QpPair q = p.connect();
  fill(0, 0, 64, 3);
  Sge s = p.sge(0, 0, 64);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &s, p.addr(1, 30000), p.rkey(1))), 0);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_WRITE, &s, p.addr(1, 40000), p.rkey(1) ^ 0xff)), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[0].wr_id, 1u);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(wa[1].wr_id, 2u);
  EXPECT_EQ(wa[1].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[1].status);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[30000], 64));
}

// A READ (or an atomic) and then, right behind it, a WRITE with a bad rkey.
// The responder executes the READ/atomic, queues its response, then refuses
// the WRITE. The responses owed for the earlier PSNs must still go out ahead
// of the NAK (IBTA: responses in PSN order), so the READ/atomic completes
// successfully and only the WRITE fails with REM_ACCESS_ERR. (Regression: an
// earlier responder_error() sent the NAK straight to the TX ring and then
// flushed the owed responses, so the executed atomic was reported as failed.)
TEST_F(Errors, FatalNakDoesNotOvertakeOwedReadOrAtomicResponses) {
  for (const bool atomic : {false, true}) {
    SCOPED_TRACE(atomic ? "atomic" : "read");
    wa.clear();
    const QpPair q = p.connect();
    fill(1, 0, 8192, 11);
    put64(1, 9000, 500);
    Sge rd = p.sge(0, 0, atomic ? 8 : 8192);
    SendWr r = atomic ? rdma_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &rd, p.addr(1, 9000), p.rkey(1))
                      : rdma_wr(1, IBV_WR_RDMA_READ, &rd, p.addr(1, 0), p.rkey(1));
    r.compare_add = 1;
    Sge ws = p.sge(0, 20000, 64);
    ASSERT_EQ(p.A().post_send(q.a, r), 0);
    ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_WRITE, &ws, p.addr(1, 30000), p.rkey(1) ^ 0xff)), 0);
    ASSERT_TRUE(wait(0, wa, 2));
    EXPECT_EQ(wa[0].wr_id, 1u);
    EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
    EXPECT_EQ(wa[1].wr_id, 2u);
    EXPECT_EQ(wa[1].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[1].status);
    if (atomic) {
      EXPECT_EQ(get64(1, 9000), 501u);  // it was executed once
      EXPECT_EQ(get64(0, 0), 500u);     // and its result returned
    } else {
      EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[0], 8192));
    }
    EXPECT_EQ(q.b->state, IBV_QPS_ERR);
    EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  }
}

// ---------------------------------------------------------- 4. out of bounds

TEST_F(Errors, WritePastEndOfMr) {
  const QpPair q = p.connect();
  const std::size_t end = p.node[1].mem.size();
  fill(0, 0, 200, 7);
  // Exactly up to the last byte is fine.
  Sge s100 = p.sge(0, 0, 100);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &s100, p.addr(1, end - 100), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  ASSERT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[end - 100], 100));
  // One byte more is not.
  fill(0, 0, 200, 77);
  Sge s101 = p.sge(0, 0, 101);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_WRITE, &s101, p.addr(1, end - 100), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].wr_id, 2u);
  EXPECT_EQ(wa[1].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[1].status);
  EXPECT_NE(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[end - 100], 100));
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u);
}

TEST_F(Errors, ReadAndWriteBeforeStartOfMr) {
  // An MR over the middle of B's memory; an access starting 8 bytes before it.
  Mr* mid = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 65536, 4096,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mid, nullptr);
  const QpPair q1 = p.connect();
  Sge s = p.sge(0, 0, 64);
  ASSERT_EQ(p.A().post_send(q1.a, rdma_wr(1, IBV_WR_RDMA_READ, &s, p.addr(1, 65536 - 8), mid->rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[0].status);
  const QpPair q2 = p.connect();
  ASSERT_EQ(p.A().post_send(q2.a, rdma_wr(2, IBV_WR_RDMA_WRITE, &s, p.addr(1, 65536 - 8), mid->rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[1].status);
  EXPECT_EQ(q1.b->ctr[QpCounter::remote_access_err] + q2.b->ctr[QpCounter::remote_access_err], 2u);
}

// --------------------------------------------------------- 5. read-only MR

TEST_F(Errors, WriteToReadOnlyMrIsRefusedReadSucceeds) {
  // IBTA 10.6.3.1: remote write or atomic needs local write; remote read alone is fine.
  EXPECT_EQ(p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 16384, 4096, IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 16384, 4096, IBV_ACCESS_REMOTE_ATOMIC), nullptr);
  Mr* ro = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 16384, 4096, IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(ro, nullptr);
  const QpPair q = p.connect();
  fill(1, 16384, 4096, 21);
  Sge rd = p.sge(0, 0, 3000);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_READ, &rd, p.addr(1, 16384 + 50), ro->rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  ASSERT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(wa[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[16384 + 50], 3000));
  fill(0, 10000, 64, 0xee);
  const std::vector<std::uint8_t> before(p.node[1].mem.begin() + 16384, p.node[1].mem.begin() + 16384 + 64);
  Sge wr = p.sge(0, 10000, 64);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_WRITE, &wr, p.addr(1, 16384), ro->rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].wr_id, 2u);
  EXPECT_EQ(wa[1].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[1].status);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), p.node[1].mem.begin() + 16384));
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u);
}

TEST_F(Errors, AtomicToReadOnlyMrIsRefused) {
  Mr* ro = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 16384, 4096,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(ro, nullptr);
  for (const ibv_wr_opcode opc : {IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_WRITE}) {
    SCOPED_TRACE(opc);
    wa.clear();
    const QpPair q = p.connect();
    put64(1, 16384, 41);
    Sge s = p.sge(0, 0, 8);
    SendWr w = rdma_wr(1, opc, &s, p.addr(1, 16384), ro->rkey);
    w.compare_add = 1;
    ASSERT_EQ(p.A().post_send(q.a, w), 0);
    ASSERT_TRUE(wait(0, wa, 1));
    EXPECT_EQ(wa[0].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[0].status);
    EXPECT_EQ(wa[0].opcode, opc == IBV_WR_ATOMIC_WRITE ? IBV_WC_ATOMIC_WRITE : IBV_WC_FETCH_ADD);
    EXPECT_EQ(get64(1, 16384), 41u);
    EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u);
    EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  }
}

// ---------------------------------------------------- 6. misaligned atomic

TEST_F(Errors, MisalignedAtomicIsInvalidRequest) {
  for (const ibv_wr_opcode opc : {IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_CMP_AND_SWP}) {
    SCOPED_TRACE(opc);
    wa.clear();
    const QpPair q = p.connect();
    put64(1, 64, 0x1111);
    put64(1, 72, 0x2222);
    put64(0, 0, 0xabcd);
    Sge s = p.sge(0, 0, 8);
    SendWr w = rdma_wr(9, opc, &s, p.addr(1, 68), p.rkey(1));
    w.compare_add = 0;
    w.swap = 5;
    ASSERT_EQ(p.A().post_send(q.a, w), 0);
    ASSERT_TRUE(wait(0, wa, 1));
    EXPECT_EQ(wa[0].wr_id, 9u);
    EXPECT_EQ(wa[0].status, IBV_WC_REM_INV_REQ_ERR) << to_string(wa[0].status);
    EXPECT_EQ(wa[0].opcode, opc == IBV_WR_ATOMIC_FETCH_AND_ADD ? IBV_WC_FETCH_ADD : IBV_WC_COMP_SWAP);
    EXPECT_EQ(get64(1, 64), 0x1111u);
    EXPECT_EQ(get64(1, 72), 0x2222u);
    EXPECT_EQ(get64(0, 0), 0xabcdu);  // nothing written back
    EXPECT_EQ(q.a->state, IBV_QPS_ERR);
    EXPECT_EQ(q.b->state, IBV_QPS_ERR);
    const auto naks = frames(1, op::kRcAck, q.a->qpn);
    ASSERT_EQ(naks.size(), 1u);
    EXPECT_EQ(naks[0]->syndrome, 0x61);
    EXPECT_TRUE(frames(1, op::kRcAtomicAck, q.a->qpn).empty());
  }
}

// ------------------------------------------------ 7. invalid opcode sequence

TEST_F(Errors, OpcodeOutOfSequenceIsNakedAsInvalidRequest) {
  // A MIDDLE or LAST packet with no FIRST before it, at the expected PSN.
  struct Case {
    std::uint8_t opcode;
    std::size_t payload;
  };
  for (const Case c : {Case{op::kRcSendMiddle, 1024}, Case{op::kRcSendLast, 100}, Case{op::kRcWriteMiddle, 1024},
                       Case{op::kRcWriteLast, 100}}) {
    SCOPED_TRACE(static_cast<int>(c.opcode));
    wb.clear();
    const QpPair q = p.connect();
    ASSERT_EQ(post_recv(q.b, 77, 200000, 4096), 0);
    const wire::Psn epsn = q.b->resp.epsn;
    const auto f = frame(0, c.opcode, q.b->qpn, epsn, {}, c.payload);
    ASSERT_FALSE(f.empty());
    p.wire.inject(wire::ConstBytes(f.data(), f.size()));
    ASSERT_TRUE(p.wire.run_until([&] { return q.b->state == IBV_QPS_ERR; }, 1'000'000));
    settle(200'000);
    EXPECT_EQ(q.b->ctr[QpCounter::bad_opcode_seq], 1u);
    EXPECT_EQ(q.b->ctr[QpCounter::sent_naks], 1u);
    const auto naks = frames(1, op::kRcAck, q.a->qpn);
    ASSERT_EQ(naks.size(), 1u);
    EXPECT_EQ(naks[0]->syndrome, 0x61);
    EXPECT_EQ(naks[0]->psn, epsn.value());
    // Nothing was written, and B's receive is flushed.
    for (std::size_t i = 200000; i < 200000 + 64; ++i) ASSERT_EQ(p.node[1].mem[i], 0);
    ASSERT_EQ(wb.size(), 1u);
    EXPECT_EQ(wb[0].wr_id, 77u);
    EXPECT_EQ(wb[0].status, IBV_WC_WR_FLUSH_ERR);
    // A never sent that PSN: the NAK is a ghost to it.
    EXPECT_EQ(q.a->ctr[QpCounter::ghost_acks], 1u);
    EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  }
  EXPECT_TRUE(wa.empty());
}

TEST_F(Errors, FirstPacketInsideAMessageIsInvalidRequest) {
  // SEND_FIRST, then a packet that starts a message before the LAST: a
  // second FIRST, or a SEND or WRITE ONLY (which the responder otherwise
  // takes on its shortest path), is out of opcode sequence. The receive WQE
  // being filled completes in error, and nothing of the second is written.
  for (const std::uint8_t second : {op::kRcSendFirst, op::kRcSendOnly, op::kRcWriteOnly}) {
    SCOPED_TRACE(static_cast<int>(second));
    wb.clear();
    const QpPair q = p.connect();
    ASSERT_EQ(post_recv(q.b, 77, 200000, 4096), 0);
    const wire::Psn epsn = q.b->resp.epsn;
    wire::ExtFields ext;
    if (second == op::kRcWriteOnly) {
      ext.reth_va = p.addr(1, 300000);
      ext.reth_rkey = p.rkey(1);
      ext.reth_len = 100;
    }
    const auto f1 = frame(0, op::kRcSendFirst, q.b->qpn, epsn, {}, 1024);
    const auto f2 = frame(0, second, q.b->qpn, epsn + 1, ext, second == op::kRcSendFirst ? 1024 : 100);
    ASSERT_FALSE(f2.empty());
    p.wire.inject(wire::ConstBytes(f1.data(), f1.size()));
    p.wire.inject(wire::ConstBytes(f2.data(), f2.size()));
    ASSERT_TRUE(p.wire.run_until([&] { return q.b->state == IBV_QPS_ERR; }, 1'000'000));
    settle(200'000);
    EXPECT_EQ(q.b->ctr[QpCounter::bad_opcode_seq], 1u);
    const auto naks = frames(1, op::kRcAck, q.a->qpn);
    ASSERT_EQ(naks.size(), 1u);
    EXPECT_EQ(naks[0]->syndrome, 0x61);
    EXPECT_EQ(naks[0]->psn, (epsn + 1).value());
    ASSERT_EQ(wb.size(), 1u);
    EXPECT_EQ(wb[0].wr_id, 77u);
    EXPECT_NE(wb[0].status, IBV_WC_SUCCESS);
    EXPECT_NE(wb[0].status, IBV_WC_WR_FLUSH_ERR) << "the WQE in progress should report the error itself";
    for (std::size_t i = 300000; i < 300000 + 100; ++i) ASSERT_EQ(p.node[1].mem[i], 0) << "the WRITE ONLY wrote";
  }
}

// ---------------------------------------------------------- 8. ghost ACK

TEST_F(Errors, GhostAckIsDroppedAndCounted) {
  PairOptions o;
  const QpPair q = p.connect(o);
  ASSERT_EQ(post_recv(q.b, 5, 100000, 4096), 0);
  fill(0, 0, 200, 4);
  Sge s = p.sge(0, 0, 200);
  ASSERT_EQ(p.A().post_send(q.a, send_wr(1, &s)), 0);
  // Far beyond anything A sent, and just one past the only PSN it sends.
  const auto far = ack_to_a(q, wire::Psn(o.psn_a) + 1000, 0x1f);
  const auto next = ack_to_a(q, wire::Psn(o.psn_a) + 1, 0x1f);
  p.wire.inject(wire::ConstBytes(far.data(), far.size()));
  p.wire.inject(wire::ConstBytes(next.data(), next.size()));
  ASSERT_TRUE(p.wire.run_until([&] { return q.a->ctr[QpCounter::ghost_acks] == 2; }, 1'000'000));
  p.poll(0, wa);
  EXPECT_TRUE(wa.empty()) << "a ghost ACK completed work";
  EXPECT_EQ(q.a->req.una, wire::Psn(o.psn_a));
  ASSERT_TRUE(wait(0, wa, 1));
  ASSERT_TRUE(wait(1, wb, 1));
  EXPECT_EQ(wa[0].wr_id, 1u);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[100000], 200));
  settle(3'000'000);
  EXPECT_EQ(wa.size(), 1u);
  EXPECT_EQ(q.a->ctr[QpCounter::ghost_acks], 2u);
  EXPECT_EQ(q.a->ctr[QpCounter::timeouts], 0u);
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
}

// ------------------------------------------------- 9. NAK for an unsent PSN

TEST_F(Errors, NakForUnsentPsnIsIgnored) {
  PairOptions o;
  const QpPair q = p.connect(o);
  fill(0, 0, 300, 8);
  Sge s = p.sge(0, 0, 300);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &s, p.addr(1, 300000), p.rkey(1))), 0);
  // Sequence error, remote access error, invalid request and RNR NAKs, all
  // for PSNs A has not sent: none may fail or stall the WRITE in flight.
  const std::uint8_t syn[] = {0x60, 0x62, 0x61, 0x21};
  for (std::size_t i = 0; i < 4; ++i) {
    const auto f = ack_to_a(q, wire::Psn(o.psn_a) + 500 + static_cast<std::uint32_t>(i), syn[i]);
    p.wire.inject(wire::ConstBytes(f.data(), f.size()));
  }
  ASSERT_TRUE(p.wire.run_until([&] { return q.a->ctr[QpCounter::ghost_acks] == 4; }, 1'000'000));
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  EXPECT_EQ(q.a->req.rnr_until, 0u);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[300000], 300));
  settle(3'000'000);
  EXPECT_EQ(wa.size(), 1u);
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  EXPECT_EQ(q.a->ctr[QpCounter::rcvd_naks], 0u);
  EXPECT_EQ(q.a->ctr[QpCounter::rcvd_seq_err], 0u);
  EXPECT_EQ(q.a->ctr[QpCounter::rcvd_rnr_err], 0u);
  EXPECT_EQ(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
  // The QP still works.
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_WRITE, &s, p.addr(1, 310000), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS);
}

TEST_F(Errors, NakCodesMapToCompletionStatus) {
  // A NAK for the second of three WRITEs in flight: it acknowledges the first
  // (a NAK implicitly ACKs the PSNs before it) and fails the second with the
  // status of its code; the third is flushed.
  struct Case {
    std::uint8_t syndrome;
    ibv_wc_status status;
  };
  const Case cases[] = {{0x61, IBV_WC_REM_INV_REQ_ERR},
                        {0x62, IBV_WC_REM_ACCESS_ERR},
                        {0x63, IBV_WC_REM_OP_ERR},
                        {0x64, IBV_WC_REM_INV_RD_REQ_ERR}};
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.syndrome));
    wa.clear();
    PairOptions o;
    const QpPair q = p.connect(o);
    // B executes the WRITEs but its ACKs never arrive; the NAK is ours.
    sim::Impairments imp;
    imp.loss = 1.0;
    const std::uint32_t bqpn = q.b->qpn;
    imp.filter = [bqpn](const TxFrame& f) { return f.qpn == bqpn; };
    p.wire.set_impairments(imp);
    Sge s = p.sge(0, 0, 64);
    ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &s, p.addr(1, 0), p.rkey(1))), 0);
    ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_WRITE, &s, p.addr(1, 64), p.rkey(1))), 0);
    ASSERT_EQ(p.A().post_send(q.a, rdma_wr(3, IBV_WR_RDMA_WRITE, &s, p.addr(1, 128), p.rkey(1), 0)), 0);
    const auto nak = ack_to_a(q, wire::Psn(o.psn_a) + 1, c.syndrome);
    p.wire.inject(wire::ConstBytes(nak.data(), nak.size()));
    ASSERT_TRUE(wait(0, wa, 3, 500'000));  // well before any timeout
    EXPECT_EQ(wa[0].wr_id, 1u);
    EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
    EXPECT_EQ(wa[1].wr_id, 2u);
    EXPECT_EQ(wa[1].status, c.status) << to_string(wa[1].status);
    EXPECT_EQ(wa[2].wr_id, 3u);
    EXPECT_EQ(wa[2].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(q.a->state, IBV_QPS_ERR);
    EXPECT_EQ(q.a->ctr[QpCounter::rcvd_naks], 1u);
    EXPECT_EQ(q.a->ctr[QpCounter::timeouts], 0u);
  }
}

// --------------------------------------------- 10. posting in the wrong state

TEST_F(Errors, PostInWrongState) {
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = p.node[0].cq;
  Qp* qp = p.A().create_qp(p.node[0].pd, ia);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(qp->state, IBV_QPS_RESET);
  Sge s = p.sge(0, 0, 16);
  const SendWr w = send_wr(1, &s);
  const RecvWr r{2, {&s, 1}};
  EXPECT_EQ(p.A().post_send(qp, w), EINVAL);
  EXPECT_EQ(p.A().post_recv(qp, r), EINVAL);

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_TRUE(p.A().modify_qp(qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  EXPECT_EQ(p.A().post_send(qp, w), EINVAL);
  EXPECT_EQ(p.A().post_recv(qp, r), 0);  // receives may be posted from INIT on

  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = 0x99;
  a.rq_psn = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, p.B().config().ip.b.data(), 16);
  ASSERT_TRUE(p.A().modify_qp(qp, a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
  EXPECT_EQ(p.A().post_send(qp, w), EINVAL);
  EXPECT_EQ(p.A().post_recv(qp, r), 0);
  EXPECT_EQ(qp->sq.size(), 0u);
  EXPECT_EQ(qp->rq.depth(), 2u);
  p.poll(0, wa);
  EXPECT_TRUE(wa.empty());

  // ERR: posts are accepted and flushed, signaled or not.
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_TRUE(p.A().modify_qp(qp, a, IBV_QP_STATE));
  p.poll(0, wa);
  ASSERT_EQ(wa.size(), 2u);  // the two receives
  for (const ibv_wc& wc : wa) {
    EXPECT_EQ(wc.wr_id, 2u);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  }
  wa.clear();
  EXPECT_EQ(p.A().post_send(qp, w), 0);
  EXPECT_EQ(p.A().post_send(qp, send_wr(3, &s, 0)), 0);
  EXPECT_EQ(p.A().post_recv(qp, RecvWr{4, {&s, 1}}), 0);
  p.poll(0, wa);
  ASSERT_EQ(wa.size(), 3u);
  EXPECT_EQ(wa[0].wr_id, 1u);
  EXPECT_EQ(wa[1].wr_id, 3u);
  EXPECT_EQ(wa[2].wr_id, 4u);
  for (const ibv_wc& wc : wa) EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wa[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wa[2].opcode, IBV_WC_RECV);
  settle(1'000'000);
  EXPECT_EQ(frames_from(0, 0x99), 0u);  // nothing went on the wire
  EXPECT_EQ(wa.size(), 3u);
}

TEST_F(Errors, PostSendOnConnectedQpMovedToErrIsFlushed) {
  const QpPair q = p.connect();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_TRUE(p.A().modify_qp(q.a, a, IBV_QP_STATE));
  Sge s = p.sge(0, 0, 16);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(8, IBV_WR_RDMA_WRITE, &s, p.addr(1, 0), p.rkey(1), 0)), 0);
  p.poll(0, wa);
  ASSERT_EQ(wa.size(), 1u);
  EXPECT_EQ(wa[0].wr_id, 8u);
  EXPECT_EQ(wa[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wa[0].opcode, IBV_WC_RDMA_WRITE);
  settle(1'000'000);
  EXPECT_EQ(frames_from(0, q.b->qpn), 0u);
  EXPECT_EQ(wa.size(), 1u);
}

TEST_F(Errors, BadWorkRequestsAreRefusedAtPost) {
  PairOptions o;
  o.cap.max_send_wr = 2;
  o.cap.max_send_sge = 2;
  o.cap.max_inline_data = 64;
  const QpPair q = p.connect(o);
  Sge s3[3] = {p.sge(0, 0, 8), p.sge(0, 8, 8), p.sge(0, 16, 8)};
  SendWr w = send_wr(1, nullptr);
  w.sg_list = {s3, 3};  // more SGEs than max_send_sge
  EXPECT_EQ(p.A().post_send(q.a, w), EINVAL);
  Sge big = p.sge(0, 0, 65);
  w = send_wr(2, &big, IBV_SEND_SIGNALED | IBV_SEND_INLINE);  // over max_inline_data
  EXPECT_EQ(p.A().post_send(q.a, w), EINVAL);
  Sge eight = p.sge(0, 0, 8);
  w = rdma_wr(3, IBV_WR_RDMA_READ, &eight, p.addr(1, 0), p.rkey(1), IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  EXPECT_EQ(p.A().post_send(q.a, w), EINVAL);  // a READ cannot be inline
  Sge four = p.sge(0, 0, 4);
  w = rdma_wr(4, IBV_WR_ATOMIC_FETCH_AND_ADD, &four, p.addr(1, 0), p.rkey(1));
  EXPECT_EQ(p.A().post_send(q.a, w), EINVAL);  // an atomic needs one 8-byte SGE
  // Opcodes the engine does not offer (a real enum value each: an
  // out-of-range enum would be undefined behaviour before we ever saw it).
  // (LOCAL_INV and BIND_MW are offered, and their SGEs ignored, as verbs
  // reads none: test_send_entry.cc.)
  for (ibv_wr_opcode bad_op : {IBV_WR_DRIVER1, IBV_WR_TSO}) {  // ATOMIC_WRITE: its own tests
    w = send_wr(5, &eight, IBV_SEND_SIGNALED, bad_op);
    EXPECT_EQ(p.A().post_send(q.a, w), EINVAL);
  }
  EXPECT_EQ(q.a->sq.size(), 0u);
  // Full: ENOMEM, and the QP is fine.
  EXPECT_EQ(p.A().post_send(q.a, rdma_wr(6, IBV_WR_RDMA_WRITE, &eight, p.addr(1, 0), p.rkey(1))), 0);
  EXPECT_EQ(p.A().post_send(q.a, rdma_wr(7, IBV_WR_RDMA_WRITE, &eight, p.addr(1, 8), p.rkey(1))), 0);
  EXPECT_EQ(p.A().post_send(q.a, rdma_wr(8, IBV_WR_RDMA_WRITE, &eight, p.addr(1, 16), p.rkey(1))), ENOMEM);
  ASSERT_TRUE(wait(0, wa, 2));
  settle(1'000'000);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[0].wr_id, 6u);
  EXPECT_EQ(wa[1].wr_id, 7u);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  // Receive side: too many SGEs.
  Sge r5[5] = {p.sge(1, 0, 8), p.sge(1, 8, 8), p.sge(1, 16, 8), p.sge(1, 24, 8), p.sge(1, 32, 8)};
  EXPECT_EQ(p.B().post_recv(q.b, RecvWr{9, {r5, 5}}), EINVAL);
}

TEST_F(Errors, ReceiveIntoBadMemoryIsResponderProtectionError) {
  // The responder cannot place a SEND: its receive WQE is completed with
  // LOC_PROT_ERR, the requester sees a remote operational error, both fail.
  Mr* ro = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 65536, 4096, IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(ro, nullptr);
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "bad lkey" : "no LOCAL_WRITE");
    wa.clear();
    wb.clear();
    const QpPair q = p.connect();
    Sge rs = variant == 0 ? p.sge(1, 100000, 4096) : Sge{p.addr(1, 65536), 4096, ro->lkey};
    if (variant == 0) rs.lkey ^= 0xff;
    ASSERT_EQ(p.B().post_recv(q.b, RecvWr{5, {&rs, 1}}), 0);
    Sge s = p.sge(0, 0, 100);
    ASSERT_EQ(p.A().post_send(q.a, send_wr(6, &s)), 0);
    ASSERT_TRUE(wait(1, wb, 1));
    ASSERT_TRUE(wait(0, wa, 1));
    EXPECT_EQ(wb[0].wr_id, 5u);
    EXPECT_EQ(wb[0].status, IBV_WC_LOC_PROT_ERR) << to_string(wb[0].status);
    EXPECT_EQ(wa[0].wr_id, 6u);
    EXPECT_EQ(wa[0].status, IBV_WC_REM_OP_ERR) << to_string(wa[0].status);
    EXPECT_EQ(q.a->state, IBV_QPS_ERR);
    EXPECT_EQ(q.b->state, IBV_QPS_ERR);
    const auto naks = frames(1, op::kRcAck, q.a->qpn);
    ASSERT_EQ(naks.size(), 1u);
    EXPECT_EQ(naks[0]->syndrome, 0x63);
  }
  for (int i = 0; i < 100; ++i) ASSERT_EQ(p.node[1].mem[65536 + static_cast<std::size_t>(i)], 0);
}

// ---------------------------------------------------- 11. local protection

TEST_F(Errors, BadLkeyIsLocalProtectionError) {
  const QpPair q = p.connect();
  ASSERT_EQ(post_recv(q.b, 1, 100000, 4096), 0);
  // A good WRITE, then a SEND with a bad lkey, then another WRITE: the first
  // completes, the second fails when it reaches the head, the third is flushed.
  Sge good = p.sge(0, 0, 64);
  Sge bad = good;
  bad.lkey ^= 0xff;
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &good, p.addr(1, 0), p.rkey(1))), 0);
  ASSERT_EQ(p.A().post_send(q.a, send_wr(2, &bad, 0)), 0);  // unsignaled, still reported
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(3, IBV_WR_RDMA_WRITE, &good, p.addr(1, 0), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 3));
  EXPECT_EQ(wa[0].wr_id, 1u);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa[1].wr_id, 2u);
  EXPECT_EQ(wa[1].status, IBV_WC_LOC_PROT_ERR) << to_string(wa[1].status);
  EXPECT_EQ(wa[1].opcode, IBV_WC_SEND);
  EXPECT_EQ(wa[2].wr_id, 3u);
  EXPECT_EQ(wa[2].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(frames(0, op::kRcSendOnly, q.b->qpn).size(), 0u);
  EXPECT_EQ(frames(0, op::kRcWriteOnly, q.b->qpn).size(), 1u);
  settle(1'000'000);
  EXPECT_EQ(q.b->state, IBV_QPS_RTS);  // a local error is not the responder's business
  EXPECT_TRUE(wb.empty());
}

TEST_F(Errors, SgeOutsideLocalMrIsLocalProtectionError) {
  const QpPair q = p.connect();
  Sge s = p.sge(0, p.node[0].mem.size() - 10, 20);  // runs 10 bytes past the MR
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &s, p.addr(1, 0), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_LOC_PROT_ERR) << to_string(wa[0].status);
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(frames_from(0, q.b->qpn), 0u);
}

TEST_F(Errors, ReadIntoMrWithoutLocalWriteIsLocalProtectionError) {
  const QpPair q = p.connect();
  Mr* ro = p.A().reg_mr(p.node[0].pd, p.node[0].mem.data() + 65536, 4096, IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(ro, nullptr);
  // Sending from it is fine: local read needs no permission.
  ASSERT_EQ(post_recv(q.b, 1, 100000, 4096), 0);
  fill(0, 65536, 100, 17);
  Sge s{p.addr(0, 65536), 100, ro->lkey};
  ASSERT_EQ(p.A().post_send(q.a, send_wr(1, &s)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  ASSERT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[65536], &p.node[1].mem[100000], 100));
  // A READ landing in it is not.
  const std::vector<std::uint8_t> before(p.node[0].mem.begin() + 65536, p.node[0].mem.begin() + 65536 + 100);
  fill(1, 0, 100, 33);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_RDMA_READ, &s, p.addr(1, 0), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].wr_id, 2u);
  EXPECT_EQ(wa[1].status, IBV_WC_LOC_PROT_ERR) << to_string(wa[1].status);
  EXPECT_EQ(wa[1].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_TRUE(frames(0, op::kRcReadRequest, q.b->qpn).empty());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), p.node[0].mem.begin() + 65536));
}

// ------------------------------------------------- 12. receive buffer too small

TEST_F(Errors, ReceiveBufferTooSmall) {
  const QpPair q = p.connect();
  ASSERT_EQ(post_recv(q.b, 5, 100000, 100), 0);
  Sge s = p.sge(0, 0, 200);
  ASSERT_EQ(p.A().post_send(q.a, send_wr(6, &s)), 0);
  ASSERT_TRUE(wait(1, wb, 1));
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wb[0].wr_id, 5u);
  EXPECT_EQ(wb[0].status, IBV_WC_LOC_LEN_ERR) << to_string(wb[0].status);
  EXPECT_EQ(wb[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wa[0].wr_id, 6u);
  EXPECT_EQ(wa[0].status, IBV_WC_REM_INV_REQ_ERR) << to_string(wa[0].status);
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  const auto naks = frames(1, op::kRcAck, q.a->qpn);
  ASSERT_EQ(naks.size(), 1u);
  EXPECT_EQ(naks[0]->syndrome, 0x61);
  settle(1'000'000);
  EXPECT_EQ(wa.size(), 1u);
  EXPECT_EQ(wb.size(), 1u);
}

TEST_F(Errors, ReceiveBufferTooSmallForMultiPacketSend) {
  const QpPair q = p.connect();  // 1024-byte MTU: 3000 bytes are 3 packets
  ASSERT_EQ(post_recv(q.b, 5, 100000, 1500), 0);
  ASSERT_EQ(post_recv(q.b, 50, 110000, 4096), 0);
  Sge s = p.sge(0, 0, 3000);
  ASSERT_EQ(p.A().post_send(q.a, send_wr(6, &s)), 0);
  ASSERT_TRUE(wait(1, wb, 2));
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wb[0].wr_id, 5u);
  EXPECT_EQ(wb[0].status, IBV_WC_LOC_LEN_ERR) << to_string(wb[0].status);
  EXPECT_EQ(wb[1].wr_id, 50u);
  EXPECT_EQ(wb[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wa[0].wr_id, 6u);
  EXPECT_EQ(wa[0].status, IBV_WC_REM_INV_REQ_ERR) << to_string(wa[0].status);
  EXPECT_EQ(q.a->state, IBV_QPS_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  // The NAK names the MIDDLE packet, the first that did not fit.
  const auto naks = frames(1, op::kRcAck, q.a->qpn);
  ASSERT_EQ(naks.size(), 1u);
  EXPECT_EQ(naks[0]->syndrome, 0x61);
  EXPECT_EQ(naks[0]->psn, PairOptions{}.psn_a + 1);
}

// ------------------------------------------------ 13. unsignaled completions

TEST_F(Errors, UnsignaledCompletions) {
  const QpPair q = p.connect();
  fill(0, 0, 4096, 3);
  Sge s[4];
  for (int i = 0; i < 4; ++i) {
    s[i] = p.sge(0, static_cast<std::uint64_t>(i) * 1000, 1000);
    const unsigned flags = i == 3 ? IBV_SEND_SIGNALED : 0;
    ASSERT_EQ(p.A().post_send(q.a, rdma_wr(static_cast<std::uint64_t>(i + 1), IBV_WR_RDMA_WRITE, &s[i],
                                           p.addr(1, 50000 + static_cast<std::uint64_t>(i) * 1000), p.rkey(1), flags)),
              0);
  }
  ASSERT_TRUE(wait(0, wa, 1));
  settle(2'000'000);
  ASSERT_EQ(wa.size(), 1u);
  EXPECT_EQ(wa[0].wr_id, 4u);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(q.a->ctr[QpCounter::completions], 1u);
  EXPECT_EQ(q.a->sq.size(), 0u);  // the unsignaled ones are retired all the same
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[50000], 4000));
  // An error on an unsignaled WR is reported.
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(5, IBV_WR_RDMA_WRITE, &s[0], p.addr(1, 0), p.rkey(1) ^ 0xff, 0)), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].wr_id, 5u);
  EXPECT_EQ(wa[1].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[1].status);
  EXPECT_EQ(q.a->ctr[QpCounter::completions], 2u);
}

// ------------------------------------------------------- 14. SEND with invalidate

TEST_F(Errors, SendWithInvalidateRevokesRkey) {
  const QpPair q = p.connect();
  Mr* mr2 = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 65536, 4096,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr2, nullptr);
  const std::uint32_t rkey = mr2->rkey;
  fill(0, 0, 256, 1);
  Sge w = p.sge(0, 0, 256);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &w, p.addr(1, 65536), rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  ASSERT_EQ(wa[0].status, IBV_WC_SUCCESS);

  ASSERT_EQ(post_recv(q.b, 9, 100000, 4096), 0);
  Sge s = p.sge(0, 1000, 64);
  SendWr inv = send_wr(2, &s, IBV_SEND_SIGNALED, IBV_WR_SEND_WITH_INV);
  inv.invalidate_rkey = rkey;
  ASSERT_EQ(p.A().post_send(q.a, inv), 0);
  ASSERT_TRUE(wait(1, wb, 1));
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wb[0].wr_id, 9u);
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wb[0].byte_len, 64u);
  EXPECT_TRUE(wb[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_FALSE(wb[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wb[0].invalidated_rkey, rkey);
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa[1].opcode, IBV_WC_SEND);
  EXPECT_FALSE(frames(0, op::kRcSendOnlyInv, q.b->qpn).empty());

  fill(0, 0, 256, 100);
  const std::vector<std::uint8_t> before(p.node[1].mem.begin() + 65536, p.node[1].mem.begin() + 65536 + 256);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(3, IBV_WR_RDMA_WRITE, &w, p.addr(1, 65536), rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 3));
  EXPECT_EQ(wa[2].wr_id, 3u);
  EXPECT_EQ(wa[2].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[2].status);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), p.node[1].mem.begin() + 65536));
  EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
}

TEST_F(Errors, SendWithInvalidateMultiPacket) {
  const QpPair q = p.connect();
  Mr* mr2 = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 65536, 4096,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr2, nullptr);
  const std::uint32_t rkey = mr2->rkey;
  ASSERT_EQ(post_recv(q.b, 9, 100000, 4096), 0);
  fill(0, 0, 2500, 3);
  Sge s = p.sge(0, 0, 2500);
  SendWr inv = send_wr(2, &s, IBV_SEND_SIGNALED, IBV_WR_SEND_WITH_INV);
  inv.invalidate_rkey = rkey;
  ASSERT_EQ(p.A().post_send(q.a, inv), 0);
  ASSERT_TRUE(wait(1, wb, 1));
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].byte_len, 2500u);
  EXPECT_TRUE(wb[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(wb[0].invalidated_rkey, rkey);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[100000], 2500));
  EXPECT_EQ(frames(0, op::kRcSendLastInv, q.b->qpn).size(), 1u);
  // A READ with the invalidated key is refused.
  Sge rd = p.sge(0, 10000, 64);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(3, IBV_WR_RDMA_READ, &rd, p.addr(1, 65536), rkey)), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[1].status);
}

TEST_F(Errors, AReadRestartedPartWayLeavesNothingOutstanding) {
  // A READ's middle response is lost: the READ is asked again from there.
  // Once it completes nothing is outstanding, so an idle QP neither times
  // out nor, its retries spent on nothing, goes to ERR.
  const QpPair q = p.connect();
  int middles = 0;
  sim::Impairments imp;
  imp.loss = 1.0;
  imp.filter = [&middles](const TxFrame& f) { return f.opcode == op::kRcReadRespMiddle && middles++ == 0; };
  p.wire.set_impairments(imp);
  Sge rd = p.sge(0, 0, 4 * 1024);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_READ, &rd, p.addr(1, 65536), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 1, 20 * timeout_ns(PairOptions{}.timeout)));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(p.wire.stats().dropped, 1u);
  EXPECT_EQ(0, std::memcmp(p.node[0].mem.data(), p.node[1].mem.data() + 65536, 4 * 1024));
  EXPECT_EQ(q.a->req.una, q.a->req.sent_hi) << "nothing beyond the READ's last response";
  const std::uint64_t timeouts = q.a->ctr[QpCounter::timeouts];
  p.wire.run_until([] { return false; }, 20 * timeout_ns(PairOptions{}.timeout));
  EXPECT_EQ(q.a->ctr[QpCounter::timeouts], timeouts);
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  EXPECT_EQ(q.a->ctr[QpCounter::retry_exceeded_err], 0u);
}

// ------------------------------------------- 15. an atomic never runs twice

TEST_F(Errors, DuplicateAtomicNeverExecutesTwice) {
  const QpPair q = p.connect();
  int atomic_acks = 0;
  sim::Impairments imp;
  imp.loss = 1.0;
  // Drop only the first atomic ACK.
  imp.filter = [&atomic_acks](const TxFrame& f) { return f.opcode == op::kRcAtomicAck && atomic_acks++ == 0; };
  p.wire.set_impairments(imp);
  put64(1, 128, 1000);
  Sge s = p.sge(0, 0, 8);
  SendWr fa = rdma_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &s, p.addr(1, 128), p.rkey(1));
  fa.compare_add = 7;
  ASSERT_EQ(p.A().post_send(q.a, fa), 0);
  ASSERT_TRUE(wait(0, wa, 1, 20 * timeout_ns(PairOptions{}.timeout)));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(wa[0].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(get64(0, 0), 1000u);    // the original value
  EXPECT_EQ(get64(1, 128), 1007u);  // added once
  EXPECT_EQ(p.wire.stats().dropped, 1u);
  EXPECT_EQ(atomic_acks, 2);
  EXPECT_GE(q.b->ctr[QpCounter::atomic_replays], 1u);
  EXPECT_GE(q.b->ctr[QpCounter::duplicate_request], 1u);
  EXPECT_EQ(q.b->ctr[QpCounter::replay_miss], 0u);
  EXPECT_GE(q.a->ctr[QpCounter::retransmitted_pkts], 1u);
  EXPECT_EQ(frames(0, op::kRcFetchAdd, q.b->qpn).size(), 1u + q.a->ctr[QpCounter::retransmitted_pkts]);

  // A compare-and-swap the same way: run again it would fail its compare
  // and return the swapped value instead of the original.
  atomic_acks = 0;
  Sge s2 = p.sge(0, 8, 8);
  SendWr cs = rdma_wr(2, IBV_WR_ATOMIC_CMP_AND_SWP, &s2, p.addr(1, 128), p.rkey(1));
  cs.compare_add = 1007;
  cs.swap = 5;
  ASSERT_EQ(p.A().post_send(q.a, cs), 0);
  ASSERT_TRUE(wait(0, wa, 2, 20 * timeout_ns(PairOptions{}.timeout)));
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS) << to_string(wa[1].status);
  EXPECT_EQ(wa[1].opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(get64(0, 8), 1007u);
  EXPECT_EQ(get64(1, 128), 5u);
  EXPECT_GE(q.b->ctr[QpCounter::atomic_replays], 2u);
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
  EXPECT_EQ(q.b->state, IBV_QPS_RTS);
}

// ------------------------------------------------------------------ 16. fence

struct FenceTimes {
  std::uint64_t read_req = 0, first_resp = 0, last_resp = 0, send = 0;
};

FenceTimes run_fence_case(Pair& p, const std::vector<Seen>& seen, std::vector<ibv_wc>& wa, std::vector<ibv_wc>& wb,
                          unsigned send_flags, bool& ok) {
  FenceTimes t;
  ok = false;
  const QpPair q = p.connect();
  for (std::size_t i = 0; i < 8192; ++i) p.node[1].mem[i] = static_cast<std::uint8_t>(i * 7 + 1);
  Sge rs = p.sge(1, 100000, 4096);
  if (p.B().post_recv(q.b, RecvWr{1, {&rs, 1}}) != 0) return t;
  Sge rd = p.sge(0, 0, 8192);  // 8 response packets
  SendWr r;
  r.wr_id = 10;
  r.opcode = IBV_WR_RDMA_READ;
  r.send_flags = IBV_SEND_SIGNALED;
  r.sg_list = {&rd, 1};
  r.remote_addr = p.addr(1, 0);
  r.rkey = p.rkey(1);
  Sge ss = p.sge(0, 20000, 64);
  SendWr s;
  s.wr_id = 11;
  s.opcode = IBV_WR_SEND;
  s.send_flags = IBV_SEND_SIGNALED | send_flags;
  s.sg_list = {&ss, 1};
  if (p.A().post_send(q.a, r) != 0 || p.A().post_send(q.a, s) != 0) return t;
  if (!p.wire.run_until(
          [&] {
            p.poll(0, wa);
            p.poll(1, wb);
            return wa.size() >= 2 && wb.size() >= 1;
          },
          20'000'000))
    return t;
  for (const Seen& f : seen) {
    if (f.from == 0 && f.opcode == op::kRcReadRequest && !t.read_req) t.read_req = f.t;
    if (f.from == 1 && f.opcode == op::kRcReadRespFirst && !t.first_resp) t.first_resp = f.t;
    if (f.from == 1 && f.opcode == op::kRcReadRespLast) t.last_resp = f.t;
    if (f.from == 0 && f.opcode == op::kRcSendOnly && !t.send) t.send = f.t;
  }
  ok = t.read_req && t.first_resp && t.last_resp && t.send;
  return t;
}

TEST_F(Errors, FencedSendWaitsForRead) {
  bool ok;
  const FenceTimes t = run_fence_case(p, seen, wa, wb, IBV_SEND_FENCE, ok);
  ASSERT_TRUE(ok);
  EXPECT_GT(t.send, t.last_resp) << "the fenced SEND left before the READ completed";
  // It cannot leave before A has received the last response.
  EXPECT_GE(t.send, t.last_resp + sim::Impairments{}.delay_ns);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[0].wr_id, 10u);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa[1].wr_id, 11u);
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[0], 8192));
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
}

TEST_F(Errors, UnfencedSendDoesNotWaitForRead) {
  // The control for the test above: without the fence the SEND goes at once.
  bool ok;
  const FenceTimes t = run_fence_case(p, seen, wa, wb, 0, ok);
  ASSERT_TRUE(ok);
  EXPECT_LT(t.send, t.first_resp);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS);
}

}  // namespace
}  // namespace uroce::testing

namespace uroce::testing {
namespace {

// IBTA 9.6.1.1 header checks, on both roles: a frame with a foreign P_Key,
// or addressed to another IP, is dropped and counted before it reaches a
// QP. The responder must not execute such a WRITE (and the genuine one at
// that PSN must still be executed); the requester must not retire WQEs on
// such an ACK.
class HeaderChecks : public Errors {};

TEST_F(HeaderChecks, RxSaysWhatItDidWithEachFrame) {
  const QpPair q = p.connect();
  auto frame = [&](std::uint32_t destqp, const wire::IpAddr& dst, std::uint16_t pkey, std::uint16_t vlan = 0) {
    wire::FrameSpec s;
    s.vlan = vlan != 0;
    s.vlan_tci = vlan;
    s.eth_src = p.node[0].eng->config().mac;
    s.eth_dst = p.node[1].eng->config().mac;
    s.ipver = wire::IpVersion::kV4;
    s.src = p.node[0].eng->config().ip;
    s.dst = dst;
    s.pkey = pkey;
    s.udp_sport = 0xc123;
    s.opcode = wire::op::kRcSendOnly;
    s.destqp = destqp;
    s.psn = wire::Psn(0x300);  // ahead of what B expects: a sequence NAK, nothing executed
    const std::uint8_t payload[8] = {};
    std::vector<std::uint8_t> f(256);
    f.resize(wire::build_frame(wire::Bytes(f.data(), f.size()), s, wire::ConstBytes(payload, 8)));
    return f;
  };
  const wire::IpAddr b_ip = p.node[1].eng->config().ip;
  auto rx = [&](const std::vector<std::uint8_t>& f) { return p.B().rx(wire::ConstBytes(f.data(), f.size()), 1000); };
  EXPECT_EQ(rx(frame(q.b->qpn, b_ip, 0xffff)), RxVerdict::kToQp);
  EXPECT_EQ(rx(frame(q.b->qpn, wire::IpAddr::from_v4(10, 0, 0, 99), 0xffff)), RxVerdict::kWrongDst);
  EXPECT_EQ(rx(frame(q.b->qpn, b_ip, 0x8001)), RxVerdict::kBadPkey);
  EXPECT_EQ(rx(frame(0x7777, b_ip, 0xffff)), RxVerdict::kUnknownQp);
  std::vector<std::uint8_t> bad_icrc = frame(q.b->qpn, b_ip, 0xffff);
  bad_icrc.back() ^= 1;
  EXPECT_EQ(rx(bad_icrc), RxVerdict::kBadIcrc);
  const std::vector<std::uint8_t> arp(60, 0);
  EXPECT_EQ(rx(arp), RxVerdict::kNotRoce);
  // B's port is untagged: a tagged frame is another VLAN's, whatever it holds.
  const auto wrong_vlan = p.B().counters()[PortCounter::rx_wrong_vlan];
  EXPECT_EQ(rx(frame(q.b->qpn, b_ip, 0xffff, 7)), RxVerdict::kWrongVlan);
  EXPECT_EQ(p.B().counters()[PortCounter::rx_wrong_vlan], wrong_vlan + 1);
}

TEST_F(HeaderChecks, ResponderDropsAWriteWithAForeignPkeyOrAnotherDestination) {
  const QpPair q = p.connect();
  for (int bad = 0; bad < 2; ++bad) {
    wire::FrameSpec s;
    s.eth_src = p.node[0].eng->config().mac;
    s.eth_dst = p.node[1].eng->config().mac;
    s.ipver = wire::IpVersion::kV4;
    s.src = p.node[0].eng->config().ip;
    s.dst = bad == 0 ? p.node[1].eng->config().ip : wire::IpAddr::from_v4(10, 0, 0, 99);
    s.pkey = bad == 0 ? 0x8001 : 0xffff;
    s.udp_sport = 0xc123;
    s.opcode = wire::op::kRcWriteOnly;
    s.destqp = q.b->qpn;
    s.psn = wire::Psn(0x100);  // the PSN B expects from A
    s.ext.reth_va = p.addr(1, 0);
    s.ext.reth_rkey = p.rkey(1);
    s.ext.reth_len = 8;
    const std::uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<std::uint8_t> f(256);
    f.resize(wire::build_frame(wire::Bytes(f.data(), f.size()), s, wire::ConstBytes(payload, 8)));
    p.wire.inject(wire::ConstBytes(f.data(), f.size()));
  }
  settle(1'000'000);
  EXPECT_EQ(p.B().counters()[PortCounter::rx_bad_pkey], 1u);
  EXPECT_EQ(p.B().counters()[PortCounter::rx_wrong_dst], 1u);
  EXPECT_EQ(p.node[1].mem[0], 0) << "a dropped WRITE was executed";
  EXPECT_EQ(q.b->ctr[QpCounter::rcvd_pkts], 0u);
  // The genuine WRITE at that PSN is new to B, and is executed.
  Sge src = p.sge(0, 64, 8);
  p.node[0].mem[64] = 0x77;
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &src, p.addr(1, 0), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(p.node[1].mem[0], 0x77);
  EXPECT_EQ(q.b->ctr[QpCounter::duplicate_request], 0u);
}

TEST_F(HeaderChecks, RequesterIgnoresAnAckWithAForeignPkey) {
  const QpPair q = p.connect();
  // B never answers: its frames are lost, so only the forged ACK could retire A's WRITE.
  sim::Impairments imp;
  imp.loss = 1.0;
  const std::uint32_t bqpn = q.b->qpn;
  imp.filter = [bqpn](const TxFrame& f) { return f.qpn == bqpn && f.opcode == wire::op::kRcAck; };
  p.wire.set_impairments(imp);
  Sge src = p.sge(0, 0, 8);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &src, p.addr(1, 0), p.rkey(1))), 0);
  settle(100'000);
  wire::FrameSpec s;  // an ACK for A's WRITE, as B would send it, but from partition 0x0002
  s.eth_src = p.node[1].eng->config().mac;
  s.eth_dst = p.node[0].eng->config().mac;
  s.ipver = wire::IpVersion::kV4;
  s.src = p.node[1].eng->config().ip;
  s.dst = p.node[0].eng->config().ip;
  s.pkey = 0x8002;
  s.udp_sport = 0xc123;
  s.opcode = wire::op::kRcAck;
  s.destqp = q.a->qpn;
  s.psn = wire::Psn(0x100);
  s.ext.aeth_syndrome = 0x1f;
  s.ext.aeth_msn = 1;
  std::vector<std::uint8_t> ack(256);
  ack.resize(wire::build_frame(wire::Bytes(ack.data(), ack.size()), s, wire::ConstBytes()));
  p.wire.inject(wire::ConstBytes(ack.data(), ack.size()));
  settle(200'000);  // well before A's ACK timeout
  EXPECT_EQ(p.A().counters()[PortCounter::rx_bad_pkey], 1u);
  p.poll(0, wa);
  EXPECT_TRUE(wa.empty()) << "the WRITE was retired by an ACK from a foreign partition";
}

// ------------------------------------------------------ ATOMIC WRITE (IBTA 1.5)

TEST_F(Errors, AtomicWriteStoresEightBytesOnceAndCompletes) {
  const QpPair q = p.connect();
  put64(1, 128, 0x1111);
  put64(1, 136, 0x2222);
  put64(0, 0, 0x0123456789abcdefull);
  Sge s = p.sge(0, 0, 8);
  SendWr w = rdma_wr(5, IBV_WR_ATOMIC_WRITE, &s, p.addr(1, 128), p.rkey(1));
  ASSERT_EQ(p.A().post_send(q.a, w), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS) << to_string(wa[0].status);
  EXPECT_EQ(wa[0].opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(get64(1, 128), 0x0123456789abcdefull);
  EXPECT_EQ(get64(1, 136), 0x2222u);  // exactly 8 bytes
  const auto sent = frames(0, op::kRcAtomicWrite, q.b->qpn);
  ASSERT_EQ(sent.size(), 1u);  // one packet, acknowledged as a WRITE
  EXPECT_FALSE(frames(1, op::kRcAck, q.a->qpn).empty());
  EXPECT_TRUE(frames(1, op::kRcAtomicAck, q.a->qpn).empty());
  // The same request again (a retransmission): acknowledged, not stored again.
  put64(1, 128, 0x7777);
  const auto again = frame(0, op::kRcAtomicWrite, q.b->qpn, q.b->resp.epsn - 1,
                           [&] {
                             wire::ExtFields e;
                             e.reth_va = p.addr(1, 128);
                             e.reth_rkey = p.rkey(1);
                             e.reth_len = 8;
                             return e;
                           }(),
                           8);
  ASSERT_FALSE(again.empty());
  p.wire.inject(wire::ConstBytes(again.data(), again.size()));
  settle(200'000);
  EXPECT_EQ(get64(1, 128), 0x7777u);
  EXPECT_EQ(q.b->ctr[QpCounter::duplicate_request], 1u);
  EXPECT_EQ(q.b->state, IBV_QPS_RTS);
  // And the QP goes on: a WRITE after it completes (the PSN and MSN moved on).
  for (int i = 0; i < 64; ++i) p.node[0].mem[512 + i] = static_cast<std::uint8_t>(i + 3);
  Sge ws = p.sge(0, 512, 64);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(6, IBV_WR_RDMA_WRITE, &ws, p.addr(1, 1024), p.rkey(1))), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS) << to_string(wa[1].status);
  EXPECT_EQ(std::memcmp(&p.node[1].mem[1024], &p.node[0].mem[512], 64), 0);
  EXPECT_EQ(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
}

TEST_F(Errors, AtomicWriteOfOtherThanEightAlignedBytesIsRefusedAtPost) {
  const QpPair q = p.connect();
  Sge four = p.sge(0, 0, 4);
  EXPECT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_ATOMIC_WRITE, &four, p.addr(1, 128), p.rkey(1))), EINVAL);
  Sge eight = p.sge(0, 0, 8);
  EXPECT_EQ(p.A().post_send(q.a, rdma_wr(2, IBV_WR_ATOMIC_WRITE, &eight, p.addr(1, 132), p.rkey(1))), EINVAL);
  settle(100'000);
  EXPECT_TRUE(wa.empty());
  EXPECT_EQ(q.a->state, IBV_QPS_RTS);
}

TEST_F(Errors, AtomicWriteWhoseRethIsNotEightBytesIsInvalidRequest) {
  // A peer's ATOMIC WRITE saying 16 bytes (its payload is 8): never stored.
  const QpPair q = p.connect();
  put64(1, 256, 0x3333);
  wire::ExtFields e;
  e.reth_va = p.addr(1, 256);
  e.reth_rkey = p.rkey(1);
  e.reth_len = 16;
  const auto f = frame(0, op::kRcAtomicWrite, q.b->qpn, q.b->resp.epsn, e, 8);
  ASSERT_FALSE(f.empty());
  p.wire.inject(wire::ConstBytes(f.data(), f.size()));
  ASSERT_TRUE(p.wire.run_until([&] { return q.b->state == IBV_QPS_ERR; }, 1'000'000));
  settle(200'000);  // the NAK goes out
  EXPECT_EQ(get64(1, 256), 0x3333u);
  const auto naks = frames(1, op::kRcAck, q.a->qpn);
  ASSERT_EQ(naks.size(), 1u);
  EXPECT_EQ(naks[0]->syndrome, 0x61);
}

/// A FLUSH work request (IBTA 1.5): no data; the FETH's placement type and
/// selectivity level in `imm`'s place, the length in compare_add's.
SendWr flush_wr(std::uint64_t id, std::uint64_t raddr, std::uint32_t rkey, std::uint64_t len, std::uint32_t type,
                std::uint32_t level) {
  SendWr w;
  w.wr_id = id;
  w.opcode = static_cast<ibv_wr_opcode>(UROCE_WR_FLUSH);
  w.send_flags = IBV_SEND_SIGNALED;
  w.remote_addr = raddr;
  w.rkey = rkey;
  w.compare_add = len;
  w.imm_data = type | level << 4;
  return w;
}

TEST_F(Errors, FlushAfterWritesCompletesOnItsAck) {
  PairOptions o;
  o.access |= UROCE_ACCESS_FLUSH_GLOBAL;
  const QpPair q = p.connect(o);
  // An MR that takes FLUSHes over B's memory at 64 KiB.
  Mr* fm = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 65536, 8192,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | UROCE_ACCESS_FLUSH_GLOBAL);
  ASSERT_NE(fm, nullptr);
  const std::uint64_t base = reinterpret_cast<std::uint64_t>(p.node[1].mem.data() + 65536);
  for (int i = 0; i < 3000; ++i) p.node[0].mem[i] = static_cast<std::uint8_t>(i * 5 + 1);
  Sge s = p.sge(0, 0, 3000);
  ASSERT_EQ(p.A().post_send(q.a, rdma_wr(1, IBV_WR_RDMA_WRITE, &s, base, fm->rkey, 0)), 0);
  ASSERT_EQ(p.A().post_send(q.a, flush_wr(2, base, fm->rkey, 3000, UROCE_FLUSH_GLOBAL, UROCE_FLUSH_RANGE)), 0);
  ASSERT_EQ(p.A().post_send(q.a, flush_wr(3, base + 8000, fm->rkey, 50000, UROCE_FLUSH_GLOBAL, UROCE_FLUSH_MR)), 0);
  ASSERT_TRUE(wait(0, wa, 2));
  for (const ibv_wc& c : wa) {
    EXPECT_EQ(c.status, IBV_WC_SUCCESS) << to_string(c.status);
    EXPECT_EQ(c.opcode, static_cast<ibv_wc_opcode>(UROCE_WC_FLUSH));  // IBV_WC_FLUSH
  }
  EXPECT_EQ(wa[0].wr_id, 2u);
  EXPECT_EQ(wa[1].wr_id, 3u);
  EXPECT_EQ(std::memcmp(p.node[1].mem.data() + 65536, p.node[0].mem.data(), 3000), 0);
  EXPECT_EQ(frames(0, op::kRcFlush, q.b->qpn).size(), 2u);  // one packet each, no payload
  EXPECT_EQ(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
  EXPECT_EQ(q.b->state, IBV_QPS_RTS);
}

TEST_F(Errors, FlushBeyondItsMrOrWithoutFlushAccessIsARemoteAccessError) {
  PairOptions o;
  o.access |= UROCE_ACCESS_FLUSH_GLOBAL;
  // A range past the MR's end; an MR without FLUSH access; persistence
  // (uroce has no persistent memory, so it refuses it as rxe does on memory
  // that is not).
  for (int c = 0; c < 3; ++c) {
    Pair pp;
    const QpPair q = pp.connect(o);
    const unsigned acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | (c == 1 ? 0 : UROCE_ACCESS_FLUSH_GLOBAL);
    Mr* fm = pp.B().reg_mr(pp.node[1].pd, pp.node[1].mem.data() + 65536, 8192, acc);
    ASSERT_NE(fm, nullptr);
    const std::uint64_t base = reinterpret_cast<std::uint64_t>(pp.node[1].mem.data() + 65536);
    const SendWr w = c == 0   ? flush_wr(1, base + 4096, fm->rkey, 8192, UROCE_FLUSH_GLOBAL, UROCE_FLUSH_RANGE)
                     : c == 1 ? flush_wr(1, base, fm->rkey, 64, UROCE_FLUSH_GLOBAL, UROCE_FLUSH_RANGE)
                              : flush_wr(1, base, fm->rkey, 64, UROCE_FLUSH_PERSISTENT, UROCE_FLUSH_RANGE);
    ASSERT_EQ(pp.A().post_send(q.a, w), 0);
    std::vector<ibv_wc> got;
    ASSERT_TRUE(pp.wire.run_until(
        [&] {
          ibv_wc wc{};
          if (pp.A().poll_cq(pp.node[0].cq, {&wc, 1}) == 1) got.push_back(wc);
          return !got.empty();
        },
        50'000'000));
    EXPECT_EQ(got[0].status, IBV_WC_REM_ACCESS_ERR) << "case " << c << ": " << to_string(got[0].status);
    EXPECT_EQ(q.b->ctr[QpCounter::remote_access_err], 1u) << "case " << c;
  }
  // Nor may an MR promise persistence.
  EXPECT_EQ(p.B().reg_mr(p.node[1].pd, p.node[1].mem.data(), 4096,
                         IBV_ACCESS_LOCAL_WRITE | UROCE_ACCESS_FLUSH_PERSISTENT),
            nullptr);
}

TEST_F(Errors, FlushOnAQpWithoutFlushAccessIsRefusedByTheResponder) {
  const QpPair q = p.connect();  // no UROCE_ACCESS_FLUSH_GLOBAL on B's QP
  Mr* fm = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + 65536, 8192,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | UROCE_ACCESS_FLUSH_GLOBAL);
  ASSERT_NE(fm, nullptr);
  const std::uint64_t base = reinterpret_cast<std::uint64_t>(p.node[1].mem.data() + 65536);
  ASSERT_EQ(p.A().post_send(q.a, flush_wr(1, base, fm->rkey, 64, UROCE_FLUSH_GLOBAL, UROCE_FLUSH_RANGE)), 0);
  ASSERT_TRUE(wait(0, wa, 1));
  EXPECT_EQ(wa[0].status, IBV_WC_REM_ACCESS_ERR) << to_string(wa[0].status);
}

TEST_F(Errors, MalformedFlushesAreRefusedAtPostAndOnTheWire) {
  const QpPair q = p.connect();
  // No placement type; an unknown one; an unknown level; with data.
  EXPECT_EQ(p.A().post_send(q.a, flush_wr(1, p.addr(1, 0), p.rkey(1), 8, 0, 0)), EINVAL);
  EXPECT_EQ(p.A().post_send(q.a, flush_wr(2, p.addr(1, 0), p.rkey(1), 8, 4, 0)), EINVAL);
  EXPECT_EQ(p.A().post_send(q.a, flush_wr(3, p.addr(1, 0), p.rkey(1), 8, 1, 2)), EINVAL);
  SendWr d = flush_wr(4, p.addr(1, 0), p.rkey(1), 8, 1, 0);
  Sge s = p.sge(0, 0, 8);
  d.sg_list = {&s, 1};
  EXPECT_EQ(p.A().post_send(q.a, d), EINVAL);
  // A FLUSH on UD or UC does not exist.
  PairOptions uc;
  uc.type = IBV_QPT_UC;
  Pair pu;
  const QpPair qu = pu.connect(uc);
  EXPECT_EQ(pu.A().post_send(qu.a, flush_wr(5, 0, 0, 8, 1, 0)), EINVAL);
  settle(100'000);
  EXPECT_TRUE(wa.empty());
  // A peer's FLUSH with no placement type in its FETH: invalid request.
  wire::ExtFields e;
  e.reth_va = p.addr(1, 0);
  e.reth_rkey = p.rkey(1);
  e.reth_len = 8;
  e.feth = 0;
  const auto f = frame(0, op::kRcFlush, q.b->qpn, q.b->resp.epsn, e, 0);
  ASSERT_FALSE(f.empty());
  p.wire.inject(wire::ConstBytes(f.data(), f.size()));
  ASSERT_TRUE(p.wire.run_until([&] { return q.b->state == IBV_QPS_ERR; }, 1'000'000));
  settle(200'000);
  const auto naks = frames(1, op::kRcAck, q.a->qpn);
  ASSERT_EQ(naks.size(), 1u);
  EXPECT_EQ(naks[0]->syndrome, 0x61);
}

}  // namespace
}  // namespace uroce::testing
