// The data path allocates nothing after warm-up: post_send, post_recv, rx,
// poll, drain_tx and poll_cq, including go-back-N and selective repeat under
// loss, READ responses and atomics, and the doorbell protocol of a shared
// ring. Every allocation form is counted (tests/support/alloc_counter.h):
// operator new in all its forms, aligned ones included, and the C allocators.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <tuple>
#include <vector>

#include "stack/abi/doorbell.h"
#include "tests/support/alloc_counter.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

struct Driver {
  Pair& p;
  QpPair q;
  std::uint64_t posted = 0, done_a = 0, done_b = 0, want_a = 0, want_b = 0;
  std::uint64_t counter_at_b = 0;
  int failures = 0;

  // One batch: 32 WRs of every kind, then run until all complete. Uses only
  // fixed arrays, so any allocation seen is the stack's own.
  void batch() {
    static const ibv_wr_opcode kOps[] = {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ,
                                         IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_SEND_WITH_IMM,
                                         IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_ATOMIC_CMP_AND_SWP};
    want_a = done_a;
    want_b = done_b;
    for (int i = 0; i < 32; ++i) {
      const ibv_wr_opcode op = kOps[posted % 7];
      const std::uint32_t len = op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP
                                    ? 8
                                    : static_cast<std::uint32_t>((posted * 977) % 5000);
      Sge s = p.sge(0, 65536 * static_cast<std::uint64_t>(i % 16), len);
      SendWr wr;
      wr.wr_id = posted++;
      wr.opcode = op;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.sg_list = {&s, 1};
      wr.remote_addr = (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP)
                           ? p.addr(1, 2u << 20)
                           : p.addr(1, 65536 * static_cast<std::uint64_t>(i % 16));
      wr.rkey = p.rkey(1);
      wr.compare_add = op == IBV_WR_ATOMIC_CMP_AND_SWP ? counter_at_b : 3;
      wr.swap = counter_at_b + 3;
      if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) counter_at_b += 3;
      if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
        Sge r = p.sge(1, (1u << 20) + 8192 * static_cast<std::uint64_t>(i % 16), 8192);
        if (p.B().post_recv(q.b, RecvWr{wr.wr_id, {&r, 1}}) != 0) ++failures;
        ++want_b;
      }
      if (p.A().post_send(q.a, wr) != 0) ++failures;
      ++want_a;
    }
    Driver* self = this;  // one pointer: fits std::function's small buffer
    const bool ok = p.wire.run_until(
        [self] {
          ibv_wc wc[16];
          int n = self->p.A().poll_cq(self->p.node[0].cq, wc);
          for (int i = 0; i < n; ++i) self->failures += wc[i].status != IBV_WC_SUCCESS;
          self->done_a += static_cast<std::uint64_t>(n);
          n = self->p.B().poll_cq(self->p.node[1].cq, wc);
          for (int i = 0; i < n; ++i) self->failures += wc[i].status != IBV_WC_SUCCESS;
          self->done_b += static_cast<std::uint64_t>(n);
          return self->done_a == self->want_a && self->done_b == self->want_b;
        },
        10'000'000'000);
    if (!ok) ++failures;
  }
};

namespace ac = alloc_counter;

/// The counted window: zero allocations, or the counts by form and where
/// the first one came from.
#define EXPECT_NO_ALLOCATIONS(what) \
  EXPECT_EQ(ac::total(), 0u) << "allocations " << (what) << ": " << ac::report()

// Each congestion control too: its hooks run on the data path. CE marks
// make the CNPs that DCQCN reacts to. And each with selective repeat (its
// own opcodes, selective ACKs, out-of-order placement) as well as go-back-N.
class NoAllocCc : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(NoAllocCc, DataPathAllocatesNothingAfterWarmUp) {
  const char* cc = std::get<0>(GetParam());
  const bool sr = std::get<1>(GetParam());
  Pair p(5, 4u << 20, 64, false, [cc](int, EngineConfig& c) { c.cc = cc; });
  PairOptions po;
  po.selective_repeat = sr;
  const QpPair q = p.connect(po);
  ASSERT_EQ(q.a->sr != nullptr, sr);
  sim::Impairments imp;
  imp.loss = 0.02;
  imp.dup = 0.02;
  imp.reorder = 0.02;
  imp.corrupt = 0.01;
  imp.ce = 0.05;
  p.wire.set_impairments(imp);
  Driver d{p, q};
  for (int i = 0; i < 20; ++i) d.batch();  // warm-up
  ASSERT_EQ(d.failures, 0);
  ac::start();
  for (int i = 0; i < 200; ++i) d.batch();
  ac::stop();
  EXPECT_EQ(d.failures, 0);
  EXPECT_EQ(d.done_a, d.posted);
  EXPECT_GT(q.a->ctr[transport::QpCounter::retransmitted_pkts], 0u);  // the recovery paths ran
  if (sr) EXPECT_GT(q.b->sr->ooo, 0u) << "selective repeat placed packets out of order";
  EXPECT_NO_ALLOCATIONS("on the data path");
  EXPECT_EQ(p.A().cc_report(*q.a).algorithm, std::string_view(cc));
  if (std::string_view(cc) == "dcqcn") EXPECT_GT(q.a->ctr[transport::QpCounter::cnp_received], 0u);
}
INSTANTIATE_TEST_SUITE_P(Cc, NoAllocCc,
                         ::testing::Combine(::testing::Values("none", "dcqcn", "swift"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_sr" : "_gbn");
                         });

// The same through rings an application shares: A's QP and CQ are placed in
// memory the test holds, the test is the application (it publishes send
// entries, bumps the posts word, and consumes completions from the CQ ring), under the same
// loss. Nothing on the engine's side of a shared ring allocates either, nor
// the doorbell protocol (stack/abi/doorbell.h) around it: the test plays the
// daemon too, announcing its sleep before each batch, so every bump rings.
TEST(NoAlloc, SharedRingsAllocateNothingAfterWarmUp) {
  Pair p(9, 4u << 20);
  std::vector<std::uint64_t> sq_mem(uroce_ring_bytes(64, sizeof(uroce_send_entry)) / 8 + 8),
      rq_mem(uroce_ring_bytes(64, sizeof(uroce_recv_entry)) / 8 + 8),
      cq_mem(uroce_ring_bytes(256, sizeof(uroce_cq_entry)) / 8 + 8);
  const auto sq = abi::Ring<uroce_send_entry>::create(sq_mem.data(), 64, UROCE_RING_SEND, 1);
  const auto rq = abi::Ring<uroce_recv_entry>::create(rq_mem.data(), 64, UROCE_RING_RECV, 1);
  const auto cqr = abi::Ring<uroce_cq_entry>::create(cq_mem.data(), 256, UROCE_RING_CQ, 1);
  abi::Ring<uroce_send_entry> app_sq;
  abi::Ring<uroce_cq_entry> app_cq;
  ASSERT_EQ(abi::Ring<uroce_send_entry>::attach(sq_mem.data(), sq_mem.size() * 8, UROCE_RING_SEND, app_sq),
            abi::AttachError::kOk);
  ASSERT_EQ(abi::Ring<uroce_cq_entry>::attach(cq_mem.data(), cq_mem.size() * 8, UROCE_RING_CQ, app_cq),
            abi::AttachError::kOk);
  transport::Cq* cq = p.A().create_cq(256, &cqr);
  transport::QpInitAttr ia;
  ia.send_cq = ia.recv_cq = cq;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
  ia.sq_ring = &sq;
  ia.rq_ring = &rq;
  transport::Qp* a = p.A().create_qp(p.node[0].pd, ia);
  transport::QpInitAttr ib;
  ib.send_cq = ib.recv_cq = p.node[1].cq;
  transport::Qp* b = p.B().create_qp(p.node[1].pd, ib);
  ASSERT_TRUE(cq && a && b);
  abi::Connect k;
  k.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  k.timeout = 8;
  k.min_rnr_timer = 1;
  k.dest_qp_num = b->qpn;
  std::memcpy(k.dgid.raw, p.B().config().ip.b.data(), 16);
  Pair::must(p.A().bring_up(a, k));
  k.dest_qp_num = a->qpn;
  std::memcpy(k.dgid.raw, p.A().config().ip.b.data(), 16);
  Pair::must(p.B().bring_up(b, k));
  sim::Impairments imp;
  imp.loss = 0.02;
  imp.reorder = 0.02;
  p.wire.set_impairments(imp);
  uroce_session_page page{};
  int bell[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, bell), 0);
  std::uint64_t posted = 0, done_a = 0, done_b = 0, rung = 0, heard = 0;
  int failures = 0;
  auto batch = [&] {
    abi::announce_sleep(&page);
    static const std::uint8_t kOps[] = {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD};
    const std::uint64_t want_a = posted + 32;
    std::uint64_t want_b = done_b;
    for (int i = 0; i < 32; ++i) {
      const std::uint8_t op = kOps[posted % 4];
      const bool atomic = op == IBV_WR_ATOMIC_FETCH_AND_ADD;
      uroce_send_entry e{};
      e.wr_id = posted++;
      e.opcode = op;
      e.send_flags = IBV_SEND_SIGNALED;
      e.num_sge = 1;
      e.sg_list[0] = {p.addr(0, 65536 * static_cast<std::uint64_t>(i % 16)),
                      atomic ? 8u : static_cast<std::uint32_t>((posted * 977) % 5000), p.node[0].mr->lkey};
      if (atomic) {
        e.op.atomic.remote_addr = p.addr(1, 2u << 20);
        e.op.atomic.rkey = p.rkey(1);
        e.op.atomic.compare_add = 3;
      } else {
        e.op.rdma.remote_addr = p.addr(1, 65536 * static_cast<std::uint64_t>(i % 16));
        e.op.rdma.rkey = p.rkey(1);
      }
      if (op == IBV_WR_SEND) {
        Sge r = p.sge(1, (1u << 20) + 8192 * static_cast<std::uint64_t>(i % 16), 8192);
        if (p.B().post_recv(b, RecvWr{e.wr_id, {&r, 1}}) != 0) ++failures;
        ++want_b;
      }
      if (!app_sq.push(e)) ++failures;
      rung += abi::bump_posts(&page, bell[0]);
      p.A().take_posts(a);
    }
    heard += abi::drain(bell[1]);
    abi::announce_awake(&page);
    // One pointer in the predicate, as above: it fits std::function's
    // small buffer, so any allocation counted is the stack's own.
    struct Poll {
      Pair& p;
      abi::Ring<uroce_cq_entry>& app_cq;
      std::uint64_t &done_a, &done_b, want_a, want_b;
      int& failures;
    } st{p, app_cq, done_a, done_b, want_a, want_b, failures};
    Poll* ps = &st;
    const bool ok = p.wire.run_until(
        [ps] {
          uroce_cq_entry c;
          while (ps->app_cq.pop(c)) {
            ps->failures += c.status != IBV_WC_SUCCESS;
            ++ps->done_a;
          }
          ibv_wc wc[16];
          const int n = ps->p.B().poll_cq(ps->p.node[1].cq, wc);
          for (int j = 0; j < n; ++j) ps->failures += wc[j].status != IBV_WC_SUCCESS;
          ps->done_b += static_cast<std::uint64_t>(n);
          return ps->done_a == ps->want_a && ps->done_b == ps->want_b;
        },
        10'000'000'000);
    if (!ok) ++failures;
  };
  for (int i = 0; i < 10; ++i) batch();  // warm-up
  ASSERT_EQ(failures, 0);
  const std::uint64_t rung_before = rung;
  ac::start();
  for (int i = 0; i < 100; ++i) batch();
  ac::stop();
  ::close(bell[0]);
  ::close(bell[1]);
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(done_a, posted);
  EXPECT_GT(a->ctr[transport::QpCounter::retransmitted_pkts], 0u);  // the recovery paths ran
  EXPECT_EQ(rung - rung_before, 100u * 32) << "every bump rang: the daemon had announced its sleep";
  EXPECT_EQ(heard, rung) << "every ring was heard";
  EXPECT_EQ(page.posts, posted) << "every post bumped the posts word";
  EXPECT_NO_ALLOCATIONS("on the data path of a shared ring");
}

// The counter itself works: each allocation form is seen, one at a time,
// on its own and from another thread. An allocation the compiler could
// prove unused may be removed, so each pointer escapes first.
template <typename T>
void escape(T* p) {
  asm volatile("" : : "g"(p) : "memory");
}
struct alignas(64) Line {
  std::uint64_t v[8];
};

TEST(NoAlloc, CounterSeesEveryAllocationForm) {
  struct Form {
    const char* name;
    void (*fn)();
  };
  static const Form kForms[] = {
      {"new", [] { auto* p = new int(1); escape(p); delete p; }},
      {"new[]", [] { auto* p = new int[9]; escape(p); delete[] p; }},
      {"new nothrow", [] { auto* p = new (std::nothrow) int(1); escape(p); delete p; }},
      {"new[] nothrow", [] { auto* p = new (std::nothrow) int[9]; escape(p); delete[] p; }},
      {"aligned new", [] { auto* p = new Line(); escape(p); delete p; }},
      {"aligned new[]", [] { auto* p = new Line[3]; escape(p); delete[] p; }},
      {"aligned new nothrow", [] { auto* p = new (std::nothrow) Line(); escape(p); delete p; }},
      {"aligned new[] nothrow", [] { auto* p = new (std::nothrow) Line[3]; escape(p); delete[] p; }},
      {"vector of an over-aligned type (as SendWqe)", [] { std::vector<Line> v(4); escape(v.data()); }},
      {"malloc", [] { void* p = std::malloc(24); escape(p); std::free(p); }},
      {"calloc", [] { void* p = std::calloc(3, 8); escape(p); std::free(p); }},
      {"realloc", [] {
         void* p = std::malloc(8);
         escape(p);
         ac::start();  // only the realloc
         p = std::realloc(p, 4096);
         escape(p);
         std::free(p);
       }},
      {"aligned_alloc", [] { void* p = std::aligned_alloc(64, 128); escape(p); std::free(p); }},
      {"posix_memalign", [] {
         void* p = nullptr;
         if (::posix_memalign(&p, 64, 128) == 0) escape(p);
         std::free(p);
       }},
      {"memalign", [] { void* p = ::memalign(64, 128); escape(p); std::free(p); }},
      {"another thread", [] {
         static std::atomic<bool> go{false};
         go = false;
         std::thread t([] {
           while (!go) std::this_thread::yield();
           void* p = std::malloc(24);
           escape(p);
           std::free(p);
         });
         ac::start();  // not the thread's own creation: only its malloc
         go = true;
         t.join();
       }},
  };
  for (const Form& f : kForms) {
    ac::start();
    f.fn();
    ac::stop();
    EXPECT_GE(ac::total(), 1u) << f.name << " went uncounted";
  }
  // And nothing is counted outside the window.
  ac::start();
  ac::stop();
  void* p = std::malloc(24);
  escape(p);
  std::free(p);
  EXPECT_EQ(ac::total(), 0u);
}

}  // namespace
}  // namespace uroce::testing
