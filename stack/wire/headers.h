// RoCEv2 header layouts: L2/L3/L4 underlay and the InfiniBand transport
// headers (IBTA vol. 1 rel. 1.5, ch. 9.2 and Annex A17).
//
// Every struct is bytes and be<> fields only: no bitfields, alignment 1, and
// a static_assert on its size. Sub-byte fields are read through accessors.
#pragma once

#include <array>
#include <cstdint>

#include "stack/wire/be.h"

namespace uroce::wire {

using MacAddr = std::array<std::uint8_t, 6>;

inline constexpr std::uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr std::uint16_t kEtherTypeArp = 0x0806;
inline constexpr std::uint16_t kEtherTypeVlan = 0x8100;
inline constexpr std::uint16_t kEtherTypeIpv6 = 0x86dd;
inline constexpr std::uint8_t kIpProtoUdp = 17;
/// IANA-assigned RoCEv2 UDP destination port (IBTA Annex A17).
inline constexpr std::uint16_t kRoceV2Port = 4791;
/// rxe and the kernel pick UDP source ports from this range (IB_ROCE_UDP_ENCAP_VALID_PORT_MIN).
inline constexpr std::uint16_t kRoceSportMin = 0xC000;

struct EthHdr {
  MacAddr dst;
  MacAddr src;
  be16 ethertype;
};
static_assert(sizeof(EthHdr) == 14);

/// 802.1Q tag as it follows the source MAC: TPID already consumed as the
/// outer ethertype, so this is TCI plus the inner ethertype.
struct VlanTag {
  be16 tci;
  be16 ethertype;
  [[nodiscard]] std::uint16_t vid() const { return tci.get() & 0x0fff; }
  [[nodiscard]] std::uint8_t pcp() const { return static_cast<std::uint8_t>(tci.get() >> 13); }
};
static_assert(sizeof(VlanTag) == 4);

struct Ipv4Hdr {
  std::uint8_t ver_ihl;
  std::uint8_t tos;  // DSCP(6) | ECN(2)
  be16 total_len;
  be16 id;
  be16 frag;  // flags(3) | fragment offset(13)
  std::uint8_t ttl;
  std::uint8_t proto;
  be16 csum;
  std::array<std::uint8_t, 4> src;
  std::array<std::uint8_t, 4> dst;

  [[nodiscard]] std::uint8_t version() const { return ver_ihl >> 4; }
  [[nodiscard]] std::uint8_t ihl() const { return ver_ihl & 0x0f; }
  [[nodiscard]] std::uint8_t dscp() const { return tos >> 2; }
  [[nodiscard]] std::uint8_t ecn() const { return tos & 0x3; }
  [[nodiscard]] bool more_fragments() const { return (frag.get() & 0x2000) != 0; }
  [[nodiscard]] std::uint16_t frag_offset() const { return frag.get() & 0x1fff; }
};
static_assert(sizeof(Ipv4Hdr) == 20);

struct Ipv6Hdr {
  be32 ver_tc_flow;  // version(4) | traffic class(8) | flow label(20)
  be16 payload_len;
  std::uint8_t next_header;
  std::uint8_t hop_limit;
  std::array<std::uint8_t, 16> src;
  std::array<std::uint8_t, 16> dst;

  [[nodiscard]] std::uint8_t version() const { return static_cast<std::uint8_t>(ver_tc_flow.get() >> 28); }
  [[nodiscard]] std::uint8_t traffic_class() const { return static_cast<std::uint8_t>(ver_tc_flow.get() >> 20); }
  [[nodiscard]] std::uint32_t flow_label() const { return ver_tc_flow.get() & 0xfffff; }
  [[nodiscard]] std::uint8_t dscp() const { return traffic_class() >> 2; }
  [[nodiscard]] std::uint8_t ecn() const { return traffic_class() & 0x3; }
};
static_assert(sizeof(Ipv6Hdr) == 40);

struct UdpHdr {
  be16 sport;
  be16 dport;
  be16 len;
  be16 csum;
};
static_assert(sizeof(UdpHdr) == 8);

/// Base Transport Header (IBTA 9.2).
struct Bth {
  std::uint8_t opcode;
  std::uint8_t flags;  // SE(1) | MigReq(1) | PadCnt(2) | TVer(4)
  be16 pkey;
  std::uint8_t resv8a;  // FECN(1) | BECN(1) | reserved(6)  -- masked in the ICRC
  be24 destqp;
  std::uint8_t ackreq;  // AckReq(1) | reserved(7)
  be24 psn;

  [[nodiscard]] bool se() const { return (flags & 0x80) != 0; }
  [[nodiscard]] bool migreq() const { return (flags & 0x40) != 0; }
  [[nodiscard]] std::uint8_t padcnt() const { return (flags >> 4) & 0x3; }
  [[nodiscard]] std::uint8_t tver() const { return flags & 0x0f; }
  [[nodiscard]] bool fecn() const { return (resv8a & 0x80) != 0; }
  [[nodiscard]] bool becn() const { return (resv8a & 0x40) != 0; }
  [[nodiscard]] bool ack_req() const { return (ackreq & 0x80) != 0; }

  void set_flags(bool se, bool migreq, std::uint8_t pad, std::uint8_t tver = 0) {
    flags = static_cast<std::uint8_t>((se ? 0x80 : 0) | (migreq ? 0x40 : 0) | ((pad & 3) << 4) | (tver & 0xf));
  }
};
static_assert(sizeof(Bth) == 12);

/// RDMA Extended Transport Header (9.3.3).
struct Reth {
  be64 va;
  be32 rkey;
  be32 dma_len;
};
static_assert(sizeof(Reth) == 16);

/// ACK Extended Transport Header (9.3.5). Syndrome bits 7:5 select ACK,
/// RNR NAK or NAK; the low five bits carry credits, the RNR timer or the NAK code.
struct Aeth {
  std::uint8_t syndrome;
  be24 msn;
};
static_assert(sizeof(Aeth) == 4);

/// Atomic Extended Transport Header (9.3.4).
struct AtomicEth {
  be64 va;
  be32 rkey;
  be64 swap_add;
  be64 compare;
};
static_assert(sizeof(AtomicEth) == 28);

/// Atomic Acknowledge Extended Transport Header (9.3.6).
struct AtomicAckEth {
  be64 orig;
};
static_assert(sizeof(AtomicAckEth) == 8);

/// Immediate data (9.3.7).
struct ImmDt {
  be32 imm;
};
static_assert(sizeof(ImmDt) == 4);

/// Invalidate Extended Transport Header (9.3.8).
struct Ieth {
  be32 rkey;
};
static_assert(sizeof(Ieth) == 4);

/// Datagram Extended Transport Header (9.3.2).
struct Deth {
  be32 qkey;
  std::uint8_t resv;
  be24 src_qp;
};
static_assert(sizeof(Deth) == 8);

/// XRC Extended Transport Header (IBTA 9.3.5.5): the XRC SRQ, on the
/// responder's node, that an XRC request is for.
struct Xrceth {
  std::uint8_t resv;
  be24 srqn;
};
static_assert(sizeof(Xrceth) == 4);

/// FLUSH Extended Transport Header (IBTA 1.5 9.3.9, Memory Placement Extensions).
struct Feth {
  be32 bits;  // reserved(26) | selectivity level(2) | placement type(4)
  [[nodiscard]] std::uint8_t selectivity() const { return static_cast<std::uint8_t>((bits.get() >> 4) & 0x3); }
  [[nodiscard]] std::uint8_t placement_type() const { return static_cast<std::uint8_t>(bits.get() & 0xf); }
};
static_assert(sizeof(Feth) == 4);

/// RoCEv2 Congestion Notification Packet body (A17.9.3): BTH with opcode
/// 0x81 and BECN set, then 16 reserved bytes, then the ICRC.
struct CnpBody {
  std::array<std::uint8_t, 16> reserved;
};
static_assert(sizeof(CnpBody) == 16);

/// uroce's selective-repeat header (ours, not IBTA; on the manufacturer-
/// specific opcodes SR_SEND and SR_WRITE, between uroce peers only). It
/// makes every packet self-describing, as IRN's extension headers do
/// (Mittal et al., SIGCOMM 2018, section 5): which message (the receive
/// WQE's sequence number), where in it, its whole length, and its
/// immediate data, so a packet can be placed however it arrives.
struct Srh {
  be32 msn;     // the message's receive sequence number (SENDs and WRITEs with immediate)
  be32 offset;  // this packet's byte offset in the message
  be32 total;   // the message's length
  be32 imm;     // ImmDt, when kSrhImm
  std::uint8_t flags;
  std::array<std::uint8_t, 3> reserved;
};
static_assert(sizeof(Srh) == 20);
inline constexpr std::uint8_t kSrhLast = 1;     // the message's last packet
inline constexpr std::uint8_t kSrhImm = 2;      // carries immediate data (completes a receive)
inline constexpr std::uint8_t kSrhSolicit = 4;  // solicited event

/// uroce's selective acknowledgement (on SR_ACK, after the AETH): the
/// first PSN not yet received (the BTH carries the one before it, the
/// cumulative acknowledgement), and which of the 256 PSNs from there have
/// arrived, bit k of word k/64 for PSN base + k.
struct Sack {
  be32 base;  // low 24 bits
  std::array<be64, 4> bits;
};
static_assert(sizeof(Sack) == 36);

inline constexpr std::size_t kIcrcLen = 4;

/// AETH syndrome classes (9.3.5, table 44).
enum class AethKind : std::uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };
[[nodiscard]] constexpr AethKind aeth_kind(std::uint8_t syndrome) {
  const auto top = syndrome >> 5;
  if (top == 0) return AethKind::kAck;
  if (top == 1) return AethKind::kRnrNak;
  if (top == 3) return AethKind::kNak;
  return AethKind::kReserved;
}
/// NAK codes carried in the low 5 syndrome bits when aeth_kind() is kNak.
enum class NakCode : std::uint8_t {
  kPsnSeqError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,
};
/// The "invalid credit count" code that rxe always sends (9.7.7.2.5): the
/// syndrome of every ACK uroce sends.
inline constexpr std::uint8_t kAethCreditInvalid = 0x1f;
/// A NAK's syndrome: class 3 and its code.
[[nodiscard]] constexpr std::uint8_t nak_syndrome(NakCode c) {
  return static_cast<std::uint8_t>(0x60 | static_cast<std::uint8_t>(c));
}
/// An RNR NAK's syndrome: class 1 and the minimum RNR timer's 5-bit code.
[[nodiscard]] constexpr std::uint8_t rnr_nak_syndrome(std::uint8_t timer) {
  return static_cast<std::uint8_t>(0x20 | (timer & 31));
}

}  // namespace uroce::wire
