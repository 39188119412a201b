// RoCEv2 frame builder: complete frames for every opcode in the table, with
// IP and UDP lengths, the IPv4 header checksum, pad and ICRC filled in.
//
// build_headers() writes everything up to the payload so a caller can place
// the payload elsewhere (an external mbuf buffer) and finish the ICRC over
// scatter-gather segments; build_frame() does the whole frame in one buffer.
#pragma once

#include <array>
#include <cstdint>

#include "stack/wire/addr.h"
#include "stack/wire/be.h"
#include "stack/wire/headers.h"
#include "stack/wire/opcode.h"
#include "stack/wire/psn.h"

namespace uroce::wire {

/// Values for the extension headers. Only those the opcode carries
/// (per kOpcodeTable) are written.
struct ExtFields {
  std::uint64_t reth_va = 0;
  std::uint32_t reth_rkey = 0;
  std::uint32_t reth_len = 0;
  std::uint8_t aeth_syndrome = 0;
  std::uint32_t aeth_msn = 0;
  std::uint64_t atomic_va = 0;
  std::uint32_t atomic_rkey = 0;
  std::uint64_t atomic_swap_add = 0;
  std::uint64_t atomic_compare = 0;
  std::uint64_t atomic_ack_orig = 0;
  std::uint32_t imm = 0;  // ImmDt, as the 32-bit value sent big-endian
  std::uint32_t ieth_rkey = 0;
  std::uint32_t deth_qkey = 0;
  std::uint32_t deth_src_qp = 0;
  std::uint32_t xrc_srqn = 0;  // XRCETH
  std::uint32_t feth = 0;
  // uroce's selective repeat (Srh, Sack)
  std::uint32_t srh_msn = 0, srh_offset = 0, srh_total = 0;
  std::uint8_t srh_flags = 0;
  std::uint32_t sack_base = 0;
  std::array<std::uint64_t, 4> sack_bits{};
};

struct FrameSpec {
  // L2
  MacAddr eth_dst{};
  MacAddr eth_src{};
  bool vlan = false;
  std::uint16_t vlan_tci = 0;
  // L3
  IpVersion ipver = IpVersion::kV4;
  IpAddr src{};
  IpAddr dst{};
  std::uint8_t dscp = 0;
  std::uint8_t ecn = 0;
  std::uint8_t ttl = 64;
  std::uint16_t ip_id = 0;
  bool dont_fragment = true;
  bool ipv4_checksum = true;  // false: leave 0 for a NIC checksum offload to fill
  std::uint32_t flow_label = 0;  // IPv6
  // L4
  std::uint16_t udp_sport = kRoceSportMin;
  // BTH
  std::uint8_t opcode = 0;
  bool se = false;
  bool migreq = false;
  bool fecn = false;
  bool becn = false;
  bool ackreq = false;
  std::uint16_t pkey = 0xffff;
  std::uint32_t destqp = 0;
  Psn psn{};
  ExtFields ext{};
};

/// Bytes from the Ethernet header to the end of the transport headers.
[[nodiscard]] std::size_t header_len(const FrameSpec& spec) noexcept;
/// Whole frame length for a payload of `payload_len` bytes.
[[nodiscard]] std::size_t frame_len(const FrameSpec& spec, std::size_t payload_len) noexcept;
/// Pad bytes needed to bring a payload to a 4-byte multiple.
[[nodiscard]] constexpr std::uint8_t pad_for(std::size_t payload_len) noexcept {
  return static_cast<std::uint8_t>((4 - (payload_len & 3)) & 3);
}

/// Writes the headers of a frame whose payload will be `payload_len` bytes.
/// Returns the header length, or 0 if `out` is too small, the opcode is not
/// in the table, or the opcode carries no payload but `payload_len` != 0.
[[nodiscard]] std::size_t build_headers(Bytes out, const FrameSpec& spec, std::size_t payload_len) noexcept;

/// Writes the extension headers `info` names after the BTH at `bth`, into
/// bytes the caller zeroed (build_headers and HeaderTemplate::emit).
void build_ext(std::uint8_t* bth, const OpcodeInfo& info, const ExtFields& e) noexcept;
/// Writes a complete frame (headers, payload, pad, ICRC). Returns its length,
/// or 0 on the same errors as build_headers().
[[nodiscard]] std::size_t build_frame(Bytes out, const FrameSpec& spec, ConstBytes payload) noexcept;

/// Marks a frame's IP header "congestion experienced" (ECN 11), as a
/// switch does, the IPv4 header checksum included: `l3` is the IPv4 or
/// IPv6 header. The ICRC masks these bits, so it stays valid.
void mark_ce(std::uint8_t* l3, IpVersion v) noexcept;

/// The UDP source port for a QP pair, from the flow label as the kernel's
/// rdma_get_udp_sport() derives it: a 20-bit label hashed from the two QPNs
/// (or the given label), folded to 14 bits and put in 0xC000..0xFFFF.
[[nodiscard]] constexpr std::uint16_t udp_sport_for(std::uint32_t lqpn, std::uint32_t rqpn,
                                                    std::uint32_t flow_label = 0) noexcept {
  std::uint32_t fl = flow_label;
  if (fl == 0) {
    std::uint64_t v = std::uint64_t{lqpn} * rqpn;
    v ^= v >> 20;
    v ^= v >> 40;
    fl = static_cast<std::uint32_t>(v & 0xfffff);
  }
  std::uint32_t low = fl & 0x03fff;
  const std::uint32_t high = fl & 0xfc000;
  low ^= high >> 14;
  return static_cast<std::uint16_t>(low | kRoceSportMin);
}

}  // namespace uroce::wire
