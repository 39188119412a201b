// RoCEv2 frame parser: one entry point from Ethernet frame to packet
// metadata, or a precise rejection reason.
//
// The parser never reads outside the frame it is given: every header view is
// preceded by a length check, and extension-header lengths come from the
// opcode table. Reserved bits that IBTA says to ignore on receipt (BTH resv8a
// and the low 7 bits of the AckReq byte, MigReq, the DETH reserved byte) are
// ignored.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "stack/wire/addr.h"
#include "stack/wire/be.h"
#include "stack/wire/headers.h"
#include "stack/wire/opcode.h"
#include "stack/wire/psn.h"

namespace uroce::wire {

/// Which header a rejection is about.
enum class HeaderId : std::uint8_t {
  kNone,
  kEth,
  kVlan,
  kIpv4,
  kIpv6,
  kUdp,
  kBth,
  kDeth,
  kXrceth,
  kFeth,
  kReth,
  kAtomicEth,
  kAeth,
  kAtomicAckEth,
  kImmDt,
  kIeth,
  kCnp,
  kSrh,
  kSack,
  kPayload,
  kIcrc,
};

#define UROCE_PARSE_REJECTS(X)                                          \
  X(kOk, "ok")                                                          \
  X(kTruncated, "truncated header")                                     \
  X(kNotIp, "ethertype is not IPv4 or IPv6")                            \
  X(kBadIpVersion, "bad IP version")                                    \
  X(kBadIhl, "bad IPv4 IHL")                                            \
  X(kBadIpv4Checksum, "bad IPv4 header checksum")                       \
  X(kBadIpLength, "IP length inconsistent with frame")                  \
  X(kIpFragment, "IP fragment")                                         \
  X(kNotUdp, "IP protocol is not UDP")                                  \
  X(kBadUdpLength, "bad UDP length")                                    \
  X(kNotRocePort, "UDP destination port is not 4791")                   \
  X(kBadTver, "BTH TVer is not 0")                                      \
  X(kReservedOpcode, "reserved opcode")                                 \
  X(kUnsupportedTransport, "unsupported transport (RD)")                \
  X(kBadPadCount, "pad count inconsistent with length")                 \
  X(kBadLength, "payload length not allowed for opcode")                \
  X(kPayloadOverMtu, "payload over the path MTU")                       \
  X(kBadIcrc, "ICRC mismatch")

enum class Reject : std::uint8_t {
#define UROCE_X(name, text) name,
  UROCE_PARSE_REJECTS(UROCE_X)
#undef UROCE_X
      kCount
};

[[nodiscard]] std::string_view to_string(Reject r);
[[nodiscard]] std::string_view to_string(HeaderId h);

struct ParseStatus {
  Reject reject = Reject::kOk;
  HeaderId header = HeaderId::kNone;  // for kTruncated: the header that did not fit
  /// The frame was identified as RoCEv2 (IP/UDP to port 4791) before the
  /// rejection, so a rejection is a malformed RoCE frame, not foreign traffic.
  bool roce = false;

  [[nodiscard]] bool ok() const { return reject == Reject::kOk; }
  /// e.g. "truncated header: RETH"
  [[nodiscard]] std::string to_string() const;
};

struct ParseOptions {
  /// Largest payload accepted: the path MTU (256..4096).
  std::uint32_t max_payload = 4096;
  bool verify_icrc = true;
};

/// A parsed RoCEv2 packet. Pointers refer into the caller's frame, which must
/// outlive it.
struct Packet {
  const std::uint8_t* frame = nullptr;
  std::uint32_t frame_len = 0;  // bytes used, up to the end of the ICRC

  // L2
  MacAddr eth_dst{}, eth_src{};
  bool has_vlan = false;
  std::uint16_t vlan_tci = 0;

  // L3/L4
  IpVersion ipver = IpVersion::kV4;
  IpAddr src{}, dst{};
  std::uint8_t dscp = 0, ecn = 0, ttl = 0;
  std::uint32_t flow_label = 0;
  std::uint16_t sport = 0;
  std::uint16_t l3_off = 0, l4_off = 0, bth_off = 0;

  // BTH
  std::uint8_t opcode = 0;
  const OpcodeInfo* info = nullptr;
  bool se = false, migreq = false, ackreq = false, fecn = false, becn = false;
  std::uint8_t padcnt = 0;
  std::uint16_t pkey = 0;
  std::uint32_t destqp = 0;
  Psn psn{};

  // Payload and trailer
  std::uint16_t payload_off = 0;  // from the start of the frame
  std::uint32_t payload_len = 0;  // without pad
  std::uint16_t icrc_off = 0;
  std::uint32_t icrc = 0;  // as received

  [[nodiscard]] ConstBytes payload() const { return {frame + payload_off, payload_len}; }
  [[nodiscard]] const Bth* bth() const { return view<Bth>(frame + bth_off); }
  [[nodiscard]] const Reth* reth() const { return ext<Reth>(info->off_reth); }
  [[nodiscard]] const Aeth* aeth() const { return ext<Aeth>(info->off_aeth); }
  [[nodiscard]] const AtomicEth* atomic_eth() const { return ext<AtomicEth>(info->off_atomic_eth); }
  [[nodiscard]] const AtomicAckEth* atomic_ack() const { return ext<AtomicAckEth>(info->off_atomic_ack); }
  [[nodiscard]] const ImmDt* immdt() const { return ext<ImmDt>(info->off_immdt); }
  [[nodiscard]] const Ieth* ieth() const { return ext<Ieth>(info->off_ieth); }
  [[nodiscard]] const Srh* srh() const { return ext<Srh>(info->off_srh); }
  [[nodiscard]] const Sack* sack() const { return ext<Sack>(info->off_sack); }
  [[nodiscard]] const Deth* deth() const { return ext<Deth>(info->off_deth); }
  [[nodiscard]] const Xrceth* xrceth() const { return ext<Xrceth>(info->off_xrceth); }
  [[nodiscard]] const Feth* feth() const { return ext<Feth>(info->off_feth); }

 private:
  template <typename H>
  [[nodiscard]] const H* ext(std::uint8_t off) const {
    return off == 0 ? nullptr : view<H>(frame + bth_off + off);
  }
};

/// Parses an Ethernet frame holding a RoCEv2 packet. On success fills `out`.
[[nodiscard]] ParseStatus parse_frame(ConstBytes frame, const ParseOptions& opts, Packet& out) noexcept;

/// One's-complement sum over an IPv4 header, as used for its checksum
/// (RFC 791 / RFC 1071); returns the folded 16-bit complement.
[[nodiscard]] std::uint16_t ipv4_header_checksum(const std::uint8_t* hdr, std::size_t len) noexcept;

}  // namespace uroce::wire
