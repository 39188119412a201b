// The shared-memory ABI: layout (from C and C++), attach checks, and the
// ring protocol across two mappings of one memfd, as an application and the
// daemon would see it, with a producer and a consumer on two threads.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "stack/abi/ring.h"

extern "C" size_t uroce_abi_c_layout(int which);

namespace uroce::abi {
namespace {

TEST(Abi, LayoutIsTheSameInCAndCpp) {
  EXPECT_EQ(uroce_abi_c_layout(0), sizeof(uroce_ring_header));
  EXPECT_EQ(uroce_abi_c_layout(1), sizeof(uroce_send_entry));
  EXPECT_EQ(uroce_abi_c_layout(2), sizeof(uroce_recv_entry));
  EXPECT_EQ(uroce_abi_c_layout(3), sizeof(uroce_cq_entry));
  EXPECT_EQ(uroce_abi_c_layout(4), offsetof(uroce_send_entry, sg_list));
  EXPECT_EQ(sizeof(uroce_ring_header), 192u);
  EXPECT_EQ(uroce_ring_bytes(64, sizeof(uroce_cq_entry)), 192u + 64 * 64);
}

/// One memfd mapped twice: two addresses for the same pages.
struct Shared {
  explicit Shared(std::size_t n) : bytes(n) {
    fd = memfd_create("uroce-ring-test", 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(n)), 0);
    a = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    b = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ~Shared() {
    munmap(a, bytes);
    munmap(b, bytes);
    close(fd);
  }
  std::size_t bytes;
  int fd = -1;
  void* a = nullptr;
  void* b = nullptr;
};

TEST(Ring, ProducerAndConsumerOnTwoMappingsAndTwoThreads) {
  constexpr std::uint32_t kEntries = 64;  // small, so the ring fills and wraps many times
  constexpr std::uint64_t kCount = 1'000'000;
  Shared shm(uroce_ring_bytes(kEntries, sizeof(uroce_send_entry)));
  ASSERT_NE(shm.a, shm.b);
  auto prod = Ring<uroce_send_entry>::create(shm.a, kEntries, UROCE_RING_SEND, 7);
  Ring<uroce_send_entry> cons;
  ASSERT_EQ(Ring<uroce_send_entry>::attach(shm.b, shm.bytes, UROCE_RING_SEND, cons), AttachError::kOk);
  EXPECT_EQ(cons.handle(), 7u);
  std::uint64_t bad = 0, got = 0;
  std::thread consumer([&] {
    uroce_send_entry e;
    while (got < kCount) {
      if (!cons.pop(e)) continue;
      // Every field written by the producer is there: nothing torn, nothing stale.
      if (e.wr_id != got || e.op.rdma.remote_addr != got * 3 || e.sg_list[3].lkey != static_cast<std::uint32_t>(got ^ 0x5a5a) ||
          e.opcode != static_cast<std::uint8_t>(got))
        ++bad;
      ++got;
    }
  });
  std::uint64_t full = 0;
  for (std::uint64_t i = 0; i < kCount;) {
    uroce_send_entry e{};
    e.wr_id = i;
    e.op.rdma.remote_addr = i * 3;
    e.opcode = static_cast<std::uint8_t>(i);
    e.sg_list[3].lkey = static_cast<std::uint32_t>(i ^ 0x5a5a);
    if (prod.push(e)) {
      ++i;
    } else {
      ++full;
    }
  }
  consumer.join();
  EXPECT_EQ(got, kCount);
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(full, 0u);  // the full path was exercised
  uroce_send_entry e;
  EXPECT_FALSE(cons.pop(e));  // and now it is empty
}

/// A CQ ring of 4 on two mappings: the producer's on `a`, the consumer's on
/// `b`, with wr_ids 0..3 pushed (the ring full).
void full_ring_of_four(Shared& shm, Ring<uroce_cq_entry>& p, Ring<uroce_cq_entry>& c) {
  p = Ring<uroce_cq_entry>::create(shm.a, 4, UROCE_RING_CQ, 1);
  ASSERT_EQ(Ring<uroce_cq_entry>::attach(shm.b, shm.bytes, UROCE_RING_CQ, c), AttachError::kOk);
  uroce_cq_entry e{};
  for (int i = 0; i < 4; ++i) {
    e.wr_id = static_cast<std::uint64_t>(i);
    EXPECT_TRUE(p.push(e));
  }
}

TEST(Ring, FullAndEmptyOnOneThread) {
  Shared shm(uroce_ring_bytes(4, sizeof(uroce_cq_entry)));
  Ring<uroce_cq_entry> p, c;
  full_ring_of_four(shm, p, c);
  uroce_cq_entry e{};
  EXPECT_FALSE(p.push(e));  // full
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(c.pop(e));
    EXPECT_EQ(e.wr_id, static_cast<std::uint64_t>(i));
  }
  EXPECT_FALSE(c.pop(e));  // empty
  EXPECT_TRUE(p.push(e));  // room again
}

// A CQ's resize: what the consumer has not taken moves to the new ring, in
// order, with the notification state; a ring too small for it is refused.
TEST(Ring, CopyToMovesWhatWaitsAndTheNotificationState) {
  Shared shm(uroce_ring_bytes(4, sizeof(uroce_cq_entry)));
  Ring<uroce_cq_entry> p, c;
  full_ring_of_four(shm, p, c);
  uroce_cq_entry e{};
  ASSERT_TRUE(c.pop(e));  // the consumer took #0: #1..#3 wait
  c.arm_notify();
  ASSERT_TRUE(p.take_notify());  // notified == arm == 1
  c.arm_notify();                // armed again, not yet notified
  std::vector<std::byte> small(uroce_ring_bytes(2, sizeof(uroce_cq_entry)));
  auto too_small = Ring<uroce_cq_entry>::create(small.data(), 2, UROCE_RING_CQ, 1);
  EXPECT_FALSE(p.copy_to(too_small));
  std::vector<std::byte> big(uroce_ring_bytes(16, sizeof(uroce_cq_entry)));
  auto bigger = Ring<uroce_cq_entry>::create(big.data(), 16, UROCE_RING_CQ, 1);
  ASSERT_TRUE(p.copy_to(bigger));
  Ring<uroce_cq_entry> c2;
  ASSERT_EQ(Ring<uroce_cq_entry>::attach(big.data(), big.size(), UROCE_RING_CQ, c2), AttachError::kOk);
  for (int i = 1; i < 4; ++i) {
    ASSERT_TRUE(c2.pop(e));
    EXPECT_EQ(e.wr_id, static_cast<std::uint64_t>(i));
  }
  EXPECT_FALSE(c2.pop(e));
  EXPECT_EQ(c2.notified(), 1u);
  EXPECT_TRUE(bigger.take_notify());  // the second arm carried over: it is still owed
}

TEST(Ring, AttachRefusesWhatItCannotTrust) {
  Shared shm(uroce_ring_bytes(8, sizeof(uroce_recv_entry)));
  Ring<uroce_recv_entry>::create(shm.a, 8, UROCE_RING_RECV, 3);
  auto* h = static_cast<uroce_ring_header*>(shm.a);
  Ring<uroce_recv_entry> r;
  EXPECT_EQ(Ring<uroce_recv_entry>::attach(shm.b, 100, UROCE_RING_RECV, r), AttachError::kTooSmall);
  EXPECT_EQ(Ring<uroce_recv_entry>::attach(shm.b, shm.bytes, UROCE_RING_SEND, r), AttachError::kBadKind);
  Ring<uroce_cq_entry> wrong_type;
  EXPECT_EQ(Ring<uroce_cq_entry>::attach(shm.b, shm.bytes, UROCE_RING_RECV, wrong_type), AttachError::kBadEntrySize);
  h->major = UROCE_ABI_MAJOR + 1;
  EXPECT_EQ(Ring<uroce_recv_entry>::attach(shm.b, shm.bytes, UROCE_RING_RECV, r), AttachError::kBadVersion);
  EXPECT_STREQ(to_string(AttachError::kBadVersion), "ABI major version mismatch");
  h->major = UROCE_ABI_MAJOR;
  h->entries = 6;
  EXPECT_EQ(Ring<uroce_recv_entry>::attach(shm.b, shm.bytes, UROCE_RING_RECV, r), AttachError::kBadEntries);
  h->entries = 8;
  h->magic = 0;
  EXPECT_EQ(Ring<uroce_recv_entry>::attach(shm.b, shm.bytes, UROCE_RING_RECV, r), AttachError::kBadMagic);
  h->magic = UROCE_ABI_MAGIC;
  EXPECT_EQ(Ring<uroce_recv_entry>::attach(shm.b, shm.bytes, UROCE_RING_RECV, r), AttachError::kOk);
  EXPECT_TRUE(uroce_abi_compatible(UROCE_ABI_MAJOR, UROCE_ABI_MINOR + 5));
  EXPECT_FALSE(uroce_abi_compatible(UROCE_ABI_MAJOR + 1, 0));
}

}  // namespace
}  // namespace uroce::abi
