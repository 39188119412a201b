// The systemd watchdog is fed at half its timeout, and only while every
// pipeline makes passes: one wedged pipeline (on any lcore) stops the
// feeding until it turns again.
#include <gtest/gtest.h>

#include <vector>

#include "control/node/watchdog.h"

namespace uroce::control {
namespace {

constexpr std::uint64_t kMs = 1'000'000;

TEST(Watchdog, OffWithoutATimeout) {
  Watchdog w;
  std::vector<std::uint64_t> p{1, 2};
  EXPECT_FALSE(w.enabled());
  for (std::uint64_t t = 0; t < 10; ++t) {
    p[0] += 1;
    EXPECT_FALSE(w.due(t * 1000 * kMs, p));
  }
}

TEST(Watchdog, FedAtHalfTheTimeoutWhileEveryPipelineTurns) {
  Watchdog w(1000 * kMs);
  std::vector<std::uint64_t> p{0, 0, 0};
  EXPECT_FALSE(w.due(0, p)) << "the first look starts the clock";
  int fed = 0;
  for (std::uint64_t t = 1; t <= 3000; ++t) {  // 3 s in 1 ms steps, every pipeline turning
    for (auto& x : p) ++x;
    fed += w.due(t * kMs, p);
  }
  EXPECT_EQ(fed, 6) << "every 500 ms";
  EXPECT_EQ(w.feeds(), 6u);
  EXPECT_EQ(w.stalls(), 0u);
}

TEST(Watchdog, OneWedgedPipelineStopsTheFeedingUntilItTurnsAgain) {
  Watchdog w(1000 * kMs);
  std::vector<std::uint64_t> p{0, 0, 0};
  (void)w.due(0, p);
  int fed = 0;
  for (std::uint64_t t = 1; t <= 1000; ++t) {
    for (auto& x : p) ++x;
    fed += w.due(t * kMs, p);
  }
  EXPECT_EQ(fed, 2);
  // Pipeline 2 wedges for 2 s; the others keep turning: never fed, so
  // systemd's timeout (1 s) runs out.
  for (std::uint64_t t = 1001; t <= 3000; ++t) {
    ++p[0];
    ++p[1];
    EXPECT_FALSE(w.due(t * kMs, p)) << "at " << t << " ms";
  }
  EXPECT_EQ(w.stalls(), 4u);
  EXPECT_EQ(w.stalled_pipeline(), 2u);
  // It turns again: fed at the next check.
  fed = 0;
  for (std::uint64_t t = 3001; t <= 3500; ++t) {
    for (auto& x : p) ++x;
    fed += w.due(t * kMs, p);
  }
  EXPECT_EQ(fed, 1);
}

}  // namespace
}  // namespace uroce::control
