// A connected QP's headers, built once (issue #14): every packet of an RC or
// UC QP has the same Ethernet, VLAN, IP and UDP headers and the same BTH
// P_Key and DestQP; only the opcode, SE, PadCnt, AckReq, PSN, the lengths
// (and so the IPv4 checksum) and the extension headers change.
//
// build() makes the template through build_headers (one builder), and
// learns from icrc_masked (one masking) which bits of it the ICRC masks.
// emit() then copies the template and patches what changes, the IPv4
// checksum incrementally (RFC 1624). icrc() masks those bits in the frame
// itself, a few word ORs, runs one CRC from the LRH's stand-in through the
// headers (and any payload copied after them), and puts the bytes back: no
// masked copy of the headers. Both give what build_headers and
// icrc_compute give for the same packet, byte for byte (test_template.cc).
#pragma once

#include <cstdint>
#include <span>

#include "stack/wire/builder.h"
#include "stack/wire/icrc.h"

namespace uroce::wire {

/// What changes from one packet of a QP to the next.
struct PacketFields {
  std::uint8_t opcode = 0;
  bool se = false;
  bool ackreq = false;
  Psn psn{};
};

class HeaderTemplate {
 public:
  /// The longest header emit() writes: Ethernet, VLAN, IPv6, UDP and the
  /// longest transport header in the opcode table.
  static constexpr std::size_t kMaxLen = 14 + 4 + 40 + 8 + 64;

  /// From the QP's spec (its BTH fields other than P_Key and DestQP, and
  /// its extension fields, are not used). False if it does not build.
  bool build(const FrameSpec& base) noexcept;
  void clear() noexcept { base_len_ = 0; }
  [[nodiscard]] bool valid() const noexcept { return base_len_ != 0; }
  /// Where the IP header starts.
  [[nodiscard]] std::size_t l3_offset() const noexcept { return l3_; }

  /// Writes one packet's headers into `out` (kMaxLen bytes at least).
  /// Returns their length, or 0 where build_headers would (an opcode not in
  /// the table, a payload on an opcode without one, a frame over 64 KiB).
  std::size_t emit(std::uint8_t* out, const PacketFields& p, const ExtFields& ext,
                   std::size_t payload_len) const noexcept;

  /// The ICRC of a packet whose headers emit() wrote at `frame` (`len`
  /// bytes: the headers, and any payload and pad copied after them),
  /// followed by `more` (payload elsewhere) and `pad` zero bytes. The
  /// masked bits are set in `frame` for the CRC and put back: `frame` is
  /// as it was when icrc() returns.
  [[nodiscard]] std::uint32_t icrc(std::uint8_t* frame, std::size_t len, std::span<const ConstBytes> more,
                                   std::uint8_t pad) const noexcept;

 private:
  std::uint8_t hdr_[14 + 4 + 40 + 8 + 12]{};  // L2 to the end of the BTH
  // The ICRC's mask over its view (the LRH's 8 bytes, then L3 to the end of
  // the BTH), as words ORed into the frame: a 1 is a bit the ICRC masks.
  static constexpr std::size_t kMaskWords = (kIcrcMaskedMax + 7) / 8;
  // That view's length: 8, then IPv4 (no options) or IPv6, UDP and the BTH.
  static constexpr std::size_t kMaskedV4 = 8 + 20 + 8 + 12, kMaskedV6 = 8 + 40 + 8 + 12;
  std::uint64_t mask_[kMaskWords]{};
  std::uint8_t base_len_ = 0;                  // bytes of hdr_ (0: no template)
  std::uint8_t l3_ = 0, udp_ = 0, bth_ = 0;    // offsets in hdr_
  std::uint8_t flags_ = 0;                     // the BTH flags byte but SE and PadCnt (MigReq, TVer)
  bool v4_ = true;
  bool csum_ = true;                           // the IPv4 checksum is ours to fill (not offloaded)
  std::uint32_t csum_base_ = 0;                // ~checksum + ~total length of the template (RFC 1624)
  std::uint16_t len_base_ = 0;                 // the template's IP total (v4) or payload (v6) length
};

}  // namespace uroce::wire
