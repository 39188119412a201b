// Invariant CRC for RoCEv2 (IBTA Annex A17.3.3).
//
// The ICRC is a CRC-32 (the Ethernet polynomial, as computed by zlib's
// crc32()) over: 8 bytes of 0xFF standing in for the LRH, the IP header with
// its variant fields masked to 1s (IPv4: TOS, TTL, header checksum; IPv6:
// traffic class, flow label, hop limit), the UDP header with its checksum
// masked, the BTH with its resv8a byte (FECN/BECN/reserved) masked, then the
// rest of the packet up to the ICRC itself. It is sent least significant
// byte first.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "stack/wire/be.h"

namespace uroce::wire {

/// ICRC over a packet given as scatter-gather segments that start at the IP
/// header and stop just before the 4-byte ICRC trailer. The IP, UDP and BTH
/// headers must lie in the first segment; later segments may be any size.
/// Returns nullopt when the first segment is too short or not IPv4/IPv6.
[[nodiscard]] std::optional<std::uint32_t> icrc_compute(std::span<const ConstBytes> segs) noexcept;

/// The ICRC's view of the headers: writes into `buf` (kIcrcMaskedMax bytes)
/// the 8 bytes of 0xFF, then the IP, UDP and BTH headers at the start of
/// `l3` with their variant fields masked. Returns the bytes written, or 0
/// when `l3` is too short or not IPv4/IPv6. The CRC of these, then of the
/// rest of the packet, is the ICRC.
inline constexpr std::size_t kIcrcMaskedMax = 8 + 60 + 8 + 12;
std::size_t icrc_masked(ConstBytes l3, std::uint8_t* buf) noexcept;

/// The same over one contiguous buffer.
[[nodiscard]] std::optional<std::uint32_t> icrc_compute(ConstBytes l3_to_icrc) noexcept;

/// The ICRC goes on the wire least significant byte first.
inline void icrc_store(std::uint8_t* p, std::uint32_t icrc) noexcept {
  p[0] = static_cast<std::uint8_t>(icrc);
  p[1] = static_cast<std::uint8_t>(icrc >> 8);
  p[2] = static_cast<std::uint8_t>(icrc >> 16);
  p[3] = static_cast<std::uint8_t>(icrc >> 24);
}
[[nodiscard]] inline std::uint32_t icrc_load(const std::uint8_t* p) noexcept {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) |
         (std::uint32_t{p[3]} << 24);
}

/// The raw library CRC-32 that the ICRC is built on (ISA-L's
/// crc32_gzip_refl), exposed so the benchmark can compare it with zlib's,
/// and the ICRC with both, on the same buffers.
[[nodiscard]] std::uint32_t crc32_raw(std::uint32_t crc, ConstBytes data) noexcept;

/// The CRC-32 (ISA-L) continued from `crc` over `head`, then each of
/// `more`, then `pad` zero bytes: the one way both ICRCs run ISA-L. It
/// returns with the upper halves of the vector registers clean
/// (VZEROUPPER where the CPU has AVX): ISA-L's AVX-512 kernels leave them
/// dirty, and the SSE code the compiler emits for our own copies then pays
/// a transition on every instruction (measured here: a 64-byte ICRC at
/// 175 ns instead of 57).
[[nodiscard]] std::uint32_t crc32_chain(std::uint32_t crc, ConstBytes head, std::span<const ConstBytes> more = {},
                                        std::size_t pad = 0) noexcept;

}  // namespace uroce::wire
