// Receive dispatch: a frame's port checks (VLAN, parse and ICRC, the
// destination address), then its QP's (state, P_Key, transport, peer),
// then the responder or the completer; a multicast group's datagram goes
// to each QP attached to the group.
#include <cerrno>

#include "stack/transport/engine.h"

namespace uroce::transport {

RxVerdict Engine::rx(wire::ConstBytes frame, std::uint64_t now) {
  // Every drop is counted, and the verdict says which it was.
  const auto drop = [this](PortCounter c, RxVerdict v) {
    port_ctr_.inc(c);
    return v;
  };
  port_ctr_.inc(PortCounter::rx_frames);
  wire::Packet pkt;
  wire::ParseOptions opts;
  const wire::ParseStatus st = wire::parse_frame(frame, opts, pkt);
  // With a VLAN configured only that VLAN's frames are the port's, and
  // without one only untagged frames: the one look at the tag (the parse's).
  if ((pkt.has_vlan ? pkt.vlan_tci & 0x0fff : 0) != (cfg_.vlan_tci & 0x0fff))
    return drop(PortCounter::rx_wrong_vlan, RxVerdict::kWrongVlan);
  if (!st.ok()) {
    if (!st.roce) {
      if (!flows_.empty() && rx_raw(frame)) return RxVerdict::kRaw;
      return drop(PortCounter::rx_not_roce, RxVerdict::kNotRoce);
    }
    if (st.reject == wire::Reject::kBadIcrc) return drop(PortCounter::rx_icrc_err, RxVerdict::kBadIcrc);
    return drop(PortCounter::rx_malformed, RxVerdict::kMalformed);
  }
  // Header checks before anything reaches a QP (IBTA 9.6.1.1): the
  // destination address must be this port's, or a frame addressed to
  // another host could be executed here (and the real one then taken for
  // a duplicate).
  // A multicast group's datagram is the other kind of address we take
  // (tested only when the address is not the port's: off the unicast path).
  const bool mine = pkt.dst == cfg_.ip;
  if (!mine && !pkt.dst.is_multicast()) return drop(PortCounter::rx_wrong_dst, RxVerdict::kWrongDst);
  last_now_ = now;
  return mine ? to_qp(slot_qp(pkt.destqp), pkt, now) : to_group(pkt, now);
}

RxVerdict Engine::to_qp(Qp* qp, const wire::Packet& pkt, std::uint64_t now) {
  const auto drop = [this](PortCounter c, RxVerdict v) {
    port_ctr_.inc(c);
    return v;
  };
  if (pkt.info->has(wire::kOpCnp)) {
    // A reaction point's input (IBTA A17.9.3): for our live QP, from its
    // peer (a UD QP has none: from anyone), to its congestion control.
    if (qp == nullptr || qp->quarantine_until || qp == gsi_.get() ||
        (qp->type != IBV_QPT_UD && !(pkt.src == qp->remote_ip)))
      return drop(PortCounter::rx_cnp_dropped, RxVerdict::kCnpDropped);
    port_ctr_.inc(PortCounter::rx_cnp);
    qp->ctr.inc(QpCounter::cnp_received);
    cc_event(*qp, [now](cc::Algorithm& a) { a.on_cnp(now); });
    return RxVerdict::kCnp;
  }
  if (qp == nullptr) return drop(PortCounter::rx_unknown_qp, RxVerdict::kUnknownQp);
  if (qp->quarantine_until) {
    on_quarantined(*qp, pkt, now);
    return RxVerdict::kQuarantined;
  }
  if (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_ERR)
    return drop(PortCounter::rx_bad_state, RxVerdict::kBadState);
  // P_Key: every QP is in the default partition (0xFFFF, full member).
  // A packet matches when the low 15 bits match and one of the two is a
  // full member (IBTA 10.9.3), so 0x7FFF and 0xFFFF pass.
  if ((pkt.pkey & 0x7fff) != (kDefaultPkey & 0x7fff) || ((pkt.pkey | kDefaultPkey) & 0x8000) == 0)
    return drop(PortCounter::rx_bad_pkey, RxVerdict::kBadPkey);
  if (wire::is_sr_opcode(pkt.opcode)) {
    // uroce's selective repeat: only for an RC QP set to it, from its peer.
    if (!qp->sr || qp->type != IBV_QPT_RC) return drop(PortCounter::rx_wrong_transport, RxVerdict::kWrongTransport);
    if (!(pkt.src == qp->remote_ip)) return drop(PortCounter::rx_wrong_peer, RxVerdict::kWrongPeer);
    if (pkt.payload_len > qp->mtu) return drop(PortCounter::rx_malformed, RxVerdict::kMalformed);
    qp->ctr.inc(QpCounter::rcvd_pkts);
    if (pkt.ecn == 3) notify_congestion(*qp, now);
    if (pkt.opcode != wire::op::kSrAck) {
      on_sr_request(*qp, pkt);
    } else if (qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_SQD) {
      on_sr_ack(*qp, pkt, now);
    } else {
      qp->ctr.inc(QpCounter::unexpected_resp);
    }
    return RxVerdict::kToQp;
  }
  const wire::Transport t = wire::transport_of(pkt.opcode);
  const bool type_ok = (t == wire::Transport::kRc && qp->type == IBV_QPT_RC && qp->xrc == Xrc::kNone) ||
                       (t == wire::Transport::kUc && qp->type == IBV_QPT_UC) ||
                       (t == wire::Transport::kUd && qp->type == IBV_QPT_UD);
  if (!type_ok) [[unlikely]] {
    // XRC: requests to a target, responses to an initiator; each goes on as
    // RC's opcode of the same offset (its headers where the XRC opcode has them).
    const bool req = pkt.info->has(wire::kOpRequest);
    if (t != wire::Transport::kXrc || qp->xrc != (req ? Xrc::kRecv : Xrc::kSend))
      return drop(PortCounter::rx_wrong_transport, RxVerdict::kWrongTransport);
    wire::Packet rc = pkt;
    rc.opcode = static_cast<std::uint8_t>(pkt.opcode - wire::op::kXrcBase);
    return deliver(*qp, rc, now);
  }
  return deliver(*qp, pkt, now);
}

RxVerdict Engine::deliver(Qp& qp_ref, const wire::Packet& pkt, std::uint64_t now) {
  const auto drop = [this](PortCounter c, RxVerdict v) {
    port_ctr_.inc(c);
    return v;
  };
  Qp* qp = &qp_ref;
  if (qp->type != IBV_QPT_UD && !(pkt.src == qp->remote_ip)) return drop(PortCounter::rx_wrong_peer, RxVerdict::kWrongPeer);
  if (pkt.payload_len > qp->mtu) return drop(PortCounter::rx_malformed, RxVerdict::kMalformed);
  // A CM peer reaches QP1 before anything else: learn its MAC from the frame
  // (ARP-style gleaning), so the REP and the QP's RTR need no resolution.
  if (qp == gsi_.get() && !neighbors_.contains(pkt.src)) neighbors_.learn(pkt.src, pkt.eth_src);
  qp->ctr.inc(QpCounter::rcvd_pkts);
  if (pkt.ecn == 3) {
    if (qp->type == IBV_QPT_UD) {
      notify_congestion_ud(*qp, pkt, now);
    } else {
      notify_congestion(*qp, now);
    }
  }
  if (pkt.info->has(wire::kOpRequest)) {
    if (qp->sr && !sr_quiet(*qp)) {
      // On a selective-repeat QP an IBTA request is fenced (sr.h): one
      // amid selective repeat's own is not its peer's, and is not taken.
      qp->ctr.inc(QpCounter::out_of_sequence);
      return RxVerdict::kToQp;
    }
    if (qp->xrc == Xrc::kRecv && !xrc_bind(*qp, pkt) && pkt.psn == qp->resp.epsn) [[unlikely]] {
      // An XRC SRQ that is not there, or not in the target's domain: an
      // invalid request (its retries, behind the expected PSN, are replayed).
      responder_error(*qp, pkt, Exec::kNakInvalid);
      return RxVerdict::kToQp;
    }
    on_request(*qp, pkt, now);
  } else {
    on_response(*qp, pkt, now);
  }
  return RxVerdict::kToQp;
}

bool Engine::xrc_bind(Qp& qp, const wire::Packet& pkt) {
  const auto it = xrc_srqs_.find(pkt.xrceth()->srqn.get());
  if (it == xrc_srqs_.end() || it->second->xrcd() != qp.xrcd) return false;
  Srq* s = it->second;
  if (qp.resp.in_msg != Responder::InMsg::kNone && s != qp.srq) return false;  // one SRQ for a whole message
  qp.srq = s;
  qp.recv_cq = s->cq();
  qp.pd = s->pd();
  return true;
}

// -------------------------------------------------------------- multicast

int Engine::attach_mcast(Qp* qp, const wire::IpAddr& gid) {
  if (qp == nullptr || qp->quarantine_until || qp->type != IBV_QPT_UD || !gid.is_multicast()) return EINVAL;
  for (const McastAttach& m : mcast_)
    if (m.qp == qp && m.gid == gid) return 0;
  if (mcast_.size() >= cfg_.max_mcast_attach) return ENOMEM;
  mcast_.push_back({gid, qp});
  return 0;
}

int Engine::detach_mcast(Qp* qp, const wire::IpAddr& gid) {
  const auto n = std::erase_if(mcast_, [&](const McastAttach& m) { return m.qp == qp && m.gid == gid; });
  return n != 0 ? 0 : EINVAL;
}

RxVerdict Engine::to_group(const wire::Packet& pkt, std::uint64_t now) {
  // Only a UD datagram to the multicast QPN (IBTA 10.5.2.3) is a group's.
  if (pkt.destqp != 0xFFFFFFu || wire::transport_of(pkt.opcode) != wire::Transport::kUd) {
    port_ctr_.inc(PortCounter::rx_wrong_dst);
    return RxVerdict::kWrongDst;
  }
  RxVerdict v = RxVerdict::kUnknownQp;
  bool member = false;
  for (const McastAttach& m : mcast_) {
    if (!(m.gid == pkt.dst)) continue;
    member = true;
    if (to_qp(m.qp, pkt, now) == RxVerdict::kToQp) v = RxVerdict::kToQp;  // each refusal is counted as its QP's
  }
  if (!member) port_ctr_.inc(PortCounter::rx_unknown_qp);  // a group nobody here is in
  return v;
}

void Engine::loop_to_group(const TxFrame& f, const wire::IpAddr& group, std::uint64_t now) {
  bool members = false;
  for (const McastAttach& m : mcast_) members = members || m.gid == group;
  if (!members) return;
  const std::size_t n = f.copy_to(wire::Bytes(mcast_loop_.data(), mcast_loop_.size()));
  if (n != 0) (void)rx(wire::ConstBytes(mcast_loop_.data(), n), now);
}

}  // namespace uroce::transport
