// A hashed timing wheel of intrusive entries (Varghese and Lauck): each
// object holds at most one deadline, in its own WheelHook, so scheduling,
// moving and cancelling are O(1) and allocate nothing. The engine keeps one
// entry per QP that waits only on time (its retry, RNR, pacer or
// congestion-control timer), so poll() visits a QP when it has work or its
// time has come, never to find that it has neither.
//
// Slots are 2^kShift ns wide; a deadline more than a turn of the wheel
// away waits in its slot until the turn in which it falls due. Entries fire
// once now has reached them, never before.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace uroce::transport {

template <typename T>
struct WheelHook {
  T* next = nullptr;
  T* prev = nullptr;
  std::uint64_t at = 0;  // 0: not in the wheel
  std::uint32_t slot = 0;
};

template <typename T, WheelHook<T> T::*Hook>
class TimerWheel {
 public:
  static constexpr unsigned kShift = 10;        // 1.024 us a slot
  static constexpr std::uint32_t kSlots = 4096;  // 4.2 ms a turn

  /// Puts `x` in the wheel at `at` (ns, not 0), or moves it there.
  void schedule(T& x, std::uint64_t at) {
    WheelHook<T>& h = x.*Hook;
    if (h.at == at) return;
    if (h.at != 0) unlink(x);
    // A deadline already past goes in the slot that expire() visits next.
    const std::uint64_t tick = std::max(at >> kShift, tick_);
    h.at = at;
    h.slot = static_cast<std::uint32_t>(tick % kSlots);
    h.prev = nullptr;
    h.next = head_[h.slot];
    if (h.next) (h.next->*Hook).prev = &x;
    head_[h.slot] = &x;
    busy_[h.slot >> 6] |= std::uint64_t{1} << (h.slot & 63);
    ++n_;
  }
  void cancel(T& x) {
    if ((x.*Hook).at != 0) unlink(x);
  }
  [[nodiscard]] bool scheduled(const T& x) const { return (x.*Hook).at != 0; }
  [[nodiscard]] std::size_t size() const { return n_; }

  /// Takes out every entry due by `now` and calls fire(T&) for it.
  template <typename F>
  void expire(std::uint64_t now, F&& fire) {
    const std::uint64_t end = now >> kShift;
    if (n_ == 0) {
      tick_ = end;
      return;
    }
    // Every slot from the last visit to now's, each once at most.
    const std::uint64_t first = end - tick_ >= kSlots ? end - (kSlots - 1) : tick_;
    for (std::uint64_t t = first; t <= end && n_ != 0; ++t) {
      const auto s = static_cast<std::uint32_t>(t % kSlots);
      if (!((busy_[s >> 6] >> (s & 63)) & 1)) continue;
      for (T* x = head_[s]; x != nullptr;) {
        T* next = (x->*Hook).next;
        if ((x->*Hook).at <= now) {
          unlink(*x);
          fire(*x);
        }
        x = next;
      }
    }
    tick_ = end;  // its slot is visited again: what falls due later in it
  }

  /// No later than the earliest deadline in the wheel, and exact when few
  /// entries lie before it (at most kLookAhead are read); 0 if empty.
  [[nodiscard]] std::uint64_t next_at() const {
    if (n_ == 0) return 0;
    constexpr std::uint32_t kLookAhead = 64;
    std::uint64_t best = 0;
    std::uint32_t read = 0;
    for (std::uint32_t ahead = 0; ahead < kSlots;) {
      const auto s = static_cast<std::uint32_t>((tick_ + ahead) % kSlots);
      const std::uint64_t word = busy_[s >> 6] >> (s & 63);
      if (word == 0) {
        ahead += 64 - (s & 63);  // the rest of this word is idle
        continue;
      }
      const auto skip = static_cast<std::uint32_t>(std::countr_zero(word));
      if (skip != 0) {
        ahead += skip;
        continue;
      }
      const std::uint64_t start = (tick_ + ahead) << kShift;
      if (best != 0 && start >= best) break;  // nothing in this slot or after it is earlier
      for (const T* x = head_[s]; x != nullptr; x = (x->*Hook).next) {
        if (read++ == kLookAhead) return best != 0 ? std::min(best, std::max<std::uint64_t>(start, 1)) : std::max<std::uint64_t>(start, 1);
        if (best == 0 || (x->*Hook).at < best) best = (x->*Hook).at;
      }
      ++ahead;
    }
    return best;
  }

 private:
  void unlink(T& x) {
    WheelHook<T>& h = x.*Hook;
    if (h.prev) {
      (h.prev->*Hook).next = h.next;
    } else {
      head_[h.slot] = h.next;
      if (h.next == nullptr) busy_[h.slot >> 6] &= ~(std::uint64_t{1} << (h.slot & 63));
    }
    if (h.next) (h.next->*Hook).prev = h.prev;
    h = WheelHook<T>{};
    --n_;
  }

  std::array<T*, kSlots> head_{};
  std::array<std::uint64_t, kSlots / 64> busy_{};
  std::uint64_t tick_ = 0;  // the slot expire() visited last
  std::size_t n_ = 0;
};

}  // namespace uroce::transport
