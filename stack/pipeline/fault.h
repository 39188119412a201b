// Built-in fault injection for a port's RX or TX path, for tests and for
// protocol research: drop, duplicate, reorder, delay, corrupt and ECN-mark
// RoCE frames, by probability or by rules naming (QP, PSN) targets. Other
// frames (ARP, ICMP) are never touched. The delay line is a fixed pool, so
// nothing allocates once configured. When no fault is configured the
// dataplane skips the injector entirely (one predictable branch per burst).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "stack/wire/be.h"

namespace uroce::pipeline {

struct FaultRule {
  enum class Action : std::uint8_t { kDrop, kDup, kCorrupt, kEcn, kDelay };
  std::uint32_t qpn = 0;  // destination QP in the BTH
  bool any_qpn = false;   // "*": any destination QP (a test that knows the PSN before the QP)
  std::uint32_t psn = 0;
  Action action = Action::kDrop;
  std::uint32_t times = 1;  // how many matching frames it applies to
};

struct FaultConfig {
  double drop = 0, dup = 0, reorder = 0, corrupt = 0, ecn = 0;  // probabilities 0..1
  std::uint32_t delay_us = 0;     // added to every frame
  std::uint32_t reorder_us = 50;  // extra hold for reordered frames (0..reorder_us)
  std::vector<FaultRule> rules;
  [[nodiscard]] bool active() const {
    return drop > 0 || dup > 0 || reorder > 0 || corrupt > 0 || ecn > 0 || delay_us > 0 || !rules.empty();
  }
  /// Parses "drop=0.01,dup=0.02,reorder=0.05,corrupt=0.001,ecn=0.1,delay_us=20,
  /// rule=drop:QPN:PSN[:N]" (rules may repeat; QPN * matches any QP).
  /// Returns false with `err` set.
  static bool parse(const std::string& text, FaultConfig& out, std::string& err);
  [[nodiscard]] std::string to_string() const;
};

struct FaultStats {
  std::uint64_t seen = 0, dropped = 0, duplicated = 0, reordered = 0, delayed = 0, corrupted = 0, ecn_marked = 0,
                rule_hits = 0, delay_full = 0;
};

class FaultInjector {
 public:
  explicit FaultInjector(std::uint64_t seed, std::uint32_t slots = 1024);
  void configure(const FaultConfig& c);
  [[nodiscard]] bool active() const { return active_; }
  [[nodiscard]] const FaultStats& stats() const { return st_; }
  [[nodiscard]] const FaultConfig& config() const { return cfg_; }

  /// Passes one frame through: `deliver(bytes)` is called 0, 1 or 2 times
  /// now, or the frame is held and handed over later by release().
  template <typename F>
  void apply(wire::ConstBytes frame, std::uint64_t now, F&& deliver);
  /// Hands over held frames whose time has come.
  template <typename F>
  void release(std::uint64_t now, F&& deliver);

 private:
  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  /// Returns a modifiable copy of the frame in scratch_, decides the fate.
  enum class Fate : std::uint8_t { kPass, kDrop, kDup, kHold };
  Fate decide(wire::ConstBytes frame, std::uint64_t now, std::uint8_t*& data, std::uint64_t& until);
  bool hold(const std::uint8_t* data, std::size_t len, std::uint64_t until);

  FaultConfig cfg_;
  bool active_ = false;
  std::mt19937_64 rng_;
  FaultStats st_;
  static constexpr std::size_t kSlot = 9216;
  std::vector<std::uint8_t> scratch_;
  std::vector<std::uint8_t> pool_;
  struct Held {
    std::uint64_t until;
    std::uint32_t slot;
    std::uint32_t len;
  };
  std::vector<Held> held_;  // unordered; scanned on release (small)
  std::vector<std::uint32_t> free_;
};

template <typename F>
void FaultInjector::apply(wire::ConstBytes frame, std::uint64_t now, F&& deliver) {
  std::uint8_t* data = nullptr;
  std::uint64_t until = 0;
  switch (decide(frame, now, data, until)) {
    case Fate::kPass: deliver(wire::ConstBytes(data, frame.size())); break;
    case Fate::kDrop: break;
    case Fate::kDup:
      deliver(wire::ConstBytes(data, frame.size()));
      deliver(wire::ConstBytes(data, frame.size()));
      break;
    case Fate::kHold:
      if (!hold(data, frame.size(), until)) deliver(wire::ConstBytes(data, frame.size()));
      break;
  }
}

template <typename F>
void FaultInjector::release(std::uint64_t now, F&& deliver) {
  for (std::size_t i = 0; i < held_.size();) {
    if (held_[i].until <= now) {
      const Held h = held_[i];
      held_[i] = held_.back();
      held_.pop_back();
      deliver(wire::ConstBytes(&pool_[std::size_t{h.slot} * kSlot], h.len));
      free_.push_back(h.slot);
    } else {
      ++i;
    }
  }
}

}  // namespace uroce::pipeline
