#include "stack/cc/dcqcn.h"

#include <algorithm>
#include <cmath>

namespace uroce::cc {

namespace {
/// Alpha below this is taken as zero: its timer stops.
constexpr double kAlphaFloor = 1.0 / 1024;
/// The most timer periods one call catches up on (a QP that idled longer
/// jumps ahead).
constexpr int kMaxCatchUp = 4096;
}  // namespace

Dcqcn::Dcqcn(const Path& path, const DcqcnParams& p)
    : p_(p), line_(static_cast<double>(path.line_rate_bps)), rc_(line_), rt_(line_), alpha_(p.initial_alpha) {
  publish();
}

void Dcqcn::publish() {
  // At line rate the QP is not paced at all (no cost, no rounding).
  limits.rate_bps = rc_ >= line_ ? 0 : static_cast<std::uint64_t>(rc_);
}

void Dcqcn::on_cnp(std::uint64_t now) {
  if (last_cut_ != 0 && now < last_cut_ + p_.reduce_period_ns) {
    ++ignored_;
    return;
  }
  last_cut_ = now;
  rt_ = rc_;
  rc_ = std::max(rc_ * (1 - alpha_ / 2), p_.min_rate_bps);
  alpha_ = (1 - p_.g) * alpha_ + p_.g;
  alpha_next_ = now + p_.alpha_period_ns;
  increase_next_ = now + p_.increase_period_ns;
  bytes_ = 0;
  t_stage_ = b_stage_ = 0;
  publish();
}

void Dcqcn::on_tx(std::uint64_t, std::uint32_t bytes) {
  if (rc_ >= line_) return;  // nothing to recover
  bytes_ += bytes;
  if (bytes_ >= p_.byte_counter) {
    bytes_ = 0;
    ++b_stage_;
    increase();
    publish();
  }
}

void Dcqcn::increase() {
  const std::uint32_t f = p_.fast_recovery;
  if (std::max(t_stage_, b_stage_) < f) {
    // Fast recovery: halfway back to the target.
  } else if (std::min(t_stage_, b_stage_) > f) {
    rt_ += (std::min(t_stage_, b_stage_) - f) * p_.hai_bps;  // hyper increase
  } else {
    rt_ += p_.ai_bps;  // additive increase
  }
  rt_ = std::min(rt_, line_);
  rc_ = std::min((rt_ + rc_) / 2, line_);
  // Within a bit of the line it is the line: the timer stops.
  if (line_ - rc_ < 1.0) rc_ = line_;
}

void Dcqcn::on_timer(std::uint64_t now) {
  for (int k = 0; k < kMaxCatchUp && alpha_next_ != 0 && now >= alpha_next_; ++k) {
    alpha_ *= 1 - p_.g;  // a period without a CNP (a CNP moves the timer)
    alpha_next_ = alpha_ < kAlphaFloor && rc_ >= line_ ? 0 : alpha_next_ + p_.alpha_period_ns;
  }
  if (alpha_next_ != 0 && now >= alpha_next_) alpha_next_ = now + p_.alpha_period_ns;
  for (int k = 0; k < kMaxCatchUp && increase_next_ != 0 && now >= increase_next_; ++k) {
    ++t_stage_;
    increase();
    increase_next_ = rc_ >= line_ ? 0 : increase_next_ + p_.increase_period_ns;
  }
  if (increase_next_ != 0 && now >= increase_next_) increase_next_ = now + p_.increase_period_ns;
  if (rc_ >= line_ && alpha_next_ != 0 && alpha_ < kAlphaFloor) alpha_next_ = 0;
  publish();
}

std::uint64_t Dcqcn::next_timer() const {
  if (alpha_next_ == 0) return increase_next_;
  if (increase_next_ == 0) return alpha_next_;
  return std::min(alpha_next_, increase_next_);
}

}  // namespace uroce::cc
