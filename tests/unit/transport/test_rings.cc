// One queue per verbs queue: the engine reads an application's shared rings
// itself and writes completions straight into its shared CQ ring. These tests
// place the rings in memory the test holds, as uroced places them in a memfd,
// and play the application on the other side of each ring -- well-behaved,
// then hostile.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "stack/abi/ring.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

using abi::AttachError;

/// Memory for one ring, and the application's view of it (attached as a
/// real application attaches).
template <typename E>
struct SharedRing {
  SharedRing(std::uint32_t entries, uroce_ring_kind kind)
      : mem(uroce_ring_bytes(entries, sizeof(E)) / 8 + 8), kind(kind) {
    daemon = abi::Ring<E>::create(mem.data(), entries, kind, 1);
    EXPECT_EQ(abi::Ring<E>::attach(mem.data(), bytes(), kind, app), AttachError::kOk);
  }
  std::size_t bytes() const { return mem.size() * 8; }
  uroce_ring_header* header() { return reinterpret_cast<uroce_ring_header*>(mem.data()); }
  E* slot(std::uint32_t i) { return reinterpret_cast<E*>(header() + 1) + (i & (header_entries - 1)); }
  std::vector<std::uint64_t> mem;
  uroce_ring_kind kind;
  abi::Ring<E> daemon, app;
  std::uint32_t header_entries = 16;
};

/// A pair whose node-0 QP has shared SQ and RQ rings and a shared CQ.
struct Shared : ::testing::Test {
  Pair p{11, 1 << 20};
  SharedRing<uroce_send_entry> sq{16, UROCE_RING_SEND};
  SharedRing<uroce_recv_entry> rq{16, UROCE_RING_RECV};
  SharedRing<uroce_cq_entry> cqr{64, UROCE_RING_CQ};
  Cq* cq = nullptr;
  Qp* a = nullptr;
  Qp* b = nullptr;

  void SetUp() override {
    cqr.header_entries = 64;
    cq = p.A().create_cq(64, &cqr.daemon);
    ASSERT_NE(cq, nullptr);
    // Bring up a shared-ring QP on A and a heap one on B, connected.
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = cq;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.sq_ring = &sq.daemon;
    ia.rq_ring = &rq.daemon;
    a = p.A().create_qp(p.node[0].pd, ia);
    QpInitAttr ib;
    ib.send_cq = ib.recv_cq = p.node[1].cq;
    b = p.B().create_qp(p.node[1].pd, ib);
    ASSERT_TRUE(a && b);
    bring_up(p.A(), a, b->qpn, p.B().config().ip);
    bring_up(p.B(), b, a->qpn, p.A().config().ip);
  }
  static void bring_up(Engine& e, Qp* q, std::uint32_t dqpn, const wire::IpAddr& dip) {
    abi::Connect k;
    k.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    k.dest_qp_num = dqpn;
    std::memcpy(k.dgid.raw, dip.b.data(), 16);
    k.min_rnr_timer = 1;
    k.timeout = 8;
    k.max_rd_atomic = k.max_dest_rd_atomic = 1;
    Pair::must(e.bring_up(q, k));
  }
  uroce_send_entry write_entry(std::uint64_t id, std::uint64_t loff, std::uint64_t roff, std::uint32_t len) {
    uroce_send_entry e{};
    e.wr_id = id;
    e.opcode = IBV_WR_RDMA_WRITE;
    e.send_flags = IBV_SEND_SIGNALED;
    e.num_sge = 1;
    e.sg_list[0] = {p.addr(0, loff), len, p.node[0].mr->lkey};
    e.op.rdma.remote_addr = p.addr(1, roff);
    e.op.rdma.rkey = p.rkey(1);
    return e;
  }
  /// Runs the wire until the application's CQ ring holds n entries (it pops them into out).
  bool wait_cqes(std::size_t n, std::vector<uroce_cq_entry>& out) {
    return p.wire.run_until(
        [&] {
          uroce_cq_entry e;
          while (cqr.app.pop(e)) out.push_back(e);
          return out.size() >= n;
        },
        100'000'000);
  }
};

TEST_F(Shared, WorkPostedInTheRingRunsAndCompletesIntoTheSharedCq) {
  for (std::uint32_t i = 0; i < 512; ++i) p.node[0].mem[i] = static_cast<std::uint8_t>(i * 3 + 1);
  ASSERT_TRUE(sq.app.push(write_entry(7, 0, 4096, 512)));
  EXPECT_EQ(p.A().take_posts(a), 1u) << "the engine takes the published entry itself";
  std::vector<uroce_cq_entry> got;
  ASSERT_TRUE(wait_cqes(1, got));
  EXPECT_EQ(got[0].wr_id, 7u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(0, std::memcmp(&p.node[1].mem[4096], &p.node[0].mem[0], 512));
  EXPECT_EQ(cq->depth(), 0u) << "the application consumed it from the shared ring";
}

TEST_F(Shared, TheRingIsTheWholeSendQueueSoAFullRingIsBackPressure) {
  // Nothing reaches B: WQEs stay outstanding, and their slots stay taken.
  sim::Impairments imp;
  imp.loss = 1.0;
  p.wire.set_impairments(imp);
  std::uint32_t pushed = 0;
  while (pushed < 40 && sq.app.push(write_entry(pushed, 0, 0, 64))) {
    ++pushed;
    p.A().take_posts(a);
  }
  EXPECT_EQ(pushed, 16u) << "a slot returns to the producer only when its WQE completes";
  EXPECT_EQ(a->sq.size(), 16u);
  p.wire.set_impairments({});
  std::vector<uroce_cq_entry> got;
  ASSERT_TRUE(wait_cqes(16, got));
  EXPECT_TRUE(sq.app.push(write_entry(99, 0, 0, 64))) << "completed slots are free again";
}

TEST_F(Shared, AnEntryRewrittenAfterItWasTakenChangesNothing) {
  for (std::uint32_t i = 0; i < 256; ++i) p.node[0].mem[i] = static_cast<std::uint8_t>(0x40 + i);
  ASSERT_TRUE(sq.app.push(write_entry(1, 0, 8192, 256)));
  ASSERT_EQ(p.A().take_posts(a), 1u);
  // The hostile application rewrites the published slot: another address,
  // a huge length, another opcode. The engine checked its own copy.
  uroce_send_entry* s = sq.slot(0);
  s->op.rdma.remote_addr = p.addr(1, 0);
  s->sg_list[0].length = 0xffffffff;
  s->num_sge = 200;
  s->opcode = IBV_WR_RDMA_READ;
  std::vector<uroce_cq_entry> got;
  ASSERT_TRUE(wait_cqes(1, got));
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(0, std::memcmp(&p.node[1].mem[8192], &p.node[0].mem[0], 256));
  EXPECT_EQ(p.node[1].mem[0], 0u) << "nothing was written where the rewritten entry pointed";
}

TEST_F(Shared, AMalformedEntryCompletesWithLocQpOpErrAndTheQpGoesToErr) {
  uroce_send_entry bad = write_entry(5, 0, 0, 64);
  bad.opcode = 200;
  ASSERT_TRUE(sq.app.push(bad));
  ASSERT_TRUE(sq.app.push(write_entry(6, 0, 0, 64)));
  p.A().take_posts(a);
  std::vector<uroce_cq_entry> got;
  ASSERT_TRUE(wait_cqes(2, got));
  EXPECT_EQ(got[0].wr_id, 5u);
  EXPECT_EQ(got[0].status, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(got[1].wr_id, 6u);
  EXPECT_EQ(got[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(a->state, IBV_QPS_ERR);
  EXPECT_EQ(p.A().counters()[PortCounter::bad_wqe], 1u);
}

TEST_F(Shared, HeaderAndIndicesOutOfRangeAreNotTrusted) {
  // The application scribbles over every header field it can reach.
  for (uroce_ring_header* h : {sq.header(), rq.header(), cqr.header()}) {
    h->entries = 0xffffffffu;
    h->entry_size = 3;
    h->magic = 0;
    h->prod = 0x7ffffff0u;
    h->cons = 0x80000123u;
  }
  // And claims every SQ slot holds the entry at some far index.
  for (std::uint32_t k = 0; k < 16; ++k) sq.slot(k)->seq = 0x7ffffff0u + k;
  EXPECT_EQ(p.A().take_posts(a), 0u) << "no slot holds the entry at the engine's own index";
  // A receive slot with a valid seq at the engine's index but 200 SGEs.
  uroce_recv_entry* r = rq.slot(0);
  std::memset(r, 0, sizeof *r);
  r->wr_id = 77;
  r->num_sge = 200;
  __atomic_store_n(&r->seq, 1u, __ATOMIC_RELEASE);
  // B sends a SEND: A's responder takes that malformed receive.
  Sge s = p.sge(1, 0, 32);
  SendWr w;
  w.wr_id = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = {&s, 1};
  ASSERT_EQ(p.B().post_send(b, w), 0);
  p.wire.run_until([&] { return p.A().counters()[PortCounter::bad_wqe] >= 1; }, 10'000'000);
  EXPECT_EQ(p.A().counters()[PortCounter::bad_wqe], 1u) << "the malformed receive is counted, not used";
  // Its LOC_QP_OP_ERR completion meets a CQ whose consumer index is out of
  // range: that reads as a full CQ, so the CQ overflows (counted, and its
  // QP goes to ERR), and nothing is written anywhere in the ring.
  p.A().poll(p.wire.now());
  EXPECT_EQ(p.A().counters()[PortCounter::cq_overflows], 1u);
  EXPECT_EQ(a->state, IBV_QPS_ERR);
  const uroce_cq_entry* c = reinterpret_cast<uroce_cq_entry*>(cqr.header() + 1);
  for (int k = 0; k < 64; ++k) EXPECT_EQ(c[k].seq, 0u) << "slot " << k;
}

TEST_F(Shared, ACqConsumerIndexOutOfRangeHurtsOnlyThatCq) {
  // The same, with the engine's producer index where the application says:
  // entries land at the engine's own index, within the ring.
  cqr.header()->entries = 0xffffffffu;
  cqr.header()->prod = 0x12345678u;
  ASSERT_TRUE(sq.app.push(write_entry(3, 0, 0, 64)));
  p.A().take_posts(a);
  std::vector<uroce_cq_entry> got;
  ASSERT_TRUE(wait_cqes(1, got));
  EXPECT_EQ(got[0].wr_id, 3u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
}

TEST(SharedHostile, AProducerThatRefillsAsFastAsTheEngineRefusesCannotHoldIt) {
  // A QP left in INIT, whose application republishes the next slot as soon
  // as the engine gives the last one back: each take_posts takes one ring's worth
  // at most, and says there may be more.
  Pair p{5, 1 << 16};
  SharedRing<uroce_send_entry> sq{16, UROCE_RING_SEND};
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = p.node[0].cq;
  ia.cap.max_send_wr = 16;
  ia.sq_ring = &sq.daemon;
  Qp* q = p.A().create_qp(p.node[0].pd, ia);
  ASSERT_NE(q, nullptr);
  ibv_qp_attr x{};
  x.qp_state = IBV_QPS_INIT;
  x.port_num = 1;
  Pair::must(p.A().modify_qp(q, x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  std::atomic<bool> stop{false};
  std::thread hostile([&] {
    std::uint32_t next = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint32_t cons = __atomic_load_n(&sq.header()->cons, __ATOMIC_ACQUIRE);
      while (next - cons < 16) {  // keep the ring full, whatever the engine takes
        uroce_send_entry* e = sq.slot(next);
        e->wr_id = next;
        __atomic_store_n(&e->seq, next + 1, __ATOMIC_RELEASE);
        ++next;
      }
    }
  });
  std::size_t worst = 0;
  bool always_more = true;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < until) {
    bool more = false;
    const std::size_t n = p.A().take_posts(q, &more);
    worst = std::max(worst, n);
    if (n >= 16 && !more) always_more = false;
  }
  stop = true;
  hostile.join();
  EXPECT_LE(worst, 16u) << "one take_posts took more than one ring's worth: the producer held the engine";
  EXPECT_GT(worst, 0u);
  EXPECT_TRUE(always_more) << "a pass that took a whole ring's worth must ask to be called again";
}

TEST_F(Shared, SendsPostedBeforeRtsAreRefusedWhetherOrNotAKickCameFirst) {
  // A fresh shared-ring QP brought to RTR, a WRITE published, not taken, then RTS.
  SharedRing<uroce_send_entry> sq2{16, UROCE_RING_SEND};
  SharedRing<uroce_recv_entry> rq2{16, UROCE_RING_RECV};
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = cq;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.sq_ring = &sq2.daemon;
  ia.rq_ring = &rq2.daemon;
  Qp* q = p.A().create_qp(p.node[0].pd, ia);
  ASSERT_NE(q, nullptr);
  abi::Connect k;
  k.dest_qp_num = b->qpn;
  std::memcpy(k.dgid.raw, p.B().config().ip.b.data(), 16);
  const auto steps = abi::bring_up_steps(k);
  Pair::must(p.A().modify_qp(q, steps[0].attr, steps[0].mask));
  Pair::must(p.A().modify_qp(q, steps[1].attr, steps[1].mask));
  p.node[1].mem[100] = 0;
  p.node[0].mem[0] = 0x5a;
  ASSERT_TRUE(sq2.app.push(write_entry(31, 0, 100, 1)));
  Pair::must(p.A().modify_qp(q, steps[2].attr, steps[2].mask));
  std::vector<uroce_cq_entry> got;
  ASSERT_TRUE(wait_cqes(1, got));
  EXPECT_EQ(got[0].wr_id, 31u);
  EXPECT_EQ(got[0].status, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(p.node[1].mem[100], 0) << "a send posted in RTR ran";
}

struct Hooks {
  int notified = 0;
  std::vector<std::pair<ibv_event_type, void*>> events;
  static void notify(void* ctx, Cq&) { ++static_cast<Hooks*>(ctx)->notified; }
  static void event(void* ctx, ibv_event_type t, Cq* cq, Qp* qp) {
    static_cast<Hooks*>(ctx)->events.emplace_back(t, cq ? static_cast<void*>(cq) : static_cast<void*>(qp));
  }
};

TEST_F(Shared, AnArmedCqIsNotifiedOncePerArm) {
  Hooks h;
  p.A().set_hooks(&Hooks::notify, &Hooks::event, &h);
  cq->want_notify(true);
  std::vector<uroce_cq_entry> got;
  ASSERT_TRUE(sq.app.push(write_entry(1, 0, 0, 64)));
  p.A().take_posts(a);
  ASSERT_TRUE(wait_cqes(1, got));
  EXPECT_EQ(h.notified, 0) << "not armed: no notification";
  cqr.app.arm_notify();
  for (std::uint64_t i = 2; i < 5; ++i) {
    ASSERT_TRUE(sq.app.push(write_entry(i, 0, 0, 64)));
    p.A().take_posts(a);
  }
  ASSERT_TRUE(wait_cqes(4, got));
  EXPECT_EQ(h.notified, 1) << "armed once: notified once, however many completions came";
}

// The order of a send completion's two effects, seen at the instant it
// matters: the first store into the CQ ring. The ring's pages are read-only
// until then; the write fault stops the engine mid-completion, and the
// handler reads the send ring's consumer index before letting the store
// through. An application that posts again the moment it sees a completion
// (perftest counts its room so) must find the slot already free: this fails
// when the completion is published first.
struct CqWriteWatch {
  std::uint8_t* begin = nullptr;
  std::size_t len = 0;
  const uroce_ring_header* sq = nullptr;
  std::uint32_t sq_cons_seen = 0;
  int faults = 0;
};
CqWriteWatch* g_cq_watch = nullptr;

void on_cq_write(int, siginfo_t* si, void*) {
  CqWriteWatch& w = *g_cq_watch;
  const auto* at = static_cast<const std::uint8_t*>(si->si_addr);
  if (at < w.begin || at >= w.begin + w.len) {
    signal(SIGSEGV, SIG_DFL);  // a real fault: it happens again, and kills
    return;
  }
  w.sq_cons_seen = __atomic_load_n(&w.sq->cons, __ATOMIC_ACQUIRE);
  ++w.faults;
  mprotect(w.begin, w.len, PROT_READ | PROT_WRITE);
}

TEST(SharedOrder, ASendSlotIsFreeBeforeItsCompletionIsVisible) {
  Pair p{13, 1 << 16};
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t cq_len = (uroce_ring_bytes(64, sizeof(uroce_cq_entry)) + page - 1) / page * page;
  void* cq_mem = mmap(nullptr, cq_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(cq_mem, MAP_FAILED);
  const auto cq_ring = abi::Ring<uroce_cq_entry>::create(cq_mem, 64, UROCE_RING_CQ, 1);
  abi::Ring<uroce_cq_entry> app_cq;
  ASSERT_EQ(abi::Ring<uroce_cq_entry>::attach(cq_mem, cq_len, UROCE_RING_CQ, app_cq), AttachError::kOk);
  SharedRing<uroce_send_entry> sq{16, UROCE_RING_SEND};
  Cq* cq = p.A().create_cq(64, &cq_ring);
  ASSERT_NE(cq, nullptr);
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = cq;
  ia.cap.max_send_wr = 16;
  ia.sq_ring = &sq.daemon;
  Qp* a = p.A().create_qp(p.node[0].pd, ia);
  QpInitAttr ib;
  ib.send_cq = ib.recv_cq = p.node[1].cq;
  Qp* b = p.B().create_qp(p.node[1].pd, ib);
  ASSERT_TRUE(a && b);
  Shared::bring_up(p.A(), a, b->qpn, p.B().config().ip);
  Shared::bring_up(p.B(), b, a->qpn, p.A().config().ip);

  CqWriteWatch watch{static_cast<std::uint8_t*>(cq_mem), cq_len, sq.header(), 0, 0};
  g_cq_watch = &watch;
  struct sigaction act{}, old{};
  act.sa_sigaction = on_cq_write;
  act.sa_flags = SA_SIGINFO;
  sigemptyset(&act.sa_mask);
  ASSERT_EQ(sigaction(SIGSEGV, &act, &old), 0);
  ASSERT_EQ(mprotect(cq_mem, cq_len, PROT_READ), 0);

  uroce_send_entry e{};
  e.wr_id = 5;
  e.opcode = IBV_WR_RDMA_WRITE;
  e.send_flags = IBV_SEND_SIGNALED;
  e.num_sge = 1;
  e.sg_list[0] = {p.addr(0, 0), 64, p.node[0].mr->lkey};
  e.op.rdma.remote_addr = p.addr(1, 0);
  e.op.rdma.rkey = p.rkey(1);
  ASSERT_TRUE(sq.app.push(e));
  p.A().take_posts(a);
  uroce_cq_entry c{};
  const bool done = p.wire.run_until([&] { return app_cq.pop(c); }, 100'000'000);

  sigaction(SIGSEGV, &old, nullptr);
  g_cq_watch = nullptr;
  munmap(cq_mem, cq_len);
  ASSERT_TRUE(done);
  EXPECT_EQ(c.wr_id, 5u);
  EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(watch.faults, 1) << "one first store into the CQ ring";
  EXPECT_EQ(watch.sq_cons_seen, 1u) << "the send slot went back to the producer before the completion was written";
}

TEST(CqOverflow, RaisesCqErrMovesItsQpsToErrAndIsCounted) {
  Pair p{3, 1 << 16};
  Hooks h;
  p.A().set_hooks(&Hooks::notify, &Hooks::event, &h);
  Cq* small = p.A().create_cq(4);
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = small;
  ia.cap.max_send_wr = 16;
  Qp* a = p.A().create_qp(p.node[0].pd, ia);
  QpInitAttr ib;
  ib.send_cq = ib.recv_cq = p.node[1].cq;
  Qp* b = p.B().create_qp(p.node[1].pd, ib);
  ASSERT_TRUE(small && a && b);
  Shared::bring_up(p.A(), a, b->qpn, p.B().config().ip);
  Shared::bring_up(p.B(), b, a->qpn, p.A().config().ip);
  // A second QP on a CQ of its own is untouched.
  const QpPair other = p.connect();
  Sge s = p.sge(0, 0, 64);
  for (std::uint64_t i = 0; i < 8; ++i) ASSERT_EQ(p.A().post_send(a, p.write_to(1, s, 0, i)), 0);
  p.wire.run_until([&] { return a->state == IBV_QPS_ERR; }, 100'000'000);
  EXPECT_EQ(a->state, IBV_QPS_ERR) << "the QP that completes into the overflowed CQ";
  ASSERT_EQ(h.events.size(), 2u);
  EXPECT_EQ(h.events[0], std::make_pair(IBV_EVENT_CQ_ERR, static_cast<void*>(small)));
  EXPECT_EQ(h.events[1], std::make_pair(IBV_EVENT_QP_FATAL, static_cast<void*>(a)));
  EXPECT_EQ(p.A().counters()[PortCounter::cq_overflows], 1u);
  EXPECT_EQ(p.A().counters()[PortCounter::cqe_dropped], 4u) << "8 completions, 4 fitted";
  EXPECT_TRUE(small->overflowed());
  EXPECT_EQ(small->depth(), 4u);
  QpInitAttr again;
  again.send_cq = again.recv_cq = small;
  EXPECT_EQ(p.A().create_qp(p.node[0].pd, again), nullptr) << "no new QP reports into a CQ that lost completions";
  EXPECT_EQ(other.a->state, IBV_QPS_RTS);
  std::vector<ibv_wc> wa;
  ASSERT_EQ(p.A().post_send(other.a, p.write_to(1, s, 0, 42)), 0);
  ASSERT_TRUE(p.wire.run_until([&] { return p.poll(0, wa) > 0 || !wa.empty(); }, 100'000'000));
  EXPECT_EQ(wa[0].wr_id, 42u);
  EXPECT_EQ(wa[0].status, IBV_WC_SUCCESS);
}

}  // namespace
}  // namespace uroce::testing
