// abi::AdaptiveSpin: how long a waiter polls before it blocks, learnt from
// the gaps it has seen (stack/abi/spin.h).
#include "stack/abi/spin.h"

#include <gtest/gtest.h>

namespace {
using uroce::abi::AdaptiveSpin;
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
  EXPECT_EQ(s.window_ns(5 * kUs), 200 * kUs) << "but the last gap was near: poll the cap";
  s.gap(800 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 200 * kUs) << "up to four caps";
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
  EXPECT_EQ(s.window_ns(5 * kUs), 50 * kUs) << "the gaps are past the cap now, but within four caps";
  s.set_cap(10 * kUs);
  EXPECT_EQ(s.window_ns(5 * kUs), 5 * kUs) << "past four caps: sparse";
}

TEST(AdaptiveSpin, ALateYieldTurnsYieldsIntoNapsForASecond) {
  constexpr std::uint64_t kMs = 1000 * kUs;
  AdaptiveSpin s;
  EXPECT_TRUE(s.yielded(0, 10 * kUs)) << "back in 10 us: the core is free";
  EXPECT_TRUE(s.yielded(1 * kMs, 1 * kMs + 400 * kUs)) << "back in 0.4 ms: the process waited for ran";
  EXPECT_FALSE(s.naps(2 * kMs));
  EXPECT_FALSE(s.yielded(3 * kMs, 3 * kMs + 700 * kUs)) << "back after a slice: a process that keeps the core";
  EXPECT_TRUE(s.naps(4 * kMs));
  EXPECT_EQ(s.window_ns(5 * kUs, 4 * kMs), AdaptiveSpin::kDefaultCapNs) << "naps poll for the cap";
  EXPECT_EQ(s.window_ns(0, 4 * kMs), 0u) << "polling off stays off";
  EXPECT_TRUE(s.naps(1003 * kMs + 699 * kUs));
  EXPECT_FALSE(s.naps(1003 * kMs + 700 * kUs)) << "for a second";
  EXPECT_FALSE(s.yielded(2000 * kMs, 2004 * kMs));
  EXPECT_TRUE(s.naps(2005 * kMs)) << "again after the next";
  EXPECT_EQ(s.late_yields(), 2u);
}
}  // namespace
