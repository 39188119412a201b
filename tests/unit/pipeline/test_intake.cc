// The intake stage (stack/pipeline/intake.h): an application's posts reach
// the engine through its session's work ring, and a pass looks at the
// queues it names and no others. The test plays the application on shared
// memory it holds, as uroced shares a memfd, with the producer helpers the
// library uses (stack/abi/work_ring.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "stack/abi/doorbell.h"
#include "stack/abi/ring.h"
#include "stack/abi/send_entry.h"
#include "stack/abi/work_ring.h"
#include "stack/pipeline/intake.h"
#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

using pipeline::Intake;

/// A QP of node 0 whose send and receive queues are shared rings, and the
/// application's views of them.
struct SharedQp {
  static constexpr std::uint32_t kEntries = 16;
  std::vector<std::uint64_t> sq_mem = std::vector<std::uint64_t>(uroce_ring_bytes(kEntries, sizeof(uroce_send_entry)) / 8 + 8);
  std::vector<std::uint64_t> rq_mem = std::vector<std::uint64_t>(uroce_ring_bytes(kEntries, sizeof(uroce_recv_entry)) / 8 + 8);
  abi::Ring<uroce_send_entry> sq_daemon, sq;
  abi::Ring<uroce_recv_entry> rq_daemon, rq;
  Qp* qp = nullptr;

  SharedQp(Pair& p, Cq* cq) {
    sq_daemon = abi::Ring<uroce_send_entry>::create(sq_mem.data(), kEntries, UROCE_RING_SEND, 1);
    rq_daemon = abi::Ring<uroce_recv_entry>::create(rq_mem.data(), kEntries, UROCE_RING_RECV, 1);
    EXPECT_EQ(abi::Ring<uroce_send_entry>::attach(sq_mem.data(), sq_mem.size() * 8, UROCE_RING_SEND, sq), abi::AttachError::kOk);
    EXPECT_EQ(abi::Ring<uroce_recv_entry>::attach(rq_mem.data(), rq_mem.size() * 8, UROCE_RING_RECV, rq), abi::AttachError::kOk);
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = cq;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = kEntries;
    ia.sq_ring = &sq_daemon;
    ia.rq_ring = &rq_daemon;
    qp = p.A().create_qp(p.node[0].pd, ia);
    EXPECT_NE(qp, nullptr);
    abi::Connect k;
    k.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    k.dest_qp_num = 0x100;  // nothing answers: the test looks at what the engine took, not at the wire
    std::memcpy(k.dgid.raw, p.B().config().ip.b.data(), 16);
    k.timeout = 8;
    Pair::must(p.A().bring_up(qp, k));
  }
};

/// A session page in memory the test holds (page-aligned, zeroed, as a
/// fresh memfd is).
struct Page {
  alignas(4096) std::uint8_t bytes[UROCE_SESSION_PAGE_BYTES] = {};
  uroce_session_page* get() { return reinterpret_cast<uroce_session_page*>(bytes); }
};

struct IntakeTest : ::testing::Test {
  Pair p{5, 1 << 20, 512};
  std::unique_ptr<Page> page = std::make_unique<Page>();
  std::unique_ptr<Page> page2 = std::make_unique<Page>();  // another session's
  Intake in{p.A()};
  std::vector<std::unique_ptr<SharedQp>> qps;
  static constexpr std::uint32_t kSession = 7;

  void make(std::size_t n, std::uint16_t minor = UROCE_ABI_MINOR) {
    in.add_session(kSession, page->get(), minor);
    for (std::size_t i = 0; i < n; ++i) {
      qps.push_back(std::make_unique<SharedQp>(p, p.node[0].cq));
      in.add_qp(kSession, qps.back()->qp);
    }
  }
  /// A 64-byte WRITE, written by the one encoder, as liburoce writes it.
  uroce_send_entry write_entry(std::uint64_t id) {
    ibv_sge sg{p.addr(0, 0), 64, p.node[0].mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.wr.rdma = {p.addr(1, 0), p.rkey(1)};
    uroce_send_entry e;
    EXPECT_EQ(abi::encode_send(wr, {}, nullptr, e), nullptr);
    return e;
  }
  /// What liburoce does for a send: publish, then name the queue.
  bool post(std::size_t i, std::uint64_t id = 1) {
    SharedQp& q = *qps[i];
    if (!q.sq.push(write_entry(id))) return false;
    (void)abi::queue_work(page->get(), q.sq.header(), q.qp->qpn);
    return true;
  }
};

TEST_F(IntakeTest, APassLooksAtTheQpPostedToAndNoOther) {
  make(64);
  ASSERT_TRUE(post(5));
  EXPECT_GT(in.run(), 0u);
  EXPECT_EQ(in.counters().names, 1u);
  EXPECT_EQ(in.counters().looks, 1u) << "63 idle QPs of the session cost nothing";
  EXPECT_EQ(qps[5]->qp->sq.size(), 1u) << "the engine took the entry";
  EXPECT_EQ(in.run(), 0u);
  EXPECT_EQ(in.counters().looks, 1u) << "nothing named, nothing looked at";
}

TEST_F(IntakeTest, ManyPostsBeforeAPassAreOneNameAndAPostAfterItNamesAgain) {
  make(4);
  for (int k = 0; k < 10; ++k) ASSERT_TRUE(post(2, static_cast<std::uint64_t>(k)));
  (void)in.run();
  EXPECT_EQ(in.counters().names, 1u) << "the queue is named once while the name waits";
  EXPECT_EQ(qps[2]->qp->sq.size(), 10u);
  ASSERT_TRUE(post(2, 10));
  (void)in.run();
  EXPECT_EQ(in.counters().names, 2u) << "taking the name cleared its flag";
  EXPECT_EQ(qps[2]->qp->sq.size(), 11u);
}

TEST_F(IntakeTest, ANameThatIsNotTheSessionsOwnIsCountedAndIgnored) {
  make(2);
  // A QP of another session on the same engine, and a number nobody holds.
  in.add_session(8, page2->get(), UROCE_ABI_MINOR);
  SharedQp other(p, p.node[0].cq);
  in.add_qp(8, other.qp);
  ASSERT_TRUE(other.sq.push(write_entry(1)));
  uroce_ring_header fake[2] = {};
  ASSERT_TRUE(abi::queue_work(page->get(), other.sq.header(), other.qp->qpn));
  ASSERT_TRUE(abi::queue_work(page->get(), &fake[0], 0xabcdef));
  ASSERT_TRUE(abi::queue_work(page->get(), &fake[1], UROCE_WORK_TM_SRQ | 99));
  (void)in.run();
  EXPECT_EQ(in.counters().foreign, 3u);
  EXPECT_EQ(in.counters().looks, 0u);
  EXPECT_EQ(other.qp->sq.size(), 0u) << "session 7 cannot make the engine take session 8's posts";
}

TEST_F(IntakeTest, AFullWorkRingMakesOneLookAtEveryQueueOfTheSession) {
  make(3);
  // Fill the ring with names of nothing, then post: the name is lost, the
  // overflow word is set instead.
  std::vector<uroce_ring_header> fake(UROCE_WORK_ENTRIES);
  for (auto& h : fake) ASSERT_TRUE(abi::queue_work(page->get(), &h, 0xfffff0));
  ASSERT_TRUE(qps[1]->sq.push(write_entry(1)));
  EXPECT_FALSE(abi::queue_work(page->get(), qps[1]->sq.header(), qps[1]->qp->qpn));
  (void)in.run();
  EXPECT_EQ(in.counters().overflows, 1u);
  EXPECT_EQ(in.counters().scans, 1u);
  EXPECT_EQ(qps[1]->qp->sq.size(), 1u) << "the post whose name was lost is taken";
  ASSERT_TRUE(post(1));
  (void)in.run();
  EXPECT_EQ(qps[1]->qp->sq.size(), 2u) << "the scan cleared the flag: the next post is named";
  EXPECT_EQ(in.counters().scans, 1u);
}

TEST_F(IntakeTest, OlderApplicationsAreServedByThePostsWordOrEveryPass) {
  make(3, 19);  // a library of minor 5..19: bumps the posts word
  ASSERT_TRUE(qps[0]->sq.push(write_entry(1)));
  (void)in.run();
  EXPECT_EQ(in.counters().looks, 0u) << "the posts word has not moved";
  (void)abi::bump_posts(page->get(), -1);
  (void)in.run();
  EXPECT_EQ(in.counters().looks, 3u) << "every QP of the session";
  EXPECT_EQ(qps[0]->qp->sq.size(), 1u);
  (void)in.run();
  EXPECT_EQ(in.counters().looks, 3u);
  in.remove_session(kSession);
  in.add_session(kSession, page->get(), 4);  // before minor 5: every pass
  for (auto& q : qps) in.add_qp(kSession, q->qp);
  (void)in.run();
  (void)in.run();
  EXPECT_EQ(in.counters().looks, 9u);
}

TEST_F(IntakeTest, AReceivePostedInErrIsFlushedThroughItsName) {
  make(1);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_TRUE(p.A().modify_qp(qps[0]->qp, a, IBV_QP_STATE));
  ASSERT_EQ(qps[0]->sq.qp_state(), IBV_QPS_ERR);
  uroce_recv_entry r{};
  r.wr_id = 42;
  ASSERT_TRUE(qps[0]->rq.push(r));
  ASSERT_TRUE(abi::queue_work(page->get(), qps[0]->sq.header(), qps[0]->qp->qpn));
  (void)in.run();
  std::vector<ibv_wc> wc;
  p.poll(0, wc);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 42u);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
}

// Producers on their own threads (an application's), the intake on this
// one: every post is taken, however the names and the clears interleave.
TEST_F(IntakeTest, NoPostIsLeftUnseenByConcurrentProducers) {
  make(4);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;  // each post completes at once, flushed, and frees its slot
  for (auto& q : qps) ASSERT_TRUE(p.A().modify_qp(q->qp, a, IBV_QP_STATE));
  constexpr int kPerThread = 20000;
  std::atomic<bool> stop{false};
  std::vector<std::thread> producers;
  for (std::size_t t = 0; t < qps.size(); ++t)
    producers.emplace_back([&, t] {
      for (int k = 0; k < kPerThread && !stop.load(std::memory_order_relaxed);) {
        if (post(t, static_cast<std::uint64_t>(k))) ++k;
        else std::this_thread::yield();
      }
    });
  std::size_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::vector<ibv_wc> wc;
  while (done < qps.size() * kPerThread && std::chrono::steady_clock::now() < deadline) {
    (void)in.run();
    wc.clear();
    while (p.poll(0, wc) > 0) {
    }
    done += wc.size();
    if (wc.empty()) std::this_thread::yield();
  }
  stop = true;
  for (auto& t : producers) t.join();
  EXPECT_EQ(done, qps.size() * kPerThread) << "a post was published and never taken";
}

}  // namespace
}  // namespace uroce::testing
