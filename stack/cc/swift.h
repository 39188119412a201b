// A delay-target window in the style of Swift (Kumar et al., "Swift: Delay
// is Simple and Effective for Congestion Control in the Datacenter",
// SIGCOMM 2020, section 3): below the target delay (the base round trip
// plus an allowance for queueing) the window grows by
// `ai` packets per round trip; above it, it shrinks in proportion to how
// far the delay is over the target, at most once per round trip and by at
// most max_mdf. A loss (a sequence NAK) or a timeout cuts it as well.
// Below one packet the window becomes a pacing rate (window x MTU per RTT),
// as Swift does.
#pragma once

#include "stack/cc/cc.h"

namespace uroce::cc {

struct SwiftParams {
  /// The queueing delay allowed over the base round trip: 10 us. Ours:
  /// Swift's target is a fabric base delay plus a per-hop allowance. The
  /// base is the path's (Path::base_rtt_ns) where the engine knows it, else
  /// the smallest sample the QP has seen (which a QP that starts behind a
  /// standing queue overestimates: configure the base where fairness matters).
  std::uint64_t target_ns = 10'000;
  /// ai: 1 packet per round trip (Swift's additive increment).
  double ai = 1.0;
  /// beta: 0.8 (ours; Swift's multiplicative-decrease constant).
  double beta = 0.8;
  /// max_mdf: 0.5 (Swift: at most a halving per round trip).
  double max_mdf = 0.5;
  /// The window's floor: 0.01 packets (Swift lets it fall below one and paces).
  double min_window = 0.01;
  /// The initial window: 16 packets (ours: about a 10 Gb/s, few-us
  /// path's bandwidth-delay product), at most the engine's cap.
  double initial_window = 16;
};

class Swift final : public Algorithm {
 public:
  Swift(const Path& path, const SwiftParams& p = {});
  [[nodiscard]] std::string_view name() const override { return "swift"; }
  void on_ack(std::uint64_t now, std::uint32_t pkts) override;
  void on_rtt(std::uint64_t now, std::uint64_t rtt_ns) override;
  void on_nak(std::uint64_t now) override;
  void on_timeout(std::uint64_t now) override;
  [[nodiscard]] State state() const override { return {pacing_bps(), 0, 0, cwnd_}; }

 private:
  void decrease(std::uint64_t now, double factor);
  void publish();
  [[nodiscard]] double pacing_bps() const;
  SwiftParams p_;
  double frame_bits_;
  double max_;
  double cwnd_;
  [[nodiscard]] std::uint64_t target() const { return base_ + p_.target_ns; }
  std::uint64_t rtt_ = 0;            // the latest sample (0: none yet)
  std::uint64_t base_ = 0;           // the base round trip: the path's, or the smallest sample
  bool base_fixed_ = false;
  std::uint64_t last_decrease_ = 0;  // when the window last shrank
};

}  // namespace uroce::cc
