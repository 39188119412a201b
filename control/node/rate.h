// A token bucket: the one rate limit of the control plane (log lines, a
// uid's control requests).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace uroce::control {

/// `per_s` tokens a second, at most `burst` held; starts full.
class TokenBucket {
 public:
  TokenBucket(double per_s, double burst) : rate_(per_s), burst_(burst), tokens_(burst) {}
  /// Takes a token at `now_ns` (a monotonic clock): 0 when there was one,
  /// else how long until there will be (ns), and nothing is taken.
  std::uint64_t take(std::uint64_t now_ns) {
    refill(now_ns);
    if (tokens_ >= 1 - 1e-9) {  // the wait said below is rounded: it must be enough
      tokens_ = std::max(0.0, tokens_ - 1);
      return 0;
    }
    return static_cast<std::uint64_t>(std::ceil((1 - tokens_) / rate_ * 1e9));
  }
  /// Whether the bucket is full at `now_ns` (one that is can be forgotten).
  [[nodiscard]] bool full(std::uint64_t now_ns) const { return held(now_ns) >= burst_; }

 private:
  [[nodiscard]] double held(std::uint64_t now_ns) const {
    if (last_ == 0 || now_ns <= last_) return tokens_;
    return std::min(burst_, tokens_ + rate_ * static_cast<double>(now_ns - last_) / 1e9);
  }
  void refill(std::uint64_t now_ns) {
    tokens_ = held(now_ns);
    if (now_ns > last_) last_ = now_ns;
  }
  double rate_, burst_, tokens_;
  std::uint64_t last_ = 0;
};

}  // namespace uroce::control
