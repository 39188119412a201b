// Congestion: the notification point (a CE-marked packet makes a CNP to
// its sender, IBTA A17.9.2), and each QP's congestion control (cc/) hooked
// up: its algorithm chosen, and its rate and window applied to the pacer
// and the send window.
#include <algorithm>
#include <cerrno>

#include "stack/transport/engine.h"

namespace uroce::transport {

void Engine::notify_congestion(Qp& qp, std::uint64_t now) {
  qp.ctr.inc(QpCounter::ce_marked);
  cc_event(qp, [now](cc::Algorithm& a) { a.on_ce(now); });
  if (cfg_.cnp_interval_ns == 0 || now < qp.cnp_next) return;
  if (send_cnp(qp, spec_for(qp, wire::op::kCnp, wire::Psn{}))) qp.cnp_next = now + cfg_.cnp_interval_ns;
}

bool Engine::send_cnp(Qp& qp, wire::FrameSpec spec) {
  TxFrame* f = tx_slot();
  if (f == nullptr) return false;  // counted as tx_ring_full; the next CE mark tries again
  // As a ConnectX-4 Lx sends one: BECN, PSN 0, ECT(0), the CNP DSCP, UDP
  // source port 0, no AckReq, 16 reserved bytes (the builder's CnpBody).
  spec.becn = true;
  spec.dscp = cfg_.cnp_dscp;
  spec.ecn = 2;
  spec.udp_sport = 0;
  finish_frame(*f, qp, spec, 0);
  qp.ctr.inc(QpCounter::cnp_sent);
  return true;
}

void Engine::notify_congestion_ud(Qp& qp, const wire::Packet& pkt, std::uint64_t now) {
  qp.ctr.inc(QpCounter::ce_marked);
  if (cfg_.cnp_interval_ns == 0 || pkt.deth() == nullptr) return;
  const std::uint32_t src_qp = pkt.deth()->src_qp.get() & 0xffffff;
  std::uint32_t h = src_qp * 0x9e3779b1u ^ qp.qpn * 0x85ebca6bu;
  for (const std::uint8_t b : pkt.src.b) h = (h ^ b) * 0x01000193u;
  UdCnpSlot& slot = ud_cnp_[h % ud_cnp_.size()];
  const bool same = slot.src == pkt.src && slot.src_qp == src_qp && slot.qpn == qp.qpn;
  if (same && now < slot.next) return;
  wire::FrameSpec spec = spec_for(qp, wire::op::kCnp, wire::Psn{});
  spec.dst = pkt.src;
  spec.eth_dst = pkt.eth_src;  // back the way the datagram came
  spec.ipver = pkt.src.is_v4_mapped() ? wire::IpVersion::kV4 : wire::IpVersion::kV6;
  spec.destqp = src_qp;
  if (send_cnp(qp, spec)) slot = UdCnpSlot{pkt.src, src_qp, qp.qpn, now + cfg_.cnp_interval_ns};
}

int Engine::set_rate(Qp* qp, std::uint64_t bits_per_s) {
  if (qp == nullptr || qp->quarantine_until) return EINVAL;
  qp->rate_limit_bps = bits_per_s;
  apply_cc(*qp);
  return 0;
}

int Engine::set_cc(Qp* qp, std::string_view name) {
  if (qp == nullptr || qp->quarantine_until) return EINVAL;
  const cc::Entry* e = cc::find(name);
  if (e == nullptr) return EINVAL;
  if (qp->type == IBV_QPT_UD && e->make && !e->ud) return EOPNOTSUPP;  // it needs ACKs, which UD has none of
  qp->cc = e->make ? e->make(cc::Path{cfg_.line_rate_bps, qp->mtu, cfg_.send_window, cfg_.base_rtt_ns}) : nullptr;
  apply_cc(*qp);
  if (qp->cc && qp->cc->next_timer()) activate(*qp);
  return 0;
}

void Engine::apply_cc(Qp& qp) {
  const cc::Limits l = qp.cc ? qp.cc->limits : cc::Limits{};
  std::uint64_t rate = qp.rate_limit_bps;
  if (l.rate_bps != 0 && (rate == 0 || l.rate_bps < rate)) rate = l.rate_bps;
  if (rate == 0) qp.req.pace_next = 0;
  qp.rate_bps = rate;
  qp.window = l.window != 0 && l.window < cfg_.send_window ? l.window : cfg_.send_window;
  if (qp.sr) {
    // Selective repeat: no more in flight than the SACK spans, nor than
    // the bandwidth-delay product it was given (IRN's BDP-FC).
    const std::uint32_t cap = cfg_.sr_window != 0 && cfg_.sr_window < Bitmap256::kBits ? cfg_.sr_window : Bitmap256::kBits;
    qp.window = std::min(qp.window, cap);
  }
}

CcReport Engine::cc_report(const Qp& qp) const {
  CcReport r;
  r.algorithm = qp.cc ? qp.cc->name() : "none";
  if (qp.cc) r.state = qp.cc->state();
  r.pace_bps = qp.rate_bps;
  r.window = qp.window;
  r.rtt_samples = qp.rtt.count();
  r.rtt_min_ns = qp.rtt.min();
  r.rtt_mean_ns = qp.rtt.mean();
  r.rtt_p99_ns = qp.rtt.quantile(0.99);
  return r;
}

}  // namespace uroce::transport
