// One encoder for every send entry (stack/abi/send_entry.h) and one decoder
// (the engine's): for every operation, a verbs work request (liburoce's
// path, and so the drop-ins') and the engine's own request become the same
// WQE, with each field where the operation needs it.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

#include "stack/abi/send_entry.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

struct RoundTrip : ::testing::Test {
  Pair p{3, 1 << 20};
  std::uint8_t data[64] = {};

  Qp* qp(ibv_qp_type type) {
    PairOptions o;
    o.type = type;
    o.cap.max_inline_data = 64;
    return p.connect(o).a;
  }
  /// liburoce's path: the verbs request through the encoder into the QP's
  /// ring, taken by the engine.
  SendWqe verbs(Qp* q, const ibv_send_wr& wr, const abi::SendAv* av = nullptr) {
    uroce_send_entry e;
    const char* why = abi::encode_send(wr, {q->type == IBV_QPT_UD, false}, av, e);
    EXPECT_EQ(why, nullptr) << why;
    EXPECT_TRUE(q->sq_ring.push(e));
    EXPECT_EQ(p.A().take_posts(q), 1u);
    return q->sq.at(q->sq.tail() - 1);
  }
  /// The engine's own path.
  SendWqe engine(Qp* q, const SendWr& wr) {
    EXPECT_EQ(p.A().post_send(q, wr), 0);
    return q->sq.at(q->sq.tail() - 1);
  }
  static void same_head(const SendWqe& a, const SendWqe& b) {
    EXPECT_EQ(a.wr_id, b.wr_id);
    EXPECT_EQ(a.opcode, b.opcode);
    EXPECT_EQ(a.flags, b.flags);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.length, b.length);
    EXPECT_EQ(a.nsge, b.nsge);
    EXPECT_FALSE(a.refused);
    EXPECT_FALSE(b.refused);
  }
};

TEST_F(RoundTrip, WriteWithImmediateAndSgesKeepAddressKeyImmediateAndData) {
  Qp* q = qp(IBV_QPT_RC);
  ibv_sge sg[2] = {{p.addr(0, 0), 100, p.node[0].mr->lkey}, {p.addr(0, 512), 28, p.node[0].mr->lkey}};
  ibv_send_wr wr{};
  wr.wr_id = 0x1234;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = sg;
  wr.num_sge = 2;
  wr.imm_data = htonl(0xa1b2c3d4);
  wr.wr.rdma = {p.addr(1, 4096), p.rkey(1)};
  const SendWqe a = verbs(q, wr);
  const Sge s2[2] = {{sg[0].addr, 100, sg[0].lkey}, {sg[1].addr, 28, sg[1].lkey}};
  SendWr w;
  w.wr_id = 0x1234;
  w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = s2;
  w.imm_data = 0xa1b2c3d4;
  w.remote_addr = p.addr(1, 4096);
  w.rkey = p.rkey(1);
  const SendWqe b = engine(q, w);
  same_head(a, b);
  for (const SendWqe* x : {&a, &b}) {
    EXPECT_EQ(x->remote_addr, p.addr(1, 4096));
    EXPECT_EQ(x->rkey, p.rkey(1));
    EXPECT_EQ(x->imm, 0xa1b2c3d4u) << "host order in the WQE";
    EXPECT_EQ(x->length, 128u);
    EXPECT_EQ(x->sge[1].addr, sg[1].addr);
    EXPECT_EQ(x->sge[1].lkey, sg[1].lkey);
  }
}

TEST_F(RoundTrip, AtomicsKeepCompareAndSwap) {
  Qp* q = qp(IBV_QPT_RC);
  for (ibv_wr_opcode op : {IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    ibv_sge sg{p.addr(0, 64), 8, p.node[0].mr->lkey};
    ibv_send_wr wr{};
    wr.opcode = op;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.wr.atomic = {p.addr(1, 8), 0x1111222233334444ull, 0x5555666677778888ull, p.rkey(1)};
    const SendWqe a = verbs(q, wr);
    const Sge s{sg.addr, 8, sg.lkey};
    SendWr w;
    w.opcode = op;
    w.sg_list = {&s, 1};
    w.remote_addr = p.addr(1, 8);
    w.rkey = p.rkey(1);
    w.compare_add = 0x1111222233334444ull;
    w.swap = 0x5555666677778888ull;
    const SendWqe b = engine(q, w);
    same_head(a, b);
    for (const SendWqe* x : {&a, &b}) {
      EXPECT_EQ(x->kind, WqeKind::kAtomic);
      EXPECT_EQ(x->remote_addr, p.addr(1, 8));
      EXPECT_EQ(x->rkey, p.rkey(1));
      EXPECT_EQ(x->compare_add, 0x1111222233334444ull);
      EXPECT_EQ(x->swap, 0x5555666677778888ull);
    }
  }
}

TEST_F(RoundTrip, ABindKeepsTheWindowItsNewKeyTheMrTheRangeAndTheAccess) {
  Qp* q = qp(IBV_QPT_RC);
  ibv_mw mw{};
  mw.rkey = 0x00abcd01;
  ibv_mr mr{};
  mr.lkey = 0x00123402;
  ibv_send_wr wr{};
  wr.wr_id = 9;
  wr.opcode = IBV_WR_BIND_MW;
  wr.bind_mw.mw = &mw;
  wr.bind_mw.rkey = 0x00abcd77;
  wr.bind_mw.bind_info = {&mr, 0x7000, 0x900, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE};
  const SendWqe a = verbs(q, wr);
  SendWr w;
  w.wr_id = 9;
  w.opcode = IBV_WR_BIND_MW;
  w.bind_mw_rkey = 0x00abcd01;
  w.bind_new_rkey = 0x00abcd77;
  w.bind_mr_lkey = 0x00123402;
  w.bind_addr = 0x7000;
  w.bind_length = 0x900;
  w.bind_access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  const SendWqe b = engine(q, w);
  same_head(a, b);
  for (const SendWqe* x : {&a, &b}) {
    EXPECT_EQ(x->kind, WqeKind::kLocal);
    EXPECT_EQ(x->bind.mw_rkey, 0x00abcd01u);
    EXPECT_EQ(x->bind.new_rkey, 0x00abcd77u);
    EXPECT_EQ(x->bind.mr_lkey, 0x00123402u);
    EXPECT_EQ(x->bind.addr, 0x7000u);
    EXPECT_EQ(x->bind.length, 0x900u);
    EXPECT_EQ(x->bind.access, unsigned{IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE});
  }
}

TEST_F(RoundTrip, LocalInvalidateSendWithInvalidateAndFlushKeepTheirKeysAndFields) {
  Qp* q = qp(IBV_QPT_RC);
  ibv_send_wr inv{};
  inv.opcode = IBV_WR_LOCAL_INV;
  inv.invalidate_rkey = 0x00777701;
  const SendWqe a = verbs(q, inv);
  SendWr w;
  w.opcode = IBV_WR_LOCAL_INV;
  w.invalidate_rkey = 0x00777701;
  const SendWqe b = engine(q, w);
  same_head(a, b);
  EXPECT_EQ(a.invalidate_rkey, 0x00777701u);
  EXPECT_EQ(b.invalidate_rkey, 0x00777701u);

  ibv_sge sg{p.addr(0, 0), 16, p.node[0].mr->lkey};
  ibv_send_wr sinv{};
  sinv.opcode = IBV_WR_SEND_WITH_INV;
  sinv.sg_list = &sg;
  sinv.num_sge = 1;
  sinv.invalidate_rkey = 0x00888802;
  const SendWqe c = verbs(q, sinv);
  const Sge s{sg.addr, 16, sg.lkey};
  SendWr ws;
  ws.opcode = IBV_WR_SEND_WITH_INV;
  ws.sg_list = {&s, 1};
  ws.invalidate_rkey = 0x00888802;
  const SendWqe d = engine(q, ws);
  same_head(c, d);
  EXPECT_EQ(c.invalidate_rkey, 0x00888802u);
  EXPECT_EQ(d.invalidate_rkey, 0x00888802u);

  ibv_send_wr fl{};
  fl.opcode = static_cast<ibv_wr_opcode>(UROCE_WR_FLUSH);
  fl.wr.atomic = {p.addr(1, 256), 4096, UROCE_FLUSH_GLOBAL | (UROCE_FLUSH_RANGE << 4), p.rkey(1)};
  const SendWqe e = verbs(q, fl);
  SendWr wf;
  wf.opcode = static_cast<ibv_wr_opcode>(UROCE_WR_FLUSH);
  wf.remote_addr = p.addr(1, 256);
  wf.rkey = p.rkey(1);
  wf.compare_add = 4096;
  wf.imm_data = UROCE_FLUSH_GLOBAL | (UROCE_FLUSH_RANGE << 4);
  const SendWqe f = engine(q, wf);
  same_head(e, f);
  for (const SendWqe* x : {&e, &f}) {
    EXPECT_EQ(x->remote_addr, p.addr(1, 256));
    EXPECT_EQ(x->rkey, p.rkey(1));
    EXPECT_EQ(x->compare_add, 4096u) << "FLUSH's length";
    EXPECT_EQ(x->imm, UROCE_FLUSH_GLOBAL);
  }
}

TEST_F(RoundTrip, InlineDataIsCopiedWhole) {
  Qp* q = qp(IBV_QPT_RC);
  for (int i = 0; i < 64; ++i) data[i] = static_cast<std::uint8_t>(i * 7 + 1);
  ibv_sge sg[2] = {{reinterpret_cast<std::uint64_t>(data), 40, 0}, {reinterpret_cast<std::uint64_t>(data + 40), 24, 0}};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE;
  wr.sg_list = sg;
  wr.num_sge = 2;
  const SendWqe a = verbs(q, wr);
  const Sge s[2] = {{sg[0].addr, 40, 0}, {sg[1].addr, 24, 0}};
  SendWr w;
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_INLINE;
  w.sg_list = s;
  const SendWqe b = engine(q, w);
  same_head(a, b);
  for (const SendWqe* x : {&a, &b}) {
    EXPECT_TRUE(x->is_inline);
    EXPECT_EQ(x->length, 64u);
    EXPECT_EQ(0, std::memcmp(x->inline_data, data, 64));
  }
  // Over 64 bytes: refused by the encoder, with the reason.
  sg[1].length = 25;
  uroce_send_entry e;
  EXPECT_STREQ(abi::encode_send(wr, {}, nullptr, e), "inline data over 64 bytes (max_inline_data)");
}

TEST_F(RoundTrip, AUdSendKeepsItsAddressVectorQpAndQKey) {
  Qp* q = qp(IBV_QPT_UD);
  Ah ah;
  ah.dgid = p.B().config().ip;
  ah.dmac = p.B().config().mac;
  ah.traffic_class = 0x68;
  ibv_sge sg{p.addr(0, 0), 32, p.node[0].mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.imm_data = htonl(77);
  wr.wr.ud.remote_qpn = 0x4321;
  wr.wr.ud.remote_qkey = 0x11111111;
  const abi::SendAv av{ah.dgid.b.data(), ah.dmac.data(), ah.traffic_class};
  const SendWqe a = verbs(q, wr, &av);
  const Sge s{sg.addr, 32, sg.lkey};
  SendWr w;
  w.opcode = IBV_WR_SEND_WITH_IMM;
  w.sg_list = {&s, 1};
  w.imm_data = 77;
  w.ah = &ah;
  w.remote_qpn = 0x4321;
  w.remote_qkey = 0x11111111;
  const SendWqe b = engine(q, w);
  same_head(a, b);
  for (const SendWqe* x : {&a, &b}) {
    EXPECT_EQ(x->ah.dgid, ah.dgid);
    EXPECT_EQ(x->ah.dmac, ah.dmac);
    EXPECT_EQ(x->ah.traffic_class, 0x68);
    EXPECT_EQ(x->remote_qpn, 0x4321u);
    EXPECT_EQ(x->remote_qkey, 0x11111111u);
    EXPECT_EQ(x->imm, 77u);
  }
  uroce_send_entry e;
  EXPECT_STREQ(abi::encode_send(wr, {true, false}, nullptr, e), "a UD send needs an address handle from ibv_create_ah");
}

TEST_F(RoundTrip, AnXrcSendCarriesItsSrqNumberInEveryLayoutThatHasOne) {
  ibv_sge sg{0x1000, 8, 1};
  for (ibv_wr_opcode op : {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    ibv_send_wr wr{};
    wr.opcode = op;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.qp_type.xrc.remote_srqn = 0x00beef;
    uroce_send_entry e;
    ASSERT_EQ(abi::encode_send(wr, {false, true}, nullptr, e), nullptr);
    EXPECT_EQ(e.op.rdma.xrc_srqn, 0x00beefu);
    EXPECT_EQ(e.op.atomic.xrc_srqn, 0x00beefu);
    EXPECT_EQ(abi::encode_send(wr, {false, false}, nullptr, e), nullptr);
    EXPECT_EQ(e.op.rdma.xrc_srqn, 0u) << "only an XRC send QP's entries carry one";
  }
}

TEST_F(RoundTrip, TooManySgesOrABindWithoutAWindowAreRefusedWithTheReason) {
  ibv_sge sg[5] = {};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = sg;
  wr.num_sge = 5;
  uroce_send_entry e;
  EXPECT_STREQ(abi::encode_send(wr, {}, nullptr, e), "too many SGEs");
  wr.num_sge = 0;
  wr.opcode = IBV_WR_BIND_MW;
  EXPECT_STREQ(abi::encode_send(wr, {}, nullptr, e), "a bind names no memory window");
}

}  // namespace
}  // namespace uroce::testing
