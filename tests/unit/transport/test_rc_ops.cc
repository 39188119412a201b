// RC operations end to end over the simulated wire, with data checked.
#include <gtest/gtest.h>

#include <numeric>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

class RcOps : public ::testing::Test {
 protected:
  void SetUp() override { q = p.connect(); }
  void fill(int node, std::uint64_t off, std::size_t len, std::uint8_t seed) {
    for (std::size_t i = 0; i < len; ++i) p.node[node].mem[off + i] = static_cast<std::uint8_t>(seed + i * 7);
  }
  bool run_until_wcs(int node, std::size_t n, std::vector<ibv_wc>& wcs, std::uint64_t max_ns = 100'000'000) {
    return p.wire.run_until(
        [&] {
          p.poll(node, wcs);
          return wcs.size() >= n;
        },
        max_ns);
  }
  Pair p;
  QpPair q;
};

TEST_F(RcOps, SendRecv) {
  fill(0, 0, 3000, 1);
  Sge rs = p.sge(1, 100000, 4096);
  ASSERT_EQ(p.B().post_recv(q.b, RecvWr{7, {&rs, 1}}), 0);
  Sge ss = p.sge(0, 0, 3000);
  SendWr wr;
  wr.wr_id = 42;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = 0xdeadbeef;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&ss, 1};
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);
  std::vector<ibv_wc> wa, wb;
  ASSERT_TRUE(run_until_wcs(1, 1, wb));
  ASSERT_TRUE(run_until_wcs(0, 1, wa));
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].wr_id, 7u);
  EXPECT_EQ(wb[0].byte_len, 3000u);
  EXPECT_EQ(wb[0].opcode, IBV_WC_RECV);
  EXPECT_TRUE(wb[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(__builtin_bswap32(wb[0].imm_data), 0xdeadbeefu);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa[0].wr_id, 42u);
  EXPECT_EQ(wa[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[100000], 3000));
}

// Small payloads are placed by copy_payload's overlapping word moves, not by
// memcpy: every length from 0 to 40 bytes, by WRITE and by SEND, lands
// exactly, and not a byte on either side of it changes.
TEST_F(RcOps, EverySmallPayloadLandsExactlyAndAloneByWriteAndBySend) {
  fill(0, 0, 64, 3);
  auto& bm = p.node[1].mem;
  for (std::uint32_t len = 0; len <= 40; ++len) {
    for (const bool send : {false, true}) {
      const std::uint64_t at = 200000 + 128 * len + (send ? 64 : 0) + 8;  // 8 bytes of guard before, 16 after
      std::memset(&bm[at - 8], 0xa5, len + 24);
      Sge ss = p.sge(0, 0, len);
      SendWr wr = p.write_to(1, ss, at, len);
      if (send) {
        Sge rs = p.sge(1, at, len);
        ASSERT_EQ(p.B().post_recv(q.b, RecvWr{len, {&rs, 1}}), 0);
        wr.opcode = IBV_WR_SEND;
      }
      ASSERT_EQ(p.A().post_send(q.a, wr), 0);
      std::vector<ibv_wc> wa, wb;
      ASSERT_TRUE(run_until_wcs(0, 1, wa));
      if (send) {
        ASSERT_TRUE(run_until_wcs(1, 1, wb));
        EXPECT_EQ(wb[0].byte_len, len);
      }
      ASSERT_EQ(wa[0].status, IBV_WC_SUCCESS) << len;
      EXPECT_EQ(0, std::memcmp(&bm[at], &p.node[0].mem[0], len)) << (send ? "SEND " : "WRITE ") << len;
      for (std::uint64_t i = at - 8; i < at; ++i) EXPECT_EQ(bm[i], 0xa5) << "before, at length " << len;
      for (std::uint64_t i = at + len; i < at + len + 16; ++i) EXPECT_EQ(bm[i], 0xa5) << "after, at length " << len;
    }
  }
}

TEST_F(RcOps, WriteReadAtomics) {
  fill(0, 0, 5000, 3);
  Sge ss = p.sge(0, 0, 5000);
  SendWr w;
  w.wr_id = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = {&ss, 1};
  w.remote_addr = p.addr(1, 8192);
  w.rkey = p.rkey(1);
  ASSERT_EQ(p.A().post_send(q.a, w), 0);
  Sge rd = p.sge(0, 20000, 5000);
  SendWr r;
  r.wr_id = 2;
  r.opcode = IBV_WR_RDMA_READ;
  r.send_flags = IBV_SEND_SIGNALED;
  r.sg_list = {&rd, 1};
  r.remote_addr = p.addr(1, 8192);
  r.rkey = p.rkey(1);
  ASSERT_EQ(p.A().post_send(q.a, r), 0);
  std::uint64_t init = 100;
  std::memcpy(&p.node[1].mem[64], &init, 8);
  Sge as = p.sge(0, 40000, 8);
  SendWr fa;
  fa.wr_id = 3;
  fa.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  fa.send_flags = IBV_SEND_SIGNALED;
  fa.sg_list = {&as, 1};
  fa.remote_addr = p.addr(1, 64);
  fa.rkey = p.rkey(1);
  fa.compare_add = 5;
  ASSERT_EQ(p.A().post_send(q.a, fa), 0);
  Sge cs_sge = p.sge(0, 40008, 8);
  SendWr cs;
  cs.wr_id = 4;
  cs.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  cs.send_flags = IBV_SEND_SIGNALED;
  cs.sg_list = {&cs_sge, 1};
  cs.remote_addr = p.addr(1, 64);
  cs.rkey = p.rkey(1);
  cs.compare_add = 105;
  cs.swap = 7;
  ASSERT_EQ(p.A().post_send(q.a, cs), 0);
  std::vector<ibv_wc> wa;
  ASSERT_TRUE(run_until_wcs(0, 4, wa));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(wa[static_cast<std::size_t>(i)].status, IBV_WC_SUCCESS) << i;
    EXPECT_EQ(wa[static_cast<std::size_t>(i)].wr_id, static_cast<std::uint64_t>(i + 1));
  }
  EXPECT_EQ(wa[1].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wa[2].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(wa[3].opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[8192], 5000));
  EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[0].mem[20000], 5000));
  std::uint64_t v, o1, o2;
  std::memcpy(&v, &p.node[1].mem[64], 8);
  std::memcpy(&o1, &p.node[0].mem[40000], 8);
  std::memcpy(&o2, &p.node[0].mem[40008], 8);
  EXPECT_EQ(o1, 100u);
  EXPECT_EQ(o2, 105u);
  EXPECT_EQ(v, 7u);
}

}  // namespace
}  // namespace uroce::testing
