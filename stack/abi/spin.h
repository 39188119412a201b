// How long a waiter on either side of the rings polls before it blocks,
// learnt from the gaps it has seen. One policy for the daemon's loop (and
// the embedded node's waits, through the pipeline's idle policy) and for
// liburoce's CQ waits.
//
// On a host whose cores are shared, a poller that blocks as soon as a queue
// is empty pays a wake-up (tens of microseconds in a VM) on every message
// of a ping-pong, and one that spins without end holds the core that the
// process it waits for needs (a non-preemptive kernel leaves a spinning
// process on its core until its slice ends). So a waiter:
//   - polls while the gaps it has seen say work comes back soon: twice the
//     recent gap (an average over about four), at least a floor (the
//     configured spin), at most a cap; an average gap beyond half the cap
//     means traffic is sparse, and the waiter polls the floor only;
//   - gives its core away between empty polls (sched_yield, by the caller),
//     so a runnable process on the same core runs at once, and the poller
//     costs nothing to it;
//   - then blocks.
// A gap is measured from the moment the waiter found nothing to the moment
// it found work, sleeps included: a gap that a sleep made long (the wake-up
// cost) widens the window, and the next gaps, measured while polling, bring
// it back down to what the traffic needs.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace uroce::abi {

class AdaptiveSpin {
 public:
  /// 200 us: traffic with gaps up to 100 us (10,000 messages a second and
  /// more) is polled for; sparser traffic sleeps after the floor.
  static constexpr std::uint64_t kDefaultCapNs = 200'000;

  explicit AdaptiveSpin(std::uint64_t cap_ns = kDefaultCapNs) : cap_(cap_ns) {}
  void set_cap(std::uint64_t cap_ns) { cap_.store(cap_ns, std::memory_order_relaxed); }

  /// An idle stretch of `ns` that ended with work.
  void gap(std::uint64_t ns) {
    const std::uint64_t cap = cap_.load(std::memory_order_relaxed);
    const std::uint64_t g = std::min(ns, 2 * cap);  // one long pause moves the average, not a minute's worth
    const std::uint64_t a = avg_.load(std::memory_order_relaxed);
    avg_.store(a == kNone ? g : (3 * a + g) / 4, std::memory_order_relaxed);
  }

  /// How long to poll now, after the last work: at least `floor_ns`.
  [[nodiscard]] std::uint64_t window_ns(std::uint64_t floor_ns) const {
    const std::uint64_t a = avg_.load(std::memory_order_relaxed);
    const std::uint64_t cap = cap_.load(std::memory_order_relaxed);
    if (a == kNone || 2 * a > cap) return floor_ns;
    return std::max(floor_ns, 2 * a);
  }

 private:
  static constexpr std::uint64_t kNone = UINT64_MAX;
  // Relaxed atomics: several threads may wait on one CQ, and a lost update
  // only nudges a window.
  std::atomic<std::uint64_t> cap_;
  std::atomic<std::uint64_t> avg_{kNone};
};

}  // namespace uroce::abi
