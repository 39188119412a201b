// sigbus_guard: a SIGBUS on a guarded range (an application's memory, here
// a memfd truncated under its mapping, the classic way to cause one) is
// caught, the range replaced, its owner reported; outside any guarded range
// a SIGBUS still kills.
#include "control/node/sigbus_guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace g = uroce::control::sigbus_guard;

namespace {

constexpr std::size_t kLen = 64 * 1024;

/// A memfd of kLen bytes, mapped shared (as uroced maps an MR), then
/// truncated to nothing: the next access to the mapping faults.
struct Doomed {
  int fd = -1;
  volatile std::uint8_t* p = nullptr;
  Doomed() {
    fd = ::memfd_create("doomed", MFD_CLOEXEC);
    EXPECT_EQ(::ftruncate(fd, kLen), 0);
    void* m = ::mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(m, MAP_FAILED);
    p = static_cast<volatile std::uint8_t*>(m);
    p[0] = 0x5a;  // shared with the file while it lasts
  }
  void truncate() { EXPECT_EQ(::ftruncate(fd, 0), 0); }
  ~Doomed() {
    ::munmap(const_cast<std::uint8_t*>(p), kLen);
    ::close(fd);
  }
};

TEST(SigbusGuard, AFaultInAGuardedRangeIsCaughtReplacedAndReported) {
  ASSERT_TRUE(g::install(16));
  Doomed a, b;
  const int sa = g::guard(const_cast<std::uint8_t*>(a.p), kLen, 7);
  const int sb = g::guard(const_cast<std::uint8_t*>(b.p), kLen, 9);
  ASSERT_GE(sa, 0);
  ASSERT_GE(sb, 0);
  const std::uint64_t before = g::caught();
  a.truncate();
  a.p[4096 * 3 + 5] = 0x11;  // SIGBUS without the guard
  EXPECT_EQ(a.p[4096 * 3 + 5], 0x11) << "the write landed on the replacement memory";
  EXPECT_EQ(a.p[0], 0) << "the whole range was replaced, with zeros";
  EXPECT_EQ(g::caught(), before + 1);
  std::vector<std::uint32_t> owners;
  g::take_poisoned([&](std::uint32_t o) { owners.push_back(o); });
  EXPECT_EQ(owners, std::vector<std::uint32_t>{7}) << "only the faulting range's owner";
  owners.clear();
  g::take_poisoned([&](std::uint32_t o) { owners.push_back(o); });
  EXPECT_TRUE(owners.empty()) << "each fault is reported once";
  // The other range still shares its memfd's pages.
  b.p[1] = 0x22;
  std::uint8_t via_fd[2] = {};
  ASSERT_EQ(::pread(b.fd, via_fd, 2, 0), 2);
  EXPECT_EQ(via_fd[1], 0x22);
  g::unguard(sa);
  g::unguard(sb);
}

TEST(SigbusGuardDeathTest, AFaultOutsideEveryGuardedRangeStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ASSERT_TRUE(g::install(16));
  // Killed by SIGBUS (or, under ASan, by its report: whatever handled
  // SIGBUS before the guard decides).
  EXPECT_DEATH(
      {
        Doomed a;
        const int s = g::guard(const_cast<std::uint8_t*>(a.p), kLen, 7);
        g::unguard(s);  // no longer application memory in use
        a.truncate();
        a.p[100] = 1;
      },
      "");
}

TEST(SigbusGuard, SlotsAreReusedAndTheTableHasABound) {
  ASSERT_TRUE(g::install(16));
  static std::uint8_t mem[4096 * 4];
  std::vector<int> slots;
  for (int i = 0; i < 64; ++i) {
    const int s = g::guard(mem, sizeof mem, 1);
    if (s < 0) break;
    slots.push_back(s);
  }
  EXPECT_EQ(slots.size(), 16u) << "the table holds what install() made room for";
  g::unguard(slots.back());
  EXPECT_EQ(g::guard(mem, sizeof mem, 1), slots.back()) << "a freed slot is used again";
  for (int s : slots) g::unguard(s);
}

}  // namespace
