// ODP MRs (on-demand paging): nothing is shared or pinned; every access
// goes through the application's memory file (here this process's
// /proc/self/mem) when it happens. The region has a hole (a page never
// mapped, or unmapped after registration): an access there is an access
// error for that work request, never a crash, and the rest works.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

constexpr std::size_t kPage = 4096;
constexpr unsigned kAll =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
    IBV_ACCESS_ON_DEMAND;

/// Four pages with the third one unmapped (the hole), and this process's
/// memory file.
struct OdpRegion {
  std::uint8_t* p = nullptr;
  int mem = -1;
  OdpRegion() {
    p = static_cast<std::uint8_t*>(::mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(p, MAP_FAILED);
    ::munmap(p + 2 * kPage, kPage);
    mem = ::open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    EXPECT_GE(mem, 0);
  }
  ~OdpRegion() {
    ::munmap(p, 2 * kPage);
    ::munmap(p + 3 * kPage, kPage);
    ::close(mem);
  }
  std::uint64_t at(std::size_t off) const { return reinterpret_cast<std::uint64_t>(p + off); }
};

/// Runs until node 0 has a completion; returns it.
ibv_wc complete(Pair& p, std::vector<ibv_wc>* b_out = nullptr) {
  std::vector<ibv_wc> wa, wb;
  p.wire.run_until(
      [&] {
        p.poll(0, wa);
        p.poll(1, wb);
        return !wa.empty();
      },
      200'000'000);
  if (b_out) *b_out = wb;
  EXPECT_FALSE(wa.empty()) << "no completion";
  return wa.empty() ? ibv_wc{} : wa.front();
}

SendWr rdma(ibv_wr_opcode op, const Sge& s, std::uint64_t raddr, std::uint32_t rkey) {
  SendWr w;
  w.wr_id = 1;
  w.opcode = op;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = {&s, 1};
  w.remote_addr = raddr;
  w.rkey = rkey;
  return w;
}

TEST(Odp, RemoteWriteReadAndAtomicsReachMemoryThatWasNeverShared) {
  Pair p(11, 1 << 20);
  OdpRegion r;
  Mr* mr = p.B().reg_mr_odp(p.node[1].pd, r.at(0), 4 * kPage, r.at(0), kAll, r.mem);
  ASSERT_NE(mr, nullptr);
  auto q = p.connect();
  // A WRITE of 4 KiB (4 packets) into the ODP pages, across a page boundary.
  for (std::uint32_t i = 0; i < kPage; ++i) p.node[0].mem[i] = static_cast<std::uint8_t>(i * 7);
  Sge s = p.sge(0, 0, kPage);
  ASSERT_EQ(p.A().post_send(q.a, rdma(IBV_WR_RDMA_WRITE, s, r.at(100), mr->rkey)), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(r.p + 100, p.node[0].mem.data(), kPage), 0);
  // A READ of it back, into other memory: the response is read out of the
  // ODP pages packet by packet.
  Sge back = p.sge(0, 8192, kPage);
  ASSERT_EQ(p.A().post_send(q.a, rdma(IBV_WR_RDMA_READ, back, r.at(100), mr->rkey)), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(p.node[0].mem.data() + 8192, r.p + 100, kPage), 0);
  // Fetch-and-add, then compare-and-swap, on a word in the last page.
  std::uint64_t word = 40;
  std::memcpy(r.p + 3 * kPage, &word, 8);
  Sge res = p.sge(0, 16384, 8);
  SendWr fa = rdma(IBV_WR_ATOMIC_FETCH_AND_ADD, res, r.at(3 * kPage), mr->rkey);
  fa.compare_add = 2;
  ASSERT_EQ(p.A().post_send(q.a, fa), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_SUCCESS);
  std::memcpy(&word, r.p + 3 * kPage, 8);
  EXPECT_EQ(word, 42u);
  std::uint64_t orig;
  std::memcpy(&orig, p.node[0].mem.data() + 16384, 8);
  EXPECT_EQ(orig, 40u);
  SendWr cs = rdma(IBV_WR_ATOMIC_CMP_AND_SWP, res, r.at(3 * kPage), mr->rkey);
  cs.compare_add = 42;
  cs.swap = 7;
  ASSERT_EQ(p.A().post_send(q.a, cs), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_SUCCESS);
  std::memcpy(&word, r.p + 3 * kPage, 8);
  EXPECT_EQ(word, 7u);
}

TEST(Odp, AWriteIntoAPageTheApplicationDoesNotHaveIsARemoteAccessError) {
  Pair p(12, 1 << 20);
  OdpRegion r;
  Mr* mr = p.B().reg_mr_odp(p.node[1].pd, r.at(0), 4 * kPage, r.at(0), kAll, r.mem);
  ASSERT_NE(mr, nullptr);
  auto q = p.connect();
  Sge s = p.sge(0, 0, 64);
  ASSERT_EQ(p.A().post_send(q.a, rdma(IBV_WR_RDMA_WRITE, s, r.at(2 * kPage + 8), mr->rkey)), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_GE(q.b->ctr[QpCounter::remote_access_err], 1u);
}

TEST(Odp, AReadOfAPageTheApplicationDoesNotHaveIsARemoteAccessError) {
  Pair p(13, 1 << 20);
  OdpRegion r;
  Mr* mr = p.B().reg_mr_odp(p.node[1].pd, r.at(0), 4 * kPage, r.at(0), kAll, r.mem);
  ASSERT_NE(mr, nullptr);
  auto q = p.connect();
  // 3 packets from the second page into the hole: the first one goes, the
  // second meets the hole.
  Sge s = p.sge(0, 0, 3 * 1024);
  ASSERT_EQ(p.A().post_send(q.a, rdma(IBV_WR_RDMA_READ, s, r.at(2 * kPage - 1024), mr->rkey)), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_REM_ACCESS_ERR);
}

TEST(Odp, LocalOdpSgesSendAndReceive) {
  Pair p(14, 1 << 20);
  OdpRegion ra, rb;
  Mr* ma = p.A().reg_mr_odp(p.node[0].pd, ra.at(0), 4 * kPage, ra.at(0), kAll, ra.mem);
  Mr* mb = p.B().reg_mr_odp(p.node[1].pd, rb.at(0), 4 * kPage, rb.at(0), kAll, rb.mem);
  ASSERT_NE(ma, nullptr);
  ASSERT_NE(mb, nullptr);
  auto q = p.connect();
  for (std::uint32_t i = 0; i < 3000; ++i) ra.p[i] = static_cast<std::uint8_t>(i * 13 + 1);
  Sge rs{rb.at(kPage + 10), 3000, mb->lkey};
  ASSERT_EQ(p.B().post_recv(q.b, RecvWr{9, {&rs, 1}}), 0);
  Sge ss{ra.at(0), 3000, ma->lkey};
  SendWr w = rdma(IBV_WR_SEND, ss, 0, 0);
  ASSERT_EQ(p.A().post_send(q.a, w), 0);
  std::vector<ibv_wc> wb;
  EXPECT_EQ(complete(p, &wb).status, IBV_WC_SUCCESS);
  p.wire.run_until([&] { return p.poll(1, wb) > 0 || !wb.empty(); }, 10'000'000);
  ASSERT_FALSE(wb.empty());
  EXPECT_EQ(wb.front().status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(rb.p + kPage + 10, ra.p, 3000), 0);
  // A READ's response scattered into a local ODP SGE.
  Sge into{ra.at(kPage), 2048, ma->lkey};
  ASSERT_EQ(p.A().post_send(q.a, rdma(IBV_WR_RDMA_READ, into, p.addr(1, 0), p.rkey(1))), 0);
  for (std::uint32_t i = 0; i < 2048; ++i) p.node[1].mem[i] = static_cast<std::uint8_t>(i ^ 0x5a);
  EXPECT_EQ(complete(p).status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(ra.p + kPage, p.node[1].mem.data(), 2048), 0);
}

TEST(Odp, ALocalSgeInAPageTheApplicationDoesNotHaveIsALocalProtectionError) {
  Pair p(15, 1 << 20);
  OdpRegion r;
  Mr* ma = p.A().reg_mr_odp(p.node[0].pd, r.at(0), 4 * kPage, r.at(0), kAll, r.mem);
  ASSERT_NE(ma, nullptr);
  auto q = p.connect();
  Sge s{r.at(2 * kPage), 512, ma->lkey};
  ASSERT_EQ(p.A().post_send(q.a, rdma(IBV_WR_RDMA_WRITE, s, p.addr(1, 0), p.rkey(1))), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_LOC_PROT_ERR);
}

TEST(Odp, AnImplicitMrReachesTheWholeAddressSpace) {
  Pair p(16, 1 << 20);
  OdpRegion r;
  Mr* mr = p.B().reg_mr_odp(p.node[1].pd, 0, UINT64_MAX, 0, kAll, r.mem);
  ASSERT_NE(mr, nullptr);
  auto q = p.connect();
  // Memory mapped after the registration, anywhere.
  auto* late = static_cast<std::uint8_t*>(::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(late, MAP_FAILED);
  std::memset(p.node[0].mem.data(), 0xab, 256);
  Sge s = p.sge(0, 0, 256);
  ASSERT_EQ(p.A().post_send(q.a, rdma(IBV_WR_RDMA_WRITE, s, reinterpret_cast<std::uint64_t>(late) + 64, mr->rkey)), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_SUCCESS);
  EXPECT_EQ(late[64], 0xab);
  EXPECT_EQ(late[64 + 255], 0xab);
  ::munmap(late, kPage);
  // Unmapped again: an access error, not a crash.
  ASSERT_EQ(p.A().post_send(q.a, rdma(IBV_WR_RDMA_WRITE, s, reinterpret_cast<std::uint64_t>(late) + 64, mr->rkey)), 0);
  EXPECT_EQ(complete(p).status, IBV_WC_REM_ACCESS_ERR);
}

TEST(Odp, AnOdpMrNeedsItsMemoryFileAndARangeThatDoesNotWrap) {
  Pair p(17, 1 << 20);
  EXPECT_EQ(p.B().reg_mr_odp(p.node[1].pd, 4096, 4096, 4096, kAll, -1), nullptr);
  EXPECT_EQ(p.B().reg_mr_odp(p.node[1].pd, UINT64_MAX - 10, 4096, 4096, kAll, 0), nullptr);
  EXPECT_EQ(p.B().reg_mr_odp(p.node[1].pd, 4096, 0, 4096, kAll, 0), nullptr);
}

}  // namespace
}  // namespace uroce::testing
