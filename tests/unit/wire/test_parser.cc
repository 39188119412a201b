#include "stack/wire/parser.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "stack/wire/builder.h"
#include "stack/wire/icrc.h"
#include "tests/support/random_frames.h"

namespace uroce::wire {
namespace {

class ParserTest : public ::testing::Test {
 protected:
  std::vector<std::uint8_t> build(std::uint8_t opcode, std::size_t payload = 0, IpVersion v = IpVersion::kV4,
                                  bool vlan = false) {
    FrameSpec s;
    s.ipver = v;
    s.vlan = vlan;
    s.vlan_tci = 0x2005;
    s.src = v == IpVersion::kV4 ? IpAddr::from_v4(10, 0, 0, 1) : IpAddr::from_v6_bytes(v6a);
    s.dst = v == IpVersion::kV4 ? IpAddr::from_v4(10, 0, 0, 2) : IpAddr::from_v6_bytes(v6b);
    s.opcode = opcode;
    s.destqp = 0x12;
    s.psn = Psn(0xfffffe);
    s.ackreq = true;
    s.ext.reth_va = 0x1000;
    s.ext.reth_rkey = 0xabcd;
    s.ext.reth_len = static_cast<std::uint32_t>(payload);
    std::vector<std::uint8_t> pl(payload);
    for (std::size_t i = 0; i < payload; ++i) pl[i] = static_cast<std::uint8_t>(i * 7);
    std::vector<std::uint8_t> f(frame_len(s, payload));
    EXPECT_EQ(build_frame(f, s, pl), f.size());
    return f;
  }
  static void refresh_icrc(std::vector<std::uint8_t>& f, std::size_t l3 = 14) {
    icrc_store(f.data() + f.size() - 4, *icrc_compute(ConstBytes(f.data() + l3, f.size() - l3 - 4)));
  }
  static void refresh_ipv4_csum(std::vector<std::uint8_t>& f, std::size_t l3 = 14) {
    f[l3 + 10] = f[l3 + 11] = 0;
    const std::uint16_t c = ipv4_header_checksum(f.data() + l3, 20);
    f[l3 + 10] = static_cast<std::uint8_t>(c >> 8);
    f[l3 + 11] = static_cast<std::uint8_t>(c);
  }
  ParseStatus parse(const std::vector<std::uint8_t>& f, std::uint32_t mtu = 4096) {
    ParseOptions o;
    o.max_payload = mtu;
    return parse_frame(f, o, pkt);
  }
  Packet pkt;
  std::uint8_t v6a[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  std::uint8_t v6b[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
};

// The checksum adds 32-bit words in the machine's order (RFC 1071 2.B):
// against the textbook sum of big-endian 16-bit words, on random headers of
// every IPv4 length (options included) and the sums that fold most.
TEST(Ipv4Checksum, EqualsTheSixteenBitSum) {
  const auto textbook = [](const std::uint8_t* h, std::size_t len) {
    std::uint32_t sum = 0;
    for (std::size_t i = 0; i + 1 < len; i += 2) sum += (std::uint32_t{h[i]} << 8) | h[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return static_cast<std::uint16_t>(~sum);
  };
  std::mt19937 rng(7);
  std::uint8_t h[60];
  for (int round = 0; round < 2000; ++round) {
    for (auto& b : h) b = static_cast<std::uint8_t>(round < 4 ? (round & 1 ? 0xff : 0x00) : rng());
    for (std::size_t len = 2; len <= sizeof h; len += 2)
      ASSERT_EQ(ipv4_header_checksum(h, len), textbook(h, len)) << "length " << len << ", round " << round;
  }
}

TEST_F(ParserTest, ParsesWriteFirstFields) {
  const auto f = build(op::kRcWriteFirst, 256);
  ASSERT_TRUE(parse(f).ok());
  EXPECT_EQ(pkt.opcode, op::kRcWriteFirst);
  EXPECT_EQ(pkt.destqp, 0x12u);
  EXPECT_EQ(pkt.psn, Psn(0xfffffe));
  EXPECT_TRUE(pkt.ackreq);
  ASSERT_NE(pkt.reth(), nullptr);
  EXPECT_EQ(pkt.reth()->rkey.get(), 0xabcdu);
  EXPECT_EQ(pkt.aeth(), nullptr);
  EXPECT_EQ(pkt.payload_len, 256u);
  EXPECT_EQ(pkt.payload()[3], 21);
  EXPECT_EQ(pkt.src, IpAddr::from_v4(10, 0, 0, 1));
}

TEST_F(ParserTest, Ipv6AndVlan) {
  const auto f = build(op::kUdSendOnlyImm, 13, IpVersion::kV6, true);
  ASSERT_TRUE(parse(f).ok()) << parse(f).to_string();
  EXPECT_TRUE(pkt.has_vlan);
  EXPECT_EQ(pkt.vlan_tci, 0x2005);
  EXPECT_EQ(pkt.ipver, IpVersion::kV6);
  EXPECT_EQ(pkt.padcnt, 3);
  EXPECT_EQ(pkt.payload_len, 13u);
  EXPECT_NE(pkt.deth(), nullptr);
  EXPECT_NE(pkt.immdt(), nullptr);
}

TEST_F(ParserTest, EthernetPaddingIsIgnored) {
  auto f = build(op::kRcAck);
  f.resize(f.size() + 20, 0);  // trailing bytes beyond the IP length
  ASSERT_TRUE(parse(f).ok());
  EXPECT_EQ(pkt.frame_len, f.size() - 20);
}

TEST_F(ParserTest, ReservedBitsIgnored) {
  auto f = build(op::kRcSendOnly, 8);
  f[14 + 20 + 8 + 4] = 0x10;  // resv8a, as real Huawei frames set it (masked in the ICRC)
  f[14 + 20 + 8 + 8] |= 0x7f;  // the reserved bits next to AckReq
  refresh_icrc(f);
  EXPECT_TRUE(parse(f).ok()) << parse(f).to_string();
}

TEST_F(ParserTest, EveryTruncationNamesTheHeader) {
  const auto full = build(op::kRcWriteOnlyImm, 0, IpVersion::kV4, true);
  // Cut inside each header; lengths in the IP and UDP headers are fixed up so
  // the truncation is seen by the transport layer too.
  struct Case {
    std::size_t keep;
    HeaderId want;
  } cases[] = {{10, HeaderId::kEth}, {16, HeaderId::kVlan}, {18 + 10, HeaderId::kIpv4}};
  for (const auto& c : cases) {
    std::vector<std::uint8_t> f(full.begin(), full.begin() + static_cast<long>(c.keep));
    const auto st = parse(f);
    EXPECT_EQ(st.reject, Reject::kTruncated);
    EXPECT_EQ(st.header, c.want) << st.to_string();
  }
  // Shrink the IP/UDP lengths to cut inside the BTH extension headers.
  for (auto [cut_to, want] : std::initializer_list<std::pair<std::size_t, HeaderId>>{
           {4, HeaderId::kUdp}, {8, HeaderId::kBth}, {8 + 12 + 4 + 8, HeaderId::kReth}, {8 + 12 + 16 + 2 + 4, HeaderId::kImmDt}}) {
    auto f = full;
    const std::size_t l3 = 18;
    const std::size_t udp_len = cut_to;
    f.resize(l3 + 20 + udp_len);
    f[l3 + 2] = static_cast<std::uint8_t>((20 + udp_len) >> 8);
    f[l3 + 3] = static_cast<std::uint8_t>(20 + udp_len);
    refresh_ipv4_csum(f, l3);
    if (udp_len >= 6) {
      f[l3 + 20 + 4] = static_cast<std::uint8_t>(udp_len >> 8);
      f[l3 + 20 + 5] = static_cast<std::uint8_t>(udp_len);
    }
    const auto st = parse(f);
    EXPECT_EQ(st.reject, Reject::kTruncated) << st.to_string();
    EXPECT_EQ(st.header, want) << st.to_string();
    EXPECT_TRUE(st.roce);
  }
}

TEST_F(ParserTest, PreciseRejections) {
  auto expect = [&](std::vector<std::uint8_t> f, Reject r) {
    const auto st = parse(f);
    EXPECT_EQ(st.reject, r) << "got: " << st.to_string();
  };
  const auto good = build(op::kRcSendOnly, 100);
  {
    auto f = good;
    f[14] = 0x65;  // IPv6 version in an IPv4 ethertype
    expect(f, Reject::kBadIpVersion);
  }
  {
    auto f = good;
    f[14] = 0x44;
    expect(f, Reject::kBadIhl);
  }
  {
    auto f = good;
    f[14 + 8] ^= 1;  // TTL without fixing the checksum
    expect(f, Reject::kBadIpv4Checksum);
  }
  {
    auto f = good;
    f[14 + 20 + 5] ^= 4;  // UDP length
    expect(f, Reject::kBadUdpLength);
  }
  {
    auto f = good;
    f[14 + 20 + 3] = 0x42;  // destination port
    const auto st = parse(f);
    EXPECT_EQ(st.reject, Reject::kNotRocePort);
    EXPECT_FALSE(st.roce);
  }
  {
    auto f = good;
    f[14 + 9] = 6;  // TCP
    refresh_ipv4_csum(f);
    expect(f, Reject::kNotUdp);
  }
  {
    auto f = good;
    f[12] = 0x08;
    f[13] = 0x06;  // ARP
    expect(f, Reject::kNotIp);
  }
  {
    auto f = good;
    f[14 + 20 + 8 + 1] |= 0x01;  // TVer 1
    refresh_icrc(f);
    expect(f, Reject::kBadTver);
  }
  {
    auto f = good;
    f[14 + 20 + 8] = 0x15;  // reserved RC opcode
    refresh_icrc(f);
    expect(f, Reject::kReservedOpcode);
  }
  {
    auto f = good;
    f[14 + 20 + 8] = 0x44;  // RD SEND_ONLY
    refresh_icrc(f);
    expect(f, Reject::kUnsupportedTransport);
  }
  {
    auto f = good;
    f.back() ^= 0x80;
    expect(f, Reject::kBadIcrc);
  }
  {
    auto f = good;
    f[20] |= 0x20;  // More Fragments
    refresh_ipv4_csum(f);
    expect(f, Reject::kIpFragment);
  }
  expect(good, Reject::kOk);
  {
    const auto f = build(op::kRcSendOnly, 1024);
    EXPECT_EQ(parse(f, 512).reject, Reject::kPayloadOverMtu);
    EXPECT_TRUE(parse(f, 1024).ok());
  }
}

TEST_F(ParserTest, PadCountMustFitLength) {
  // SEND_ONLY with 100 bytes: pad 0. Claim pad 3 on a FIRST packet: refused.
  auto f = build(op::kRcSendFirst, 100);
  f[14 + 20 + 8 + 1] |= 0x30;
  refresh_icrc(f);
  EXPECT_EQ(parse(f).reject, Reject::kBadPadCount);
  // An ACK may not carry payload or pad.
  auto a = build(op::kRcAck);
  a[14 + 20 + 8 + 1] |= 0x10;
  refresh_icrc(a);
  EXPECT_EQ(parse(a).reject, Reject::kBadLength);
  // Pad larger than the payload region.
  auto z = build(op::kRcSendOnly, 0);
  z[14 + 20 + 8 + 1] |= 0x20;
  refresh_icrc(z);
  EXPECT_EQ(parse(z).reject, Reject::kBadPadCount);
}

TEST_F(ParserTest, AtomicWriteNeedsEightBytes) {
  auto ok = build(op::kRcAtomicWrite, 8);
  EXPECT_TRUE(parse(ok).ok());
  auto bad = build(op::kRcAtomicWrite, 12);
  EXPECT_EQ(parse(bad).reject, Reject::kBadLength);
}

TEST_F(ParserTest, RoundTripsEveryOpcode) {
  std::mt19937_64 rng(3);
  std::vector<std::uint8_t> buf(9000);
  for (std::uint8_t op : testing::valid_opcodes()) {
    for (auto v : {IpVersion::kV4, IpVersion::kV6}) {
      const auto rf = testing::random_frame(rng, op, v, true);
      const std::size_t n = build_frame(buf, rf.spec, rf.payload);
      ASSERT_EQ(n, frame_len(rf.spec, rf.payload.size()));
      const auto st = parse_frame(ConstBytes(buf.data(), n), ParseOptions{}, pkt);
      ASSERT_TRUE(st.ok()) << opcode_name(op) << ": " << st.to_string();
      EXPECT_EQ(pkt.opcode, op);
      EXPECT_EQ(pkt.destqp, rf.spec.destqp);
      EXPECT_EQ(pkt.psn, rf.spec.psn);
      EXPECT_EQ(pkt.ackreq, rf.spec.ackreq);
      EXPECT_EQ(pkt.se, rf.spec.se);
      EXPECT_EQ(pkt.pkey, rf.spec.pkey);
      EXPECT_EQ(pkt.dscp, rf.spec.dscp);
      EXPECT_EQ(pkt.ecn, rf.spec.ecn);
      EXPECT_EQ(pkt.src, rf.spec.src);
      EXPECT_EQ(pkt.sport, rf.spec.udp_sport);
      EXPECT_EQ(pkt.padcnt, pad_for(rf.payload.size()));
      ASSERT_EQ(pkt.payload_len, rf.payload.size());
      EXPECT_TRUE(std::equal(rf.payload.begin(), rf.payload.end(), pkt.payload().begin()));
      if (auto* h = pkt.reth()) {
        EXPECT_EQ(h->dma_len.get(), rf.spec.ext.reth_len);
      }
      if (auto* h = pkt.aeth()) {
        EXPECT_EQ(h->msn.get(), rf.spec.ext.aeth_msn);
      }
      if (auto* h = pkt.atomic_eth()) {
        EXPECT_EQ(h->compare.get(), rf.spec.ext.atomic_compare);
      }
      if (auto* h = pkt.atomic_ack()) {
        EXPECT_EQ(h->orig.get(), rf.spec.ext.atomic_ack_orig);
      }
      if (auto* h = pkt.immdt()) {
        EXPECT_EQ(h->imm.get(), rf.spec.ext.imm);
      }
      if (auto* h = pkt.ieth()) {
        EXPECT_EQ(h->rkey.get(), rf.spec.ext.ieth_rkey);
      }
      if (auto* h = pkt.deth()) {
        EXPECT_EQ(h->src_qp.get(), rf.spec.ext.deth_src_qp);
      }
    }
  }
}

}  // namespace
}  // namespace uroce::wire
