#include "tools/pcap/decode.h"

#include <gtest/gtest.h>

#include <vector>

#include "stack/wire/builder.h"

namespace uroce::tools {
namespace {

using namespace uroce::wire;

class DecodeTest : public ::testing::Test {
 protected:
  void add(std::uint8_t opcode, std::uint32_t psn, std::uint32_t qp = 7, std::uint8_t syndrome = 0,
           std::uint32_t read_len = 0, std::uint8_t ecn = 0, std::size_t payload = 0) {
    FrameSpec s;
    s.src = IpAddr::from_v4(10, 0, 0, 1);
    s.dst = IpAddr::from_v4(10, 0, 0, 2);
    s.opcode = opcode;
    s.destqp = qp;
    s.psn = Psn(psn);
    s.ecn = ecn;
    s.ext.aeth_syndrome = syndrome;
    s.ext.reth_len = read_len;
    std::vector<std::uint8_t> pl(payload, 1);
    std::vector<std::uint8_t> f(frame_len(s, payload));
    ASSERT_EQ(build_frame(f, s, pl), f.size());
    Packet pkt;
    ASSERT_TRUE(dec.add(f, pkt).ok());
  }
  const QpSummary& qp(std::uint32_t n = 7) { return dec.qps().at(QpKey{IpAddr::from_v4(10, 0, 0, 2), n}); }
  Decoder dec{1024};
};

TEST_F(DecodeTest, CountsMessagesGapsAndRepeats) {
  add(op::kRcSendFirst, 10, 7, 0, 0, 0, 1024);
  add(op::kRcSendMiddle, 11, 7, 0, 0, 0, 1024);
  add(op::kRcSendLast, 12, 7, 0, 0, 0, 100);
  add(op::kRcWriteOnly, 14);  // gap: 13 missing
  add(op::kRcWriteOnly, 14);  // repeat
  add(op::kRcWriteOnly, 15);
  const auto& s = qp();
  EXPECT_EQ(s.packets, 6u);
  EXPECT_EQ(s.payload_bytes, 2148u);
  EXPECT_EQ(s.messages, 4u);
  EXPECT_EQ(s.psn_gaps, 1u);
  EXPECT_EQ(s.psn_repeats, 1u);
}

TEST_F(DecodeTest, ReadRequestAdvancesByResponsePackets) {
  add(op::kRcReadRequest, 100, 7, 0, 3000);  // 3 responses at MTU 1024
  add(op::kRcSendOnly, 103);
  add(op::kRcReadRequest, 104, 7, 0, 0);  // zero-length READ: 1 PSN
  add(op::kRcSendOnly, 105);
  EXPECT_EQ(qp().psn_gaps, 0u);
  EXPECT_EQ(qp().psn_repeats, 0u);
  add(op::kRcReadRequest, 106, 7, 0, 2048);
  add(op::kRcSendOnly, 107);  // reuses a PSN the READ response still covers
  EXPECT_EQ(qp().psn_repeats, 1u);
  // Across the 2^24 wrap, on another QP.
  add(op::kRcReadRequest, 0xfffffe, 8, 0, 4096);  // 4 responses: fffffe..1
  add(op::kRcSendOnly, 2, 8);
  EXPECT_EQ(qp(8).psn_gaps + qp(8).psn_repeats, 0u);
}

TEST_F(DecodeTest, AethSyndromesCnpAndEcn) {
  add(op::kRcAck, 1, 9, 0x1f);
  add(op::kRcAck, 2, 9, 0x60);  // NAK PSN sequence error
  add(op::kRcAck, 2, 9, 0x62);  // NAK remote access
  add(op::kRcAck, 3, 9, 0x2e);  // RNR NAK
  add(op::kRcReadRespLast, 4, 9, 0x00);
  add(op::kCnp, 0, 9, 0, 0, 3);
  const auto& s = qp(9);
  EXPECT_EQ(s.acks, 2u);
  EXPECT_EQ(s.naks[0], 1u);
  EXPECT_EQ(s.naks[2], 1u);
  EXPECT_EQ(s.rnr_naks, 1u);
  EXPECT_EQ(s.cnps, 1u);
  EXPECT_EQ(s.ecn_ce, 1u);
  EXPECT_EQ(s.messages, 0u);  // responses are not messages
}

TEST_F(DecodeTest, NonRoceAndMalformedCounted) {
  std::vector<std::uint8_t> arp(60, 0);
  arp[12] = 0x08;
  arp[13] = 0x06;
  Packet pkt;
  EXPECT_FALSE(dec.add(arp, pkt).ok());
  FrameSpec s;
  s.opcode = op::kRcSendOnly;
  std::vector<std::uint8_t> f(frame_len(s, 0));
  ASSERT_GT(build_frame(f, s, {}), 0u);
  f.back() ^= 1;
  EXPECT_EQ(dec.add(f, pkt).reject, Reject::kBadIcrc);
  EXPECT_EQ(dec.totals().frames, 2u);
  EXPECT_EQ(dec.totals().non_roce, 1u);
  EXPECT_EQ(dec.totals().malformed, 1u);
  EXPECT_EQ(dec.totals().bad_icrc, 1u);
  EXPECT_TRUE(dec.qps().empty());
}

TEST(Describe, MentionsKeyFields) {
  FrameSpec s;
  s.opcode = op::kRcAck;
  s.destqp = 0x11;
  s.psn = Psn(42);
  s.ext.aeth_syndrome = 0x60;
  std::vector<std::uint8_t> f(frame_len(s, 0));
  ASSERT_GT(build_frame(f, s, {}), 0u);
  Packet pkt;
  ASSERT_TRUE(parse_frame(f, ParseOptions{}, pkt).ok());
  const std::string d = describe(pkt);
  EXPECT_NE(d.find("RC_ACKNOWLEDGE"), std::string::npos);
  EXPECT_NE(d.find("dqp=0x000011"), std::string::npos);
  EXPECT_NE(d.find("psn=42"), std::string::npos);
  EXPECT_NE(d.find("NAK psn_seq_error"), std::string::npos);
}

}  // namespace
}  // namespace uroce::tools
