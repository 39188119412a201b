// When to feed systemd's watchdog: only while every pipeline still turns.
// The daemon's main loop asks `due` as it goes; it says yes at half the
// watchdog's timeout since the last feed, and only if each pipeline's pass
// count moved since then. A wedged pipeline (one that stopped making passes,
// on any lcore) stops the feeding, and systemd restarts the daemon when the
// timeout runs out. Pure arithmetic on counts and a clock: no systemd here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace uroce::control {

class Watchdog {
 public:
  /// `timeout_ns`: systemd's WatchdogSec (0: no watchdog, never due).
  explicit Watchdog(std::uint64_t timeout_ns = 0) : timeout_(timeout_ns) {}

  [[nodiscard]] bool enabled() const { return timeout_ != 0; }
  [[nodiscard]] std::uint64_t timeout_ns() const { return timeout_; }

  /// At `now`, with `passes[k]` the passes pipeline k has made so far:
  /// whether to feed the watchdog now. The first call only starts the clock.
  bool due(std::uint64_t now, std::span<const std::uint64_t> passes) {
    if (timeout_ == 0) return false;
    if (last_.size() != passes.size()) {
      last_.assign(passes.begin(), passes.end());
      checked_ = now;
      return false;
    }
    if (now - checked_ < timeout_ / 2) return false;
    checked_ = now;
    bool all = true;
    for (std::size_t k = 0; k < passes.size(); ++k) {
      if (passes[k] == last_[k]) {
        all = false;
        stalled_ = k;
      }
      last_[k] = passes[k];
    }
    if (!all) {
      ++stalls_;
      return false;
    }
    ++feeds_;
    return true;
  }

  [[nodiscard]] std::uint64_t feeds() const { return feeds_; }
  /// Checks at which some pipeline had made no pass (the watchdog went unfed).
  [[nodiscard]] std::uint64_t stalls() const { return stalls_; }
  /// The last pipeline found stalled.
  [[nodiscard]] std::size_t stalled_pipeline() const { return stalled_; }

 private:
  std::uint64_t timeout_;
  std::uint64_t checked_ = 0;
  std::vector<std::uint64_t> last_;
  std::uint64_t feeds_ = 0, stalls_ = 0;
  std::size_t stalled_ = 0;
};

}  // namespace uroce::control
