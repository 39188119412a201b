// Responder: checks and executes incoming requests, generates ACKs, NAKs,
// READ responses and atomic ACKs (IBTA 9.7.5.1, rxe_resp.c's role).
#include <atomic>
#include <cstring>

#include "stack/transport/engine.h"

namespace uroce::transport {

using wire::Psn;
namespace op = wire::op;

void Engine::on_request(Qp& qp, const wire::Packet& pkt, std::uint64_t /*now*/) {
  if (qp.type == IBV_QPT_RC) [[likely]] {
    on_rc_request(qp, pkt);
  } else if (qp.type == IBV_QPT_UC) {
    on_uc_request(qp, pkt);
  } else if (qp.type == IBV_QPT_UD) {
    on_ud_request(qp, pkt);
  }
}

// ------------------------------------------------------------ quarantine

void Engine::on_quarantined(Qp& qp, const wire::Packet& pkt, std::uint64_t now) {
  if (now >= qp.quarantine_until) {
    release(qp);
    port_ctr_.inc(PortCounter::rx_unknown_qp);
    return;
  }
  // Only a retry of a SEND or WRITE it already took (behind its expected
  // PSN) is answered: with the ACK of the newest PSN it took, as a live
  // responder re-ACKs a duplicate. READs and atomics need memory or state
  // that went with the QP.
  const bool dup = pkt.info->has(wire::kOpRequest) && !pkt.info->has(wire::kOpRead) &&
                   !pkt.info->has(wire::kOpAtomic) && distance(qp.resp.epsn, pkt.psn) < 0 &&
                   pkt.src == qp.remote_ip;
  if (!dup || !queue_ack(qp, wire::kAethCreditInvalid, qp.resp.epsn - 1)) {
    port_ctr_.inc(PortCounter::rx_quarantined);
    return;
  }
  port_ctr_.inc(PortCounter::quarantine_acks);
  activate(qp);
}

// ------------------------------------------------------------------- RC

// Called from on_request alone, in this file: inline there, every RC
// request saves a call.
[[gnu::always_inline]] inline void Engine::on_rc_request(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  if (pkt.psn != s.epsn) [[unlikely]] {
    on_rc_out_of_order(qp, pkt);
    return;
  }
  const Exec e = execute(qp, pkt);
  if (e != Exec::kOk) [[unlikely]] {
    on_rc_refused(qp, pkt, e);
    return;
  }
  if (s.nak_sent && !pkt.info->has(wire::kOpRead) && !pkt.info->has(wire::kOpAtomic)) {
    // The gap is filled: tell the requester now, on top of the coalesced
    // ACK below, so recovery does not hinge on a single feedback frame.
    queue_ack(qp, wire::kAethCreditInvalid, pkt.psn);
  }
  s.nak_sent = false;
  // READ and atomic requests are answered by their responses.
  if (pkt.ackreq && !pkt.info->has(wire::kOpRead) && !pkt.info->has(wire::kOpAtomic)) schedule_ack(qp, pkt.psn);
}

void Engine::on_rc_out_of_order(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  if (distance(s.epsn, pkt.psn) > 0) {
    // Ahead of what we expect: something was lost. One NAK per gap, naming
    // the first missing PSN (IBTA 9.7.5.1.2); the rest are dropped.
    qp.ctr.inc(QpCounter::out_of_sequence);
    if (!s.nak_sent && queue_ack(qp, wire::nak_syndrome(wire::NakCode::kPsnSeqError), s.epsn)) s.nak_sent = true;  // counted when sent
    return;
  }
  qp.ctr.inc(QpCounter::duplicate_request);
  replay_duplicate(qp, pkt);
}

void Engine::on_rc_refused(Qp& qp, const wire::Packet& pkt, Exec e) {
  switch (e) {
    case Exec::kRnr:
      // No receive WQE: ask the requester to come back later (9.7.5.2.8).
      if (queue_ack(qp, wire::rnr_nak_syndrome(qp.min_rnr_timer), pkt.psn))
        qp.ctr.inc(QpCounter::send_rnr_err);
      break;
    case Exec::kDrop: break;
    default: responder_error(qp, pkt, e); break;
  }
}

void Engine::responder_error(Qp& qp, const wire::Packet& pkt, Exec e) {
  const std::uint8_t syn = wire::nak_syndrome(e == Exec::kNakAccess ? wire::NakCode::kRemoteAccessError
                                              : e == Exec::kNakOp   ? wire::NakCode::kRemoteOperationalError
                                                                    : wire::NakCode::kInvalidRequest);
  // Responses already owed for earlier requests (READ data, atomic results,
  // a coalesced ACK) go out first, in order; then the NAK; then the QP
  // moves to ERR, which discards whatever could not be sent.
  settle_pending_ack(qp);
  run_responses(qp);
  if (send_ack(qp, syn, pkt.psn)) qp.ctr.inc(QpCounter::sent_naks);
  if (qp.resp.have_rwqe) {
    const ibv_wc_status st = e == Exec::kNakAccess ? IBV_WC_REM_ACCESS_ERR
                             : e == Exec::kNakOp   ? IBV_WC_REM_OP_ERR
                                                   : IBV_WC_REM_INV_REQ_ERR;
    complete_recv(qp, qp.resp.rwqe, st, IBV_WC_RECV, 0);
    tm_abort(qp);
    qp.resp.have_rwqe = false;
  }
  // Class B/C errors take the responder's QP to the error state (10.7.3).
  set_error(qp);
}

Engine::Exec Engine::execute(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  const wire::OpcodeInfo& info = *pkt.info;
  using IM = Responder::InMsg;
  // Most requests are a SEND or WRITE ONLY between messages: in sequence,
  // and none of the length rules below applies to a packet that both
  // starts and ends its message.
  constexpr std::uint32_t kOnlyMask = wire::kOpStart | wire::kOpEnd | wire::kOpFlush | wire::kOpAtomicWrite;
  if (s.in_msg == IM::kNone && (info.flags & kOnlyMask) == (wire::kOpStart | wire::kOpEnd)) {
    if (info.flags & wire::kOpSend) return exec_send(qp, pkt);
    if (info.flags & wire::kOpWrite) return exec_write(qp, pkt);
  }
  bool seq_ok;
  switch (s.in_msg) {
    case IM::kNone: seq_ok = info.has(wire::kOpStart); break;
    case IM::kSend: seq_ok = info.has(wire::kOpSend) && !info.has(wire::kOpStart); break;
    case IM::kWrite: seq_ok = info.has(wire::kOpWrite) && !info.has(wire::kOpStart); break;
    default: seq_ok = false;
  }
  if (!seq_ok) {
    qp.ctr.inc(QpCounter::bad_opcode_seq);
    return Exec::kNakInvalid;
  }
  if (info.has(wire::kOpFlush)) return exec_flush(qp, pkt);
  if (info.has(wire::kOpAtomicWrite)) return exec_atomic_write(qp, pkt);
  // Every packet but the last of a multi-packet message is exactly one MTU.
  if (info.has(wire::kOpPayload) && !info.has(wire::kOpEnd) && pkt.payload_len != qp.mtu) return Exec::kNakInvalid;
  if (info.has(wire::kOpPayload) && info.has(wire::kOpEnd) && !info.has(wire::kOpStart) && pkt.payload_len == 0)
    return Exec::kNakInvalid;  // a LAST packet carries at least one byte
  if (info.has(wire::kOpSend)) return exec_send(qp, pkt);
  if (info.has(wire::kOpWrite)) return exec_write(qp, pkt);
  if (info.has(wire::kOpRead)) return exec_read(qp, pkt, pkt.psn);
  if (info.has(wire::kOpAtomic)) return exec_atomic(qp, pkt);
  return Exec::kNakInvalid;
}

Engine::Exec Engine::exec_send(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  const wire::OpcodeInfo& info = *pkt.info;
  if (info.has(wire::kOpStart)) {
    if (!s.have_rwqe) {
      if (qp.srq && qp.srq->tm) [[unlikely]] {
        if (!tm_start(qp, pkt)) return Exec::kRnr;
      } else if (!take_recv(qp, s.rwqe)) {
        return Exec::kRnr;
      }
      s.have_rwqe = true;
    }
    s.offset = 0;
  }
  if (s.tm >= Responder::Tm::kEager) [[unlikely]] {
    // Matched to a tag: its own placement (tm.cc).
    if (const Exec x = tm_place(qp, pkt); x != Exec::kOk) {
      s.have_rwqe = false;
      return x;
    }
  } else if (s.offset + pkt.payload_len > s.rwqe.length) {
    // The message does not fit the receive buffer (a local length error at
    // the responder, reported to the requester as an invalid request).
    complete_recv(qp, s.rwqe, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0);
    s.have_rwqe = false;
    s.tm = Responder::Tm::kNone;
    return Exec::kNakInvalid;
  } else if (!scatter_recv(mrs_, qp.pd, s.rwqe, s.offset, pkt.payload())) {
    complete_recv(qp, s.rwqe, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0);
    s.have_rwqe = false;
    s.tm = Responder::Tm::kNone;
    return Exec::kNakOp;
  }
  s.offset += pkt.payload_len;
  ++s.epsn;
  if (!info.has(wire::kOpEnd)) {
    s.in_msg = Responder::InMsg::kSend;
    return Exec::kOk;
  }
  unsigned flags = 0;
  std::uint32_t extra = 0;
  if (const auto* imm = pkt.immdt()) {
    flags |= IBV_WC_WITH_IMM;
    extra = imm->imm.get();
  }
  if (const auto* inv = pkt.ieth()) {
    const std::uint32_t rkey = inv->rkey.get();
    if (!mrs_.invalidate(rkey, qp.pd, qp.handle)) {
      complete_recv(qp, s.rwqe, IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV, 0);
      tm_abort(qp);
      s.have_rwqe = false;
      return Exec::kNakInvalid;
    }
    flags |= IBV_WC_WITH_INV;
    extra = rkey;
  }
  if (s.tm != Responder::Tm::kNone) [[unlikely]]
    tm_finish(qp, static_cast<std::uint32_t>(s.offset), flags, extra);
  else
    complete_recv(qp, s.rwqe, IBV_WC_SUCCESS, IBV_WC_RECV, static_cast<std::uint32_t>(s.offset), flags, extra);
  s.have_rwqe = false;
  s.in_msg = Responder::InMsg::kNone;
  ++s.msn;
  return Exec::kOk;
}

// ATOMIC WRITE (IBTA 1.5): eight bytes stored at an aligned address as one
// store, so a reader never sees half of them; acknowledged as a WRITE. Its
// length is exactly 8, in the RETH and in the packet (a shorter payload is
// malformed, never read past).
Engine::Exec Engine::exec_atomic_write(Qp& qp, const wire::Packet& pkt) {
  const wire::Reth* reth = pkt.reth();
  if (reth->dma_len.get() != 8 || pkt.payload_len != 8) return Exec::kNakInvalid;
  if ((reth->va.get() & 7) != 0) return Exec::kNakInvalid;  // misaligned
  MemRef p;
  if (!(qp.access & IBV_ACCESS_REMOTE_WRITE) ||
      mrs_.check(reth->rkey.get(), true, qp.pd, qp.handle, reth->va.get(), 8, IBV_ACCESS_REMOTE_WRITE, &p) != KeyCheck::kOk ||
      (p.odp() && !put_bytes(p, pkt.payload().data(), 8))) {
    qp.ctr.inc(QpCounter::remote_access_err);
    return Exec::kNakAccess;
  }
  if (!p.odp()) {
    std::uint64_t v;
    std::memcpy(&v, pkt.payload().data(), 8);  // the bytes as they came, stored as they are
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(p.p)).store(v, std::memory_order_release);
  }
  Responder& s = qp.resp;
  ++s.epsn;
  s.in_msg = Responder::InMsg::kNone;
  ++s.msn;
  return Exec::kOk;
}

Engine::Exec Engine::exec_flush(Qp& qp, const wire::Packet& pkt) {
  // IBTA 1.5 A19: make what earlier WRITEs placed globally visible. The
  // engine places every byte with ordinary stores into memory the host
  // shares: a full fence is that. Persistence needs persistent memory,
  // which uroce does not have (rxe refuses it too, on memory that is not).
  const std::uint32_t bits = pkt.feth()->bits.get();
  const std::uint32_t type = bits & 0xf, level = (bits >> 4) & 3;
  if (type == 0 || (type & ~3u) != 0 || level > UROCE_FLUSH_MR || pkt.payload_len != 0) return Exec::kNakInvalid;
  const wire::Reth* reth = pkt.reth();
  const unsigned need = (type & UROCE_FLUSH_GLOBAL ? UROCE_ACCESS_FLUSH_GLOBAL : 0) |
                        (type & UROCE_FLUSH_PERSISTENT ? UROCE_ACCESS_FLUSH_PERSISTENT : 0);
  MemRef p;
  // The range must lie in the MR; for the whole MR, its first byte names it.
  const std::uint64_t len = level == UROCE_FLUSH_RANGE ? reth->dma_len.get() : 1;
  if ((qp.access & need) != need || (type & UROCE_FLUSH_PERSISTENT) ||
      mrs_.check(reth->rkey.get(), true, qp.pd, qp.handle, reth->va.get(), std::max<std::uint64_t>(len, 1), need,
                 &p) != KeyCheck::kOk) {
    qp.ctr.inc(QpCounter::remote_access_err);
    return Exec::kNakAccess;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Responder& s = qp.resp;
  ++s.epsn;
  s.in_msg = Responder::InMsg::kNone;
  ++s.msn;
  return Exec::kOk;
}

Engine::Exec Engine::exec_write(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  const wire::OpcodeInfo& info = *pkt.info;
  const bool end = info.has(wire::kOpEnd);
  MemRef dst;  // where this packet's payload goes
  if (info.has(wire::kOpStart)) {
    const wire::Reth* reth = pkt.reth();
    const std::uint32_t len = reth->dma_len.get();
    if (end && pkt.payload_len != len) return Exec::kNakInvalid;
    if (!end && len <= qp.mtu) return Exec::kNakInvalid;
    if (!(qp.access & IBV_ACCESS_REMOTE_WRITE)) {
      qp.ctr.inc(QpCounter::remote_access_err);
      return Exec::kNakAccess;
    }
    MemRef p;
    if (len != 0 &&
        mrs_.check(reth->rkey.get(), true, qp.pd, qp.handle, reth->va.get(), len, IBV_ACCESS_REMOTE_WRITE, &p) != KeyCheck::kOk) {
      qp.ctr.inc(QpCounter::remote_access_err);
      return Exec::kNakAccess;
    }
    s.wkey = reth->rkey.get();
    s.wva = reth->va.get();
    s.wremain = len;
    s.offset = 0;
    dst = p;  // checked for the whole message just now
  }
  if (pkt.payload_len > s.wremain) return Exec::kNakInvalid;
  if (end && pkt.payload_len != s.wremain) return Exec::kNakInvalid;
  // WRITE with immediate consumes a receive WQE; check before touching memory
  // so an RNR NAK leaves everything as it was.
  const auto* imm = pkt.immdt();
  if (imm && !s.have_rwqe) {
    if (!take_recv(qp, s.rwqe)) return Exec::kRnr;
    s.have_rwqe = true;
  }
  if (pkt.payload_len) {
    // Every later packet is checked again, not only the first: the MR may
    // have been deregistered (or invalidated) since, and then this is a
    // remote access error.
    if ((dst.p == nullptr && mrs_.check(s.wkey, true, qp.pd, qp.handle, s.wva + s.offset, pkt.payload_len,
                                        IBV_ACCESS_REMOTE_WRITE, &dst) != KeyCheck::kOk) ||
        !put_bytes(dst, pkt.payload().data(), pkt.payload_len)) {
      qp.ctr.inc(QpCounter::remote_access_err);
      return Exec::kNakAccess;
    }
  }
  s.wremain -= pkt.payload_len;
  s.offset += pkt.payload_len;
  ++s.epsn;
  if (!end) {
    s.in_msg = Responder::InMsg::kWrite;
    return Exec::kOk;
  }
  if (imm) {
    complete_recv(qp, s.rwqe, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, static_cast<std::uint32_t>(s.offset),
                  IBV_WC_WITH_IMM, imm->imm.get());
    s.have_rwqe = false;
  }
  s.in_msg = Responder::InMsg::kNone;
  ++s.msn;
  return Exec::kOk;
}

Engine::Exec Engine::exec_read(Qp& qp, const wire::Packet& pkt, Psn psn) {
  Responder& s = qp.resp;
  const wire::Reth* reth = pkt.reth();
  const std::uint32_t len = reth->dma_len.get();
  if (!(qp.access & IBV_ACCESS_REMOTE_READ)) {
    qp.ctr.inc(QpCounter::remote_access_err);
    return Exec::kNakAccess;
  }
  MemRef p;
  if (len != 0 &&
      mrs_.check(reth->rkey.get(), true, qp.pd, qp.handle, reth->va.get(), len, IBV_ACCESS_REMOTE_READ, &p) != KeyCheck::kOk) {
    qp.ctr.inc(QpCounter::remote_access_err);
    return Exec::kNakAccess;
  }
  if (s.out.full()) return Exec::kNakInvalid;  // more outstanding READs than we offered
  const std::uint32_t n = packets_for(len, qp.mtu);
  const std::uint32_t depth = qp.max_dest_rd_atomic ? qp.max_dest_rd_atomic : 1;
  ReplayEntry& e = s.replay[s.replay_next++ % depth];
  e = ReplayEntry{true, false, psn, n, 0};
  settle_pending_ack(qp);
  s.out.push(RespTx{RespTx::Kind::kRead, psn, 0, n, reth->rkey.get(), reth->va.get(), len, 0, 0});
  s.epsn += n;
  ++s.msn;
  activate(qp);
  return Exec::kOk;
}

Engine::Exec Engine::exec_atomic(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  const wire::AtomicEth* a = pkt.atomic_eth();
  const std::uint64_t va = a->va.get();
  if (!(qp.access & IBV_ACCESS_REMOTE_ATOMIC)) {
    qp.ctr.inc(QpCounter::remote_access_err);
    return Exec::kNakAccess;
  }
  if (va & 7) return Exec::kNakInvalid;  // atomics must be 8-byte aligned (9.4.5)
  MemRef p;
  if (mrs_.check(a->rkey.get(), true, qp.pd, qp.handle, va, 8, IBV_ACCESS_REMOTE_ATOMIC, &p) != KeyCheck::kOk) {
    qp.ctr.inc(QpCounter::remote_access_err);
    return Exec::kNakAccess;
  }
  std::uint64_t orig;
  if (p.odp()) {
    // Through the memory file: one read and one write, atomic against
    // every other RDMA atomic (the engine runs them one at a time), not
    // against the application's own stores between the two.
    std::uint8_t old[8];
    if (!get_bytes(p, old, 8)) {
      qp.ctr.inc(QpCounter::remote_access_err);
      return Exec::kNakAccess;
    }
    std::memcpy(&orig, old, 8);
    const std::uint64_t next = pkt.opcode == op::kRcCmpSwap ? (orig == a->compare.get() ? a->swap_add.get() : orig)
                                                            : orig + a->swap_add.get();
    if (next != orig) {
      std::uint8_t nb[8];
      std::memcpy(nb, &next, 8);
      if (!put_bytes(p, nb, 8)) {
        qp.ctr.inc(QpCounter::remote_access_err);
        return Exec::kNakAccess;
      }
    }
  } else {
    std::atomic_ref<std::uint64_t> target(*reinterpret_cast<std::uint64_t*>(p.p));
    if (pkt.opcode == op::kRcCmpSwap) {
      orig = a->compare.get();
      target.compare_exchange_strong(orig, a->swap_add.get());  // orig ends up holding the old value
    } else {
      orig = target.fetch_add(a->swap_add.get());
    }
  }
  const std::uint32_t depth = qp.max_dest_rd_atomic ? qp.max_dest_rd_atomic : 1;
  s.replay[s.replay_next++ % depth] = ReplayEntry{true, true, pkt.psn, 1, orig};
  ++s.epsn;
  ++s.msn;
  queue_atomic_ack(qp, pkt.psn, orig);  // if this is lost, the retry is answered from the cache
  activate(qp);
  return Exec::kOk;
}

void Engine::replay_duplicate(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  const std::uint32_t depth = qp.max_dest_rd_atomic ? qp.max_dest_rd_atomic : 1;
  if (pkt.info->has(wire::kOpRead)) {
    for (std::uint32_t i = 0; i < depth; ++i) {
      const ReplayEntry& e = s.replay[i];
      if (e.valid && !e.atomic && in_window(pkt.psn, e.psn, e.npkts)) {
        // Answer again from the request as re-sent: it may ask for the tail
        // of the original READ only (a partially answered READ).
        const wire::Reth* reth = pkt.reth();
        const std::uint32_t len = reth->dma_len.get();
        MemRef p;
        if (len != 0 && mrs_.check(reth->rkey.get(), true, qp.pd, qp.handle, reth->va.get(), len, IBV_ACCESS_REMOTE_READ,
                                   &p) != KeyCheck::kOk)
          break;
        settle_pending_ack(qp);
        if (s.out.full()) return;
        s.out.push(RespTx{RespTx::Kind::kRead, pkt.psn, 0, packets_for(len, qp.mtu), reth->rkey.get(), reth->va.get(),
                          len, 0, 0});
        qp.ctr.inc(QpCounter::read_replays);
        activate(qp);
        return;
      }
    }
    qp.ctr.inc(QpCounter::replay_miss);
    return;
  }
  if (pkt.info->has(wire::kOpAtomic)) {
    for (std::uint32_t i = 0; i < depth; ++i) {
      const ReplayEntry& e = s.replay[i];
      if (e.valid && e.atomic && e.psn == pkt.psn) {
        // Never execute an atomic twice: resend the saved result.
        queue_atomic_ack(qp, pkt.psn, e.orig);
        qp.ctr.inc(QpCounter::atomic_replays);
        activate(qp);
        return;
      }
    }
    qp.ctr.inc(QpCounter::replay_miss);
    return;
  }
  // A duplicate SEND or WRITE is not executed again; re-ACK what we have.
  if (pkt.ackreq) schedule_ack(qp, s.epsn - 1);
}

// ------------------------------------------------------------------- UC

void Engine::on_uc_request(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  const bool start = pkt.info->has(wire::kOpStart);
  if (pkt.psn != s.epsn || s.uc_drop) {
    // UC has no retransmission: after a gap, drop until the next FIRST/ONLY
    // and resynchronise on its PSN (IBTA 9.8.3). A receive WQE being filled
    // is kept for the next message.
    if (!start) {
      qp.ctr.inc(QpCounter::uc_dropped);
      s.uc_drop = true;
      s.epsn = pkt.psn + 1;
      return;
    }
    if (pkt.psn != s.epsn) qp.ctr.inc(QpCounter::out_of_sequence);
    s.uc_drop = false;
    s.in_msg = Responder::InMsg::kNone;
    s.epsn = pkt.psn;
  }
  const Exec e = execute(qp, pkt);
  if (e != Exec::kOk) {
    // No NAKs on UC: the message is dropped.
    qp.ctr.inc(QpCounter::uc_dropped);
    s.uc_drop = true;
    s.in_msg = Responder::InMsg::kNone;
    s.epsn = pkt.psn + 1;
  }
}

// ------------------------------------------------------------------- UD

void Engine::on_ud_request(Qp& qp, const wire::Packet& pkt) {
  const wire::Deth* deth = pkt.deth();
  if (deth->qkey.get() != qp.qkey) {
    qp.ctr.inc(QpCounter::qkey_err);
    return;
  }
  RecvWqe w;
  if (!take_recv(qp, w)) {
    qp.ctr.inc(QpCounter::ud_no_recv);  // UD has no RNR: the datagram is dropped
    return;
  }
  // Verbs leaves a 40-byte GRH area at the start of a UD receive buffer.
  // For RoCEv2 it holds the IPv6 header, or 20 zero bytes then the IPv4 header.
  std::uint8_t grh[kGrhBytes] = {};
  if (pkt.ipver == wire::IpVersion::kV4) {
    std::memcpy(grh + 20, pkt.frame + pkt.l3_off, 20);
  } else {
    std::memcpy(grh, pkt.frame + pkt.l3_off, 40);
  }
  const std::uint64_t need = kGrhBytes + pkt.payload_len;
  if (need > w.length) {
    complete_recv(qp, w, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0);
    return;
  }
  if (!scatter_recv(mrs_, qp.pd, w, 0, wire::ConstBytes(grh, kGrhBytes)) ||
      !scatter_recv(mrs_, qp.pd, w, kGrhBytes, pkt.payload())) {
    complete_recv(qp, w, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0);
    return;
  }
  unsigned flags = IBV_WC_GRH;
  std::uint32_t imm = 0;
  if (const auto* i = pkt.immdt()) {
    flags |= IBV_WC_WITH_IMM;
    imm = i->imm.get();
  }
  complete_recv(qp, w, IBV_WC_SUCCESS, IBV_WC_RECV, static_cast<std::uint32_t>(need), flags, imm,
                deth->src_qp.get());
}

// ------------------------------------------------------------- transmit

void Engine::settle_pending_ack(Qp& qp) {
  // A coalesced ACK owed for earlier PSNs goes into the ordered queue ahead
  // of any later response, so the acknowledged PSN never goes back on the wire.
  Responder& s = qp.resp;
  if (!s.ack_pending) return;
  RespTx* t = s.out.emplace();
  if (t == nullptr) return;
  *t = RespTx{};
  t->kind = RespTx::Kind::kAck;
  t->psn = s.ack_psn;
  t->syndrome = wire::kAethCreditInvalid;
  s.ack_pending = false;
}

bool Engine::queue_ack(Qp& qp, std::uint8_t syndrome, Psn psn) {
  // Behind any responses already owed, so a NAK or RNR NAK never overtakes them.
  settle_pending_ack(qp);
  RespTx* t = qp.resp.out.emplace();
  if (t == nullptr) return false;
  *t = RespTx{};
  t->kind = RespTx::Kind::kAck;
  t->psn = psn;
  t->syndrome = syndrome;
  activate(qp);
  return true;
}

bool Engine::queue_atomic_ack(Qp& qp, Psn psn, std::uint64_t orig) {
  settle_pending_ack(qp);
  RespTx* t = qp.resp.out.emplace();
  if (t == nullptr) return false;
  *t = RespTx{};
  t->kind = RespTx::Kind::kAtomicAck;
  t->psn = psn;
  t->orig = orig;
  return true;
}

bool Engine::send_ack(Qp& qp, std::uint8_t syndrome, Psn psn) {
  TxFrame* f = tx_slot();
  if (f == nullptr) return false;
  finish_packet(*f, qp, {op::kRcAck, false, false, psn}, aeth(syndrome, qp.resp.msn), 0);
  return true;
}

bool Engine::send_atomic_ack(Qp& qp, Psn psn, std::uint64_t orig) {
  TxFrame* f = tx_slot();
  if (f == nullptr) return false;
  wire::ExtFields ext = aeth(wire::kAethCreditInvalid, qp.resp.msn);
  ext.atomic_ack_orig = orig;
  finish_packet(*f, qp, {op::kRcAtomicAck, false, false, psn}, ext, 0);
  return true;
}

void Engine::run_responses(Qp& qp) {
  Responder& s = qp.resp;
  while (!s.out.empty()) {
    RespTx& rt = s.out.front();
    if (rt.kind == RespTx::Kind::kAck) {
      if (!send_ack(qp, rt.syndrome, rt.psn)) return;
      if (rt.syndrome != wire::kAethCreditInvalid) {  // NAKs and RNR NAKs
        qp.ctr.inc(QpCounter::sent_naks);
        if (rt.syndrome == wire::nak_syndrome(wire::NakCode::kPsnSeqError)) qp.ctr.inc(QpCounter::sent_seq_naks);
      }
      s.out.pop();
      continue;
    }
    if (rt.kind == RespTx::Kind::kAtomicAck) {
      if (!send_atomic_ack(qp, rt.psn, rt.orig)) return;
      s.out.pop();
      continue;
    }
    const std::uint64_t off = std::uint64_t{rt.pkt} * qp.mtu;
    const std::uint32_t payload = static_cast<std::uint32_t>(std::min<std::uint64_t>(qp.mtu, rt.len - off));
    MemRef src;
    if (payload != 0) {
      MemRef p;
      if (mrs_.check(rt.rkey, true, qp.pd, qp.handle, rt.va + off, payload, IBV_ACCESS_REMOTE_READ, &p) != KeyCheck::kOk) {
        // Deregistered (or invalidated) mid-response: the rest becomes a
        // remote access NAK at this PSN (IBTA 9.7.5.2.4), never a read of
        // memory that is gone.
        qp.ctr.inc(QpCounter::remote_access_err);
        rt.kind = RespTx::Kind::kAck;
        rt.syndrome = wire::nak_syndrome(wire::NakCode::kRemoteAccessError);
        continue;
      }
      src = p;
    }
    TxFrame* f = tx_slot();
    if (f == nullptr) return;
    const bool first = rt.pkt == 0;
    const bool last = rt.pkt + 1 == rt.npkts;
    const std::uint8_t opcode = first && last ? op::kRcReadRespOnly
                                : first       ? op::kRcReadRespFirst
                                : last        ? op::kRcReadRespLast
                                              : op::kRcReadRespMiddle;
    if (payload && src.odp() && !add_odp_seg(*f, src, payload)) {
      // A page the application does not have (any more): as above.
      unbuilt(*f);
      qp.ctr.inc(QpCounter::remote_access_err);
      rt.kind = RespTx::Kind::kAck;
      rt.syndrome = wire::nak_syndrome(wire::NakCode::kRemoteAccessError);
      continue;
    }
    if (payload && !src.odp()) f->seg[f->nseg++] = {src.p, payload};
    finish_packet(*f, qp, {opcode, false, false, rt.psn}, aeth(wire::kAethCreditInvalid, s.msn), payload);
    ++rt.pkt;
    ++rt.psn;
    if (last) s.out.pop();
  }
}

void Engine::schedule_ack(Qp& qp, Psn psn) {
  // ACK coalescing: one ACK per QP per receive burst, for the newest PSN.
  Responder& s = qp.resp;
  if (s.ack_pending) qp.ctr.inc(QpCounter::ack_deferred);
  s.ack_pending = true;
  s.ack_psn = psn;
  if (!s.ack_listed) list_for_ack(qp);
}

void Engine::list_for_ack(Qp& qp) {
  qp.resp.ack_listed = true;
  ack_waiters_.push_back(&qp);  // capacity reserved for every QP: no allocation
}

void Engine::send_coalesced_acks() {
  std::size_t keep = 0;
  for (Qp* qp : ack_waiters_) {
    Responder& s = qp->resp;
    // Responses already owed go first: an ACK for a later PSN would
    // otherwise overtake READ responses and look as if they were lost.
    if (s.ack_pending && !s.out.empty()) run_responses(*qp);
    if (s.ack_pending && qp->state != IBV_QPS_ERR && qp->state != IBV_QPS_RESET &&
        (!s.out.empty() || !send_ack(*qp, wire::kAethCreditInvalid, s.ack_psn))) {
      ack_waiters_[keep++] = qp;  // TX ring full: try again next poll
      continue;
    }
    s.ack_pending = false;
    s.ack_listed = false;
  }
  ack_waiters_.resize(keep);
}

}  // namespace uroce::transport
