// The transmit share between tenants (Engine::set_tenant): with a TX ring
// that holds less than the QPs have to send, a tenant with one QP gets
// about its weight's share of the wire's bytes against a tenant with 64,
// its one packet leaves within a quantum of the other's flood, and the
// share costs nothing while one tenant alone holds QPs.
#include <gtest/gtest.h>

#include <map>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

constexpr std::uint32_t kFlooder = 1000, kVictim = 2000;
constexpr int kFloodQps = 64;

class TxShare : public ::testing::Test {
 protected:
  // A's TX ring holds 64 frames: it, not the wire, bounds what one poll sends.
  TxShare() : p(1, 8u << 20, 128, false, [](int, EngineConfig& c) { c.tx_ring = 64; }) {}
  void SetUp() override {
    for (int i = 0; i <= kFloodQps; ++i) q.push_back(p.connect());
    const auto mac = p.A().config().mac;
    p.wire.tap = [this, mac](wire::ConstBytes f, std::uint64_t) {
      wire::Packet pkt;
      wire::ParseOptions o;
      o.verify_icrc = false;
      if (std::memcmp(f.data() + 6, mac.data(), 6) == 0 && wire::parse_frame(f, o, pkt).ok() &&
          pkt.info->has(wire::kOpRequest)) {
        const std::uint32_t qpn = pkt.destqp;  // B's QP: which pair it is
        order.push_back(qpn);
        sizes.push_back(f.size());
      }
    };
  }
  void tenants(std::uint32_t victim_weight) {
    for (int i = 0; i < kFloodQps; ++i) ASSERT_EQ(p.A().set_tenant(q[i].a, kFlooder, 1), 0);
    ASSERT_EQ(p.A().set_tenant(q[kFloodQps].a, kVictim, victim_weight), 0);
  }
  /// Posts `n` WRITEs of `len` bytes on pair i.
  void post(int i, int n, std::uint32_t len) {
    for (int k = 0; k < n; ++k) {
      Sge s = p.sge(0, 0, len);
      SendWr w = p.write_to(1, s, (std::uint64_t{1} << 22) + static_cast<std::uint64_t>(i) * 16384, 7);
      ASSERT_EQ(p.A().post_send(q[static_cast<std::size_t>(i)].a, w), 0);
    }
  }
  /// Runs until the victim's WRITEs are all done; the flooder's bytes and
  /// the victim's, up to the victim's last request frame (while both had
  /// work: after it the victim only waits for its ACK).
  std::pair<std::uint64_t, std::uint64_t> race(int victim_writes) {
    std::vector<ibv_wc> wc;
    int victim_done = 0;
    EXPECT_TRUE(p.wire.run_until(
        [&] {
          p.poll(0, wc);
          for (const ibv_wc& c : wc) {
            EXPECT_EQ(c.status, IBV_WC_SUCCESS);
            victim_done += c.qp_num == q[kFloodQps].a->qpn ? 1 : 0;
          }
          wc.clear();
          return victim_done == victim_writes;
        },
        1'000'000'000));
    const std::uint32_t victim_qpn = q[kFloodQps].b->qpn;
    std::size_t last = 0;
    for (std::size_t i = 0; i < order.size(); ++i)
      if (order[i] == victim_qpn) last = i;
    std::uint64_t flood = 0, victim = 0;
    for (std::size_t i = 0; i <= last && i < order.size(); ++i) (order[i] == victim_qpn ? victim : flood) += sizes[i];
    return {flood, victim};
  }
  /// Posts one small WRITE on the victim's QP while the flood is under way
  /// (A's ring full every poll): how many flood frames leave before it.
  std::size_t one_packet_behind() {
    for (int i = 0; i < kFloodQps; ++i) post(i, 16, 16384);
    p.wire.run_until([&] { return order.size() > 2000; }, 1'000'000'000);
    const std::size_t at_post = order.size();
    post(kFloodQps, 1, 256);
    const std::uint32_t victim_qpn = q[kFloodQps].b->qpn;
    p.wire.run_until([&] { return std::find(order.begin(), order.end(), victim_qpn) != order.end(); },
                     1'000'000'000);
    const auto it = std::find(order.begin() + static_cast<std::ptrdiff_t>(at_post), order.end(), victim_qpn);
    EXPECT_NE(it, order.end());
    return static_cast<std::size_t>(it - order.begin()) - at_post;
  }
  Pair p;
  std::vector<QpPair> q;
  std::vector<std::uint32_t> order;  // B's QPN of each request frame A sent, in order
  std::vector<std::size_t> sizes;
};

TEST_F(TxShare, OneQpGetsHalfTheWireAgainstSixtyFour) {
  tenants(1);
  for (int i = 0; i < kFloodQps; ++i) post(i, 64, 16384);
  post(kFloodQps, 16, 16384);
  const auto [flood, victim] = race(16);
  ASSERT_GT(victim, 0u);
  const double share = static_cast<double>(victim) / static_cast<double>(flood + victim);
  std::printf("victim %llu bytes, flooder %llu bytes while the victim sent: share %.3f\n",
              static_cast<unsigned long long>(victim), static_cast<unsigned long long>(flood), share);
  EXPECT_GT(share, 0.45);
  EXPECT_LT(share, 0.55);
  std::uint64_t throttled = 0;
  p.A().for_each_tenant([&](const TenantReport& t) { throttled += t.throttled; });
  EXPECT_GT(throttled, 0u);
}

TEST_F(TxShare, WeightsSetTheShare) {
  tenants(3);
  for (int i = 0; i < kFloodQps; ++i) post(i, 64, 16384);
  post(kFloodQps, 16, 16384);
  const auto [flood, victim] = race(16);
  const double ratio = static_cast<double>(victim) / static_cast<double>(flood);
  std::printf("weight 3 against 1: bytes %.2f times the flooder's\n", ratio);
  EXPECT_GT(ratio, 2.5);
  EXPECT_LT(ratio, 3.5);
}

TEST_F(TxShare, OnePacketLeavesWithinAQuantumOfAFlood) {
  tenants(1);
  const std::size_t behind = one_packet_behind();
  std::printf("the victim's packet left %zu flood frames after its post\n", behind);
  // What A had queued in the poll that was running (a ring, 64 frames), then
  // at most a quantum of the flood's (4096 bytes: four 1 KiB frames) and one
  // frame of debt.
  EXPECT_LE(behind, 64u + 5u);
}

TEST_F(TxShare, WithoutSharesOnePacketWaitsForTheQpsListedBeforeIt) {
  // The control: no tenants (all in entry 0, nothing metered). Each QP
  // sends until the ring is full, in list order: the victim's one packet
  // waits for the flood QPs before it to finish.
  const std::size_t behind = one_packet_behind();
  std::printf("unshared: the victim's packet left %zu flood frames after its post\n", behind);
  EXPECT_GT(behind, 64u + 5u);
  std::size_t n = 0;
  p.A().for_each_tenant([&](const TenantReport&) { ++n; });
  EXPECT_EQ(n, 0u);
}

TEST_F(TxShare, OneTenantAloneIsNotMetered) {
  for (int i = 0; i <= kFloodQps; ++i) ASSERT_EQ(p.A().set_tenant(q[static_cast<std::size_t>(i)].a, kFlooder, 1), 0);
  for (int i = 0; i <= kFloodQps; ++i) post(i, 4, 16384);
  race(4);
  p.A().for_each_tenant([&](const TenantReport& t) {
    EXPECT_EQ(t.uid, kFlooder);
    EXPECT_EQ(t.qps, static_cast<std::uint32_t>(kFloodQps + 1));
    EXPECT_EQ(t.tx_frames, 0u);  // not counted: nothing to share
    EXPECT_EQ(t.throttled, 0u);
  });
}

TEST_F(TxShare, TenantsComeAndGoAndBadArgumentsAreRefused) {
  EXPECT_EQ(p.A().set_tenant(q[0].a, 1, 0), EINVAL);
  EXPECT_EQ(p.A().set_tenant(q[0].a, 1, Engine::kMaxWeight + 1), EINVAL);
  EXPECT_EQ(p.A().set_tenant(nullptr, 1, 1), EINVAL);
  ASSERT_EQ(p.A().set_tenant(q[0].a, 1, 2), 0);
  ASSERT_EQ(p.A().set_tenant(q[1].a, 2, 1), 0);
  EXPECT_TRUE(p.A().set_tenant_weight(1, 5));
  EXPECT_FALSE(p.A().set_tenant_weight(3, 5));  // holds no QP
  std::map<std::uint32_t, std::uint32_t> w;
  p.A().for_each_tenant([&](const TenantReport& t) { w[t.uid] = t.weight; });
  EXPECT_EQ(w, (std::map<std::uint32_t, std::uint32_t>{{1, 5}, {2, 1}}));
  // A QP moved to another tenant leaves its old one; a destroyed QP too.
  ASSERT_EQ(p.A().set_tenant(q[0].a, 2, 1), 0);
  ASSERT_EQ(p.A().destroy_qp(q[1].a), 0);
  w.clear();
  std::uint32_t qps = 0;
  p.A().for_each_tenant([&](const TenantReport& t) {
    w[t.uid] = t.weight;
    qps += t.qps;
  });
  EXPECT_EQ(w, (std::map<std::uint32_t, std::uint32_t>{{2, 1}}));
  EXPECT_EQ(qps, 1u);
}

TEST(TxShareTable, AFullTableLeavesQpsUnshared) {
  Pair p(1, 1u << 20, 64, false, [](int, EngineConfig& c) { c.max_tenants = 2; });
  const QpPair a = p.connect(), b = p.connect(), c = p.connect();
  EXPECT_EQ(p.A().set_tenant(a.a, 1, 1), 0);
  EXPECT_EQ(p.A().set_tenant(b.a, 2, 1), 0);
  EXPECT_EQ(p.A().set_tenant(c.a, 3, 1), ENOSPC);
  EXPECT_EQ(p.A().set_tenant(c.a, 2, 1), 0);  // an existing tenant still takes it
}

}  // namespace
}  // namespace uroce::testing
