// The requester's pacer on the virtual clock: a QP limited to rate R never
// sends more than R x T plus one frame in any interval T of 100 us or more,
// reaches R while it has work, and goes back to line rate when unpaced.
#include <gtest/gtest.h>

#include "tests/support/pair.h"

namespace uroce::testing {
namespace {

struct Tx {
  std::uint64_t t;
  std::size_t bytes;
};

class Pacer : public ::testing::Test {
 protected:
  void SetUp() override { q = p.connect(); }
  /// One WRITE of `len` bytes from A to B, run to completion; A's request
  /// frames with their send times.
  std::vector<Tx> write(std::uint32_t len) {
    std::vector<Tx> out;
    const auto mac = p.A().config().mac;
    p.wire.tap = [&](wire::ConstBytes f, std::uint64_t now) {
      wire::Packet pkt;
      o.verify_icrc = false;
      if (std::memcmp(f.data() + 6, mac.data(), 6) == 0 && wire::parse_frame(f, o, pkt).ok() &&
          pkt.info->has(wire::kOpRequest))
        out.push_back({now, f.size()});
    };
    for (std::uint32_t i = 0; i < len; ++i) p.node[0].mem[i] = static_cast<std::uint8_t>(i * 11 + len);
    Sge s = p.sge(0, 0, len);
    EXPECT_EQ(p.A().post_send(q.a, p.write_to(1, s, 1u << 21)), 0);
    std::vector<ibv_wc> wc;
    EXPECT_TRUE(p.wire.run_until([&] { return p.poll(0, wc) > 0 || !wc.empty(); }, 1'000'000'000));
    EXPECT_EQ(wc.at(0).status, IBV_WC_SUCCESS);
    EXPECT_EQ(0, std::memcmp(&p.node[0].mem[0], &p.node[1].mem[1u << 21], len));
    p.wire.tap = nullptr;
    return out;
  }
  /// The most bytes sent in any interval of `t_ns` starting at a frame.
  static std::size_t most_in(const std::vector<Tx>& tx, std::uint64_t t_ns) {
    std::size_t best = 0, sum = 0;
    for (std::size_t i = 0, j = 0; i < tx.size(); ++i) {
      while (j < tx.size() && tx[j].t < tx[i].t + t_ns) sum += tx[j++].bytes;
      best = std::max(best, sum);
      sum -= tx[i].bytes;
    }
    return best;
  }
  static std::size_t largest(const std::vector<Tx>& tx) {
    std::size_t m = 0;
    for (const Tx& x : tx) m = std::max(m, x.bytes);
    return m;
  }
  Pair p;
  QpPair q;
  wire::ParseOptions o;
};

TEST_F(Pacer, NeverMoreThanRateTimesIntervalPlusOneFrame) {
  constexpr std::uint64_t kRate = 1'000'000'000;  // 1 Gb/s
  ASSERT_EQ(p.A().set_rate(q.a, kRate), 0);
  const std::vector<Tx> tx = write(1u << 20);  // 1024 packets
  ASSERT_GE(tx.size(), 1024u);
  for (std::uint64_t t : {100'000ull, 250'000ull, 1'000'000ull, 4'000'000ull}) {
    SCOPED_TRACE(t);
    EXPECT_LE(most_in(tx, t), t * kRate / 8'000'000'000ull + largest(tx));
  }
  // And it reaches the rate: the frames' bytes over their span, within 2%.
  std::size_t bytes = 0;
  for (const Tx& x : tx) bytes += x.bytes;
  const double secs = static_cast<double>(tx.back().t - tx.front().t) / 1e9;
  const double rate = static_cast<double>(bytes - tx.back().bytes) * 8 / secs;
  EXPECT_GT(rate, 0.98 * kRate);
  EXPECT_LE(rate, 1.0 * kRate);
}

TEST_F(Pacer, UnderLossTheResendsArePacedToo) {
  constexpr std::uint64_t kRate = 2'000'000'000;
  sim::Impairments imp;
  imp.loss = 0.05;
  p.wire.set_impairments(imp);
  ASSERT_EQ(p.A().set_rate(q.a, kRate), 0);
  const std::vector<Tx> tx = write(1u << 20);
  ASSERT_GT(q.a->ctr[QpCounter::retransmitted_pkts], 0u);
  for (std::uint64_t t : {100'000ull, 1'000'000ull}) EXPECT_LE(most_in(tx, t), t * kRate / 8'000'000'000ull + largest(tx));
}

TEST_F(Pacer, UnpacedIsFarFasterAndRateZeroUnpaces) {
  const std::vector<Tx> free_run = write(1u << 20);
  ASSERT_EQ(p.A().set_rate(q.a, 1'000'000'000), 0);
  const std::vector<Tx> paced = write(1u << 20);
  ASSERT_EQ(p.A().set_rate(q.a, 0), 0);
  const std::vector<Tx> again = write(1u << 20);
  const auto span = [](const std::vector<Tx>& v) { return v.back().t - v.front().t; };
  EXPECT_GT(span(paced), 10 * span(free_run));
  EXPECT_LT(span(again), span(paced) / 10);
  EXPECT_EQ(p.A().set_rate(nullptr, 1), EINVAL);
}

}  // namespace
}  // namespace uroce::testing
