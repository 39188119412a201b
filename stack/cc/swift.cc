#include "stack/cc/swift.h"

#include <algorithm>

namespace uroce::cc {

namespace {
/// Headers around a full packet's payload (Ethernet, IPv4, UDP, BTH, ICRC):
/// what a window of packets costs on the wire.
constexpr double kFrameOverhead = 14 + 20 + 8 + 12 + 4;
}  // namespace

Swift::Swift(const Path& path, const SwiftParams& p)
    : p_(p),
      frame_bits_((path.mtu + kFrameOverhead) * 8),
      max_(static_cast<double>(path.max_window)),
      cwnd_(p.initial_window > 0 ? std::min(p.initial_window, max_) : max_),
      base_(path.base_rtt_ns),
      base_fixed_(path.base_rtt_ns != 0) {
  publish();
}

double Swift::pacing_bps() const {
  if (cwnd_ >= 1 || rtt_ == 0) return 0;
  return cwnd_ * frame_bits_ * 1e9 / static_cast<double>(rtt_);
}

void Swift::publish() {
  limits.window = static_cast<std::uint32_t>(std::max(1.0, cwnd_));
  limits.rate_bps = static_cast<std::uint64_t>(pacing_bps());
  if (cwnd_ < 1 && limits.rate_bps == 0) limits.rate_bps = 1;  // never unpaced below one packet
}

void Swift::on_ack(std::uint64_t, std::uint32_t pkts) {
  if (rtt_ == 0 || rtt_ >= target()) return;
  // ai per round trip: spread over the window's worth of ACKed packets.
  cwnd_ += cwnd_ >= 1 ? p_.ai * pkts / cwnd_ : p_.ai * pkts;
  cwnd_ = std::min(cwnd_, max_);
  publish();
}

void Swift::decrease(std::uint64_t now, double factor) {
  // At most once per round trip.
  if (last_decrease_ != 0 && now - last_decrease_ < std::max<std::uint64_t>(rtt_, 1)) return;
  last_decrease_ = now;
  cwnd_ = std::max(cwnd_ * factor, p_.min_window);
  publish();
}

void Swift::on_rtt(std::uint64_t now, std::uint64_t rtt_ns) {
  rtt_ = std::max<std::uint64_t>(rtt_ns, 1);
  if (!base_fixed_ && (base_ == 0 || rtt_ < base_)) base_ = rtt_;
  if (rtt_ <= target()) return;
  const double over = static_cast<double>(rtt_ - target()) / static_cast<double>(rtt_);
  decrease(now, std::max(1 - p_.beta * over, 1 - p_.max_mdf));
}

void Swift::on_nak(std::uint64_t now) { decrease(now, 1 - p_.max_mdf); }

void Swift::on_timeout(std::uint64_t now) {
  last_decrease_ = now;
  cwnd_ = std::max(std::min(cwnd_, 1.0), p_.min_window);
  publish();
}

}  // namespace uroce::cc
