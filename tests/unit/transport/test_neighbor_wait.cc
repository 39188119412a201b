// The one wait for a neighbour (neighbor_table.h, Engine::want_neighbor):
// one resolution per destination however many wait for it, asked at once
// and then on the kernel's backoff while anybody waits, and forgotten when
// the MAC is learned or the last waiter gives up.
#include <gtest/gtest.h>

#include <vector>

#include "stack/transport/engine.h"

namespace uroce::transport {
namespace {

constexpr std::uint64_t kMs = 1'000'000;

struct Asks {
  std::vector<wire::IpAddr> ips;
  static void ask(void* ctx, const wire::IpAddr& ip) { static_cast<Asks*>(ctx)->ips.push_back(ip); }
};

/// An engine whose ARP requests and neighbour solicitations are counted.
struct NeighborWait : ::testing::Test {
  static EngineConfig config() {
    EngineConfig c;
    c.ip = wire::IpAddr::from_v4(10, 0, 0, 1);
    return c;
  }
  Engine e{config()};
  Asks asks;
  void SetUp() override { e.set_resolver(&Asks::ask, &asks); }
};

TEST_F(NeighborWait, OneResolutionPerDestinationOnTheKernelsBackoff) {
  const auto peer = wire::IpAddr::from_v4(10, 0, 0, 2);
  e.want_neighbor(peer, 0, 3000 * kMs);         // an RTR parked by the session server
  e.want_neighbor(peer, 10 * kMs, 500 * kMs);   // a CM MAD to the same peer
  ASSERT_EQ(asks.ips.size(), 1u) << "asked once, at the first waiter";
  std::vector<std::uint64_t> at;
  for (std::uint64_t t = 0; t <= 3500 * kMs; t += kMs) {
    const std::size_t before = asks.ips.size();
    e.poll(t);
    if (asks.ips.size() != before) at.push_back(t / kMs);
  }
  // Again after 100 ms, then 200, 400, 800, 1000 (the cap) while the RTR
  // waits (3 s), then never.
  EXPECT_EQ(at, (std::vector<std::uint64_t>{100, 300, 700, 1500, 2500}));
  EXPECT_EQ(e.neighbors().waits(), 0u) << "forgotten once the last waiter gave up";
}

TEST_F(NeighborWait, ALearnedNeighbourEndsTheWait) {
  const auto peer = wire::IpAddr::from_v4(10, 0, 0, 3);
  e.want_neighbor(peer, 0, 3000 * kMs);
  e.neighbors().learn(peer, {2, 0, 0, 0, 0, 3});
  e.poll(200 * kMs);
  EXPECT_EQ(asks.ips.size(), 1u);
  EXPECT_EQ(e.neighbors().waits(), 0u);
  e.want_neighbor(peer, 300 * kMs, 3000 * kMs);
  EXPECT_EQ(asks.ips.size(), 1u) << "a known neighbour is not asked for";
}

}  // namespace
}  // namespace uroce::transport
