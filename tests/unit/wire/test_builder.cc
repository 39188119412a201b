#include "stack/wire/builder.h"

#include <gtest/gtest.h>

#include <vector>

#include "stack/wire/icrc.h"
#include "stack/wire/parser.h"

namespace uroce::wire {
namespace {

TEST(Builder, LengthsChecksumAndDefaults) {
  FrameSpec s;
  s.src = IpAddr::from_v4(192, 0, 2, 1);
  s.dst = IpAddr::from_v4(192, 0, 2, 2);
  s.opcode = op::kRcSendOnly;
  s.dscp = 26;
  s.ecn = 2;  // ECT(0)
  std::vector<std::uint8_t> pl(5, 0xaa);
  std::vector<std::uint8_t> f(frame_len(s, pl.size()));
  ASSERT_EQ(build_frame(f, s, pl), f.size());
  EXPECT_EQ(f.size(), 14u + 20 + 8 + 12 + 5 + 3 + 4);
  EXPECT_EQ(f[14 + 1], (26 << 2) | 2);
  EXPECT_EQ((f[14 + 2] << 8) | f[14 + 3], 20 + 8 + 12 + 8 + 4);  // IP total length
  EXPECT_EQ((f[14 + 20 + 4] << 8) | f[14 + 20 + 5], 8 + 12 + 8 + 4);  // UDP length
  EXPECT_EQ(f[14 + 20 + 6], 0);  // UDP checksum 0
  EXPECT_EQ(f[14 + 20 + 7], 0);
  EXPECT_EQ(ipv4_header_checksum(f.data() + 14, 20), 0);
  EXPECT_EQ((f[14 + 20 + 8 + 1] >> 4) & 3, 3);  // PadCnt
  EXPECT_EQ(f[14 + 6], 0x40);  // DF
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f[14 + 20 + 8 + 12 + 5 + i], 0);  // pad bytes are zero
}

TEST(Builder, LeavesTheIpv4ChecksumToAnOffloadWhenAsked) {
  FrameSpec s;
  s.opcode = op::kRcSendOnly;
  s.ipv4_checksum = false;
  std::vector<std::uint8_t> f(frame_len(s, 4));
  const std::uint8_t pl[4] = {1, 2, 3, 4};
  ASSERT_EQ(build_frame(f, s, pl), f.size());
  EXPECT_EQ(f[14 + 10], 0);
  EXPECT_EQ(f[14 + 11], 0);
  // The ICRC masks the checksum, so filling it in later keeps the ICRC valid.
  const std::uint16_t c = ipv4_header_checksum(f.data() + 14, 20);
  f[14 + 10] = static_cast<std::uint8_t>(c >> 8);
  f[14 + 11] = static_cast<std::uint8_t>(c);
  Packet pkt;
  EXPECT_TRUE(parse_frame(f, ParseOptions{}, pkt).ok());
}

TEST(Builder, RefusesBadRequests) {
  FrameSpec s;
  s.opcode = 0x15;  // reserved
  std::vector<std::uint8_t> f(256);
  EXPECT_EQ(build_frame(f, s, {}), 0u);
  s.opcode = op::kRcAck;
  const std::uint8_t pl[4] = {};
  EXPECT_EQ(build_frame(f, s, pl), 0u);  // ACK carries no payload
  s.opcode = op::kRcSendOnly;
  std::vector<std::uint8_t> small(20);
  EXPECT_EQ(build_frame(small, s, pl), 0u);
}

TEST(Builder, UdpSourcePortFromFlowHash) {
  // Flow label from the QPN product, folded into 14 bits, OR 0xC000
  // (the kernel's rdma_calc_flow_label / rdma_flow_label_to_udp_sport).
  auto ref = [](std::uint32_t a, std::uint32_t b) {
    std::uint64_t v = std::uint64_t{a} * b;
    v ^= v >> 20;
    v ^= v >> 40;
    const std::uint32_t fl = static_cast<std::uint32_t>(v) & 0xfffff;
    return static_cast<std::uint16_t>(((fl & 0x3fff) ^ ((fl & 0xfc000) >> 14)) | 0xc000);
  };
  for (std::uint32_t a : {1u, 0x11u, 0x1234u, 0xffffffu})
    for (std::uint32_t b : {2u, 0x12u, 0xabcdefu}) {
      EXPECT_EQ(udp_sport_for(a, b), ref(a, b));
      EXPECT_GE(udp_sport_for(a, b), 0xc000);
    }
  EXPECT_EQ(udp_sport_for(5, 6, 0x12345), ((0x12345 & 0x3fff) ^ (0x10000 >> 14)) | 0xc000);
}

TEST(Builder, HeadersThenScatterGatherIcrc) {
  FrameSpec s;
  s.ipver = IpVersion::kV6;
  s.opcode = op::kRcWriteOnly;
  s.ext.reth_len = 3000;
  std::vector<std::uint8_t> payload(3000, 0x5c);
  std::vector<std::uint8_t> hdr(256);
  const std::size_t hl = build_headers(hdr, s, payload.size());
  ASSERT_EQ(hl, 14u + 40 + 8 + 28);
  const std::uint8_t pad[4] = {};
  const ConstBytes segs[] = {ConstBytes(hdr.data() + 14, hl - 14), payload, ConstBytes(pad, pad_for(3000))};
  const auto sg = icrc_compute(segs);
  std::vector<std::uint8_t> whole(frame_len(s, payload.size()));
  ASSERT_GT(build_frame(whole, s, payload), 0u);
  EXPECT_EQ(*sg, icrc_load(whole.data() + whole.size() - 4));
}

}  // namespace
}  // namespace uroce::wire
