// Selective repeat (sr.h): the requester's resends, the responder's
// placement of packets however they arrive, and the completer's reading of
// selective acknowledgements. A QP is in this mode only when the
// application (or its CM) set it on both ends before RTR; every other QP,
// and so every peer that is not uroce, stays IBTA go-back-N.
#include <cstring>

#include "stack/transport/engine.h"

namespace uroce::transport {

using wire::Psn;
namespace op = wire::op;

namespace {
constexpr std::uint32_t kBits = Bitmap256::kBits;
}  // namespace

int Engine::set_selective_repeat(Qp* qp, bool on) {
  if (qp == nullptr || qp->quarantine_until) return EINVAL;
  if (qp->type != IBV_QPT_RC) return EOPNOTSUPP;
  // Both ends must agree before either expects the other's packets.
  if (qp->state != IBV_QPS_RESET && qp->state != IBV_QPS_INIT) return EBUSY;
  // Receive WQEs are taken ahead of their turn: an SRQ's are not this QP's to take.
  if (on && qp->srq) return EOPNOTSUPP;
  qp->sr = on ? std::make_unique<SrState>() : nullptr;
  apply_cc(*qp);
  return 0;
}

// ------------------------------------------------------------- requester

bool Engine::sr_carries(const SendWqe& w) {
  return w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE ||
         w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
}

bool Engine::sr_may_start(Qp& qp, const SendWqe& w) {
  SrState& s = *qp.sr;
  if (s.fenced) {
    if (is_before(qp.req.una, s.fence_end)) return false;  // the fenced operation is not done yet
    s.fenced = false;
  }
  // One selective repeat does not carry waits until all before it is acknowledged.
  return sr_carries(w) || qp.req.una == qp.req.sent_hi;
}

void Engine::sr_fence(Qp& qp, const SendWqe& w) {
  // A READ's responses, an atomic's ACK and the others' ACKs are IBTA's,
  // and so are their recovery (go-back-N) and the responder's replay of
  // them: nothing of selective repeat's is in flight meanwhile.
  SrState& s = *qp.sr;
  s.fenced = true;
  s.fence_end = w.first_psn + w.npkts;
  s.sacked.reset();
  s.lost.reset();
  s.resent.reset();
}

bool Engine::sr_fenced(const Qp& qp) {
  return qp.sr && qp.sr->fenced && is_before(qp.req.una, qp.sr->fence_end);
}

void Engine::sr_resend(Qp& qp, std::uint64_t now) {
  SrState& s = *qp.sr;
  Requester& r = qp.req;
  const auto out = static_cast<std::uint32_t>(distance(r.una, r.sent_hi));
  for (std::uint32_t k; (k = s.lost.first(std::min(out, kBits))) != kBits;) {
    if (qp.rate_bps != 0 && now < r.pace_next) return;  // the pacer holds resends too
    // Send that one packet from its WQE, then go on where the requester was.
    const std::uint32_t cursor = r.cursor, pkt = r.cursor_pkt, since = r.pkts_since_ackreq;
    go_back(qp, r.una + k);
    r.restart_ackreq = true;  // its acknowledgement tells what else is missing
    r.restart_twice = false;
    const bool sent = send_next_packet(qp, now);
    r.cursor = cursor;
    r.cursor_pkt = pkt;
    r.pkts_since_ackreq = since;
    r.restart_ackreq = false;
    if (!sent || qp.state == IBV_QPS_ERR) return;
    s.lost.clear(k);
    s.resent.set(k);
    s.resent_at[(r.una + k).value() % kBits] = now;
  }
}

void Engine::sr_timeout(Qp& qp, std::uint64_t now) {
  // Everything not yet acknowledged, selectively or not, goes again; what
  // the responder has is not resent.
  SrState& s = *qp.sr;
  Requester& r = qp.req;
  const auto out = std::min(static_cast<std::uint32_t>(distance(r.una, r.sent_hi)), kBits);
  s.resent.reset();
  for (std::uint32_t k = 0; k < out; ++k)
    if (!s.sacked.test(k)) s.lost.set(k);
  r.retry_deadline = 0;
  arm_retry(qp, now);
  activate(qp);
}

// ------------------------------------------------------------- completer

void Engine::on_sr_ack(Qp& qp, const wire::Packet& pkt, std::uint64_t now) {
  SrState& s = *qp.sr;
  Requester& r = qp.req;
  const Psn next = pkt.psn + 1;  // the first PSN the responder lacks
  const std::int32_t moved = distance(r.una, next);
  const std::int32_t outstanding = distance(r.una, r.sent_hi);
  if (moved > outstanding) {
    qp.ctr.inc(QpCounter::ghost_acks);  // acknowledges what was never sent
    return;
  }
  if (moved < 0) {
    qp.ctr.inc(QpCounter::duplicate_acks);  // older than what we know
    return;
  }
  const Psn una0 = r.una;
  const bool progress = moved > 0 && ack_upto(qp, pkt.psn);
  const auto shifted = static_cast<std::uint32_t>(distance(una0, r.una));
  s.sacked.shift(shifted);
  s.lost.shift(shifted);
  s.resent.shift(shifted);
  if (sr_fenced(qp)) {
    // A late answer to what went before the fence: nothing is missing but
    // the fenced operation, which recovers as IBTA's do.
    if (progress) on_progress(qp, una0, now);
    return;
  }
  // The SACK, from its base (the responder's expected PSN) on, as far as we sent.
  const std::int32_t off = distance(r.una, Psn(pkt.sack()->base.get()));
  const auto limit = static_cast<std::uint32_t>(std::min<std::int32_t>(distance(r.una, r.sent_hi), kBits));
  if (off >= 0 && off < static_cast<std::int32_t>(kBits)) {
    for (std::uint32_t k = 0; k + static_cast<std::uint32_t>(off) < limit; ++k) {
      const std::uint64_t w = pkt.sack()->bits[k >> 6].get();
      if ((w >> (k & 63)) & 1) s.sacked.set(k + static_cast<std::uint32_t>(off));
    }
  }
  // A hole below the highest PSN the responder has is a loss (IRN: it
  // would have arrived before the ones after it); a hole where a resend
  // went more than a round trip ago is that resend lost.
  const std::uint32_t hi = s.sacked.end();
  const std::uint64_t rtt = qp.rtt.count() ? qp.rtt.min() + qp.rtt.last() : 1'000'000;
  bool found = false;
  for (std::uint32_t k = 0; k < hi; ++k) {
    if (s.sacked.test(k) || s.lost.test(k)) continue;
    if (s.resent.test(k)) {
      if (now - s.resent_at[(r.una + k).value() % kBits] <= rtt) continue;
      s.resent.clear(k);
    }
    s.lost.set(k);
    found = true;
  }
  if (found) cc_event(qp, [now](cc::Algorithm& a) { a.on_nak(now); });
  if (progress) on_progress(qp, una0, now);
  if (found) activate(qp);
}

// ------------------------------------------------------------- responder

bool Engine::sr_take_rwqe(Qp& qp, std::uint32_t msn) {
  SrState& s = *qp.sr;
  if (msn - s.rmsn >= SrState::kRwqes) return false;  // too far ahead (or behind)
  while (static_cast<std::int32_t>(msn - s.rwqe_taken) >= 0) {
    if (!take_recv(qp, s.rwqes[s.rwqe_taken % SrState::kRwqes])) return false;
    ++s.rwqe_taken;
  }
  return true;
}

Engine::Exec Engine::sr_place(Qp& qp, const wire::Packet& pkt) {
  SrState& s = *qp.sr;
  const wire::Srh& h = *pkt.srh();
  const std::uint8_t flags = h.flags;
  const std::uint32_t msn = h.msn.get(), offset = h.offset.get(), total = h.total.get();
  const bool consumes = pkt.opcode == op::kSrSend || (flags & wire::kSrhImm);
  if (offset > total || pkt.payload_len > total - offset || pkt.payload_len > qp.mtu) return Exec::kNakInvalid;
  if ((flags & wire::kSrhLast) && offset + pkt.payload_len != total) return Exec::kNakInvalid;
  // A SEND, and a WRITE's last packet with immediate data, need their
  // receive WQE; none yet: the packet is not taken (it comes again).
  if (consumes && (pkt.opcode == op::kSrSend || (flags & wire::kSrhLast)) && !sr_take_rwqe(qp, msn)) {
    qp.ctr.inc(QpCounter::send_rnr_err);
    return Exec::kDrop;
  }
  if (pkt.opcode == op::kSrWrite) {
    const wire::Reth* reth = pkt.reth();
    if (reth->dma_len.get() != pkt.payload_len) return Exec::kNakInvalid;
    if (!(qp.access & IBV_ACCESS_REMOTE_WRITE)) {
      qp.ctr.inc(QpCounter::remote_access_err);
      return Exec::kNakAccess;
    }
    if (pkt.payload_len != 0) {
      MemRef dst;
      if (mrs_.check(reth->rkey.get(), true, qp.pd, qp.handle, reth->va.get(), pkt.payload_len,
                     IBV_ACCESS_REMOTE_WRITE, &dst) != KeyCheck::kOk ||
          !put_bytes(dst, pkt.payload().data(), pkt.payload_len)) {
        qp.ctr.inc(QpCounter::remote_access_err);
        return Exec::kNakAccess;
      }
    }
  } else {
    const RecvWqe& w = s.rwqes[msn % SrState::kRwqes];
    if (std::uint64_t{offset} + pkt.payload_len > w.length) return Exec::kNakInvalid;  // does not fit the buffer
    if (!scatter_recv(mrs_, qp.pd, w, offset, pkt.payload())) return Exec::kNakOp;
  }
  if (flags & wire::kSrhLast) {
    SrState::End& e = s.ends[pkt.psn.value() % kBits];
    e = SrState::End{true, consumes, pkt.opcode == op::kSrSend, (flags & wire::kSrhImm) != 0, msn, total, h.imm.get()};
  }
  return Exec::kOk;
}

void Engine::on_sr_request(Qp& qp, const wire::Packet& pkt) {
  SrState& s = *qp.sr;
  Responder& rs = qp.resp;
  const std::int32_t d = distance(rs.epsn, pkt.psn);
  if (d < 0 || (d < static_cast<std::int32_t>(kBits) && s.got.test(static_cast<std::uint32_t>(d)))) {
    qp.ctr.inc(QpCounter::duplicate_request);  // placed already: say so again
    send_sr_ack(qp);
    return;
  }
  if (d >= static_cast<std::int32_t>(kBits) || rs.in_msg != Responder::InMsg::kNone) {
    // Beyond what the bitmap holds, or inside a fenced IBTA message (which
    // the requester never does): it comes again.
    qp.ctr.inc(QpCounter::out_of_sequence);
    return;
  }
  const Exec e = sr_place(qp, pkt);
  if (e == Exec::kDrop) return;
  if (e != Exec::kOk) {
    responder_error(qp, pkt, e);
    return;
  }
  s.got.set(static_cast<std::uint32_t>(d));
  if (d > 0) {
    qp.ctr.inc(QpCounter::out_of_sequence);
    ++s.ooo;
  }
  // Deliver, in order, every message now complete up to the first hole.
  std::uint32_t adv = 0;
  while (adv < kBits && s.got.test(adv)) {
    SrState::End& end = s.ends[(rs.epsn + adv).value() % kBits];
    if (end.valid) {
      end.valid = false;
      if (end.consumes) {
        const RecvWqe& w = s.rwqes[end.msn % SrState::kRwqes];
        complete_recv(qp, w, IBV_WC_SUCCESS, end.is_send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM, end.total,
                      end.imm ? unsigned{IBV_WC_WITH_IMM} : 0u, end.imm_data);
        ++s.rmsn;
      }
      ++rs.msn;
    }
    ++adv;
  }
  s.got.shift(adv);
  rs.epsn += adv;
  // A packet ahead of a hole is answered at once (IRN's NACK: the sender
  // learns of the loss now); others when they ask.
  if (d > 0 || pkt.ackreq) send_sr_ack(qp);
}

bool Engine::sr_quiet(const Qp& qp) {
  // Nothing placed ahead of its turn and no receive WQE taken ahead: an
  // IBTA request (a fenced operation) may be taken at epsn.
  const SrState& s = *qp.sr;
  return s.got.end() == 0 && s.rwqe_taken == s.rmsn;
}

bool Engine::send_sr_ack(Qp& qp) {
  TxFrame* f = tx_slot();
  if (f == nullptr) return false;
  wire::ExtFields ext = aeth(wire::kAethCreditInvalid, qp.resp.msn);
  ext.sack_base = qp.resp.epsn.value();
  ext.sack_bits = qp.sr->got.words();
  finish_packet(*f, qp, {op::kSrAck, false, false, qp.resp.epsn - 1}, ext, 0);
  return true;
}

}  // namespace uroce::transport
