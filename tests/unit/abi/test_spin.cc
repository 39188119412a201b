// abi::AdaptiveSpin: how long a waiter polls before it blocks, learnt from
// the gaps it has seen (stack/abi/spin.h).
#include "stack/abi/spin.h"

#include <gtest/gtest.h>

namespace {
using uroce::abi::AdaptiveSpin;
using uroce::abi::kFirstNapForNs;
using uroce::abi::kNapForNs;
using uroce::abi::kNapMemoryNs;
constexpr std::uint64_t kUs = 1000;

TEST(AdaptiveSpin, WithoutGapsItPollsTheFloor) {
  AdaptiveSpin s(200 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 5 * kUs);
  EXPECT_EQ(s.window_ns(0), 0u) << "a floor of 0 and nothing learnt: no polling";
}

TEST(AdaptiveSpin, ShortGapsAreCoveredTwice) {
  AdaptiveSpin s(200 * kUs);
  for (int i = 0; i < 20; ++i) s.gap(8 * kUs);  // a ping-pong's message every 8 us
  EXPECT_EQ(s.window_ns(5 * kUs), 16 * kUs);
  EXPECT_EQ(s.window_ns(50 * kUs), 50 * kUs) << "never under the floor";
  EXPECT_EQ(s.window_ns(0), 0u) << "a floor of 0: polling off, whatever was learnt";
}

TEST(AdaptiveSpin, SparseTrafficGetsTheFloorOnly) {
  AdaptiveSpin s(200 * kUs);
  for (int i = 0; i < 20; ++i) s.gap(1000 * kUs);  // past the cap, and past four caps
  EXPECT_EQ(s.window_ns(5 * kUs), 5 * kUs);
  s.gap(801 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 5 * kUs) << "a last gap just past four caps: still sparse";
  // Up to the cap, the window is twice the gap, at most the cap.
  AdaptiveSpin t(200 * kUs);
  for (int i = 0; i < 20; ++i) t.gap(150 * kUs);
  EXPECT_EQ(t.window_ns(5 * kUs), 200 * kUs);
  for (int i = 0; i < 60; ++i) t.gap(60 * kUs);
  EXPECT_EQ(t.window_ns(5 * kUs), 120 * kUs);
}

TEST(AdaptiveSpin, AGapThatASleepMadeLongIsLearntBackDown) {
  AdaptiveSpin s(200 * kUs);
  s.gap(60 * kUs);  // the first message after a sleep: the wake-up's cost is in it
  EXPECT_EQ(s.window_ns(5 * kUs), 120 * kUs) << "polls long enough to find the next one";
  for (int i = 0; i < 30; ++i) s.gap(8 * kUs);  // then measured while polling
  EXPECT_LE(s.window_ns(5 * kUs), 17 * kUs);
  EXPECT_GE(s.window_ns(5 * kUs), 16 * kUs);
}

TEST(AdaptiveSpin, APingPongSleptThroughIsPolledForAgain) {
  // The state one test left behind (sparse), then a ping-pong whose gaps,
  // measured across the sleeps of four waiters on a slow host, stay past
  // the cap: the next one is polled for, and once every side polls the
  // gaps are short and the window follows them.
  AdaptiveSpin s(200 * kUs);
  for (int i = 0; i < 20; ++i) s.gap(5000 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 5 * kUs);
  s.gap(500 * kUs);
  EXPECT_GT(s.average_gap_ns(), 200 * kUs) << "the average is still past the cap";
  EXPECT_EQ(s.window_ns(5 * kUs), 800 * kUs) << "but the last gap was near: poll for twice it, up to four caps";
  s.gap(300 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 600 * kUs) << "twice the last gap";
  s.gap(800 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 800 * kUs) << "up to four caps";
  s.gap(801 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 5 * kUs) << "past four caps: sparse";
  for (int i = 0; i < 30; ++i) s.gap(25 * kUs);
  EXPECT_LE(s.window_ns(5 * kUs), 51 * kUs);
  EXPECT_GE(s.window_ns(5 * kUs), 50 * kUs);
}

TEST(AdaptiveSpin, OneLongPauseMovesTheAverageByABoundedStep) {
  AdaptiveSpin s(200 * kUs);
  for (int i = 0; i < 20; ++i) s.gap(8 * kUs);
  s.gap(60'000'000 * kUs);  // a minute without traffic
  EXPECT_EQ(s.window_ns(5 * kUs), 200 * kUs) << "a quarter of the clipped pause: polls the cap for now";
  for (int i = 0; i < 8; ++i) s.gap(8 * kUs);
  EXPECT_LT(s.window_ns(5 * kUs), 40 * kUs) << "a few short gaps bring it back";
  EXPECT_GT(s.window_ns(5 * kUs), 5 * kUs);
}

TEST(AdaptiveSpin, ACapChangeAppliesToTheNextWindow) {
  AdaptiveSpin s(200 * kUs);
  for (int i = 0; i < 20; ++i) s.gap(80 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 160 * kUs);
  s.set_cap(100 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 100 * kUs);
  s.set_cap(50 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 160 * kUs) << "the gaps are past the cap now, but within four caps: twice the last";
  s.set_cap(10 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 5 * kUs) << "past four caps: sparse";
}

TEST(AdaptiveSpin, ALateYieldNapsForAWhileThatGrowsWhileTheCompetitorStays) {
  constexpr std::uint64_t kMs = 1000 * kUs;
  AdaptiveSpin s;
  EXPECT_TRUE(s.yielded(0, 10 * kUs)) << "back in 10 us: the core is free";
  EXPECT_TRUE(s.yielded(1 * kMs, 1 * kMs + 400 * kUs)) << "back in 0.4 ms: the process waited for ran";
  EXPECT_FALSE(s.naps(2 * kMs));
  EXPECT_EQ(s.nap_for_ns(), 0u);
  // An application's start-up on the core: one slice, then it is done.
  EXPECT_FALSE(s.yielded(3 * kMs, 3 * kMs + 700 * kUs)) << "back after a slice: a process that keeps the core";
  EXPECT_EQ(s.nap_for_ns(), kFirstNapForNs);
  EXPECT_TRUE(s.naps(4 * kMs));
  EXPECT_EQ(s.window_ns(5 * kUs, 4 * kMs), AdaptiveSpin::kDefaultCapNs) << "naps poll for the cap";
  EXPECT_EQ(s.window_ns(0, 4 * kMs), 0u) << "polling off stays off";
  std::uint64_t end = 3 * kMs + 700 * kUs + kFirstNapForNs;
  EXPECT_TRUE(s.naps(end - 1));
  EXPECT_FALSE(s.naps(end)) << "a short while: a ping-pong after the start-up is polled for";
  // A competitor that stays: each late yield within a while of the last
  // one's end naps four times longer, up to kNapForNs.
  EXPECT_FALSE(s.yielded(end + 1 * kMs, end + 3 * kMs));
  EXPECT_EQ(s.nap_for_ns(), 4 * kFirstNapForNs);
  end = end + 3 * kMs + 4 * kFirstNapForNs;
  EXPECT_FALSE(s.yielded(end, end + 2 * kMs));
  EXPECT_EQ(s.nap_for_ns(), 16 * kFirstNapForNs);
  end = end + 2 * kMs + 16 * kFirstNapForNs;
  EXPECT_FALSE(s.yielded(end, end + 2 * kMs));
  EXPECT_EQ(s.nap_for_ns(), kNapForNs) << "at most";
  end = end + 2 * kMs + kNapForNs;
  EXPECT_TRUE(s.naps(end - 1));
  // It comes back after a pause: the while keeps its length.
  EXPECT_FALSE(s.yielded(end + kNapMemoryNs - 10 * kMs, end + kNapMemoryNs - 9 * kMs));
  EXPECT_EQ(s.nap_for_ns(), kNapForNs);
  end = end + kNapMemoryNs - 9 * kMs + kNapForNs;
  // After a longer quiet, a late yield starts short again.
  EXPECT_FALSE(s.yielded(end + kNapMemoryNs, end + kNapMemoryNs + 1 * kMs));
  EXPECT_EQ(s.nap_for_ns(), kFirstNapForNs);
  EXPECT_EQ(s.late_yields(), 6u);
}
}  // namespace
