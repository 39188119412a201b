// A fixed-capacity FIFO, sized once at creation and never reallocated: the
// engine's private queues (TX frames, responses, the SQ's shadow). Queues an
// application shares are abi::Ring (stack/abi/ring.h).
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

namespace uroce::transport {

template <typename T>
class Fifo {
 public:
  Fifo() = default;
  explicit Fifo(std::uint32_t capacity)
      : slots_(std::bit_ceil(capacity < 1 ? 1u : capacity)), mask_(static_cast<std::uint32_t>(slots_.size() - 1)),
        limit_(capacity) {}

  [[nodiscard]] bool full() const { return tail_ - head_ >= limit_; }
  [[nodiscard]] bool empty() const { return tail_ == head_; }
  [[nodiscard]] std::uint32_t size() const { return tail_ - head_; }
  [[nodiscard]] std::uint32_t capacity() const { return limit_; }

  /// Slot at absolute (monotonic) index i; valid for head() <= i < tail().
  T& at(std::uint32_t i) { return slots_[i & mask_]; }
  const T& at(std::uint32_t i) const { return slots_[i & mask_]; }
  [[nodiscard]] std::uint32_t head() const { return head_; }
  [[nodiscard]] std::uint32_t tail() const { return tail_; }

  bool push(const T& v) {
    if (full()) return false;
    slots_[tail_++ & mask_] = v;
    return true;
  }
  /// Reserves the next slot in place; the caller fills it.
  T* emplace() {
    if (full()) return nullptr;
    return &slots_[tail_++ & mask_];
  }
  T& front() { return slots_[head_ & mask_]; }
  /// Slots in all (a power of two), and the position of one of them: for
  /// state kept beside each slot.
  [[nodiscard]] std::uint32_t slot_count() const { return static_cast<std::uint32_t>(slots_.size()); }
  [[nodiscard]] std::uint32_t slot_of(const T* p) const { return static_cast<std::uint32_t>(p - slots_.data()); }
  void pop() { ++head_; }
  void clear() { head_ = tail_ = 0; }
  /// Empties it, the next slot taking absolute index i (a shadow's indices
  /// follow its shared ring's).
  void reset_to(std::uint32_t i) { head_ = tail_ = i; }

 private:
  std::vector<T> slots_;
  std::uint32_t mask_ = 0;
  std::uint32_t limit_ = 0;
  std::uint32_t head_ = 0;
  std::uint32_t tail_ = 0;
};

}  // namespace uroce::transport
