#include "stack/wire/icrc.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "stack/wire/builder.h"
#include "stack/wire/parser.h"
#include "tests/support/random_frames.h"

namespace uroce::wire {
namespace {

// A CNP captured on a real ConnectX-4 Lx (ICRC 82 fd 00 2a on the wire):
// DSCP 48 with ECT(0), UDP source port 0, BECN set, 16 reserved bytes.
const std::vector<std::uint8_t> kCx4Cnp = {
    0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, 0x45, 0xc2,
    0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00,
    0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff, 0xff, 0x40, 0x00,
    0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a};

TEST(Icrc, RealConnectX4CnpVector) {
  const ConstBytes l3(kCx4Cnp.data() + 14, kCx4Cnp.size() - 14 - 4);
  const auto icrc = icrc_compute(l3);
  ASSERT_TRUE(icrc.has_value());
  std::uint8_t wire_bytes[4];
  icrc_store(wire_bytes, *icrc);
  EXPECT_EQ(wire_bytes[0], 0x82);
  EXPECT_EQ(wire_bytes[1], 0xfd);
  EXPECT_EQ(wire_bytes[2], 0x00);
  EXPECT_EQ(wire_bytes[3], 0x2a);
  Packet pkt;
  EXPECT_TRUE(parse_frame(kCx4Cnp, ParseOptions{}, pkt).ok());
  EXPECT_TRUE(pkt.becn);
  EXPECT_EQ(pkt.dscp, 48);
  EXPECT_EQ(pkt.ecn, 2);
}

// Fields that vary hop by hop are masked (A17.3.3); everything else is covered.
TEST(Icrc, MaskedFieldsDoNotMatterOthersDo) {
  std::vector<std::uint8_t> f = kCx4Cnp;
  const std::size_t l3 = 14;
  auto crc = [&] { return *icrc_compute(ConstBytes(f.data() + l3, f.size() - l3 - 4)); };
  const std::uint32_t base = crc();
  for (std::size_t masked : {l3 + 1, l3 + 8, l3 + 10, l3 + 11, l3 + 20 + 6, l3 + 20 + 7, l3 + 28 + 4}) {
    f = kCx4Cnp;
    f[masked] ^= 0x5a;
    EXPECT_EQ(crc(), base) << "byte " << masked << " should be masked";
  }
  for (std::size_t covered : {l3 + 3, l3 + 2, l3 + 4, l3 + 12, l3 + 16, l3 + 20, l3 + 22, l3 + 28, l3 + 29,
                              l3 + 33, l3 + 36, l3 + 45}) {
    f = kCx4Cnp;
    f[covered] ^= 0x01;
    EXPECT_NE(crc(), base) << "byte " << covered << " should be covered";
  }
}

TEST(Icrc, Ipv6MasksTrafficClassFlowLabelHopLimit) {
  std::mt19937_64 rng(7);
  auto rf = testing::random_frame(rng, op::kRcSendOnly, IpVersion::kV6, false);
  std::vector<std::uint8_t> buf(9000);
  const std::size_t n = build_frame(buf, rf.spec, rf.payload);
  ASSERT_GT(n, 0u);
  const std::size_t l3 = 14;
  auto crc = [&] { return *icrc_compute(ConstBytes(buf.data() + l3, n - l3 - 4)); };
  const std::uint32_t base = crc();
  for (std::size_t masked : {l3 + 1, l3 + 2, l3 + 3, l3 + 7}) {
    const std::uint8_t old = buf[masked];
    buf[masked] ^= 0xff;
    EXPECT_EQ(crc(), base) << masked;
    buf[masked] = old;
  }
  buf[l3 + 0] ^= 0x0f;  // low nibble of byte 0 is traffic class: masked
  EXPECT_EQ(crc(), base);
  buf[l3 + 0] ^= 0x0f;
  buf[l3 + 8] ^= 1;  // source address: covered
  EXPECT_NE(crc(), base);
}

TEST(Icrc, ScatterGatherEqualsContiguous) {
  std::mt19937_64 rng(11);
  std::vector<std::uint8_t> buf(9000);
  for (int iter = 0; iter < 200; ++iter) {
    auto rf = testing::random_frame(rng, op::kRcWriteFirst, iter % 2 ? IpVersion::kV4 : IpVersion::kV6, true);
    rf.payload.resize(1024 + 4 * static_cast<std::size_t>(iter));
    const std::size_t n = build_frame(buf, rf.spec, rf.payload);
    ASSERT_GT(n, 0u);
    const std::size_t l3 = rf.spec.vlan ? 18 : 14;
    const ConstBytes all(buf.data() + l3, n - l3 - 4);
    const std::size_t hdrs = header_len(rf.spec) - l3;
    // Split at random points after the headers, into up to 5 segments.
    std::vector<ConstBytes> segs;
    std::size_t pos = 0, cut = hdrs;
    while (pos < all.size()) {
      const std::size_t end = std::min(all.size(), cut);
      segs.push_back(all.subspan(pos, end - pos));
      pos = end;
      cut = pos + 1 + rng() % (all.size() / 3 + 1);
    }
    EXPECT_EQ(*icrc_compute(segs), *icrc_compute(all));
    EXPECT_EQ(*icrc_compute(segs), icrc_load(buf.data() + n - 4));
  }
}

// The ICRC's CRC-32 is ISA-L's; zlib's, written here independently from
// IBTA A17.3.3's masking, is the oracle: every length from 0 to 9000 bytes
// (ISA-L switches kernels by length and alignment), at every alignment, and
// chained as the scatter-gather path chains it.
TEST(Icrc, IsalCrc32MatchesZlibAtEveryLengthAndAlignment) {
  std::mt19937_64 rng(5);
  std::vector<std::uint8_t> buf(9000 + 64);
  for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
  for (std::size_t len = 0; len <= 9000; len += len < 300 ? 1 : 37) {
    const std::size_t align = len % 16;
    const ConstBytes d(buf.data() + align, len);
    const auto z = static_cast<std::uint32_t>(crc32_z(0, d.data(), d.size()));
    ASSERT_EQ(crc32_raw(0, d), z) << "length " << len << " alignment " << align;
    const std::size_t cut = len / 3;
    ASSERT_EQ(crc32_raw(crc32_raw(0, d.first(cut)), d.subspan(cut)), z) << "chained at " << cut;
  }
}

TEST(Icrc, EqualsAZlibIcrcOverRandomFrames) {
  std::mt19937_64 rng(17);
  std::vector<std::uint8_t> buf(9000);
  for (int iter = 0; iter < 300; ++iter) {
    auto rf = testing::random_frame(rng, op::kRcSendOnly, iter % 2 ? IpVersion::kV4 : IpVersion::kV6, true);
    rf.payload.resize(static_cast<std::size_t>(iter) * 13 % 4097);
    const std::size_t n = build_frame(buf, rf.spec, rf.payload);
    ASSERT_GT(n, 0u);
    // The oracle: the masked copy of IBTA A17.3.3 over the whole of L3 to
    // the end of the pad, through zlib.
    const std::size_t l3 = rf.spec.vlan ? 18 : 14;
    std::vector<std::uint8_t> m(8 + (n - 4 - l3), 0xff);
    std::copy(buf.begin() + static_cast<std::ptrdiff_t>(l3), buf.begin() + static_cast<std::ptrdiff_t>(n - 4), m.begin() + 8);
    std::uint8_t* ip = m.data() + 8;
    std::size_t iplen;
    if ((ip[0] >> 4) == 4) {
      iplen = static_cast<std::size_t>(ip[0] & 15) * 4;
      ip[1] = ip[8] = ip[10] = ip[11] = 0xff;
    } else {
      iplen = 40;
      ip[0] |= 0x0f;
      ip[1] = ip[2] = ip[3] = ip[7] = 0xff;
    }
    ip[iplen + 6] = ip[iplen + 7] = 0xff;  // UDP checksum
    ip[iplen + 8 + 4] = 0xff;             // BTH resv8a
    const auto want = static_cast<std::uint32_t>(crc32_z(0, m.data(), m.size()));
    EXPECT_EQ(*icrc_compute(ConstBytes(buf.data() + l3, n - l3 - 4)), want);
    EXPECT_EQ(icrc_load(buf.data() + n - 4), want);
  }
}

TEST(Icrc, RejectsShortOrNonIp) {
  std::uint8_t junk[10] = {0x45};
  EXPECT_FALSE(icrc_compute(ConstBytes(junk, sizeof junk)).has_value());
  std::uint8_t v5[64] = {0x55};
  EXPECT_FALSE(icrc_compute(ConstBytes(v5, sizeof v5)).has_value());
  EXPECT_FALSE(icrc_compute(std::span<const ConstBytes>()).has_value());
}

}  // namespace
}  // namespace uroce::wire
