// How the perf tools wait: for completions, and (write_lat) for a byte of
// memory that the peer's WRITE sets.
//
// By default they poll for a few microseconds and then block on the CQ's
// completion channel (uroce_poll_cq_wait); for a byte, they yield the core
// between looks.
// On a host where the daemon and the application share cores, the daemon
// that produces the completion needs the core the application would spin on
// (a spinning process keeps its core on a non-preemptive kernel). With
// --busy-poll they poll without end, as perftest does; --yield then gives
// the core away between empty polls.
#pragma once

#include <sched.h>
#include <sys/prctl.h>

#include <chrono>
#include <cstdint>

#include "stack/verbs/uroce_verbs.h"

namespace uroce::tools {

struct WaitMode {
  bool busy = false;   // poll, never block
  bool yield = false;  // busy: sched_yield() after an empty poll
  int spin_us = 5;     // blocking: poll this long first

  /// Once, at start: with blocking waits, short sleeps really are short.
  void setup() const {
    if (!busy) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  }
};

/// Up to n completions. Busy: one poll. Blocking: waits up to max_ms for
/// the first (the CQ needs a completion channel). 0 when none came, -1 on
/// error (errno).
inline int poll_wait(uroce_cq* cq, int n, ibv_wc* wc, const WaitMode& m, int max_ms) {
  if (!m.busy) return uroce_poll_cq_wait(cq, n, wc, m.spin_us, max_ms);
  const int got = uroce_poll_cq(cq, n, wc);
  if (got == 0 && m.yield) sched_yield();
  return got;
}

/// Waits until *p == v; false at the deadline.
inline bool wait_byte(volatile std::uint8_t* p, std::uint8_t v, const WaitMode& m,
                      std::chrono::steady_clock::time_point deadline) {
  using clk = std::chrono::steady_clock;
  const auto spin_until = clk::now() + std::chrono::microseconds(m.spin_us);
  while (*p != v) {
    const auto now = clk::now();
    if (now > deadline) return false;
    // Nothing to block on (a WRITE leaves no completion at its target):
    // after the spin, give the core to whatever else is runnable on it,
    // such as the daemon that is about to deliver the WRITE. In embedded
    // mode this process delivers it: every turn runs the node.
    (void)uroce_progress(nullptr);
    if (m.busy ? m.yield : now > spin_until) (void)uroce_wait_fd(-1, 1);
  }
  return true;
}

}  // namespace uroce::tools
