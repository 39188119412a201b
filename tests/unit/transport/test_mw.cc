// Memory windows (IBTA 10.6.7), type 1 and type 2B, over the simulated wire:
// node B allocates and binds windows over an MR of its own through its QP,
// and node A reaches B's memory through the windows' R_Keys. Every access is
// checked against the bytes, every refusal against the completion verbs
// names for it.
#include <gtest/gtest.h>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

constexpr std::uint64_t kMrOff = 1u << 20;  // B's MR for windows, inside B's node memory
constexpr std::uint32_t kMrLen = 64 * 1024;

std::uint32_t inc_rkey(std::uint32_t k) { return (k & ~0xffu) | ((k + 1) & 0xffu); }  // as ibv_inc_rkey

class Mw : public ::testing::Test {
 protected:
  void SetUp() override {
    q = p.connect();
    mr = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + kMrOff, kMrLen,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
    ASSERT_NE(mr, nullptr);
  }
  std::uint64_t b_addr(std::uint64_t off) { return p.addr(1, kMrOff + off); }

  /// The next completion of node i (false if none came).
  bool next_wc(int i, ibv_wc& out) {
    std::vector<ibv_wc> w;
    if (!p.wire.run_until([&] { return p.poll(i, w, 1) > 0 || !w.empty(); }, 100'000'000)) return false;
    out = w[0];
    return true;
  }
  /// A signalled bind of `mw` over [off, off+len) of B's MR (or `over`),
  /// to the next key byte.
  SendWr bind_wr(Mr* mw, std::uint64_t off, std::uint64_t len, unsigned access, std::uint64_t wr_id = 77,
                 Mr* over = nullptr) {
    SendWr w;
    w.wr_id = wr_id;
    w.opcode = IBV_WR_BIND_MW;
    w.send_flags = IBV_SEND_SIGNALED;
    w.bind_mw_rkey = mw->rkey;
    w.bind_new_rkey = inc_rkey(mw->rkey);
    w.bind_mr_lkey = (over ? over : mr)->lkey;
    w.bind_addr = b_addr(off);
    w.bind_length = len;
    w.bind_access = access;
    return w;
  }
  /// B posts `w` on `qp`; its completion.
  ibv_wc post_b(Qp* qp, const SendWr& w) {
    EXPECT_EQ(p.B().post_send(qp, w), 0);
    ibv_wc wc{};
    EXPECT_TRUE(next_wc(1, wc));
    EXPECT_EQ(wc.wr_id, w.wr_id);
    return wc;
  }
  /// B invalidates `key` locally through `qp`; the completion.
  ibv_wc local_inv(Qp* qp, std::uint32_t key) {
    SendWr inv;
    inv.wr_id = 90;
    inv.opcode = IBV_WR_LOCAL_INV;
    inv.send_flags = IBV_SEND_SIGNALED;
    inv.invalidate_rkey = key;
    return post_b(qp, inv);
  }
  /// B binds `mw` through `qp` as `b` asks (new R_Key: the next key byte);
  /// returns the completion's status, and the new R_Key in `rkey`.
  ibv_wc_status bind(Qp* qp, Mr* mw, std::uint64_t off, std::uint64_t len, unsigned access, std::uint32_t& rkey,
                     Mr* over = nullptr) {
    const SendWr w = bind_wr(mw, off, len, access, 77, over);
    EXPECT_EQ(p.B().post_send(qp, w), 0);
    ibv_wc wc{};
    EXPECT_TRUE(next_wc(1, wc));
    EXPECT_EQ(wc.wr_id, 77u);
    if (wc.status == IBV_WC_SUCCESS) {
      EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
    }
    rkey = w.bind_new_rkey;
    return wc.status;
  }
  /// A WRITEs `len` bytes of a pattern to `va` with `rkey` through `qp`;
  /// returns A's completion status.
  ibv_wc_status write(Qp* qp, std::uint64_t va, std::uint32_t rkey, std::uint32_t len, std::uint8_t seed) {
    for (std::uint32_t i = 0; i < len; ++i) p.node[0].mem[i] = static_cast<std::uint8_t>(seed + i * 13);
    Sge s = p.sge(0, 0, len);
    SendWr w;
    w.wr_id = 5;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = {&s, 1};
    w.remote_addr = va;
    w.rkey = rkey;
    EXPECT_EQ(p.A().post_send(qp, w), 0);
    ibv_wc wc{};
    EXPECT_TRUE(next_wc(0, wc));
    return wc.status;
  }
  bool landed(std::uint64_t b_off, std::uint32_t len, std::uint8_t seed) {
    for (std::uint32_t i = 0; i < len; ++i)
      if (p.node[1].mem[kMrOff + b_off + i] != static_cast<std::uint8_t>(seed + i * 13)) return false;
    return true;
  }
  /// A fresh connected pair of QPs (after one went to ERR).
  void reconnect() { q = p.connect(); }

  Pair p;
  QpPair q;
  Mr* mr = nullptr;
};

TEST_F(Mw, Type1WriteAndReadThroughTheWindowOnly) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  std::uint32_t k = 0;
  ASSERT_EQ(bind(q.b, mw, 4096, 8192, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, k), IBV_WC_SUCCESS);
  EXPECT_NE(k, mr->rkey);
  ASSERT_EQ(write(q.a, b_addr(4096), k, 8192, 3), IBV_WC_SUCCESS);
  EXPECT_TRUE(landed(4096, 8192, 3));
  // READ back through the window.
  Sge s = p.sge(0, 100000, 8192);
  SendWr r;
  r.wr_id = 6;
  r.opcode = IBV_WR_RDMA_READ;
  r.send_flags = IBV_SEND_SIGNALED;
  r.sg_list = {&s, 1};
  r.remote_addr = b_addr(4096);
  r.rkey = k;
  ASSERT_EQ(p.A().post_send(q.a, r), 0);
  ibv_wc wc{};
  ASSERT_TRUE(next_wc(0, wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[100000], &p.node[1].mem[kMrOff + 4096], 8192));
  // One byte past the window (still inside the MR): a remote access error.
  EXPECT_EQ(write(q.a, b_addr(4096 + 8192 - 8), k, 16, 9), IBV_WC_REM_ACCESS_ERR);
  EXPECT_TRUE(landed(4096, 8192 - 8, 3));  // nothing of it was written
}

TEST_F(Mw, Type1RebindRetiresTheOldKeyAndUnbindRetiresAll) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_1);
  std::uint32_t k1 = 0, k2 = 0, k3 = 0;
  ASSERT_EQ(bind(q.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k1), IBV_WC_SUCCESS);
  ASSERT_EQ(bind(q.b, mw, 8192, 4096, IBV_ACCESS_REMOTE_WRITE, k2), IBV_WC_SUCCESS);
  EXPECT_NE(k1, k2);
  ASSERT_EQ(write(q.a, b_addr(8192), k2, 4096, 1), IBV_WC_SUCCESS);
  EXPECT_TRUE(landed(8192, 4096, 1));
  EXPECT_EQ(write(q.a, b_addr(0), k1, 64, 2), IBV_WC_REM_ACCESS_ERR);
  reconnect();
  // Unbind (type 1: no MR, length 0): the window reaches nothing.
  SendWr w = bind_wr(mw, 0, 0, 0, 78);
  w.bind_mr_lkey = 0;
  w.bind_addr = 0;
  k3 = w.bind_new_rkey;
  EXPECT_EQ(post_b(q.b, w).status, IBV_WC_SUCCESS);
  EXPECT_EQ(mr->mw_bound, 0u);
  EXPECT_EQ(write(q.a, b_addr(8192), k3, 64, 2), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Mw, Type2ServesOnlyTheQpItWasBoundThrough) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_2);
  std::uint32_t k = 0;
  ASSERT_EQ(bind(q.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k), IBV_WC_SUCCESS);
  ASSERT_EQ(write(q.a, b_addr(0), k, 4096, 4), IBV_WC_SUCCESS);
  EXPECT_TRUE(landed(0, 4096, 4));
  const QpPair other = p.connect();
  EXPECT_EQ(write(other.a, b_addr(0), k, 64, 5), IBV_WC_REM_ACCESS_ERR);
  EXPECT_TRUE(landed(0, 4096, 4));
  // A bound type 2 window is not bound again before it is invalidated.
  std::uint32_t k2 = 0;
  EXPECT_EQ(bind(q.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k2), IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  // Its QP destroyed, it comes unbound, and binds again through another.
  EXPECT_EQ(mr->mw_bound, 1u);
  EXPECT_EQ(p.B().destroy_qp(q.b), 0);
  EXPECT_EQ(mr->mw_bound, 0u);
  const QpPair third = p.connect();  // (`other` met a remote access error: ERR)
  std::uint32_t k3 = 0;
  ASSERT_EQ(bind(third.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k3), IBV_WC_SUCCESS);
  ASSERT_EQ(write(third.a, b_addr(0), k3, 4096, 6), IBV_WC_SUCCESS);
  EXPECT_TRUE(landed(0, 4096, 6));
}

TEST_F(Mw, Type2LocalInvalidateThenBindAgain) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_2);
  std::uint32_t k = 0;
  ASSERT_EQ(bind(q.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k), IBV_WC_SUCCESS);
  const ibv_wc wc = local_inv(q.b, k);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_LOCAL_INV);
  EXPECT_EQ(mr->mw_bound, 0u);
  EXPECT_EQ(write(q.a, b_addr(0), k, 64, 6), IBV_WC_REM_ACCESS_ERR);
  reconnect();
  std::uint32_t k2 = 0;
  ASSERT_EQ(bind(q.b, mw, 4096, 4096, IBV_ACCESS_REMOTE_WRITE, k2), IBV_WC_SUCCESS);
  ASSERT_EQ(write(q.a, b_addr(4096), k2, 4096, 7), IBV_WC_SUCCESS);
  EXPECT_TRUE(landed(4096, 4096, 7));
}

TEST_F(Mw, Type2RemoteInvalidateBySendWithInv) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_2);
  std::uint32_t k = 0;
  ASSERT_EQ(bind(q.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k), IBV_WC_SUCCESS);
  Sge rs = p.sge(1, 0, 256);
  ASSERT_EQ(p.B().post_recv(q.b, RecvWr{31, {&rs, 1}}), 0);
  Sge ss = p.sge(0, 0, 64);
  SendWr s;
  s.wr_id = 30;
  s.opcode = IBV_WR_SEND_WITH_INV;
  s.send_flags = IBV_SEND_SIGNALED;
  s.sg_list = {&ss, 1};
  s.invalidate_rkey = k;
  ASSERT_EQ(p.A().post_send(q.a, s), 0);
  ibv_wc wb{}, wa{};
  ASSERT_TRUE(next_wc(1, wb));
  ASSERT_TRUE(next_wc(0, wa));
  EXPECT_EQ(wa.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb.status, IBV_WC_SUCCESS);
  EXPECT_TRUE(wb.wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(wb.invalidated_rkey, k);
  EXPECT_EQ(mr->mw_bound, 0u);
  EXPECT_EQ(write(q.a, b_addr(0), k, 64, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Mw, Type1IsNotInvalidated) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_1);
  std::uint32_t k = 0;
  ASSERT_EQ(bind(q.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k), IBV_WC_SUCCESS);
  EXPECT_EQ(local_inv(q.b, k).status, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(q.b->state, IBV_QPS_ERR);
  EXPECT_EQ(mr->mw_bound, 1u);  // still bound
}

TEST_F(Mw, ZeroBasedType2) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_2);
  std::uint32_t k = 0;
  ASSERT_EQ(bind(q.b, mw, 12288, 4096, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED, k), IBV_WC_SUCCESS);
  ASSERT_EQ(write(q.a, 1024, k, 2048, 9), IBV_WC_SUCCESS);  // offset 1024 into the window
  EXPECT_TRUE(landed(12288 + 1024, 2048, 9));
  EXPECT_EQ(write(q.a, 4096 - 8, k, 16, 9), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Mw, BindRulesEachRefused) {
  Mr* plain = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + kMrOff, kMrLen,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);  // no MW_BIND
  Mr* ro = p.B().reg_mr(p.node[1].pd, p.node[1].mem.data() + kMrOff, kMrLen, IBV_ACCESS_MW_BIND);  // no LOCAL_WRITE
  Pd* other_pd = p.B().alloc_pd();
  Mr* foreign = p.B().alloc_mw(other_pd, IBV_MW_TYPE_1);
  struct Case {
    const char* what;
    unsigned type;
    std::uint64_t off, len;
    unsigned access;
    Mr* over;
  } cases[] = {
      {"the MR lacks MW_BIND", IBV_MW_TYPE_1, 0, 4096, IBV_ACCESS_REMOTE_READ, plain},
      {"remote write needs the MR's local write", IBV_MW_TYPE_1, 0, 4096, IBV_ACCESS_REMOTE_WRITE, ro},
      {"beyond the MR", IBV_MW_TYPE_2, kMrLen - 4096, 8192, IBV_ACCESS_REMOTE_READ, nullptr},
      {"type 1 is never zero based", IBV_MW_TYPE_1, 0, 4096, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED, nullptr},
      {"a type 2 window binds a range, not nothing", IBV_MW_TYPE_2, 0, 0, IBV_ACCESS_REMOTE_READ, nullptr},
      {"an unknown right", IBV_MW_TYPE_2, 0, 4096, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND, nullptr},
      {"another PD's window", 0, 0, 4096, IBV_ACCESS_REMOTE_READ, nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    reconnect();
    Mr* mw = c.type ? p.B().alloc_mw(p.node[1].pd, c.type) : foreign;
    ASSERT_NE(mw, nullptr);
    const std::uint32_t before = mw->rkey;
    std::uint32_t k = 0;
    EXPECT_EQ(bind(q.b, mw, c.off, c.len, c.access, k, c.over), IBV_WC_MW_BIND_ERR);
    EXPECT_EQ(q.b->state, IBV_QPS_ERR);
    EXPECT_EQ(mw->rkey, before);  // unchanged
    const QpPair o = p.connect();  // (B's end of q is in ERR now, and drops requests)
    EXPECT_EQ(write(o.a, b_addr(c.off), k, 64, 1), IBV_WC_REM_ACCESS_ERR);
  }
  // Local rights beside remote ones are ignored, as rxe ignores them: the
  // window takes the remote ones.
  {
    reconnect();
    Mr* w1 = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_1);
    std::uint32_t k = 0;
    ASSERT_EQ(bind(q.b, w1, 0, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, k), IBV_WC_SUCCESS);
    EXPECT_EQ(w1->access, static_cast<unsigned>(IBV_ACCESS_REMOTE_WRITE));
    EXPECT_EQ(p.B().dealloc_mw(w1), 0);
  }
  // A new R_Key naming another slot.
  reconnect();
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_2);
  SendWr w = bind_wr(mw, 0, 64, IBV_ACCESS_REMOTE_WRITE, 79);
  w.bind_new_rkey = mw->rkey + 0x100;
  EXPECT_EQ(post_b(q.b, w).status, IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(mr->mw_bound, 0u);
  // A bind on a UD QP is malformed.
  PairOptions ud;
  ud.type = IBV_QPT_UD;
  const QpPair u = p.connect(ud);
  w.bind_new_rkey = inc_rkey(mw->rkey);
  EXPECT_EQ(p.B().post_send(u.b, w), EINVAL);
}

TEST_F(Mw, MrStaysWhileWindowsAreBound) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_1);
  std::uint32_t k = 0;
  ASSERT_EQ(bind(q.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k), IBV_WC_SUCCESS);
  EXPECT_EQ(p.B().dereg_mr(mr), EBUSY);
  EXPECT_EQ(p.B().dealloc_pd(p.node[1].pd), EBUSY);
  EXPECT_EQ(p.B().dereg_mr(mw), EINVAL);    // a window is not an MR
  EXPECT_EQ(p.B().dealloc_mw(mr), EINVAL);  // nor an MR a window
  EXPECT_EQ(p.B().dealloc_mw(mw), 0);       // unbinds it
  EXPECT_EQ(mr->mw_bound, 0u);
  EXPECT_EQ(write(q.a, b_addr(0), k, 64, 1), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(p.B().dereg_mr(mr), 0);
}

TEST_F(Mw, MrIsNotReregisteredWhileWindowsAreBound) {
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_1);
  std::uint32_t k = 0;
  ASSERT_EQ(bind(q.b, mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, k), IBV_WC_SUCCESS);
  const unsigned access = mr->access;
  EXPECT_EQ(p.B().rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, IBV_ACCESS_LOCAL_WRITE, nullptr, 0, 0), EBUSY);
  EXPECT_EQ(mr->access, access);
  EXPECT_EQ(p.B().rereg_mr(mw, IBV_REREG_MR_CHANGE_ACCESS, nullptr, IBV_ACCESS_LOCAL_WRITE, nullptr, 0, 0), EINVAL);
  EXPECT_EQ(write(q.a, b_addr(0), k, 64, 1), IBV_WC_SUCCESS);  // the window still reaches its bytes
  EXPECT_EQ(p.B().dealloc_mw(mw), 0);
  EXPECT_EQ(p.B().rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, IBV_ACCESS_LOCAL_WRITE, nullptr, 0, 0), 0);
  EXPECT_EQ(write(q.a, b_addr(0), mr->rkey, 64, 2), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Mw, BindCompletesInOrderAfterTheWorkBeforeIt) {
  // B WRITEs 32 KiB to A, then binds: the bind runs when the requester
  // reaches it, and completes only after the WRITE has been acknowledged.
  Mr* mw = p.B().alloc_mw(p.node[1].pd, IBV_MW_TYPE_2);
  Sge s = p.sge(1, 0, 32768);
  SendWr wr = p.write_to(0, s, 200000, 11);
  ASSERT_EQ(p.B().post_send(q.b, wr), 0);
  const SendWr w = bind_wr(mw, 0, 4096, IBV_ACCESS_REMOTE_WRITE, 12);
  ASSERT_EQ(p.B().post_send(q.b, w), 0);
  ibv_wc first{}, second{};
  ASSERT_TRUE(next_wc(1, first));
  ASSERT_TRUE(next_wc(1, second));
  EXPECT_EQ(first.wr_id, 11u);
  EXPECT_EQ(first.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(second.wr_id, 12u);
  EXPECT_EQ(second.opcode, IBV_WC_BIND_MW);
  EXPECT_EQ(second.status, IBV_WC_SUCCESS);
  ASSERT_EQ(write(q.a, b_addr(0), w.bind_new_rkey, 4096, 2), IBV_WC_SUCCESS);
  EXPECT_TRUE(landed(0, 4096, 2));
}

}  // namespace
}  // namespace uroce::testing
