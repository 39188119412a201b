// The opcode table: the single source of truth for which headers each BTH
// opcode carries, where they sit, and what role the packet plays
// (IBTA 1.5 ch. 9.2.1 table 35 and 9.3; A17.9.3 for CNP).
//
// The parser, the builder, the ICRC and the pcap decoder all read this table;
// nothing else in the tree knows header offsets per opcode.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "stack/wire/headers.h"

namespace uroce::wire {

/// BTH opcodes (IBTA table 35). The top three bits select the transport.
namespace op {
// RC
inline constexpr std::uint8_t kRcSendFirst = 0x00;
inline constexpr std::uint8_t kRcSendMiddle = 0x01;
inline constexpr std::uint8_t kRcSendLast = 0x02;
inline constexpr std::uint8_t kRcSendLastImm = 0x03;
inline constexpr std::uint8_t kRcSendOnly = 0x04;
inline constexpr std::uint8_t kRcSendOnlyImm = 0x05;
inline constexpr std::uint8_t kRcWriteFirst = 0x06;
inline constexpr std::uint8_t kRcWriteMiddle = 0x07;
inline constexpr std::uint8_t kRcWriteLast = 0x08;
inline constexpr std::uint8_t kRcWriteLastImm = 0x09;
inline constexpr std::uint8_t kRcWriteOnly = 0x0a;
inline constexpr std::uint8_t kRcWriteOnlyImm = 0x0b;
inline constexpr std::uint8_t kRcReadRequest = 0x0c;
inline constexpr std::uint8_t kRcReadRespFirst = 0x0d;
inline constexpr std::uint8_t kRcReadRespMiddle = 0x0e;
inline constexpr std::uint8_t kRcReadRespLast = 0x0f;
inline constexpr std::uint8_t kRcReadRespOnly = 0x10;
inline constexpr std::uint8_t kRcAck = 0x11;
inline constexpr std::uint8_t kRcAtomicAck = 0x12;
inline constexpr std::uint8_t kRcCmpSwap = 0x13;
inline constexpr std::uint8_t kRcFetchAdd = 0x14;
inline constexpr std::uint8_t kRcSendLastInv = 0x16;
inline constexpr std::uint8_t kRcSendOnlyInv = 0x17;
inline constexpr std::uint8_t kRcFlush = 0x1c;
inline constexpr std::uint8_t kRcAtomicWrite = 0x1d;
// UC
inline constexpr std::uint8_t kUcSendFirst = 0x20;
inline constexpr std::uint8_t kUcSendMiddle = 0x21;
inline constexpr std::uint8_t kUcSendLast = 0x22;
inline constexpr std::uint8_t kUcSendLastImm = 0x23;
inline constexpr std::uint8_t kUcSendOnly = 0x24;
inline constexpr std::uint8_t kUcSendOnlyImm = 0x25;
inline constexpr std::uint8_t kUcWriteFirst = 0x26;
inline constexpr std::uint8_t kUcWriteMiddle = 0x27;
inline constexpr std::uint8_t kUcWriteLast = 0x28;
inline constexpr std::uint8_t kUcWriteLastImm = 0x29;
inline constexpr std::uint8_t kUcWriteOnly = 0x2a;
inline constexpr std::uint8_t kUcWriteOnlyImm = 0x2b;
// XRC (0xA0 and up): RC's opcodes at the same offsets; each request
// carries an XRCETH after the BTH.
inline constexpr std::uint8_t kXrcBase = 0xa0;
inline constexpr std::uint8_t kXrcSendOnly = 0xa4;
inline constexpr std::uint8_t kXrcAck = 0xb1;
// UD
inline constexpr std::uint8_t kUdSendOnly = 0x64;
inline constexpr std::uint8_t kUdSendOnlyImm = 0x65;
// RoCEv2 congestion notification (A17.9.3)
inline constexpr std::uint8_t kCnp = 0x81;
// uroce's selective repeat (manufacturer-specific opcodes, 0xE0 and up):
// RC semantics, only on QPs that both ends set to selective repeat.
inline constexpr std::uint8_t kSrSend = 0xe0;
inline constexpr std::uint8_t kSrWrite = 0xe1;
inline constexpr std::uint8_t kSrAck = 0xe2;
}  // namespace op

/// One of uroce's selective-repeat opcodes.
[[nodiscard]] constexpr bool is_sr_opcode(std::uint8_t opcode) { return opcode >= op::kSrSend && opcode <= op::kSrAck; }

enum class Transport : std::uint8_t { kRc = 0, kUc = 1, kRd = 2, kUd = 3, kCnp = 4, kXrc = 5, kReserved = 6 };

[[nodiscard]] constexpr Transport transport_of(std::uint8_t opcode) {
  const unsigned t = opcode >> 5;
  return t <= 5 ? static_cast<Transport>(t) : Transport::kReserved;
}

/// Per-opcode property bits.
enum OpFlag : std::uint32_t {
  kOpValid = 1u << 0,
  kOpRequest = 1u << 1,   // sent by a requester
  kOpResponse = 1u << 2,  // sent by a responder (ACK, READ response, atomic ACK)
  kOpStart = 1u << 3,     // FIRST or ONLY
  kOpEnd = 1u << 4,       // LAST or ONLY
  kOpPayload = 1u << 5,   // may carry data payload
  kOpSend = 1u << 6,
  kOpWrite = 1u << 7,
  kOpRead = 1u << 8,       // READ request
  kOpReadResp = 1u << 9,   // READ response packet
  kOpAtomic = 1u << 10,    // CmpSwap / FetchAdd request
  kOpAck = 1u << 11,       // ACKNOWLEDGE
  kOpAtomicAck = 1u << 12,
  kOpFlush = 1u << 13,
  kOpAtomicWrite = 1u << 14,
  kOpCnp = 1u << 15,
  kOpImm = 1u << 16,  // carries ImmDt
  kOpInv = 1u << 17,  // carries IETH
  // Extension headers present, in wire order after the BTH.
  kHdrDeth = 1u << 20,
  kHdrFeth = 1u << 21,
  kHdrReth = 1u << 22,
  kHdrAtomicEth = 1u << 23,
  kHdrAeth = 1u << 24,
  kHdrAtomicAckEth = 1u << 25,
  kHdrImmDt = 1u << 26,
  kHdrIeth = 1u << 27,
  kHdrCnp = 1u << 28,
  kHdrSrh = 1u << 29,   // uroce's selective-repeat header
  kHdrSack = 1u << 30,  // uroce's selective acknowledgement
  kHdrXrceth = 1u << 31,
};

/// Where each extension header sits, as a byte offset from the start of the
/// BTH; 0 means absent (the BTH itself is always at 0).
struct OpcodeInfo {
  std::string_view name;
  std::uint32_t flags = 0;
  std::uint8_t hdr_len = 0;  // BTH plus all extension headers
  std::uint8_t fixed_payload = 0;  // exact payload length, when fixed (ATOMIC_WRITE)
  std::uint8_t off_deth = 0, off_xrceth = 0, off_feth = 0, off_reth = 0, off_atomic_eth = 0;
  std::uint8_t off_aeth = 0, off_atomic_ack = 0, off_immdt = 0, off_ieth = 0, off_cnp = 0;
  std::uint8_t off_srh = 0, off_sack = 0;

  [[nodiscard]] constexpr bool valid() const { return (flags & kOpValid) != 0; }
  [[nodiscard]] constexpr bool has(std::uint32_t f) const { return (flags & f) == f; }
  [[nodiscard]] constexpr bool is_first() const { return has(kOpStart) && !has(kOpEnd); }
  [[nodiscard]] constexpr bool is_middle() const {
    return (flags & (kOpStart | kOpEnd)) == 0 && (flags & (kOpSend | kOpWrite | kOpReadResp)) != 0;
  }
  [[nodiscard]] constexpr bool is_last() const { return has(kOpEnd) && !has(kOpStart); }
  [[nodiscard]] constexpr bool is_only() const { return has(kOpStart | kOpEnd); }
};

namespace detail {

constexpr OpcodeInfo make(std::string_view name, std::uint32_t flags, std::uint8_t fixed_payload = 0) {
  OpcodeInfo i{};
  i.name = name;
  i.flags = flags | kOpValid;
  i.fixed_payload = fixed_payload;
  std::uint8_t off = sizeof(Bth);
  auto place = [&](std::uint32_t f, std::uint8_t& slot, std::size_t len) {
    if (flags & f) {
      slot = off;
      off = static_cast<std::uint8_t>(off + len);
    }
  };
  // IBTA 9.2: extension headers follow the BTH in this fixed order.
  place(kHdrDeth, i.off_deth, sizeof(Deth));
  place(kHdrXrceth, i.off_xrceth, sizeof(Xrceth));
  place(kHdrFeth, i.off_feth, sizeof(Feth));
  place(kHdrReth, i.off_reth, sizeof(Reth));
  place(kHdrAtomicEth, i.off_atomic_eth, sizeof(AtomicEth));
  place(kHdrAeth, i.off_aeth, sizeof(Aeth));
  place(kHdrAtomicAckEth, i.off_atomic_ack, sizeof(AtomicAckEth));
  place(kHdrImmDt, i.off_immdt, sizeof(ImmDt));
  place(kHdrIeth, i.off_ieth, sizeof(Ieth));
  place(kHdrCnp, i.off_cnp, sizeof(CnpBody));
  place(kHdrSrh, i.off_srh, sizeof(Srh));
  place(kHdrSack, i.off_sack, sizeof(Sack));
  i.hdr_len = off;
  return i;
}

// Families shared by RC and UC.
constexpr std::uint32_t kSendF = kOpRequest | kOpSend | kOpPayload | kOpStart;
constexpr std::uint32_t kSendM = kOpRequest | kOpSend | kOpPayload;
constexpr std::uint32_t kSendL = kOpRequest | kOpSend | kOpPayload | kOpEnd;
constexpr std::uint32_t kSendO = kSendL | kOpStart;
constexpr std::uint32_t kWriteF = kOpRequest | kOpWrite | kOpPayload | kOpStart | kHdrReth;
constexpr std::uint32_t kWriteM = kOpRequest | kOpWrite | kOpPayload;
constexpr std::uint32_t kWriteL = kOpRequest | kOpWrite | kOpPayload | kOpEnd;
constexpr std::uint32_t kWriteO = kWriteF | kOpEnd;
constexpr std::uint32_t kImm = kOpImm | kHdrImmDt;
constexpr std::uint32_t kInv = kOpInv | kHdrIeth;

constexpr void add_send_write(std::array<OpcodeInfo, 256>& t, std::uint8_t base, bool rc) {
  t[base + 0x00] = make(rc ? "RC_SEND_FIRST" : "UC_SEND_FIRST", kSendF);
  t[base + 0x01] = make(rc ? "RC_SEND_MIDDLE" : "UC_SEND_MIDDLE", kSendM);
  t[base + 0x02] = make(rc ? "RC_SEND_LAST" : "UC_SEND_LAST", kSendL);
  t[base + 0x03] = make(rc ? "RC_SEND_LAST_WITH_IMMEDIATE" : "UC_SEND_LAST_WITH_IMMEDIATE", kSendL | kImm);
  t[base + 0x04] = make(rc ? "RC_SEND_ONLY" : "UC_SEND_ONLY", kSendO);
  t[base + 0x05] = make(rc ? "RC_SEND_ONLY_WITH_IMMEDIATE" : "UC_SEND_ONLY_WITH_IMMEDIATE", kSendO | kImm);
  t[base + 0x06] = make(rc ? "RC_RDMA_WRITE_FIRST" : "UC_RDMA_WRITE_FIRST", kWriteF);
  t[base + 0x07] = make(rc ? "RC_RDMA_WRITE_MIDDLE" : "UC_RDMA_WRITE_MIDDLE", kWriteM);
  t[base + 0x08] = make(rc ? "RC_RDMA_WRITE_LAST" : "UC_RDMA_WRITE_LAST", kWriteL);
  t[base + 0x09] = make(rc ? "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE" : "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
                        kWriteL | kImm);
  t[base + 0x0a] = make(rc ? "RC_RDMA_WRITE_ONLY" : "UC_RDMA_WRITE_ONLY", kWriteO);
  t[base + 0x0b] = make(rc ? "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE" : "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
                        kWriteO | kImm);
}

/// XRC's names for RC's opcodes, by offset (empty where RC has none).
constexpr std::array<std::string_view, 0x20> kXrcNames = {
    "XRC_SEND_FIRST", "XRC_SEND_MIDDLE", "XRC_SEND_LAST", "XRC_SEND_LAST_WITH_IMMEDIATE", "XRC_SEND_ONLY",
    "XRC_SEND_ONLY_WITH_IMMEDIATE", "XRC_RDMA_WRITE_FIRST", "XRC_RDMA_WRITE_MIDDLE", "XRC_RDMA_WRITE_LAST",
    "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", "XRC_RDMA_WRITE_ONLY", "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    "XRC_RDMA_READ_REQUEST", "XRC_RDMA_READ_RESPONSE_FIRST", "XRC_RDMA_READ_RESPONSE_MIDDLE",
    "XRC_RDMA_READ_RESPONSE_LAST", "XRC_RDMA_READ_RESPONSE_ONLY", "XRC_ACKNOWLEDGE", "XRC_ATOMIC_ACKNOWLEDGE",
    "XRC_CMP_SWAP", "XRC_FETCH_ADD", "", "XRC_SEND_LAST_WITH_INVALIDATE", "XRC_SEND_ONLY_WITH_INVALIDATE", "", "", "",
    "", "XRC_FLUSH", "XRC_ATOMIC_WRITE", "", ""};

constexpr std::array<OpcodeInfo, 256> make_table() {
  std::array<OpcodeInfo, 256> t{};
  add_send_write(t, 0x00, true);
  add_send_write(t, 0x20, false);
  constexpr std::uint32_t kRr = kOpResponse | kOpReadResp | kOpPayload;
  t[op::kRcReadRequest] = make("RC_RDMA_READ_REQUEST", kOpRequest | kOpRead | kOpStart | kOpEnd | kHdrReth);
  t[op::kRcReadRespFirst] = make("RC_RDMA_READ_RESPONSE_FIRST", kRr | kOpStart | kHdrAeth);
  t[op::kRcReadRespMiddle] = make("RC_RDMA_READ_RESPONSE_MIDDLE", kRr);
  t[op::kRcReadRespLast] = make("RC_RDMA_READ_RESPONSE_LAST", kRr | kOpEnd | kHdrAeth);
  t[op::kRcReadRespOnly] = make("RC_RDMA_READ_RESPONSE_ONLY", kRr | kOpStart | kOpEnd | kHdrAeth);
  t[op::kRcAck] = make("RC_ACKNOWLEDGE", kOpResponse | kOpAck | kOpStart | kOpEnd | kHdrAeth);
  t[op::kRcAtomicAck] = make("RC_ATOMIC_ACKNOWLEDGE",
                             kOpResponse | kOpAtomicAck | kOpStart | kOpEnd | kHdrAeth | kHdrAtomicAckEth);
  t[op::kRcCmpSwap] = make("RC_CMP_SWAP", kOpRequest | kOpAtomic | kOpStart | kOpEnd | kHdrAtomicEth);
  t[op::kRcFetchAdd] = make("RC_FETCH_ADD", kOpRequest | kOpAtomic | kOpStart | kOpEnd | kHdrAtomicEth);
  t[op::kRcSendLastInv] = make("RC_SEND_LAST_WITH_INVALIDATE", kSendL | kInv);
  t[op::kRcSendOnlyInv] = make("RC_SEND_ONLY_WITH_INVALIDATE", kSendO | kInv);
  t[op::kRcFlush] = make("RC_FLUSH", kOpRequest | kOpFlush | kOpStart | kOpEnd | kHdrFeth | kHdrReth);
  t[op::kRcAtomicWrite] =
      make("RC_ATOMIC_WRITE", kOpRequest | kOpAtomicWrite | kOpPayload | kOpStart | kOpEnd | kHdrReth, 8);
  // XRC: each RC opcode again, with an XRCETH on the requests.
  for (std::uint8_t i = 0; i < 0x20; ++i)
    if (t[i].valid())
      t[op::kXrcBase + i] = make(kXrcNames[i], (t[i].flags & ~kOpValid) | ((t[i].flags & kOpRequest) ? kHdrXrceth : 0u),
                                 t[i].fixed_payload);
  t[op::kUdSendOnly] = make("UD_SEND_ONLY", kSendO | kHdrDeth);
  t[op::kUdSendOnlyImm] = make("UD_SEND_ONLY_WITH_IMMEDIATE", kSendO | kHdrDeth | kImm);
  t[op::kCnp] = make("CNP", kOpCnp | kHdrCnp);
  // Each selective-repeat packet stands alone (its Srh says where it goes),
  // so each is a start and an end, and any may be short and padded.
  t[op::kSrSend] = make("UROCE_SR_SEND", kOpRequest | kOpSend | kOpPayload | kOpStart | kOpEnd | kHdrSrh);
  t[op::kSrWrite] = make("UROCE_SR_WRITE", kOpRequest | kOpWrite | kOpPayload | kOpStart | kOpEnd | kHdrReth | kHdrSrh);
  t[op::kSrAck] = make("UROCE_SR_ACK", kOpResponse | kOpAck | kHdrAeth | kHdrSack);
  return t;
}

}  // namespace detail

inline constexpr std::array<OpcodeInfo, 256> kOpcodeTable = detail::make_table();

[[nodiscard]] constexpr const OpcodeInfo& opcode_info(std::uint8_t opcode) { return kOpcodeTable[opcode]; }
[[nodiscard]] constexpr std::string_view opcode_name(std::uint8_t opcode) {
  return kOpcodeTable[opcode].valid() ? kOpcodeTable[opcode].name : std::string_view("RESERVED");
}

// The table against the header layouts of IBTA 9.2 (and rxe_opcode.c, which agrees).
static_assert(kOpcodeTable[op::kRcSendFirst].hdr_len == 12);
static_assert(kOpcodeTable[op::kRcWriteOnlyImm].hdr_len == 12 + 16 + 4);
static_assert(kOpcodeTable[op::kRcWriteOnlyImm].off_immdt == 28);
static_assert(kOpcodeTable[op::kRcAtomicAck].off_atomic_ack == 16);
static_assert(kOpcodeTable[op::kRcCmpSwap].hdr_len == 40);
static_assert(kOpcodeTable[op::kRcFlush].off_reth == 16 && kOpcodeTable[op::kRcFlush].hdr_len == 32);
static_assert(kOpcodeTable[op::kUdSendOnlyImm].off_immdt == 20);
static_assert(kOpcodeTable[op::kRcSendOnlyInv].off_ieth == 12);
static_assert(kOpcodeTable[op::kCnp].hdr_len == 28);
static_assert(!kOpcodeTable[0x15].valid() && !kOpcodeTable[0x18].valid() && !kOpcodeTable[0x1e].valid());
static_assert(!kOpcodeTable[0x40].valid());  // RD is not implemented
static_assert(kOpcodeTable[op::kRcReadRespMiddle].is_middle() && kOpcodeTable[op::kRcSendLast].is_last());

constexpr int count_valid_opcodes() {
  int n = 0;
  for (const auto& i : kOpcodeTable) n += i.valid() ? 1 : 0;
  return n;
}
// 25 RC + 25 XRC + 12 UC + 2 UD + CNP, and uroce's three selective-repeat opcodes.
static_assert(count_valid_opcodes() == 68);
// XRC: the XRCETH after the BTH (and DETH, which XRC has none of), before RETH and AtomicETH.
static_assert(kOpcodeTable[op::kXrcSendOnly].off_xrceth == 12 && kOpcodeTable[op::kXrcSendOnly].hdr_len == 16);
static_assert(kOpcodeTable[op::kXrcBase + 0x0b].off_reth == 16 && kOpcodeTable[op::kXrcBase + 0x0b].off_immdt == 32);
static_assert(kOpcodeTable[op::kXrcBase + 0x13].hdr_len == 44);
static_assert(kOpcodeTable[op::kXrcAck].off_xrceth == 0 && kOpcodeTable[op::kXrcAck].off_aeth == 12);
static_assert(kOpcodeTable[op::kXrcBase + 0x10].off_xrceth == 0);  // READ responses carry none
static_assert(kOpcodeTable[0xb7].name == "XRC_SEND_ONLY_WITH_INVALIDATE" && kOpcodeTable[0xbc].name == "XRC_FLUSH" &&
              kOpcodeTable[0xbd].name == "XRC_ATOMIC_WRITE");
static_assert(kOpcodeTable[op::kSrWrite].off_reth == 12 && kOpcodeTable[op::kSrWrite].off_srh == 28 &&
              kOpcodeTable[op::kSrWrite].hdr_len == 48);
static_assert(kOpcodeTable[op::kSrAck].off_sack == 16 && kOpcodeTable[op::kSrAck].hdr_len == 52);

}  // namespace uroce::wire
