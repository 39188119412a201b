// The session's work ring (uroce_abi.h, minor 20): an application names the
// queues it published entries in, and the daemon looks at those alone. Both
// sides use these helpers, so the claim, the flag and the fences that make a
// lost post impossible are written once.
#pragma once

#include <atomic>
#include <cstdint>

#include "stack/abi/uroce_abi.h"

namespace uroce::abi {

namespace work_detail {
inline std::atomic_ref<std::uint32_t> word(std::uint32_t& w) { return std::atomic_ref<std::uint32_t>(w); }
}  // namespace work_detail

/// Producer: after publishing entries in the queue whose ring header is
/// `queue`, names it (`what`: a QP number, or UROCE_WORK_TM_SRQ | handle) in
/// the session's work ring, unless it is named there already. Safe from
/// any number of threads and processes at once. Returns whether it wrote
/// a name (false: already named, or the ring was full and overflow is set).
inline bool queue_work(uroce_session_page* page, uroce_ring_header* queue, std::uint32_t what) {
  using work_detail::word;
  // Orders the entries just published before the look at the flag, against
  // the daemon's clear-then-look (uroce_abi.h): one of the two sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (word(queue->work_queued).load(std::memory_order_relaxed) != 0) return false;
  if (word(queue->work_queued).exchange(1, std::memory_order_acq_rel) != 0) return false;
  uroce_work_ring* w = uroce_session_work(page);
  std::uint32_t i = word(w->prod).load(std::memory_order_relaxed);
  for (;;) {
    if (i - word(w->cons).load(std::memory_order_acquire) >= UROCE_WORK_ENTRIES) {
      word(w->overflow).store(1, std::memory_order_release);
      return false;
    }
    if (word(w->prod).compare_exchange_weak(i, i + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
  }
  uroce_work_slot& s = w->slots[i % UROCE_WORK_ENTRIES];
  word(s.what).store(what, std::memory_order_relaxed);
  word(s.seq).store(i + 1, std::memory_order_release);  // ready, last
  return true;
}

/// The daemon's side of one session's work ring. It keeps its own consumer
/// index and never trusts the shared one, which the application can write.
class WorkRing {
 public:
  WorkRing() = default;
  explicit WorkRing(uroce_session_page* page) : w_(uroce_session_work(page)), cons_(0) {}

  /// Takes the next name the application has finished writing, if any.
  bool take(std::uint32_t& what) {
    using work_detail::word;
    uroce_work_slot& s = w_->slots[cons_ % UROCE_WORK_ENTRIES];
    if (word(s.seq).load(std::memory_order_acquire) != cons_ + 1) return false;
    what = word(s.what).load(std::memory_order_relaxed);
    ++cons_;
    word(w_->cons).store(cons_, std::memory_order_release);
    return true;
  }
  /// Whether a producer found the ring full since the last call (then every
  /// queue of the session is to be looked at once). Clears it first, so a
  /// later overflow is seen by the next call.
  bool take_overflow() {
    using work_detail::word;
    if (word(w_->overflow).load(std::memory_order_relaxed) == 0) return false;
    word(w_->overflow).store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return true;
  }
  [[nodiscard]] bool valid() const { return w_ != nullptr; }

 private:
  uroce_work_ring* w_ = nullptr;
  std::uint32_t cons_ = 0;
};

/// Daemon: the queue whose name it took is no longer named; clear the flag
/// and fence before looking at the queue, so a post after the look names
/// it again.
inline void take_queued(uroce_ring_header* queue) {
  work_detail::word(queue->work_queued).store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace uroce::abi
