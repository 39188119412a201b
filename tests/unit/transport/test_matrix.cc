// Every operation x sizes {0, 1, MTU-1, MTU, MTU+1, 3*MTU+7, 1 MiB} x path
// MTU {256, 1024, 4096}, with the payload checked byte for byte; and a PSN
// wrap at 2^24 crossed in the middle of a message.
#include <gtest/gtest.h>

#include "tests/support/gbn_checker.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

constexpr std::uint64_t kMiB = 1u << 20;

struct MatrixCase {
  ibv_mtu mtu;
  ibv_wr_opcode op;
};

std::string op_name(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND: return "SEND";
    case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
    case IBV_WR_SEND_WITH_INV: return "SEND_WITH_INV";
    case IBV_WR_RDMA_WRITE: return "WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM: return "WRITE_WITH_IMM";
    case IBV_WR_RDMA_READ: return "READ";
    case IBV_WR_ATOMIC_CMP_AND_SWP: return "CMP_SWAP";
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return "FETCH_ADD";
    default: return "OTHER";
  }
}

class Matrix : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(Matrix, EverySizeArrivesByteForByte) {
  const auto [mtu_enum, op] = GetParam();
  const std::uint32_t mtu = transport::mtu_bytes(mtu_enum);
  Pair p(static_cast<std::uint64_t>(mtu) + op, 8 * kMiB);
  PairOptions o;
  o.mtu = mtu_enum;
  const QpPair q = p.connect(o);
  const bool atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
  std::vector<std::uint32_t> sizes = {0, 1, mtu - 1, mtu, mtu + 1, 3 * mtu + 7, static_cast<std::uint32_t>(kMiB)};
  if (atomic) sizes = {8};
  // Layout: A's source at 0, B's target/recv buffer at 2 MiB, B's READ source at 4 MiB, A's READ target at 6 MiB.
  std::uint64_t round = 0;
  for (const std::uint32_t len : sizes) {
    SCOPED_TRACE("size " + std::to_string(len));
    ++round;
    auto& am = p.node[0].mem;
    auto& bm = p.node[1].mem;
    for (std::uint32_t i = 0; i < len; ++i) {
      am[i] = static_cast<std::uint8_t>(round * 31 + i * 13 + (i >> 10));
      bm[4 * kMiB + i] = static_cast<std::uint8_t>(round * 17 + i * 7 + (i >> 9));
    }
    std::memset(&bm[2 * kMiB], 0, len + 64);
    std::memset(&am[6 * kMiB], 0, len + 64);
    Sge rsge = p.sge(1, 2 * kMiB, static_cast<std::uint32_t>(kMiB + 64));
    const bool consumes_recv = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV ||
                               op == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (consumes_recv) {
      ASSERT_EQ(p.B().post_recv(q.b, RecvWr{round, {&rsge, 1}}), 0);
    }
    Mr* inv_mr = nullptr;
    if (op == IBV_WR_SEND_WITH_INV) {
      inv_mr = p.B().reg_mr(p.node[1].pd, &bm[7 * kMiB], 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
      ASSERT_NE(inv_mr, nullptr);
    }
    std::uint64_t before = 1000 + round;
    std::memcpy(&bm[5 * kMiB], &before, 8);
    Sge ssge = op == IBV_WR_RDMA_READ || atomic ? p.sge(0, 6 * kMiB, len) : p.sge(0, 0, len);
    SendWr wr;
    wr.wr_id = round;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = {&ssge, 1};
    wr.imm_data = 0xa0000000u + static_cast<std::uint32_t>(round);
    wr.invalidate_rkey = inv_mr ? inv_mr->rkey : 0;
    wr.remote_addr = op == IBV_WR_RDMA_READ ? p.addr(1, 4 * kMiB) : atomic ? p.addr(1, 5 * kMiB) : p.addr(1, 2 * kMiB);
    wr.rkey = p.rkey(1);
    wr.compare_add = op == IBV_WR_ATOMIC_CMP_AND_SWP ? before : 5;
    wr.swap = 77;
    ASSERT_EQ(p.A().post_send(q.a, wr), 0);
    std::vector<ibv_wc> wa, wb;
    ASSERT_TRUE(p.wire.run_until(
        [&] {
          p.poll(0, wa);
          p.poll(1, wb);
          return !wa.empty() && (!consumes_recv || !wb.empty());
        },
        2'000'000'000))
        << "no completion";
    ASSERT_EQ(wa[0].status, IBV_WC_SUCCESS) << transport::to_string(wa[0].status);
    EXPECT_EQ(wa[0].wr_id, round);
    if (consumes_recv) {
      ASSERT_EQ(wb[0].status, IBV_WC_SUCCESS) << transport::to_string(wb[0].status);
      EXPECT_EQ(wb[0].byte_len, len);
      EXPECT_EQ(wb[0].wr_id, round);
    }
    switch (op) {
      case IBV_WR_SEND:
      case IBV_WR_SEND_WITH_IMM:
      case IBV_WR_SEND_WITH_INV:
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
        EXPECT_EQ(0, std::memcmp(&am[0], &bm[2 * kMiB], len));
        EXPECT_EQ(bm[2 * kMiB + len], 0) << "wrote past the end";
        break;
      case IBV_WR_RDMA_READ:
        EXPECT_EQ(0, std::memcmp(&bm[4 * kMiB], &am[6 * kMiB], len));
        EXPECT_EQ(am[6 * kMiB + len], 0) << "read past the end";
        break;
      default: {
        std::uint64_t now_v, orig;
        std::memcpy(&now_v, &bm[5 * kMiB], 8);
        std::memcpy(&orig, &am[6 * kMiB], 8);
        EXPECT_EQ(orig, before);
        EXPECT_EQ(now_v, op == IBV_WR_ATOMIC_CMP_AND_SWP ? 77u : before + 5);
      }
    }
    if (op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
      EXPECT_TRUE(wb[0].wc_flags & IBV_WC_WITH_IMM);
      EXPECT_EQ(__builtin_bswap32(wb[0].imm_data), wr.imm_data);
    }
    if (op == IBV_WR_SEND_WITH_INV) {
      EXPECT_TRUE(wb[0].wc_flags & IBV_WC_WITH_INV);
      EXPECT_EQ(wb[0].invalidated_rkey, inv_mr->rkey);
      EXPECT_EQ(p.B().dereg_mr(inv_mr), 0);
    }
  }
}

std::vector<MatrixCase> all_cases() {
  std::vector<MatrixCase> v;
  for (ibv_mtu m : {IBV_MTU_256, IBV_MTU_1024, IBV_MTU_4096})
    for (ibv_wr_opcode op : {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_SEND_WITH_INV, IBV_WR_RDMA_WRITE,
                             IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP,
                             IBV_WR_ATOMIC_FETCH_AND_ADD})
      v.push_back({m, op});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, Matrix, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<MatrixCase>& i) {
                           return op_name(i.param.op) + "_mtu" + std::to_string(transport::mtu_bytes(i.param.mtu));
                         });

// A 2^24 PSN wrap in the middle of messages, in both directions of a READ,
// with loss so go-back-N has to restart across the wrap too.
TEST(PsnWrap, CrossedMidMessageWithLoss) {
  Pair p(99, 4 * kMiB);
  PairOptions o;
  o.psn_a = 0xfffffd;  // A's requests wrap on the first multi-packet message
  o.psn_b = 0xfffffe;
  const QpPair q = p.connect(o);
  sim::Impairments imp;
  imp.loss = 0.05;
  p.wire.set_impairments(imp);
  GbnChecker gbn(&p.B(), q.b->qpn, q.b->resp.epsn, q.b->mtu);
  gbn.attach(p.wire);
  auto& am = p.node[0].mem;
  for (std::uint32_t i = 0; i < 8192; ++i) am[i] = static_cast<std::uint8_t>(i * 5 + 1);
  Sge s = p.sge(0, 0, 8192);
  Sge r = p.sge(1, 65536, 8192);
  ASSERT_EQ(p.B().post_recv(q.b, RecvWr{1, {&r, 1}}), 0);
  SendWr wr;
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&s, 1};
  ASSERT_EQ(p.A().post_send(q.a, wr), 0);  // PSNs 0xfffffd..0x000004
  Sge rd = p.sge(0, 131072, 8192);
  SendWr rw;
  rw.wr_id = 2;
  rw.opcode = IBV_WR_RDMA_READ;
  rw.send_flags = IBV_SEND_SIGNALED;
  rw.sg_list = {&rd, 1};
  rw.remote_addr = p.addr(1, 65536);
  rw.rkey = p.rkey(1);
  ASSERT_EQ(p.A().post_send(q.a, rw), 0);
  std::vector<ibv_wc> wa, wb;
  ASSERT_TRUE(p.wire.run_until(
      [&] {
        p.poll(0, wa);
        p.poll(1, wb);
        return wa.size() == 2 && wb.size() == 1;
      },
      5'000'000'000));
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wa[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(0, std::memcmp(&am[0], &p.node[1].mem[65536], 8192));
  EXPECT_EQ(0, std::memcmp(&am[0], &am[131072], 8192));
  EXPECT_LT(distance(wire::Psn(0xfffffd), q.a->req.next_psn), 0x100);  // really wrapped
  EXPECT_LT(q.a->req.next_psn.value(), 0x100u);
  EXPECT_TRUE(gbn.violations().empty()) << gbn.violations().front();
}

}  // namespace
}  // namespace uroce::testing
