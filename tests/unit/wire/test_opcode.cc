// The opcode table against an independent transcription of IBTA 1.5
// table 35 and the per-opcode header lists of ch. 9.2-9.3.
#include "stack/wire/opcode.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace uroce::wire {
namespace {

struct Expect {
  std::uint8_t op;
  const char* headers;  // extension headers in wire order
  int hdr_len;          // BTH included
  bool payload;
};

// Written from the spec tables, not from opcode.h.
const Expect kSpec[] = {
    {0x00, "", 12, true},           {0x01, "", 12, true},          {0x02, "", 12, true},
    {0x03, "ImmDt", 16, true},      {0x04, "", 12, true},          {0x05, "ImmDt", 16, true},
    {0x06, "RETH", 28, true},       {0x07, "", 12, true},          {0x08, "", 12, true},
    {0x09, "ImmDt", 16, true},      {0x0a, "RETH", 28, true},      {0x0b, "RETH ImmDt", 32, true},
    {0x0c, "RETH", 28, false},      {0x0d, "AETH", 16, true},      {0x0e, "", 12, true},
    {0x0f, "AETH", 16, true},       {0x10, "AETH", 16, true},      {0x11, "AETH", 16, false},
    {0x12, "AETH AtomicAckETH", 24, false}, {0x13, "AtomicETH", 40, false}, {0x14, "AtomicETH", 40, false},
    {0x16, "IETH", 16, true},       {0x17, "IETH", 16, true},      {0x1c, "FETH RETH", 32, false},
    {0x1d, "RETH", 28, true},
    {0x20, "", 12, true},           {0x21, "", 12, true},          {0x22, "", 12, true},
    {0x23, "ImmDt", 16, true},      {0x24, "", 12, true},          {0x25, "ImmDt", 16, true},
    {0x26, "RETH", 28, true},       {0x27, "", 12, true},          {0x28, "", 12, true},
    {0x29, "ImmDt", 16, true},      {0x2a, "RETH", 28, true},      {0x2b, "RETH ImmDt", 32, true},
    // XRC: RC's opcodes at 0xA0 and up, an XRCETH in every request packet.
    {0xa0, "XRCETH", 16, true},     {0xa1, "XRCETH", 16, true},    {0xa2, "XRCETH", 16, true},
    {0xa3, "XRCETH ImmDt", 20, true}, {0xa4, "XRCETH", 16, true},  {0xa5, "XRCETH ImmDt", 20, true},
    {0xa6, "XRCETH RETH", 32, true}, {0xa7, "XRCETH", 16, true},   {0xa8, "XRCETH", 16, true},
    {0xa9, "XRCETH ImmDt", 20, true}, {0xaa, "XRCETH RETH", 32, true}, {0xab, "XRCETH RETH ImmDt", 36, true},
    {0xac, "XRCETH RETH", 32, false}, {0xad, "AETH", 16, true},    {0xae, "", 12, true},
    {0xaf, "AETH", 16, true},       {0xb0, "AETH", 16, true},      {0xb1, "AETH", 16, false},
    {0xb2, "AETH AtomicAckETH", 24, false}, {0xb3, "XRCETH AtomicETH", 44, false},
    {0xb4, "XRCETH AtomicETH", 44, false}, {0xb6, "XRCETH IETH", 20, true}, {0xb7, "XRCETH IETH", 20, true},
    {0xbc, "XRCETH FETH RETH", 36, false}, {0xbd, "XRCETH RETH", 32, true},
    {0x64, "DETH", 20, true},       {0x65, "DETH ImmDt", 24, true}, {0x81, "CNP", 28, false},
    // uroce's selective repeat, in the manufacturer-specific range (docs/research.md's layout).
    {0xe0, "SRH", 32, true},        {0xe1, "RETH SRH", 48, true},  {0xe2, "AETH SACK", 52, false},
};

std::string headers_of(const OpcodeInfo& i) {
  std::string s;
  auto add = [&s](std::uint8_t off, const char* n) {
    if (off != 0) s += (s.empty() ? "" : " ") + std::string(n);
  };
  add(i.off_deth, "DETH");
  add(i.off_xrceth, "XRCETH");
  add(i.off_feth, "FETH");
  add(i.off_reth, "RETH");
  add(i.off_atomic_eth, "AtomicETH");
  add(i.off_aeth, "AETH");
  add(i.off_atomic_ack, "AtomicAckETH");
  add(i.off_immdt, "ImmDt");
  add(i.off_ieth, "IETH");
  add(i.off_cnp, "CNP");
  add(i.off_srh, "SRH");
  add(i.off_sack, "SACK");
  return s;
}

TEST(OpcodeTable, MatchesSpecTranscription) {
  std::set<int> listed;
  for (const auto& e : kSpec) {
    const OpcodeInfo& i = opcode_info(e.op);
    listed.insert(e.op);
    ASSERT_TRUE(i.valid()) << std::hex << int(e.op);
    EXPECT_EQ(headers_of(i), e.headers) << i.name;
    EXPECT_EQ(i.hdr_len, e.hdr_len) << i.name;
    EXPECT_EQ(i.has(kOpPayload), e.payload) << i.name;
  }
  for (int op = 0; op < 256; ++op)
    EXPECT_EQ(opcode_info(static_cast<std::uint8_t>(op)).valid(), listed.count(op) == 1) << std::hex << op;
}

TEST(OpcodeTable, RolesAndPositions) {
  EXPECT_TRUE(opcode_info(op::kRcSendFirst).is_first());
  EXPECT_TRUE(opcode_info(op::kUcWriteMiddle).is_middle());
  EXPECT_TRUE(opcode_info(op::kRcSendLastInv).is_last());
  EXPECT_TRUE(opcode_info(op::kUdSendOnlyImm).is_only());
  EXPECT_TRUE(opcode_info(op::kRcReadRespMiddle).has(kOpResponse));
  EXPECT_TRUE(opcode_info(op::kRcReadRequest).has(kOpRequest | kOpRead));
  EXPECT_TRUE(opcode_info(op::kRcAtomicAck).has(kOpResponse | kOpAtomicAck));
  EXPECT_EQ(opcode_info(op::kRcAtomicWrite).fixed_payload, 8);
  EXPECT_EQ(opcode_name(0x15), "RESERVED");
  EXPECT_EQ(opcode_name(op::kRcSendOnlyInv), "RC_SEND_ONLY_WITH_INVALIDATE");
  EXPECT_EQ(transport_of(0x45), Transport::kRd);
  EXPECT_EQ(transport_of(op::kCnp), Transport::kCnp);
  EXPECT_EQ(transport_of(op::kXrcSendOnly), Transport::kXrc);
  EXPECT_EQ(transport_of(0xc0), Transport::kReserved);
  EXPECT_EQ(opcode_name(op::kXrcAck), "XRC_ACKNOWLEDGE");
}

}  // namespace
}  // namespace uroce::wire
