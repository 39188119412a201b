// Packet Sequence Numbers: 24-bit, wrap-safe (IBTA 9.7.1).
//
// A PSN has no operator<: ordering only makes sense within half the space,
// so comparisons go through distance() and is_before(), which are correct
// across the 2^24 wrap.
#pragma once

#include <cstdint>

namespace uroce::wire {

class Psn {
 public:
  static constexpr std::uint32_t kMask = 0x00ff'ffff;
  static constexpr std::uint32_t kHalf = 0x0080'0000;

  constexpr Psn() = default;
  constexpr explicit Psn(std::uint32_t v) : v_(v & kMask) {}

  [[nodiscard]] constexpr std::uint32_t value() const { return v_; }

  constexpr Psn operator+(std::uint32_t n) const { return Psn(v_ + n); }
  constexpr Psn operator-(std::uint32_t n) const { return Psn(v_ - n); }
  constexpr Psn& operator+=(std::uint32_t n) {
    v_ = (v_ + n) & kMask;
    return *this;
  }
  constexpr Psn& operator++() { return *this += 1; }
  constexpr Psn operator++(int) {
    Psn old = *this;
    ++*this;
    return old;
  }
  friend constexpr bool operator==(Psn, Psn) = default;

  /// Signed distance from `from` to `to`, in [-2^23, 2^23).
  friend constexpr std::int32_t distance(Psn from, Psn to) {
    const std::uint32_t d = (to.v_ - from.v_) & kMask;
    return d >= kHalf ? static_cast<std::int32_t>(d) - static_cast<std::int32_t>(kMask + 1)
                      : static_cast<std::int32_t>(d);
  }
  /// True when `a` comes strictly before `b` within the half-space window.
  friend constexpr bool is_before(Psn a, Psn b) { return distance(a, b) > 0; }
  /// True when `p` lies in the half-open window [first, first + count).
  friend constexpr bool in_window(Psn p, Psn first, std::uint32_t count) {
    return ((p.v_ - first.v_) & kMask) < count;
  }

 private:
  std::uint32_t v_ = 0;
};

static_assert(distance(Psn(0xffffff), Psn(0)) == 1);
static_assert(distance(Psn(0), Psn(0xffffff)) == -1);
static_assert(is_before(Psn(0xfffffe), Psn(2)));
static_assert(!is_before(Psn(2), Psn(0xfffffe)));
static_assert(Psn(0xffffff) + 1 == Psn(0));
static_assert(in_window(Psn(1), Psn(0xfffffe), 4) && !in_window(Psn(2), Psn(0xfffffe), 4));

}  // namespace uroce::wire
