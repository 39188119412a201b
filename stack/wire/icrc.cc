#include "stack/wire/icrc.h"

#include <isa-l/crc.h>

#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "stack/wire/headers.h"

namespace uroce::wire {

// ISA-L's reflected CRC-32 (the gzip/zlib CRC: same polynomial, same
// inversions, so it chains like zlib's crc32); it picks its fastest kernel
// (PCLMULQDQ folding where the CPU has it) at run time.
std::uint32_t crc32_raw(std::uint32_t crc, ConstBytes data) noexcept {
  return crc32_gzip_refl(crc, data.data(), data.size());
}

namespace {
#if defined(__x86_64__)
// The intrinsic, so that the compiler knows the upper halves are gone (an
// AVX function never inlined into code built without AVX).
__attribute__((target("avx"))) void zero_upper() noexcept { _mm256_zeroupper(); }
const bool kHasAvx = __builtin_cpu_supports("avx");  // false before this file's init: only the speed-up is missed
void clean_upper_vectors() noexcept {
  if (kHasAvx) zero_upper();
}
#else
void clean_upper_vectors() noexcept {}
#endif
}  // namespace

std::uint32_t crc32_chain(std::uint32_t crc, ConstBytes head, std::span<const ConstBytes> more,
                          std::size_t pad) noexcept {
  crc = crc32_gzip_refl(crc, head.data(), head.size());
  for (const ConstBytes& s : more) crc = crc32_gzip_refl(crc, s.data(), s.size());
  if (pad != 0) {
    static constexpr std::uint8_t kZeros[4] = {};
    crc = crc32_gzip_refl(crc, kZeros, pad);
  }
  clean_upper_vectors();
  return crc;
}

std::size_t icrc_masked(ConstBytes l3, std::uint8_t* buf) noexcept {
  if (l3.empty()) return 0;
  std::size_t ip_len = 0;
  const unsigned version = l3[0] >> 4;
  if (version == 4) {
    ip_len = static_cast<std::size_t>(l3[0] & 0x0f) * 4;
    if (ip_len < sizeof(Ipv4Hdr)) return 0;
  } else if (version == 6) {
    ip_len = sizeof(Ipv6Hdr);
  } else {
    return 0;
  }
  const std::size_t masked_len = ip_len + sizeof(UdpHdr) + sizeof(Bth);
  if (l3.size() < masked_len) return 0;
  // 8 bytes of 0xFF for the LRH, then IP, UDP and BTH with the variant fields set to 1s.
  std::memset(buf, 0xff, 8);
  // The usual lengths as constants, so the copy is a few moves, not a call
  // (measured: the 64-byte ICRC takes 34 ns so, 55-58 ns through memcpy's
  // variable-length path).
  if (masked_len == 20 + 8 + 12) {
    std::memcpy(buf + 8, l3.data(), 20 + 8 + 12);
  } else if (masked_len == 40 + 8 + 12) {
    std::memcpy(buf + 8, l3.data(), 40 + 8 + 12);
  } else {
    std::memcpy(buf + 8, l3.data(), masked_len);
  }
  std::uint8_t* ip = buf + 8;
  if (version == 4) {
    ip[1] = 0xff;                // TOS: DSCP and ECN
    ip[8] = 0xff;                // TTL
    ip[10] = ip[11] = 0xff;      // header checksum
  } else {
    ip[0] |= 0x0f;               // traffic class, high nibble
    ip[1] = ip[2] = ip[3] = 0xff;  // traffic class, low nibble, and flow label
    ip[7] = 0xff;                // hop limit
  }
  std::uint8_t* udp = ip + ip_len;
  udp[6] = udp[7] = 0xff;        // UDP checksum
  udp[sizeof(UdpHdr) + 4] = 0xff;  // BTH resv8a: FECN, BECN, reserved
  return 8 + masked_len;
}

std::optional<std::uint32_t> icrc_compute(std::span<const ConstBytes> segs) noexcept {
  if (segs.empty()) return std::nullopt;
  const ConstBytes first = segs[0];
  // A short rest of the first segment (a small packet's extension headers
  // and payload) joins the masked headers in one buffer: one CRC call.
  constexpr std::size_t kJoin = 192;
  std::uint8_t buf[kIcrcMaskedMax + kJoin];
  const std::size_t n = icrc_masked(first, buf);
  if (n == 0) return std::nullopt;
  const std::size_t masked_len = n - 8;
  const std::size_t rest = first.size() - masked_len;
  if (rest <= kJoin) {
    std::memcpy(buf + n, first.data() + masked_len, rest);
    return crc32_chain(0, ConstBytes(buf, n + rest), segs.subspan(1));
  }
  return crc32_chain(crc32_raw(0, ConstBytes(buf, n)), first.subspan(masked_len), segs.subspan(1));
}

std::optional<std::uint32_t> icrc_compute(ConstBytes l3_to_icrc) noexcept {
  const ConstBytes one[1] = {l3_to_icrc};
  return icrc_compute(std::span<const ConstBytes>(one, 1));
}

}  // namespace uroce::wire
