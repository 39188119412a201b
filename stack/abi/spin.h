// How long a waiter on either side of the rings polls before it blocks,
// learnt from the gaps it has seen. One policy for the daemon's loop (and
// the embedded node's waits, through the pipeline's idle policy) and for
// liburoce's CQ waits; the naps below are the loop's (an application's
// core is its own business, the daemon's is every tenant's).
//
// On a host whose cores are shared, a poller that blocks as soon as a queue
// is empty pays a wake-up (tens of microseconds in a VM) on every message
// of a ping-pong, and one that spins without end holds the core that the
// process it waits for needs (a non-preemptive kernel leaves a spinning
// process on its core until its slice ends). So a waiter:
//   - polls while the gaps it has seen say work comes back soon: twice the
//     recent gap (an average over about four), at least a floor (the
//     configured spin), at most a cap. An average gap beyond the cap, with
//     the last gap beyond kNearCaps caps too, means traffic is sparse, and
//     the waiter polls the floor only. A last gap within kNearCaps caps is
//     polled for (twice it, at most kNearCaps caps): a gap measured across
//     sleeps holds the wake-ups' cost, here and at every peer that slept
//     too (four of them in a ping-pong between two daemons and their
//     applications), and on a slow host that alone keeps it past the cap;
//     polling the next one measures it without this side's wake-up, and
//     with every side doing so the gaps come down and the window follows
//     them (sleeping through a ping-pong does not keep it sleeping; a
//     window of the cap alone did, on two shared cores, with gaps of
//     250 to 350 us);
//   - gives its core away between empty polls (yield_core), so a runnable
//     process on the same core runs at once, and the poller costs little
//     to it;
//   - blocks when the window ends.
// A yield that comes back late (half a millisecond or more) found the core
// taken by a process that keeps it (a CPU-bound one, a flood of
// connections, even one at SCHED_IDLE: a poller that yields on every empty
// poll pushes its own deadline back, and the scheduler then runs the other
// until its slice or the tick ends, up to 4 ms at HZ=250). For a while
// after one, the waiter naps (kNapNs, a timed sleep) between empty polls
// instead of yielding: the other process runs in the nap, and the timer's
// wake-up takes the core back at once (the scheduler favours a task that
// slept). A nap costs a wake-up (about 20 us here), so napping through a
// ping-pong slows it tenfold (a second of naps keeps it slow): the while is
// short at first (kFirstNapForNs) and grows fourfold with each late yield
// that comes within a while of the last one's end, up to kNapForNs; it
// keeps its length across pauses of up to kNapMemoryNs (a competitor that
// comes and goes), and starts short again after a longer quiet. A process
// that only started up on the core (an application's first milliseconds)
// costs a short while or two; one that keeps the core costs one late yield
// a second once the while has grown.
// Shorter yields are the point (the process waited for ran).
// A gap is measured from the moment the waiter found nothing to the moment
// it found work, sleeps included: a gap that a sleep made long (the wake-up
// cost) widens the window, and the next gaps, measured while polling, bring
// it back down to what the traffic needs.
#pragma once

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace uroce::abi {

/// A yield that took longer than this gave the core to a process that
/// keeps it (one at SCHED_IDLE takes about 0.7 ms, a scheduler's slice;
/// an application that a yield lets run answers in tens of microseconds):
/// the waiter naps between polls for a while: four times the last while
/// when this late yield came within a while of the last one's end (at most
/// kNapForNs), the last while when within kNapMemoryNs, else
/// kFirstNapForNs.
inline constexpr std::uint64_t kContendedNs = 500'000;
inline constexpr std::uint64_t kFirstNapForNs = 64'000'000;
inline constexpr std::uint64_t kNapForNs = 1'024'000'000;
/// A late yield this long after the last while ended naps as long as it.
inline constexpr std::uint64_t kNapMemoryNs = 4'000'000'000;
/// A nap: a timed sleep as short as the thread's timer slack allows (the
/// daemon sets its slack to 1 us; a process's default is 50 us).
inline constexpr long kNapNs = 1'000;

inline std::uint64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return std::uint64_t(t.tv_sec) * 1'000'000'000ull + std::uint64_t(t.tv_nsec);
}

class AdaptiveSpin {
 public:
  /// 200 us: traffic with gaps up to 200 us (5,000 messages a second and
  /// more) is polled for; sparser traffic sleeps after the floor.
  static constexpr std::uint64_t kDefaultCapNs = 200'000;
  /// A last gap within this many caps is polled for (twice it, at most
  /// this many caps), whatever the average (traffic of 1,250 messages a
  /// second and more; sparser sleeps).
  static constexpr std::uint64_t kNearCaps = 4;

  AdaptiveSpin() = default;
  explicit AdaptiveSpin(std::uint64_t cap_ns) : cap_(cap_ns) {}
  void set_cap(std::uint64_t cap_ns) { cap_.store(cap_ns, std::memory_order_relaxed); }

  /// An idle stretch of `ns` that ended with work.
  void gap(std::uint64_t ns) {
    const std::uint64_t cap = cap_.load(std::memory_order_relaxed);
    const std::uint64_t g = std::min(ns, 2 * cap);  // one long pause moves the average, not a minute's worth
    const std::uint64_t a = avg_.load(std::memory_order_relaxed);
    avg_.store(a == kNone ? g : (3 * a + g) / 4, std::memory_order_relaxed);
    last_.store(ns, std::memory_order_relaxed);
  }

  /// Between empty polls: gives the core, once, to whatever else is
  /// runnable on it: a yield, or a nap for a while after a late yield.
  void yield_core() {
    const std::uint64_t a = monotonic_ns();
    if (naps(a)) {
      const timespec nap{0, kNapNs};
      (void)::nanosleep(&nap, nullptr);
      return;
    }
    (void)::sched_yield();
    yielded(a, monotonic_ns());
  }
  /// True within the while after a late yield.
  [[nodiscard]] bool naps(std::uint64_t now_ns) const {
    return now_ns < nap_until_.load(std::memory_order_relaxed);
  }
  /// Records a yield from `from_ns` to `to_ns`; false when it came back late.
  bool yielded(std::uint64_t from_ns, std::uint64_t to_ns) {
    if (to_ns - from_ns < kContendedNs) return true;
    const std::uint64_t w = nap_for_.load(std::memory_order_relaxed);
    const std::uint64_t end = nap_until_.load(std::memory_order_relaxed);
    std::uint64_t next = kFirstNapForNs;
    if (w != 0 && to_ns < end + w) next = std::min(4 * w, kNapForNs);  // the same competitor, still there
    else if (w != 0 && to_ns < end + kNapMemoryNs) next = w;          // back after a pause
    nap_for_.store(next, std::memory_order_relaxed);
    nap_until_.store(to_ns + next, std::memory_order_relaxed);
    late_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  /// The last while napped after a late yield, ns (0: none yet).
  [[nodiscard]] std::uint64_t nap_for_ns() const { return nap_for_.load(std::memory_order_relaxed); }

  /// The learnt average gap, ns (0: none yet).
  [[nodiscard]] std::uint64_t average_gap_ns() const {
    const std::uint64_t a = avg_.load(std::memory_order_relaxed);
    return a == kNone ? 0 : a;
  }
  /// Yields that came back late: how often the core was found contended.
  [[nodiscard]] std::uint64_t late_yields() const { return late_.load(std::memory_order_relaxed); }

  /// How long to poll now, after the last work: at least `floor_ns`. A
  /// floor of 0 turns polling off (a daemon told --idle-spin-us 0).
  /// While the waiter naps (`now_ns` within the while after a late yield) it
  /// polls for the cap: a nap costs the core nothing, and it is coarse (a
  /// window of a few naps would sleep through a ping-pong).
  [[nodiscard]] std::uint64_t window_ns(std::uint64_t floor_ns, std::uint64_t now_ns = 0) const {
    if (floor_ns == 0) return 0;
    const std::uint64_t cap = cap_.load(std::memory_order_relaxed);
    if (now_ns != 0 && naps(now_ns)) return std::max(floor_ns, cap);
    const std::uint64_t a = avg_.load(std::memory_order_relaxed);
    if (a == kNone) return floor_ns;
    if (a > cap) {
      const std::uint64_t l = last_.load(std::memory_order_relaxed);
      return l <= kNearCaps * cap ? std::max(floor_ns, std::min(kNearCaps * cap, std::max(cap, 2 * l))) : floor_ns;
    }
    return std::max(floor_ns, std::min(cap, 2 * a));
  }

 private:
  static constexpr std::uint64_t kNone = UINT64_MAX;
  // Relaxed atomics: several threads may wait on one CQ, and a lost update
  // only nudges a window.
  std::atomic<std::uint64_t> cap_{kDefaultCapNs};
  std::atomic<std::uint64_t> avg_{kNone};
  std::atomic<std::uint64_t> last_{kNone};  // the last gap, unclipped
  std::atomic<std::uint64_t> nap_until_{0};  // monotonic ns
  std::atomic<std::uint64_t> nap_for_{0};    // the last while, ns; 0 = none yet
  std::atomic<std::uint64_t> late_{0};
};

}  // namespace uroce::abi
