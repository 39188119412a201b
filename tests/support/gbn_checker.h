// Checks IBTA go-back-N invariants on a simulated trace, for one responder
// QP, from what the wire shows (not from the engine's own state):
//  - the PSN acknowledged by ACK/NAK frames never goes back;
//  - at most one PSN-sequence-error NAK per gap (NAK PSNs strictly increase);
//  - a NAK names the first missing PSN: the responder's expected PSN, as
//    recomputed here from the requests actually delivered, when a gap showed.
#pragma once

#include <string>
#include <vector>

#include "drivers/sim/sim_wire.h"
#include "stack/wire/parser.h"

namespace uroce::testing {

class GbnChecker {
 public:
  GbnChecker(const transport::Engine* responder, std::uint32_t qpn, wire::Psn rq_psn, std::uint32_t mtu)
      : resp_(responder), qpn_(qpn), exp_(rq_psn), mtu_(mtu) {}

  /// Hook into a SimWire (replaces its taps).
  void attach(sim::SimWire& w) {
    w.deliver_tap = [this](const transport::Engine* to, wire::ConstBytes f, std::uint64_t) { delivered(to, f); };
    w.tap = [this](wire::ConstBytes f, std::uint64_t) { sent(f); };
  }

  [[nodiscard]] const std::vector<std::string>& violations() const { return bad_; }
  [[nodiscard]] std::uint64_t naks_seen() const { return naks_; }
  [[nodiscard]] std::uint64_t acks_seen() const { return acks_; }

 private:
  void delivered(const transport::Engine* to, wire::ConstBytes f) {
    if (to != resp_) return;
    wire::Packet p;
    if (!wire::parse_frame(f, wire::ParseOptions{}, p).ok() || p.destqp != qpn_) return;
    if (!p.info->has(wire::kOpRequest)) return;
    const std::int32_t d = distance(exp_, p.psn);
    if (d == 0) {
      std::uint32_t n = 1;
      if (p.info->has(wire::kOpRead)) {
        const std::uint32_t len = p.reth()->dma_len.get();
        n = len == 0 ? 1 : (len + mtu_ - 1) / mtu_;
      }
      exp_ += n;
    } else if (d > 0) {
      if (gaps_.empty() || gaps_.back() != exp_) gaps_.push_back(exp_);
    }
  }

  void sent(wire::ConstBytes f) {
    wire::Packet p;
    if (!wire::parse_frame(f, wire::ParseOptions{}, p).ok() || p.opcode != wire::op::kRcAck) return;
    if (!(p.src == resp_->config().ip)) return;
    const std::uint8_t syn = p.aeth()->syndrome;
    const auto kind = wire::aeth_kind(syn);
    const wire::Psn acked = kind == wire::AethKind::kAck ? p.psn : p.psn - 1;
    if (have_acked_ && distance(acked_, acked) < 0)
      fail("ACK went back from " + std::to_string(acked_.value()) + " to " + std::to_string(acked.value()));
    if (!have_acked_ || distance(acked_, acked) > 0) acked_ = acked;
    have_acked_ = true;
    if (kind == wire::AethKind::kAck) ++acks_;
    if (kind == wire::AethKind::kNak && (syn & 0x1f) == 0) {
      ++naks_;
      if (have_nak_ && distance(last_nak_, p.psn) <= 0)
        fail("second NAK for the same gap at PSN " + std::to_string(p.psn.value()));
      have_nak_ = true;
      last_nak_ = p.psn;
      bool known = false;
      for (const auto g : gaps_) known = known || g == p.psn;
      if (!known) fail("NAK names PSN " + std::to_string(p.psn.value()) + ", not the first missing PSN of a gap");
      // Gaps up to this one are answered.
      std::vector<wire::Psn> rest;
      for (const auto g : gaps_)
        if (distance(p.psn, g) > 0) rest.push_back(g);
      gaps_ = rest;
    }
  }

  void fail(std::string why) {
    if (bad_.size() < 20) bad_.push_back(std::move(why));
  }

  const transport::Engine* resp_;
  std::uint32_t qpn_;
  wire::Psn exp_;
  std::uint32_t mtu_;
  std::vector<wire::Psn> gaps_;
  bool have_acked_ = false, have_nak_ = false;
  wire::Psn acked_{}, last_nak_{};
  std::uint64_t naks_ = 0, acks_ = 0;
  std::vector<std::string> bad_;
};

}  // namespace uroce::testing
