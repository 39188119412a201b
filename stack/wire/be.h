// Byte-order-declared, unaligned wire field types.
//
// A `be<T>` holds a big-endian value in raw bytes. It has no implicit
// conversion to or from T, so a byte-order mistake is a compile error rather
// than a silent bug (DPDK's rte_be16_t is a plain uint16_t and cannot catch
// that). `be24` covers the 24-bit fields of InfiniBand headers (QPN, PSN, MSN).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace uroce::wire {

using Bytes = std::span<std::uint8_t>;
using ConstBytes = std::span<const std::uint8_t>;

/// Host order to big-endian and back (the same swap both ways).
template <typename T>
[[nodiscard]] constexpr T to_from_host(T v) noexcept {
  if constexpr (std::endian::native == std::endian::big || sizeof(T) == 1) {
    return v;
  } else if constexpr (sizeof(T) == 2) {
    return static_cast<T>(__builtin_bswap16(v));
  } else if constexpr (sizeof(T) == 4) {
    return static_cast<T>(__builtin_bswap32(v));
  } else {
    return static_cast<T>(__builtin_bswap64(v));
  }
}

template <typename T>
  requires std::is_unsigned_v<T>
struct be {
  std::uint8_t b[sizeof(T)];

  [[nodiscard]] constexpr T get() const noexcept {
    if (!std::is_constant_evaluated()) {
      // One load and one byte swap (the loop below is not always
      // recognised as one: 8 loads and shifts a 64-bit field).
      T v;
      std::memcpy(&v, b, sizeof(T));
      return to_from_host(v);
    }
    T v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>((v << 8) | b[i]);
    return v;
  }
  constexpr void set(T v) noexcept {
    if (!std::is_constant_evaluated()) {
      const T w = to_from_host(v);
      std::memcpy(b, &w, sizeof(T));
      return;
    }
    for (std::size_t i = sizeof(T); i-- > 0;) {
      b[i] = static_cast<std::uint8_t>(v & 0xff);
      if constexpr (sizeof(T) > 1) v = static_cast<T>(v >> 8);
    }
  }
  static constexpr be from(T v) noexcept {
    be r{};
    r.set(v);
    return r;
  }
};

/// A 24-bit big-endian field (QPN, PSN, MSN, source QP).
struct be24 {
  std::uint8_t b[3];
  [[nodiscard]] constexpr std::uint32_t get() const noexcept {
    return (std::uint32_t{b[0]} << 16) | (std::uint32_t{b[1]} << 8) | b[2];
  }
  constexpr void set(std::uint32_t v) noexcept {
    b[0] = static_cast<std::uint8_t>(v >> 16);
    b[1] = static_cast<std::uint8_t>(v >> 8);
    b[2] = static_cast<std::uint8_t>(v);
  }
};

using be16 = be<std::uint16_t>;
using be32 = be<std::uint32_t>;
using be64 = be<std::uint64_t>;

static_assert(sizeof(be16) == 2 && alignof(be16) == 1);
static_assert(sizeof(be32) == 4 && alignof(be32) == 1);
static_assert(sizeof(be64) == 8 && alignof(be64) == 1);
static_assert(sizeof(be24) == 3 && alignof(be24) == 1);

/// Reinterprets `n` bytes at `p` as header H. Callers check the length first
/// (the parser does this against the opcode table); H is a byte-aligned
/// standard-layout struct, so the view has no alignment requirement.
template <typename H>
[[nodiscard]] inline const H* view(const std::uint8_t* p) noexcept {
  static_assert(alignof(H) == 1 && std::is_standard_layout_v<H>);
  return reinterpret_cast<const H*>(p);
}
template <typename H>
[[nodiscard]] inline H* view(std::uint8_t* p) noexcept {
  static_assert(alignof(H) == 1 && std::is_standard_layout_v<H>);
  return reinterpret_cast<H*>(p);
}

}  // namespace uroce::wire
