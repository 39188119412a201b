// (d) Truncations and random bit flips of valid frames never crash the
// parser or make it read outside the frame. Each mutated frame is copied into
// an exactly-sized heap buffer so ASan catches any overread.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "stack/wire/builder.h"
#include "stack/wire/parser.h"
#include "tests/support/random_frames.h"

namespace uroce::wire {
namespace {

ParseStatus parse_exact(const std::uint8_t* data, std::size_t n, Packet& pkt) {
  auto copy = std::make_unique<std::uint8_t[]>(n == 0 ? 1 : n);
  std::copy(data, data + n, copy.get());
  const auto st = parse_frame(ConstBytes(copy.get(), n), ParseOptions{}, pkt);
  if (st.ok()) {
    // Touch every byte the packet claims, inside the copy's lifetime.
    EXPECT_LE(pkt.payload_off + pkt.payload_len, n);
    EXPECT_LE(pkt.icrc_off + 4u, n);
    volatile std::uint8_t sink = 0;
    for (auto b : pkt.payload()) sink = sink ^ b;
    (void)sink;
  }
  return st;
}

TEST(Robustness, EveryTruncationOfEveryOpcodeIsRejected) {
  std::mt19937_64 rng(99);
  std::vector<std::uint8_t> buf(9000);
  Packet pkt;
  for (std::uint8_t op : testing::valid_opcodes()) {
    for (auto v : {IpVersion::kV4, IpVersion::kV6}) {
      const auto rf = testing::random_frame(rng, op, v, true, 300);
      const std::size_t n = build_frame(buf, rf.spec, rf.payload);
      ASSERT_GT(n, 0u);
      ASSERT_TRUE(parse_exact(buf.data(), n, pkt).ok());
      for (std::size_t cut = 0; cut < n; ++cut) {
        const auto st = parse_exact(buf.data(), cut, pkt);
        EXPECT_FALSE(st.ok()) << opcode_name(op) << " cut at " << cut;
      }
    }
  }
}

TEST(Robustness, RandomBitFlipsNeverCrashAndAreCaught) {
  std::mt19937_64 rng(1234);
  std::vector<std::uint8_t> buf(9000);
  const auto ops = testing::valid_opcodes();
  Packet pkt;
  int accepted_after_flip = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const auto rf = testing::random_frame(rng, ops[rng() % ops.size()], rng() % 4 ? IpVersion::kV4 : IpVersion::kV6,
                                          true, 512);
    std::size_t n = build_frame(buf, rf.spec, rf.payload);
    ASSERT_GT(n, 0u);
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) buf[rng() % n] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    if (rng() % 3 == 0) n = rng() % (n + 1);
    const auto st = parse_exact(buf.data(), n, pkt);
    if (st.ok()) ++accepted_after_flip;
  }
  // Flips in masked or unchecked fields (MACs, TTL, ECN, Ethernet padding) are
  // legitimately accepted; flips in ICRC-covered bytes must not be. A CRC-32
  // misses a random corruption with odds ~2^-32, so this stays well under half.
  EXPECT_LT(accepted_after_flip, 20000 / 2);
}

TEST(Robustness, ArbitraryBytes) {
  std::mt19937_64 rng(5);
  Packet pkt;
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<std::uint8_t> f(rng() % 200);
    for (auto& b : f) b = static_cast<std::uint8_t>(rng());
    if (f.size() > 14 && iter % 2) {  // make it look like IPv4/UDP/4791 to go deeper
      f[12] = 0x08;
      f[13] = 0x00;
      f[14] = 0x45;
    }
    if (parse_exact(f.data(), f.size(), pkt).ok()) ++accepted;
  }
  EXPECT_EQ(accepted, 0);
}

// A single bit flip anywhere is rejected, except in the bytes that neither
// the IPv4 checksum nor the ICRC covers: the MAC addresses, the UDP checksum
// (RoCEv2 sends 0 and receivers ignore it) and the BTH resv8a byte.
TEST(Robustness, SingleBitFlipsOutsideUncoveredBytesAreRejected) {
  std::mt19937_64 rng(77);
  std::vector<std::uint8_t> buf(9000);
  Packet pkt;
  for (std::uint8_t op : testing::valid_opcodes()) {
    auto rf = testing::random_frame(rng, op, IpVersion::kV4, false, 64);
    const std::size_t n = build_frame(buf, rf.spec, rf.payload);
    ASSERT_GT(n, 0u);
    for (std::size_t i = 0; i < n; ++i) {
      const bool uncovered = i < 12 || i == 14 + 20 + 6 || i == 14 + 20 + 7 || i == 14 + 20 + 8 + 4;
      for (int bit = 0; bit < 8; ++bit) {
        buf[i] ^= static_cast<std::uint8_t>(1u << bit);
        EXPECT_EQ(parse_exact(buf.data(), n, pkt).ok(), uncovered) << opcode_name(op) << " byte " << i;
        buf[i] ^= static_cast<std::uint8_t>(1u << bit);
      }
    }
  }
}

}  // namespace
}  // namespace uroce::wire
