// XRC (IBTA 9.8.5, 11.2.1.2): an XRC send QP's requests carry an XRCETH
// naming an XRC SRQ at the target; the target QP takes that SRQ's
// receives, completion queue and PD for them, if the SRQ is in its domain.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <set>

#include "stack/wire/parser.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

struct XrcSetup {
  Qp* ini = nullptr;  // on A
  Qp* tgt = nullptr;  // on B
  Xrcd* xrcd = nullptr;
  Srq* srq[2]{};
  Cq* cq2 = nullptr;  // srq[1]'s completions; srq[0]'s go to B's own CQ
};

void bring_up(Engine& e, Qp* me, Qp* peer, const wire::IpAddr& peer_ip) {
  abi::Connect k;
  k.type = IBV_QPT_RC;
  k.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  k.dest_qp_num = peer->qpn;
  k.rq_psn = 0x300;
  k.sq_psn = 0x300;
  std::memcpy(k.dgid.raw, peer_ip.b.data(), 16);
  k.max_rd_atomic = k.max_dest_rd_atomic = 4;
  k.timeout = 8;
  Pair::must(e.bring_up(me, k));
}

XrcSetup make(Pair& p) {
  XrcSetup x;
  x.xrcd = p.B().alloc_xrcd();
  x.cq2 = p.B().create_cq(64);
  x.srq[0] = p.B().create_srq(p.node[1].pd, 16, 1, nullptr, x.xrcd, p.node[1].cq);
  x.srq[1] = p.B().create_srq(p.node[1].pd, 16, 1, nullptr, x.xrcd, x.cq2);
  QpInitAttr ia;
  ia.qp_type = IBV_QPT_XRC_SEND;
  ia.send_cq = p.node[0].cq;
  ia.cap.max_recv_wr = 0;
  x.ini = p.A().create_qp(p.node[0].pd, ia);
  QpInitAttr ta;
  ta.qp_type = IBV_QPT_XRC_RECV;
  ta.xrcd = x.xrcd;
  x.tgt = p.B().create_qp(nullptr, ta);
  if (x.ini && x.tgt) {
    bring_up(p.A(), x.ini, x.tgt, p.B().config().ip);
    bring_up(p.B(), x.tgt, x.ini, p.A().config().ip);
  }
  return x;
}

bool run_until(Pair& p, const std::function<bool()>& done) { return p.wire.run_until(done, 1'000'000'000); }

int poll(Engine& e, Cq* cq, std::vector<ibv_wc>& out) {
  ibv_wc wc[16];
  const int n = e.poll_cq(cq, std::span<ibv_wc>(wc, 16));
  out.insert(out.end(), wc, wc + n);
  return n;
}

TEST(Xrc, ASendReachesTheSrqItsXrcethNamesAndCompletesInThatSrqsCq) {
  Pair p;
  const XrcSetup x = make(p);
  ASSERT_NE(x.ini, nullptr);
  ASSERT_NE(x.tgt, nullptr);
  ASSERT_NE(x.srq[0], nullptr);
  ASSERT_NE(x.srq[1], nullptr);
  EXPECT_NE(x.srq[0]->srq_num(), 0u);
  EXPECT_NE(x.srq[0]->srq_num(), x.srq[1]->srq_num());
  std::vector<std::uint8_t> opcodes;
  std::set<std::uint32_t> srqns;
  p.wire.tap = [&](wire::ConstBytes f, std::uint64_t) {
    wire::Packet pkt;
    if (!wire::parse_frame(f, {}, pkt).ok()) return;
    opcodes.push_back(pkt.opcode);
    if (pkt.info->off_xrceth) srqns.insert(pkt.xrceth()->srqn.get());
  };
  for (int i = 0; i < 2; ++i) {
    Sge r = p.sge(1, 1000u * (i + 1), 64);
    ASSERT_EQ(p.B().post_srq_recv(x.srq[i], RecvWr{10u + i, {&r, 1}}), 0);
  }
  // To the second SRQ first, then the first.
  for (int k : {1, 0}) {
    p.node[0].mem[k] = static_cast<std::uint8_t>(0x50 + k);
    Sge s = p.sge(0, static_cast<std::uint64_t>(k), 1);
    SendWr wr;
    wr.wr_id = 70u + k;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = 0x1234;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = {&s, 1};
    wr.xrc_srqn = x.srq[k]->srq_num();
    ASSERT_EQ(p.A().post_send(x.ini, wr), 0);
  }
  std::vector<ibv_wc> wa, wb, w2;
  ASSERT_TRUE(run_until(p, [&] {
    poll(p.A(), p.node[0].cq, wa);
    poll(p.B(), p.node[1].cq, wb);
    poll(p.B(), x.cq2, w2);
    return wa.size() >= 2 && wb.size() >= 1 && w2.size() >= 1;
  }));
  for (const auto& w : wa) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  ASSERT_EQ(w2.size(), 1u);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(w2[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(w2[0].wr_id, 11u);
  EXPECT_EQ(w2[0].qp_num, x.tgt->qpn);
  EXPECT_EQ(w2[0].byte_len, 1u);
  EXPECT_EQ(ntohl(w2[0].imm_data), 0x1234u);
  EXPECT_EQ(wb[0].wr_id, 10u);
  EXPECT_EQ(p.node[1].mem[2000], 0x51);
  EXPECT_EQ(p.node[1].mem[1000], 0x50);
  // On the wire: XRC SEND ONLY WITH IMMEDIATE with the two SRQ numbers,
  // answered by XRC ACKs; never an RC opcode.
  EXPECT_EQ(srqns, (std::set<std::uint32_t>{x.srq[0]->srq_num(), x.srq[1]->srq_num()}));
  ASSERT_FALSE(opcodes.empty());
  for (std::uint8_t op : opcodes) EXPECT_TRUE(op == 0xa5 || op == wire::op::kXrcAck) << int{op};
}

TEST(Xrc, WriteReadAndAtomicsUseTheMemoryOfTheSrqsPd) {
  Pair p;
  const XrcSetup x = make(p);
  ASSERT_NE(x.tgt, nullptr);
  for (int i = 0; i < 8; ++i) p.node[0].mem[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(0x10 + i);
  Sge s = p.sge(0, 0, 8);
  SendWr w = p.write_to(1, s, 4096, 1);
  w.xrc_srqn = x.srq[0]->srq_num();
  ASSERT_EQ(p.A().post_send(x.ini, w), 0);
  Sge rd = p.sge(0, 100, 8);
  SendWr r = p.write_to(1, rd, 4096, 2);
  r.opcode = IBV_WR_RDMA_READ;
  r.xrc_srqn = x.srq[0]->srq_num();
  ASSERT_EQ(p.A().post_send(x.ini, r), 0);
  Sge at = p.sge(0, 200, 8);
  SendWr a = p.write_to(1, at, 8192, 3);
  a.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  a.compare_add = 5;
  a.xrc_srqn = x.srq[1]->srq_num();
  ASSERT_EQ(p.A().post_send(x.ini, a), 0);
  std::vector<ibv_wc> wa;
  ASSERT_TRUE(run_until(p, [&] {
    poll(p.A(), p.node[0].cq, wa);
    return wa.size() >= 3;
  }));
  for (const auto& c : wa) EXPECT_EQ(c.status, IBV_WC_SUCCESS) << c.wr_id;
  EXPECT_EQ(0, std::memcmp(&p.node[1].mem[4096], &p.node[0].mem[0], 8));
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[100], &p.node[0].mem[0], 8));
  std::uint64_t v = 0;
  std::memcpy(&v, &p.node[1].mem[8192], 8);
  EXPECT_EQ(v, 5u);
}

TEST(Xrc, AnSrqOutsideTheTargetsDomainIsAnInvalidRequest) {
  Pair p;
  const XrcSetup x = make(p);
  ASSERT_NE(x.tgt, nullptr);
  Xrcd* other = p.B().alloc_xrcd();
  Srq* foreign = p.B().create_srq(p.node[1].pd, 4, 1, nullptr, other, p.node[1].cq);
  ASSERT_NE(foreign, nullptr);
  Sge r = p.sge(1, 0, 64);
  ASSERT_EQ(p.B().post_srq_recv(foreign, RecvWr{1, {&r, 1}}), 0);
  Sge s = p.sge(0, 0, 1);
  SendWr wr;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&s, 1};
  wr.xrc_srqn = foreign->srq_num();
  ASSERT_EQ(p.A().post_send(x.ini, wr), 0);
  std::vector<ibv_wc> wa, wb;
  ASSERT_TRUE(run_until(p, [&] {
    poll(p.A(), p.node[0].cq, wa);
    return !wa.empty();
  }));
  EXPECT_EQ(wa[0].status, IBV_WC_REM_INV_REQ_ERR);
  poll(p.B(), p.node[1].cq, wb);
  EXPECT_TRUE(wb.empty());  // the foreign SRQ's receive is untouched
  EXPECT_EQ(foreign->depth(), 1u);
  // So is a number no SRQ has.
  EXPECT_EQ(p.B().destroy_srq(foreign), 0);
}

TEST(Xrc, RcPacketsToATargetAndXrcPacketsToAnRcQpAreDropped) {
  Pair p;
  const XrcSetup x = make(p);
  ASSERT_NE(x.tgt, nullptr);
  // A plain RC QP on A aimed at the XRC target.
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = p.node[0].cq;
  Qp* rc = p.A().create_qp(p.node[0].pd, ia);
  ASSERT_NE(rc, nullptr);
  bring_up(p.A(), rc, x.tgt, p.B().config().ip);
  const auto before = p.B().counters()[PortCounter::rx_wrong_transport];
  Sge s = p.sge(0, 0, 1);
  SendWr wr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = {&s, 1};
  wr.remote_addr = p.addr(1, 0);
  wr.rkey = p.rkey(1);
  ASSERT_EQ(p.A().post_send(rc, wr), 0);
  p.wire.run_idle(1'000'000);
  EXPECT_GT(p.B().counters()[PortCounter::rx_wrong_transport], before);
}

TEST(Xrc, ObjectsAreHeldWhileUsed) {
  Pair p;
  XrcSetup x = make(p);
  ASSERT_NE(x.tgt, nullptr);
  EXPECT_EQ(p.B().dealloc_xrcd(x.xrcd), EBUSY);  // its SRQs and target QP
  EXPECT_EQ(p.B().destroy_cq(x.cq2), EBUSY);     // srq[1]'s
  // A target QP names no PD, no CQ and no SRQ of its own: an XRC SRQ it
  // served goes when asked.
  Sge r = p.sge(1, 0, 64);
  ASSERT_EQ(p.B().post_srq_recv(x.srq[1], RecvWr{1, {&r, 1}}), 0);
  Sge s = p.sge(0, 0, 1);
  SendWr wr;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&s, 1};
  wr.xrc_srqn = x.srq[1]->srq_num();
  ASSERT_EQ(p.A().post_send(x.ini, wr), 0);
  std::vector<ibv_wc> w2;
  ASSERT_TRUE(run_until(p, [&] { return poll(p.B(), x.cq2, w2) > 0; }));
  EXPECT_EQ(p.B().destroy_srq(x.srq[1]), 0);
  EXPECT_EQ(p.B().destroy_cq(x.cq2), 0);
  EXPECT_EQ(p.B().destroy_srq(x.srq[0]), 0);
  EXPECT_EQ(p.B().dealloc_xrcd(x.xrcd), EBUSY);  // the target QP
  EXPECT_EQ(p.B().destroy_qp(x.tgt), 0);
  EXPECT_EQ(p.B().dealloc_xrcd(x.xrcd), 0);
  // Shapes that are not XRC's are refused.
  QpInitAttr bad;
  bad.qp_type = IBV_QPT_XRC_RECV;  // no domain
  EXPECT_EQ(p.B().create_qp(nullptr, bad), nullptr);
  bad.qp_type = IBV_QPT_XRC_SEND;  // no PD
  bad.send_cq = p.node[1].cq;
  EXPECT_EQ(p.B().create_qp(nullptr, bad), nullptr);
  Xrcd* d = p.B().alloc_xrcd();
  EXPECT_EQ(p.B().create_srq(p.node[1].pd, 4, 1, nullptr, d, nullptr), nullptr);  // an XRC SRQ has a CQ
  EXPECT_EQ(p.B().dealloc_xrcd(d), 0);
}

}  // namespace
}  // namespace uroce::testing
