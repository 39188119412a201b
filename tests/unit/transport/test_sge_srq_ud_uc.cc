// Scatter/gather lists, inline data, a shared receive queue, and UD and UC
// end to end over the simulated wire.
#include <gtest/gtest.h>

#include <set>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

bool run_until_wcs(Pair& p, int node, std::size_t n, std::vector<ibv_wc>& out, std::uint64_t max_ns = 1'000'000'000) {
  return p.wire.run_until(
      [&] {
        p.poll(node, out);
        return out.size() >= n;
      },
      max_ns);
}

TEST(Sge, GatherThreeSgesScatterIntoThree) {
  Pair p;
  const QpPair q = p.connect();
  auto& am = p.node[0].mem;
  for (int i = 0; i < 3000; ++i) am[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i * 7 + 1);
  // Gather 1000 + 1500 + 500 bytes from three places; scatter into 700 + 2000 + 300.
  Sge g[3] = {p.sge(0, 0, 1000), p.sge(0, 1000, 1500), p.sge(0, 2500, 500)};
  Sge s[3] = {p.sge(1, 10000, 700), p.sge(1, 20000, 2000), p.sge(1, 30000, 300)};
  ASSERT_EQ(p.B().post_recv(q.b, RecvWr{1, {s, 3}}), 0);
  SendWr wr;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {g, 3};
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  std::vector<ibv_wc> wb;
  ASSERT_TRUE(run_until_wcs(p, 1, 1, wb));
  ASSERT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].byte_len, 3000u);
  auto& bm = p.node[1].mem;
  EXPECT_EQ(0, std::memcmp(&bm[10000], &am[0], 700));
  EXPECT_EQ(0, std::memcmp(&bm[20000], &am[700], 2000));
  EXPECT_EQ(0, std::memcmp(&bm[30000], &am[2700], 300));
  EXPECT_EQ(bm[30300], 0);  // nothing beyond the last SGE
}

TEST(Sge, TooManySgesAreRefusedAtPost) {
  Pair p;
  PairOptions o;
  o.cap.max_send_sge = 2;
  o.cap.max_recv_sge = 2;
  const QpPair q = p.connect(o);
  Sge g[3] = {p.sge(0, 0, 8), p.sge(0, 8, 8), p.sge(0, 16, 8)};
  SendWr wr;
  wr.sg_list = {g, 3};
  EXPECT_EQ(p.A().post_send(q.a, wr), EINVAL);
  EXPECT_EQ(p.B().post_recv(q.b, RecvWr{1, {g, 3}}), EINVAL);
}

TEST(Inline, DataIsCopiedAtPostTime) {
  Pair p;
  const QpPair q = p.connect();
  std::uint8_t local[kMaxInline];  // not in any MR: inline needs no lkey
  for (std::uint32_t i = 0; i < kMaxInline; ++i) local[i] = static_cast<std::uint8_t>(0xa0 + i);
  Sge s{reinterpret_cast<std::uint64_t>(local), kMaxInline, 0};
  SendWr wr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.sg_list = {&s, 1};
  wr.remote_addr = p.addr(1, 4096);
  wr.rkey = p.rkey(1);
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  std::uint8_t expect[kMaxInline];
  std::memcpy(expect, local, kMaxInline);
  std::memset(local, 0, sizeof local);  // the caller may reuse the buffer at once
  std::vector<ibv_wc> wa;
  ASSERT_TRUE(run_until_wcs(p, 0, 1, wa));
  ASSERT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&p.node[1].mem[4096], expect, kMaxInline));
  // Over the QP's inline limit: refused.
  std::vector<std::uint8_t> big(kMaxInline + 1);
  Sge b{reinterpret_cast<std::uint64_t>(big.data()), static_cast<std::uint32_t>(big.size()), 0};
  wr.sg_list = {&b, 1};
  EXPECT_EQ(p.A().post_send(q.a, wr), EINVAL);
}

TEST(Srq, TwoQpsShareOneReceiveQueue) {
  Pair p;
  Srq* srq = p.B().create_srq(p.node[1].pd, 16, 1);
  ASSERT_NE(srq, nullptr);
  // Two connected pairs whose B sides use the SRQ: connect normally, then
  // swap B's QPs for SRQ-backed ones is not possible after RTS, so build them here.
  QpPair q1 = p.connect(), q2 = p.connect();
  (void)q1;
  (void)q2;
  // Fresh SRQ-backed QPs on B, connected to two fresh QPs on A.
  Qp* a[2];
  Qp* b[2];
  for (int i = 0; i < 2; ++i) {
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = p.node[0].cq;
    a[i] = p.A().create_qp(p.node[0].pd, ia);
    ia.send_cq = ia.recv_cq = p.node[1].cq;
    ia.srq = srq;
    ia.cap.max_recv_wr = 0;
    b[i] = p.B().create_qp(p.node[1].pd, ia);
    ASSERT_NE(b[i], nullptr);
  }
  auto bring_up = [&](Engine& e, Qp* me, Qp* peer, const wire::IpAddr& peer_ip) {
    abi::Connect k;
    k.dest_qp_num = peer->qpn;
    std::memcpy(k.dgid.raw, peer_ip.b.data(), 16);
    k.timeout = 8;
    ASSERT_TRUE(e.bring_up(me, k));
  };
  for (int i = 0; i < 2; ++i) {
    bring_up(p.A(), a[i], b[i], p.B().config().ip);
    bring_up(p.B(), b[i], a[i], p.A().config().ip);
  }
  Sge r = p.sge(1, 0, 64);
  EXPECT_EQ(p.B().post_recv(b[0], RecvWr{9, {&r, 1}}), EINVAL);  // SRQ-backed QPs take no direct receives
  for (std::uint64_t k = 0; k < 4; ++k) {
    Sge rk = p.sge(1, 1000 * (k + 1), 64);
    ASSERT_EQ(p.B().post_srq_recv(srq, RecvWr{100 + k, {&rk, 1}}), 0);
  }
  for (int i = 0; i < 2; ++i)
    for (int m = 0; m < 2; ++m) {
      p.node[0].mem[static_cast<std::size_t>(i * 2 + m)] = static_cast<std::uint8_t>(0x40 + i * 2 + m);
      Sge s = p.sge(0, static_cast<std::uint64_t>(i * 2 + m), 1);
      SendWr wr;
      wr.opcode = IBV_WR_SEND;
      wr.sg_list = {&s, 1};
      ASSERT_EQ(p.A().post_send(a[i], wr), 0);
    }
  std::vector<ibv_wc> wb;
  ASSERT_TRUE(run_until_wcs(p, 1, 4, wb));
  std::set<std::uint64_t> ids;
  std::set<std::uint32_t> qps;
  for (const auto& w : wb) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    ids.insert(w.wr_id);
    qps.insert(w.qp_num);
  }
  EXPECT_EQ(ids, (std::set<std::uint64_t>{100, 101, 102, 103}));  // all four SRQ WQEs used
  EXPECT_EQ(qps.size(), 2u);                                      // by both QPs
  EXPECT_EQ(srq->depth(), 0u);
  EXPECT_EQ(p.B().destroy_srq(srq), EBUSY);  // still in use
}

TEST(Ud, DatagramsBetweenEnginesWithQkeyAndGrh) {
  // A port of Ethernet MTU 1500: active MTU 1024, a UD message's most.
  Pair p(1, 4u << 20, 64, false, [](int, EngineConfig& c) { c.ud_mtu = 1024; });
  PairOptions o;
  o.type = IBV_QPT_UD;
  o.qkey = 0x1234;
  const QpPair q = p.connect(o);
  Ah ah;
  ah.dgid = p.B().config().ip;
  ah.dmac = p.B().config().mac;
  auto& am = p.node[0].mem;
  for (int i = 0; i < 600; ++i) am[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i ^ 0x5a);
  Sge r = p.sge(1, 8192, 1024 + 40);
  ASSERT_EQ(p.B().post_recv(q.b, RecvWr{3, {&r, 1}}), 0);
  Sge s = p.sge(0, 0, 600);
  SendWr wr;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = 77;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&s, 1};
  wr.ah = &ah;
  wr.remote_qpn = q.b->qpn;
  wr.remote_qkey = 0x1234;
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  // A datagram with the wrong Q_Key is dropped and counted.
  wr.remote_qkey = 0x9999;
  wr.send_flags = 0;
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  std::vector<ibv_wc> wa, wb;
  ASSERT_TRUE(run_until_wcs(p, 1, 1, wb));
  p.wire.run_idle(10'000'000);
  p.poll(0, wa);
  p.poll(1, wb);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].byte_len, 640u);  // 40-byte GRH area + payload
  EXPECT_TRUE(wb[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(wb[0].src_qp, q.a->qpn);
  EXPECT_EQ(__builtin_bswap32(wb[0].imm_data), 77u);
  EXPECT_EQ(0, std::memcmp(&p.node[1].mem[8192 + 40], &am[0], 600));
  EXPECT_EQ(p.node[1].mem[8192 + 20], 0x45);  // IPv4 header at offset 20 of the GRH area
  EXPECT_EQ(q.b->ctr[QpCounter::qkey_err], 1u);
  ASSERT_EQ(wa.size(), 1u);  // the unsignaled one produced no completion
  // One with no receive posted is dropped (UD has no RNR) and counted as
  // that, not as a UC resynchronisation drop.
  wr.remote_qkey = 0x1234;
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  p.wire.run_idle(10'000'000);
  EXPECT_EQ(q.b->ctr[QpCounter::ud_no_recv], 1u);
  EXPECT_EQ(q.b->ctr[QpCounter::uc_dropped], 0u);
  // Larger than the MTU: a local length error.
  Sge big = p.sge(0, 0, 2000);
  wr.sg_list = {&big, 1};
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.remote_qkey = 0x1234;
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  wa.clear();
  ASSERT_TRUE(run_until_wcs(p, 0, 1, wa));
  EXPECT_EQ(wa[0].status, IBV_WC_LOC_LEN_ERR);
}

TEST(Ud, AMessageAsLargeAsThePortsActiveMtu) {
  // A 9000-byte link: active MTU 4096 (rxe takes a UD message's bound from
  // the port, not from a path MTU, which UD has none of): 4096 bytes go,
  // every byte, and 4097 is a local length error.
  Pair p(1, 4u << 20, 64, false, [](int, EngineConfig& c) { c.ud_mtu = 4096; });
  PairOptions o;
  o.type = IBV_QPT_UD;
  const QpPair q = p.connect(o);
  Ah ah;
  ah.dgid = p.B().config().ip;
  ah.dmac = p.B().config().mac;
  auto& am = p.node[0].mem;
  for (int i = 0; i < 4097; ++i) am[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i * 13 + 1);
  Sge r = p.sge(1, 8192, 4096 + 40);
  ASSERT_EQ(p.B().post_recv(q.b, RecvWr{3, {&r, 1}}), 0);
  Sge s = p.sge(0, 0, 4096);
  SendWr wr;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&s, 1};
  wr.ah = &ah;
  wr.remote_qpn = q.b->qpn;
  wr.remote_qkey = o.qkey;
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  std::vector<ibv_wc> wa, wb;
  ASSERT_TRUE(run_until_wcs(p, 1, 1, wb));
  ASSERT_TRUE(run_until_wcs(p, 0, 1, wa));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].byte_len, 4096u + 40);
  EXPECT_EQ(0, std::memcmp(&p.node[1].mem[8192 + 40], &am[0], 4096));
  Sge over = p.sge(0, 0, 4097);
  wr.sg_list = {&over, 1};
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  wa.clear();
  ASSERT_TRUE(run_until_wcs(p, 0, 1, wa));
  EXPECT_EQ(wa[0].status, IBV_WC_LOC_LEN_ERR);
}

TEST(Uc, MessagesArriveWholeOrNotAtAllUnderLoss) {
  Pair p(3);
  PairOptions o;
  o.type = IBV_QPT_UC;
  o.cap.max_recv_wr = 512;
  const QpPair q = p.connect(o);
  sim::Impairments imp;
  imp.loss = 0.05;
  p.wire.set_impairments(imp);
  constexpr int kMsgs = 300;
  constexpr std::uint32_t kLen = 3000;  // 3 packets at MTU 1024
  for (int i = 0; i < kMsgs; ++i) {
    Sge r = p.sge(1, 65536 + static_cast<std::uint64_t>(i) * 4096, 4096);
    ASSERT_EQ(p.B().post_recv(q.b, RecvWr{static_cast<std::uint64_t>(i), {&r, 1}}), 0);
  }
  std::vector<ibv_wc> wa, wb;
  int posted = 0;
  auto& am = p.node[0].mem;
  while (posted < kMsgs) {
    for (std::uint32_t j = 0; j < kLen; ++j) am[j] = static_cast<std::uint8_t>(posted + j);
    Sge s = p.sge(0, 0, kLen);
    SendWr wr;
    wr.wr_id = static_cast<std::uint64_t>(posted);
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = static_cast<std::uint32_t>(posted);
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = {&s, 1};
    ASSERT_EQ(p.A().post_send(q.a, wr), 0);
    ++posted;
    // One message at a time, so the source buffer is stable while in flight.
    ASSERT_TRUE(p.wire.run_until([&] { p.poll(0, wa); return static_cast<int>(wa.size()) == posted; }, 100'000'000));
    p.wire.run_idle(100'000);
    p.poll(1, wb);
  }
  // Every sender completion is SUCCESS (UC completes on send).
  for (const auto& w : wa) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  // Every delivered message is complete and correct; some were lost whole.
  int delivered = 0;
  for (const auto& w : wb) {
    ASSERT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_EQ(w.byte_len, kLen);
    const std::uint32_t id = __builtin_bswap32(w.imm_data);
    const std::uint8_t* buf = &p.node[1].mem[65536 + w.wr_id * 4096];
    bool ok = true;
    for (std::uint32_t j = 0; j < kLen && ok; ++j) ok = buf[j] == static_cast<std::uint8_t>(id + j);
    EXPECT_TRUE(ok) << "message " << id;
    ++delivered;
  }
  EXPECT_GT(delivered, kMsgs / 2);
  EXPECT_LT(delivered, kMsgs);  // 5% loss of 3 packets each loses some
  EXPECT_GT(q.b->ctr[QpCounter::uc_dropped], 0u);
}

}  // namespace
}  // namespace uroce::testing

namespace uroce::testing {
namespace {

// Applications address their buffers by their own virtual addresses; the
// daemon maps the same pages elsewhere. MRs registered with an IOVA that is
// not the engine's pointer must work for every operation, on both sides.
TEST(Iova, EveryOperationTranslatesThroughTheMr) {
  Pair p;
  const QpPair q = p.connect();
  constexpr std::uint64_t kIovaA = 0x10'0000'0000ull, kIovaB = 0x20'0000'0000ull;
  Mr* ma = p.A().reg_mr_iova(p.node[0].pd, p.node[0].mem.data(), 1 << 20,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, kIovaA);
  Mr* mb = p.B().reg_mr_iova(p.node[1].pd, p.node[1].mem.data(), 1 << 20,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                 IBV_ACCESS_REMOTE_ATOMIC,
                             kIovaB);
  ASSERT_NE(ma, nullptr);
  ASSERT_NE(mb, nullptr);
  auto& am = p.node[0].mem;
  auto& bm = p.node[1].mem;
  for (int i = 0; i < 5000; ++i) am[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i * 11);
  std::vector<ibv_wc> wa, wb;
  // SEND: gather by IOVA on A, scatter by IOVA on B.
  Sge rs{kIovaB + 100000, 8192, mb->lkey};
  ASSERT_EQ(p.B().post_recv(q.b, RecvWr{1, {&rs, 1}}), 0);
  Sge ss{kIovaA, 5000, ma->lkey};
  SendWr wr;
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&ss, 1};
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  // WRITE to B's IOVA space, READ it back into A's, FETCH_ADD on B.
  wr.wr_id = 2;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.remote_addr = kIovaB + 200000;
  wr.rkey = mb->rkey;
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  Sge rd{kIovaA + 300000, 5000, ma->lkey};
  wr.wr_id = 3;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
  wr.sg_list = {&rd, 1};
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  std::uint64_t v = 40;
  std::memcpy(&bm[400000], &v, 8);
  Sge at{kIovaA + 500000, 8, ma->lkey};
  wr.wr_id = 4;
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.sg_list = {&at, 1};
  wr.remote_addr = kIovaB + 400000;
  wr.compare_add = 2;
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  ASSERT_TRUE(p.wire.run_until([&] { p.poll(0, wa); p.poll(1, wb); return wa.size() == 4 && wb.size() == 1; }, 1'000'000'000));
  for (const auto& w : wa) EXPECT_EQ(w.status, IBV_WC_SUCCESS) << w.wr_id;
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&bm[100000], &am[0], 5000));
  EXPECT_EQ(0, std::memcmp(&bm[200000], &am[0], 5000));
  EXPECT_EQ(0, std::memcmp(&am[300000], &am[0], 5000));
  std::uint64_t orig, now_v;
  std::memcpy(&orig, &am[500000], 8);
  std::memcpy(&now_v, &bm[400000], 8);
  EXPECT_EQ(orig, 40u);
  EXPECT_EQ(now_v, 42u);
  // An address outside the MR's IOVA range is refused, not dereferenced.
  Sge outside{reinterpret_cast<std::uint64_t>(am.data()), 8, ma->lkey};  // the engine's pointer, not the IOVA
  wr.wr_id = 5;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = {&outside, 1};
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  wa.clear();
  ASSERT_TRUE(p.wire.run_until([&] { p.poll(0, wa); return !wa.empty(); }, 1'000'000'000));
  EXPECT_EQ(wa[0].status, IBV_WC_LOC_PROT_ERR);
}

}  // namespace
}  // namespace uroce::testing
