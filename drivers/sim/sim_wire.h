// A virtual Ethernet segment for transport tests: engines attach by MAC,
// frames travel with a delay, and a seeded impairment model drops,
// duplicates, reorders and corrupts them. Time is virtual (ns).
//
// After construction nothing allocates: frames live in a fixed pool and
// in-flight events in a heap over reserved storage.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "stack/transport/engine.h"

namespace uroce::sim {

struct Impairments {
  double loss = 0;       // probability a frame is dropped
  double dup = 0;        // probability a frame is delivered twice
  double reorder = 0;    // probability a frame is held back by up to reorder_ns
  double corrupt = 0;    // probability one random bit is flipped
  double ce = 0;         // probability a RoCE frame is marked ECN CE (as a congested switch does)
  std::uint64_t delay_ns = 1000;
  std::uint64_t reorder_ns = 20000;
  /// Only frames for which this returns true are impaired (all if empty).
  std::function<bool(const transport::TxFrame&)> filter;
};

struct WireStats {
  std::uint64_t sent = 0, delivered = 0, dropped = 0, duplicated = 0, reordered = 0, corrupted = 0, ce_marked = 0,
                pool_exhausted = 0, no_such_host = 0;
};

class SimWire {
 public:
  explicit SimWire(std::uint64_t seed, std::uint32_t pool_frames = 8192);

  void attach(transport::Engine* e);
  void set_impairments(const Impairments& imp) { imp_ = imp; }
  /// Called for every frame as it leaves an engine (before impairment).
  std::function<void(wire::ConstBytes frame, std::uint64_t now)> tap;
  /// Called for every frame just before an engine receives it (after impairment).
  std::function<void(const transport::Engine* to, wire::ConstBytes frame, std::uint64_t now)> deliver_tap;

  /// Timers the wire does not know of (a CM agent's): the earliest, or 0.
  std::function<std::uint64_t()> next_timer;
  /// Advances virtual time until `done()` holds or `max_ns` pass.
  bool run_until(const std::function<bool()>& done, std::uint64_t max_ns);
  /// Runs until nothing is in flight and no engine has work or timers.
  void run_idle(std::uint64_t max_ns);

  [[nodiscard]] std::uint64_t now() const { return now_; }
  [[nodiscard]] const WireStats& stats() const { return stats_; }
  /// Injects a raw frame to be delivered after the link delay.
  void inject(wire::ConstBytes frame);

 private:
  struct Event {
    std::uint64_t t;
    std::uint64_t seq;
    std::uint32_t slot;
    std::uint32_t len;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const { return a.t != b.t ? a.t > b.t : a.seq > b.seq; }
  };
  bool step();  // one iteration; true if anything happened
  void send(const transport::TxFrame& f);
  void schedule(const std::uint8_t* data, std::uint32_t len, std::uint64_t when);
  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  std::vector<transport::Engine*> engines_;
  std::vector<std::uint8_t> pool_;
  std::vector<std::uint32_t> free_;
  std::vector<Event> heap_;
  std::mt19937_64 rng_;
  Impairments imp_;
  WireStats stats_;
  std::uint64_t now_ = 1'000'000;  // start at 1 ms so 0 can mean "no deadline"
  std::uint64_t seq_ = 0;
  static constexpr std::uint32_t kSlot = 4096 + 256;
};

}  // namespace uroce::sim
