// Tag matching (uroce_abi.h): a tag-matching SRQ's list, its operations,
// and the messages that reach it over the simulated wire: an EAGER one
// that matches lands after its TMH in the tag's buffer, one that matches
// nothing takes a receive whole and stops matching until the application
// syncs, NO_TAG takes a receive, DEL takes a tag out, and a RNDV one has
// the engine READ the data from the sender and then SEND it a FIN.
#include <gtest/gtest.h>
#include <infiniband/tm_types.h>

#include <cstring>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

constexpr std::uint32_t kTags = 8;

struct TmRig {
  Pair p;
  Cq* cq = nullptr;  // B's: the SRQ's operations and its QP's receives
  Srq* srq = nullptr;
  abi::HeapRing<uroce_tm_op> ops{8, UROCE_RING_TM_OPS, 0};
  std::vector<std::uint32_t> released = std::vector<std::uint32_t>(kTags, 0);
  std::vector<std::uint32_t> gen = std::vector<std::uint32_t>(kTags, 0);
  Qp* a = nullptr;
  Qp* b = nullptr;

  TmRig() {
    cq = p.B().create_cq(256);
    srq = p.B().create_srq(p.node[1].pd, 16, 1);
    if (!cq || !srq || !p.B().make_tm(srq, cq, kTags, ops.ring(), released.data())) std::abort();
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = p.node[0].cq;
    ia.cap.max_recv_wr = 4;
    a = p.A().create_qp(p.node[0].pd, ia);
    ia.send_cq = ia.recv_cq = cq;
    ia.srq = srq;
    ia.cap = QpCap{1, 0, 0, 0, 0};  // no SGEs: the rendezvous READs are the engine's
    b = p.B().create_qp(p.node[1].pd, ia);
    if (!a || !b) std::abort();
    up(p.A(), a, b, p.B().config().ip);
    up(p.B(), b, a, p.A().config().ip);
  }
  static void up(Engine& e, Qp* me, Qp* peer, const wire::IpAddr& ip) {
    abi::Connect k;
    k.dest_qp_num = peer->qpn;
    std::memcpy(k.dgid.raw, ip.b.data(), 16);
    k.timeout = 8;
    k.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (!e.bring_up(me, k)) std::abort();
  }
  /// Posts one operation and has the engine take it, as the daemon does
  /// when the session's posts word moves.
  void op(uroce_tm_op o) {
    o.flags |= IBV_OPS_SIGNALED;
    ASSERT_TRUE(ops.ring().push(o));
    EXPECT_EQ(p.B().run_tm_ops(*srq), 1u);
  }
  /// ADD: the first index the engine released, as liburoce picks it.
  std::uint32_t add(std::uint64_t tag, std::uint64_t recv_wr_id, std::uint64_t off, std::uint32_t len,
                    std::uint32_t unexpected = 0, bool sync = false) {
    std::uint32_t i = 0;
    while (i < kTags && released[i] != gen[i]) ++i;
    if (i == kTags) std::abort();
    uroce_tm_op o{};
    o.wr_id = 1000 + i;
    o.opcode = IBV_WR_TAG_ADD;
    o.flags = sync ? IBV_OPS_TM_SYNC : 0;
    o.handle = i;
    o.gen = ++gen[i];
    o.tag = tag;
    o.mask = 0xffff;
    o.recv_wr_id = recv_wr_id;
    o.unexpected_cnt = unexpected;
    o.num_sge = 1;
    o.sge = {p.addr(1, off), len, p.node[1].mr->lkey};
    op(o);
    return i;
  }
  /// A message from A at A's offset `off`: a TMH, and `body` bytes after
  /// it (those of `content`, or 'e').
  void send_tagged(std::uint8_t tmh_op, std::uint64_t tag, std::uint32_t body, const std::uint8_t* content = nullptr,
                   std::uint64_t off = 0) {
    std::uint8_t* m = p.node[0].mem.data() + off;
    std::memset(m, 0, UROCE_TMH_BYTES);
    m[0] = tmh_op;
    m[4] = 0xc0, m[7] = 0x7e;  // app_ctx 0xc000007e
    for (int i = 0; i < 8; ++i) m[8 + i] = static_cast<std::uint8_t>(tag >> (56 - 8 * i));
    if (content)
      std::memcpy(m + UROCE_TMH_BYTES, content, body);
    else
      std::memset(m + UROCE_TMH_BYTES, 'e', body);
    Sge s = p.sge(0, off, UROCE_TMH_BYTES + body);
    SendWr wr;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = {&s, 1};
    ASSERT_EQ(p.A().post_send(a, wr), 0);
  }
  /// B's next completion (raw: a tag is in src_qp and tag_hi).
  bool next(uroce_cq_entry& e) {
    return p.wire.run_until([&] { return cq->ring().pop(e); }, 1'000'000'000);
  }
};

std::uint64_t tag_of(const uroce_cq_entry& e) { return std::uint64_t{e.tag_hi} << 32 | e.src_qp; }

TEST(TagMatching, EagerUnexpectedSyncNoTagAndDel) {
  TmRig r;
  uroce_cq_entry e;
  // ADD: its completion, in sync.
  const std::uint32_t h = r.add(5, 50, 1000, 64);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.opcode, IBV_WC_TM_ADD);
  EXPECT_EQ(e.status, IBV_WC_SUCCESS);
  EXPECT_EQ(e.wr_id, 1000 + h);
  EXPECT_EQ(e.wc_flags & IBV_WC_TM_SYNC_REQ, 0u);
  for (std::uint64_t k = 0; k < 3; ++k) {
    Sge rk = r.p.sge(1, 2000 + 200 * k, 128);
    ASSERT_EQ(r.p.B().post_srq_recv(r.srq, RecvWr{70 + k, {&rk, 1}}), 0);
  }

  // EAGER, matched: what follows the TMH, at the start of the tag's buffer.
  r.send_tagged(IBV_TMH_EAGER, 5, 40);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.status, IBV_WC_SUCCESS);
  EXPECT_EQ(e.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(e.wr_id, 50u);
  EXPECT_EQ(e.wc_flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(e.byte_len, 40u);
  EXPECT_EQ(tag_of(e), 5u);
  EXPECT_EQ(e.vendor_err, 0xc000007eu);  // the TMH's app_ctx
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.p.node[1].mem.data() + 1000), 40), std::string(40, 'e'));
  EXPECT_EQ(r.p.node[1].mem[1040], 0);
  EXPECT_EQ(r.released[h], r.gen[h]);  // the tag left the list: its index is free again

  // EAGER that matches nothing: a receive takes it whole, TMH and all.
  r.send_tagged(IBV_TMH_EAGER, 9, 40);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(e.wr_id, 70u);
  EXPECT_EQ(e.wc_flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), 0u);
  EXPECT_EQ(e.byte_len, 56u);
  EXPECT_EQ(r.p.node[1].mem[2000], IBV_TMH_EAGER);
  EXPECT_EQ(r.p.node[1].mem[2000 + 15], 9);

  // Out of sync now: an ADD says so, and nothing matches until a SYNC.
  const std::uint32_t h9 = r.add(9, 90, 1000, 64);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.opcode, IBV_WC_TM_ADD);
  EXPECT_NE(e.wc_flags & IBV_WC_TM_SYNC_REQ, 0u);
  r.send_tagged(IBV_TMH_EAGER, 9, 8);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.wr_id, 71u) << "matched while out of sync";
  EXPECT_EQ(e.wc_flags & IBV_WC_TM_MATCH, 0u);
  uroce_tm_op sync{};
  sync.wr_id = 27;
  sync.opcode = IBV_WR_TAG_SYNC;
  sync.unexpected_cnt = 2;
  r.op(sync);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.opcode, IBV_WC_TM_SYNC);
  EXPECT_EQ(e.wr_id, 27u);
  EXPECT_EQ(e.wc_flags & IBV_WC_TM_SYNC_REQ, 0u);

  // NO_TAG: a receive, and it does not count as unexpected.
  r.send_tagged(IBV_TMH_NO_TAG, 9, 8);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.opcode, IBV_WC_TM_NO_TAG);
  EXPECT_EQ(e.wr_id, 72u);
  // In sync again: the tag added while out of sync matches.
  r.send_tagged(IBV_TMH_EAGER, 9, 8);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(e.wr_id, 90u);
  EXPECT_NE(e.wc_flags & IBV_WC_TM_MATCH, 0u);
  EXPECT_EQ(tag_of(e), 9u);
  EXPECT_EQ(r.released[h9], r.gen[h9]);

  // DEL: the tag leaves the list; a second DEL of it is an error.
  const std::uint32_t h7 = r.add(7, 77, 1000, 64);
  ASSERT_TRUE(r.next(e));
  uroce_tm_op del{};
  del.wr_id = 31;
  del.opcode = IBV_WR_TAG_DEL;
  del.handle = h7;
  del.gen = r.gen[h7];
  r.op(del);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.opcode, IBV_WC_TM_DEL);
  EXPECT_EQ(e.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.released[h7], r.gen[h7]);
  r.op(del);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.opcode, IBV_WC_TM_DEL);
  EXPECT_EQ(e.status, IBV_WC_TM_ERR);
}

TEST(TagMatching, RendezvousReadsTheDataThenSendsAFin) {
  TmRig r;
  uroce_cq_entry e;
  const std::uint32_t h = r.add(11, 80, 4000, 8192);
  ASSERT_TRUE(r.next(e));
  // The sender's data, 5000 bytes (several packets), and a receive for the FIN.
  for (std::size_t i = 0; i < 5000; ++i) r.p.node[0].mem[20000 + i] = static_cast<std::uint8_t>(i * 7 + 3);
  Sge fin = r.p.sge(0, 9000, 64);
  ASSERT_EQ(r.p.A().post_recv(r.a, RecvWr{55, {&fin, 1}}), 0);
  // The TMH (RNDV, tag 11), then the RVH: where the data is, its key and length.
  std::uint8_t rvh[UROCE_RVH_BYTES]{};
  const std::uint64_t va = r.p.addr(0, 20000);
  const std::uint32_t rkey = r.p.node[0].mr->rkey, len = 5000;
  for (int i = 0; i < 8; ++i) rvh[i] = static_cast<std::uint8_t>(va >> (56 - 8 * i));
  for (int i = 0; i < 4; ++i) rvh[8 + i] = static_cast<std::uint8_t>(rkey >> (24 - 8 * i));
  for (int i = 0; i < 4; ++i) rvh[12 + i] = static_cast<std::uint8_t>(len >> (24 - 8 * i));
  r.send_tagged(IBV_TMH_RNDV, 11, UROCE_RVH_BYTES, rvh);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.status, IBV_WC_SUCCESS);
  EXPECT_EQ(e.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(e.wr_id, 80u);
  EXPECT_EQ(e.wc_flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(tag_of(e), 11u);
  ASSERT_TRUE(r.next(e));
  EXPECT_EQ(e.status, IBV_WC_SUCCESS);
  EXPECT_EQ(e.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(e.wr_id, 80u);
  EXPECT_EQ(e.wc_flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(e.byte_len, 5000u);
  EXPECT_EQ(std::memcmp(r.p.node[1].mem.data() + 4000, r.p.node[0].mem.data() + 20000, 5000), 0);
  EXPECT_EQ(r.p.node[1].mem[4000 + 5000], 0);
  EXPECT_EQ(r.released[h], r.gen[h]);
  // The sender hears of it: a FIN (a TMH alone) in its receive.
  std::vector<ibv_wc> wa;
  ASSERT_TRUE(r.p.wire.run_until(
      [&] {
        r.p.poll(0, wa);
        return !wa.empty();  // the FIN's (its SEND was not signaled)
      },
      1'000'000'000));
  bool got_fin = false;
  for (const auto& w : wa) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    if (w.opcode == IBV_WC_RECV) {
      got_fin = true;
      EXPECT_EQ(w.wr_id, 55u);
      EXPECT_EQ(w.byte_len, unsigned{UROCE_TMH_BYTES});
    }
  }
  EXPECT_TRUE(got_fin);
  EXPECT_EQ(r.p.node[0].mem[9000], IBV_TMH_FIN);
  EXPECT_EQ(r.p.node[0].mem[9000 + 15], 11);
  // The engine's own WQEs are gone, and none of them completed into B's CQ.
  EXPECT_TRUE(r.p.wire.run_until([&] { return r.b->sq.empty(); }, 1'000'000'000));
  EXPECT_EQ(r.b->sq_internal_in, r.b->sq_internal_out);
  EXPECT_FALSE(r.cq->ring().pop(e));
}

}  // namespace
}  // namespace uroce::testing
