// The sleep and wake-up protocols across two threads, as an application and
// the daemon run them over shared memory:
//  - the session page and doorbell (application -> daemon): the consumer
//    announces that it may sleep, looks at its ring once more, and blocks on
//    the doorbell; the producer rings only when it sees the announcement;
//  - CQ notification (daemon -> application): the consumer arms, polls once
//    more, and blocks on its channel; the producer signals once per arm.
// A lost wake-up shows as a wait that outlasts a generous bound, so the tests
// fail on it rather than hang. Each moves 1,000,000 entries while the
// consumer goes to sleep thousands of times.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "stack/abi/doorbell.h"
#include "stack/abi/ring.h"

namespace uroce::abi {
namespace {

constexpr std::uint32_t kEntries = 1'000'000;
constexpr int kStallMs = 2000;  // far above any scheduling delay: only a lost wake-up waits this long

struct Pair {
  int fd[2] = {-1, -1};
  Pair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, fd), 0); }
  ~Pair() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
};

/// The producer's pauses: every 97th entry it waits a few microseconds, so
/// the consumer runs dry and goes to sleep again and again.
void pause_now_and_then(std::uint32_t i) {
  if (i % 97 != 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(i % 7 * 3);
  while (std::chrono::steady_clock::now() < until) {
  }
}

/// Every 1000th entry the producer first waits (bounded) until `ready`
/// says the consumer is about to block, so the consumer blocks at least
/// 1000 times whatever the two threads' speeds; the pauses in between
/// put posts at every other moment of the protocol.
bool wait_for(const std::atomic<bool>& ready) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ready.load())
    if (std::chrono::steady_clock::now() > end) return false;
    else std::this_thread::yield();
  return true;
}

bool wait_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, kStallMs) == 1;
}

/// The producer's side of both protocols: kEntries entries in order, with
/// `signal(ring)` after each push (bump_posts, or take_notify and ring).
template <typename E, typename Signal>
std::thread start_producer(Ring<E>& prod, std::atomic<bool>& blocking, Signal signal) {
  return std::thread([&prod, &blocking, signal]() mutable {
    for (std::uint32_t i = 0; i < kEntries; ++i) {
      if (i % 1000 == 0) {
        EXPECT_TRUE(wait_for(blocking));
        blocking = false;
      }
      E e{};
      e.wr_id = i;
      while (!prod.push(e)) std::this_thread::yield();
      signal(prod);
      pause_now_and_then(i);
    }
  });
}

struct Consumed {
  std::uint32_t next = 0, blocks = 0, stalls = 0;
};

/// The consumer's side: take entries in order; when the ring is empty,
/// `prepare()` (announce the sleep, or arm), look once more, and block on
/// `fd` only if it is still empty; `woken()` after.
template <typename E, typename Prepare, typename Woken>
Consumed consume(Ring<E>& cons, int fd, std::atomic<bool>& blocking, Prepare prepare, Woken woken) {
  Consumed c;
  while (c.next < kEntries && c.stalls == 0) {
    E e;
    bool got = cons.pop(e);
    if (!got) {
      prepare();
      got = cons.pop(e);  // the last look after announcing or arming
      if (!got) {
        ++c.blocks;
        blocking = true;
        if (!wait_readable(fd)) ++c.stalls;
        (void)drain(fd);
      }
      woken();
    }
    if (got) {
      EXPECT_EQ(e.wr_id, c.next) << "out of order or lost";
      ++c.next;
    }
  }
  return c;
}

template <typename E>
struct TestRing {
  explicit TestRing(uroce_ring_kind kind) : mem(uroce_ring_bytes(256, sizeof(E))) {
    prod = Ring<E>::create(mem.data(), 256, kind, 1);
    EXPECT_EQ(Ring<E>::attach(mem.data(), mem.size(), kind, cons), AttachError::kOk);
  }
  std::vector<std::uint8_t> mem;
  Ring<E> prod, cons;
};

TEST(Doorbell, NoLostWakeUpAcrossAMillionPosts) {
  TestRing<uroce_recv_entry> r(UROCE_RING_RECV);
  uroce_session_page page{};
  Pair bell;
  std::uint32_t rung = 0;
  std::atomic<bool> blocking{false};
  std::thread producer = start_producer(r.prod, blocking, [&](Ring<uroce_recv_entry>&) {
    if (bump_posts(&page, bell.fd[1])) ++rung;
  });
  const Consumed c = consume(
      r.cons, bell.fd[0], blocking, [&] { announce_sleep(&page); }, [&] { announce_awake(&page); });
  producer.join();
  EXPECT_EQ(c.stalls, 0u) << "a post waited " << kStallMs << " ms for the consumer: a lost wake-up";
  EXPECT_EQ(c.next, kEntries);
  EXPECT_GE(c.blocks, 1000u);
  EXPECT_GE(rung, 1000u);
  EXPECT_GE(page.sleeps, c.blocks);
}

TEST(Doorbell, RingsOnlyWhileTheConsumerMaySleep) {
  uroce_session_page page{};
  Pair bell;
  EXPECT_FALSE(bump_posts(&page, bell.fd[1])) << "an awake consumer is not rung";
  EXPECT_EQ(drain(bell.fd[0]), 0u);
  announce_sleep(&page);
  EXPECT_EQ(page.sleeps, 1u);
  EXPECT_TRUE(bump_posts(&page, bell.fd[1]));
  EXPECT_TRUE(bump_posts(&page, bell.fd[1]));
  EXPECT_EQ(drain(bell.fd[0]), 2u);
  announce_awake(&page);
  EXPECT_FALSE(bump_posts(&page, bell.fd[1]));
  EXPECT_FALSE(bump_posts(nullptr, bell.fd[1])) << "an old daemon without a page: never rung";
}

TEST(Doorbell, NoLostCqNotificationAcrossAMillionCompletions) {
  TestRing<uroce_cq_entry> r(UROCE_RING_CQ);
  Pair chan;  // the completion channel: the daemon writes fd[1], the application waits on fd[0]
  std::atomic<bool> blocking{false};
  std::thread producer = start_producer(r.prod, blocking, [&](Ring<uroce_cq_entry>& prod) {
    if (prod.take_notify()) EXPECT_TRUE(ring(chan.fd[1]));
  });
  const Consumed c = consume(
      r.cons, chan.fd[0], blocking, [&] { r.cons.arm_notify(); }, [] {});
  producer.join();
  EXPECT_EQ(c.stalls, 0u) << "a completion waited " << kStallMs << " ms for its notification: a lost wake-up";
  EXPECT_EQ(c.next, kEntries);
  EXPECT_GE(c.blocks, 1000u);
}

TEST(Doorbell, OnlyUnixDatagramSocketsAreAccepted) {
  Pair p;
  EXPECT_TRUE(is_unix_dgram(p.fd[0]));
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  EXPECT_FALSE(is_unix_dgram(pipefd[1]));  // a full pipe would block the daemon
  int stream[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, stream), 0);
  EXPECT_FALSE(is_unix_dgram(stream[0]));
  for (int fd : {pipefd[0], pipefd[1], stream[0], stream[1]}) ::close(fd);
}

TEST(Doorbell, RingingAFullChannelNeverBlocks) {
  Pair p;
  // Nobody reads fd[0]: the socket fills up, and each ring still returns at
  // once (the fd is readable already, so nothing is lost).
  int ok = 0;
  for (int i = 0; i < 100000; ++i) ok += ring(p.fd[1]) ? 1 : 0;
  EXPECT_EQ(ok, 100000);
  EXPECT_GT(drain(p.fd[0]), 0u);
}

}  // namespace
}  // namespace uroce::abi
