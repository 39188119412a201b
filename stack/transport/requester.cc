// Requester: turns send WQEs into request packets (IBTA 9.7.4 / rxe_req.c's
// role). PSNs are assigned when a WQE is first started and kept with it, so
// go-back-N can restart at any packet of any message by moving a cursor.
#include <cstring>

#include "stack/transport/engine.h"

namespace uroce::transport {

using wire::Psn;
namespace op = wire::op;

namespace {

std::uint8_t pick_opcode(const SendWqe& w, bool first, bool last, ibv_qp_type type) {
  const std::uint8_t base = type == IBV_QPT_UC ? 0x20 : 0x00;
  const bool imm = w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  switch (w.kind) {
    case WqeKind::kSend:
      if (type == IBV_QPT_UD) return imm ? op::kUdSendOnlyImm : op::kUdSendOnly;
      if (w.opcode == IBV_WR_SEND_WITH_INV) return first && last ? op::kRcSendOnlyInv : last ? op::kRcSendLastInv
                                                                 : first ? op::kRcSendFirst
                                                                         : op::kRcSendMiddle;
      if (first && last) return base + (imm ? op::kRcSendOnlyImm : op::kRcSendOnly);
      if (first) return base + op::kRcSendFirst;
      if (last) return base + (imm ? op::kRcSendLastImm : op::kRcSendLast);
      return base + op::kRcSendMiddle;
    case WqeKind::kWrite:
      if (w.opcode == IBV_WR_ATOMIC_WRITE) return op::kRcAtomicWrite;  // 8 bytes: always one packet
      if (w.opcode == UROCE_WR_FLUSH) return op::kRcFlush;             // no payload: one packet
      if (first && last) return base + (imm ? op::kRcWriteOnlyImm : op::kRcWriteOnly);
      if (first) return base + op::kRcWriteFirst;
      if (last) return base + (imm ? op::kRcWriteLastImm : op::kRcWriteLast);
      return base + op::kRcWriteMiddle;
    case WqeKind::kRead: return op::kRcReadRequest;
    case WqeKind::kAtomic:
      return w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? op::kRcCmpSwap : op::kRcFetchAdd;
    case WqeKind::kLocal: break;  // sends nothing
  }
  return op::kRcSendOnly;
}

}  // namespace

void Engine::arm_retry(Qp& qp, std::uint64_t now) {
  if (qp.type != IBV_QPT_RC || qp.req.retry_deadline != 0) return;
  const std::uint64_t full = timeout_ns(qp.timeout);
  std::uint64_t t = full;
  if (qp.sr && !sr_fenced(qp) && qp.rtt.count() && t != 0) {
    // Selective repeat times out on the measured round trip (IRN's
    // RTO_low): a lost resend, or a loss at the tail that no later packet
    // reveals, costs a few round trips, not the IBTA timer. Only the IBTA
    // timer spends the retry budget (charge_at): a peer that stops
    // answering fails the QP after retry_cnt + 1 of its timeouts, as under
    // go-back-N, not after retry_cnt + 1 round trips. A fenced operation
    // (READ, atomic) recovers as go-back-N, whose every timeout spends a
    // retry: it keeps the IBTA timer.
    t = std::min(t, std::max<std::uint64_t>(4 * (qp.rtt.min() + qp.rtt.last()), 20'000));
    if (qp.req.charge_at == 0) qp.req.charge_at = now + full;
  }
  if (t != 0) qp.req.retry_deadline = now + t;
}

void Engine::run_requester(Qp& qp, std::uint64_t now) {
  Requester& r = qp.req;
  if (r.rnr_until != 0) return;  // waiting out an RNR NAK
  fetch_sends(qp);                 // what the producer posted since
  if (!metered()) {
    if (qp.sr && qp.state != IBV_QPS_ERR) sr_resend(qp, now);  // the losses first
    while (r.cursor != qp.sq.tail() && qp.state != IBV_QPS_ERR) {
      if (!send_next_packet(qp, now)) break;
    }
    return;
  }
  // Within its tenant's transmit share (Engine::poll), each frame charged.
  std::uint32_t from = tx_.tail();
  if (qp.sr && qp.state != IBV_QPS_ERR) sr_resend(qp, now);
  charge(qp, from);
  while (r.cursor != qp.sq.tail() && qp.state != IBV_QPS_ERR && tx_share_left(qp)) {
    from = tx_.tail();
    const bool more = send_next_packet(qp, now);
    charge(qp, from);
    if (!more) break;
  }
}

/// Sends the packet at the cursor. False when nothing more can go now.
bool Engine::send_next_packet(Qp& qp, std::uint64_t now) {
  Requester& r = qp.req;
  SendWqe& w = qp.sq.at(r.cursor);
  const bool rc = qp.type == IBV_QPT_RC;

  bool fresh = false;  // its SGEs were translated just now
  if (!w.started && w.refused) {
    // Malformed in the ring (IBTA 10.7.2: a local QP operation error,
    // reported in order, and the QP goes to ERR).
    if (r.cursor != qp.sq.head()) return false;
    port_ctr_.inc(PortCounter::bad_wqe);
    complete_send(qp, IBV_WC_LOC_QP_OP_ERR);
    set_error(qp);
    return false;
  }
  if (qp.type == IBV_QPT_RAW_PACKET) return send_raw(qp, w);  // a whole frame, no PSN (raw.cc)
  if (w.kind == WqeKind::kLocal) {
    // A bind or local invalidate: executed when the requester reaches it,
    // after every WQE before it has started (rxe does the same), and
    // completed in order with them. It takes no PSN.
    if (!w.started) {
      if (qp.state == IBV_QPS_SQD) return false;
      if (rc && (w.flags & IBV_SEND_FENCE) && r.rd_atomic_inflight != 0) return false;
      w.local_status = exec_local(qp, w);
      w.started = true;
      w.first_psn = r.next_psn;
    }
    if (w.local_status != IBV_WC_SUCCESS) {
      // It failed: nothing after it starts, and it completes in error (the
      // QP then goes to ERR) once it is the oldest.
      if (r.cursor != qp.sq.head()) return false;
      complete_send(qp, w.local_status);
      set_error(qp);
      return false;
    }
    if (r.cursor == qp.sq.head()) {
      complete_send(qp, IBV_WC_SUCCESS);  // moves the cursor on
    } else {
      ++r.cursor;  // go-back-N may pass it again: it is not executed twice
      r.cursor_pkt = 0;
    }
    return true;
  }
  if (!w.started) {
    if (qp.state == IBV_QPS_SQD) return false;  // drained: start nothing new
    if (rc && (w.flags & IBV_SEND_FENCE) && r.rd_atomic_inflight != 0) return false;
    const bool rd_atomic = w.kind == WqeKind::kRead || w.kind == WqeKind::kAtomic;
    if (rd_atomic && r.rd_atomic_inflight >= qp.max_rd_atomic) return false;
    // Local checks happen when the WQE starts (IBTA 10.7.2: reported as a completion).
    bool ok = w.length <= kMaxMessage && (qp.type != IBV_QPT_UD || w.length <= qp.mtu);
    ibv_wc_status bad = IBV_WC_LOC_LEN_ERR;
    if (qp.sr && !sr_may_start(qp, w)) return false;  // fenced: see sr_may_start
    if (ok && !translate_sges(qp, w)) {
      ok = false;
      bad = IBV_WC_LOC_PROT_ERR;
    }
    fresh = true;
    if (!ok) {
      // Only the head can complete (completions are in order); an error
      // further back waits for the ones before it.
      if (r.cursor != qp.sq.head()) return false;
      complete_send(qp, bad);
      set_error(qp);
      return false;
    }
    if (qp.sr && sr_carries(w) && (w.kind == WqeKind::kSend || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM))
      w.rmsn = qp.sr->next_msn++;
    w.npkts = (w.kind == WqeKind::kAtomic) ? 1 : packets_for(w.length, qp.mtu);
    w.first_psn = r.next_psn;
    r.next_psn += w.npkts;
    w.started = true;
    if (rd_atomic) ++r.rd_atomic_inflight;
    if (qp.sr && !sr_carries(w)) sr_fence(qp, w);
  }

  const Psn psn = w.first_psn + r.cursor_pkt;
  if (rc && distance(r.una, psn) >= static_cast<std::int32_t>(qp.window)) return false;
  // A later (or resent) packet that carries payload checks the memory again,
  // before it takes a TX slot: the MR may have been deregistered since the
  // WQE started (the application's mistake, which must not become a read of
  // memory that is gone).
  const bool one_packet = w.kind == WqeKind::kRead || w.kind == WqeKind::kAtomic;
  if (!one_packet && w.length != 0 && !fresh && !translate_sges(qp, w)) {
    if (r.cursor == qp.sq.head()) complete_send(qp, IBV_WC_LOC_PROT_ERR);
    set_error(qp);
    return false;
  }
  if (qp.rate_bps != 0 && now < r.pace_next) return false;  // the pacer: not yet (next_deadline says when)
  TxFrame* f = tx_slot();
  if (f == nullptr) return false;

  const bool first = r.cursor_pkt == 0;
  const bool last = one_packet || r.cursor_pkt + 1 == w.npkts;
  const bool sr = qp.sr && sr_carries(w);  // in selective repeat's own opcodes
  const std::uint8_t opcode =
      sr ? (w.kind == WqeKind::kSend ? op::kSrSend : op::kSrWrite) : pick_opcode(w, first, last, qp.type);
  wire::PacketFields pf{opcode, last && (w.flags & IBV_SEND_SOLICITED), false, psn};
  wire::ExtFields ext;
  ext.imm = w.imm;
  ext.ieth_rkey = w.invalidate_rkey;
  if (qp.xrc == Xrc::kSend) [[unlikely]] ext.xrc_srqn = w.xrc_srqn;  // the XRCETH (finish_packet makes the opcode XRC's)

  std::uint32_t payload = 0;
  const std::uint64_t off = std::uint64_t{r.cursor_pkt} * qp.mtu;
  if (w.kind == WqeKind::kRead) {
    // A READ restarted by go-back-N asks only for the bytes not yet received,
    // and its answer is a new response stream (FIRST or ONLY first).
    w.read_stream_open = false;
    ext.reth_va = w.remote_addr + off;
    ext.reth_rkey = w.rkey;
    ext.reth_len = static_cast<std::uint32_t>(w.length - off);
  } else if (w.kind == WqeKind::kAtomic) {
    ext.atomic_va = w.remote_addr;
    ext.atomic_rkey = w.rkey;
    ext.atomic_swap_add = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? w.swap : w.compare_add;
    ext.atomic_compare = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? w.compare_add : 0;
  } else {
    payload = static_cast<std::uint32_t>(std::min<std::uint64_t>(qp.mtu, w.length - off));
    if (w.kind == WqeKind::kWrite && first) {
      ext.reth_va = w.remote_addr;
      ext.reth_rkey = w.rkey;
      ext.reth_len = static_cast<std::uint32_t>(w.length);
      if (w.opcode == UROCE_WR_FLUSH) {
        ext.reth_len = static_cast<std::uint32_t>(w.compare_add);  // the range, not a payload
        ext.feth = w.imm;
      }
    }
    // Payload segments: straight from registered memory, or the inline copy.
    if (w.is_inline) {
      std::memcpy(f->inline_buf, w.inline_data + off, payload);
      if (payload) f->seg[f->nseg++] = {f->inline_buf, payload};
    } else {
      std::uint64_t skip = off;
      std::uint32_t need = payload;
      for (std::uint32_t i = 0; i < w.nsge && need > 0; ++i) {
        const Sge& s = w.sge[i];
        if (skip >= s.length) {
          skip -= s.length;
          continue;
        }
        const std::uint32_t take = static_cast<std::uint32_t>(std::min<std::uint64_t>(need, s.length - skip));
        if (!w.local[i].odp()) {
          f->seg[f->nseg++] = {w.local[i].p + skip, take};
        } else if (!add_odp_seg(*f, w.local[i].at(skip), take)) {
          // An ODP page the application does not have: a local protection error.
          unbuilt(*f);
          if (r.cursor == qp.sq.head()) complete_send(qp, IBV_WC_LOC_PROT_ERR);
          set_error(qp);
          return false;
        }
        need -= take;
        skip = 0;
      }
    }
  }
  if (sr) {
    // Self-describing (wire::Srh): where this packet goes, in which message.
    if (w.kind == WqeKind::kWrite) {
      ext.reth_va = w.remote_addr + off;
      ext.reth_rkey = w.rkey;
      ext.reth_len = payload;
    }
    ext.srh_msn = w.rmsn;
    ext.srh_offset = static_cast<std::uint32_t>(off);
    ext.srh_total = static_cast<std::uint32_t>(w.length);
    const bool imm = w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    ext.srh_flags = static_cast<std::uint8_t>((last ? wire::kSrhLast : 0) | (imm ? wire::kSrhImm : 0) |
                                                   (pf.se ? wire::kSrhSolicit : 0));
  }
  // AckReq on the last packet of a message, at least every N packets, and
  // on every packet that fills the window or leaves paced, or is the last
  // of the QP's turn (the TX ring or its tenant's share is spent): a small
  // window, a slow rate or a wait for its next turn must not hold back the
  // ACK for what was sent (and each is a round-trip sample).
  ++r.pkts_since_ackreq;
  if (rc && (last || r.pkts_since_ackreq >= cfg_.ackreq_every || r.restart_ackreq || qp.rate_bps != 0 ||
             distance(r.una, psn) + 1 >= static_cast<std::int32_t>(qp.window) || last_in_turn(qp, payload))) {
    pf.ackreq = true;
    r.pkts_since_ackreq = 0;
  }
  if (qp.type == IBV_QPT_UD) {
    // Each datagram goes where its WQE says: no template, the full builder.
    wire::FrameSpec spec = full_spec(qp, pf, ext);
    spec.dst = w.ah.dgid;
    spec.eth_dst = w.ah.dmac;
    spec.ipver = w.ah.dgid.is_v4_mapped() ? wire::IpVersion::kV4 : wire::IpVersion::kV6;
    spec.destqp = w.remote_qpn;
    // IBTA 10.2.5: a Q_Key with the high bit set means "use the QP's own".
    spec.ext.deth_qkey = (w.remote_qkey & 0x80000000u) ? qp.qkey : w.remote_qkey;
    spec.ext.deth_src_qp = qp.qpn;
    finish_frame(*f, qp, spec, payload);
    if (w.ah.dgid.is_multicast()) loop_to_group(*f, w.ah.dgid, now);
  } else {
    finish_packet(*f, qp, pf, ext, payload);
  }
  bool twice = false;
  if (r.restart_ackreq) {
    r.restart_ackreq = false;
    if (r.restart_twice) {
      // A second copy of the restart packet (the responder treats it as a
      // duplicate). Its payload segments point at the same memory.
      if (TxFrame* again = tx_slot()) {
        *again = *f;
        if (w.is_inline && again->nseg) again->seg[0].p = again->inline_buf;
        twice = true;
        qp.ctr.inc(QpCounter::sent_pkts);
        port_ctr_.inc(PortCounter::tx_frames);
      }
      r.restart_twice = false;
    }
  }
  if (qp.rate_bps != 0) {
    // The frame's time at the QP's rate (a restart's second copy too),
    // from now: a packet leaves only once its time has come, so no credit
    // builds up while the QP idles, and no burst goes beyond one frame.
    const std::uint64_t bytes = std::uint64_t{f->size()} * (twice ? 2 : 1);
    r.pace_next = now + bytes * 8'000'000'000ull / qp.rate_bps;
  }
  const bool resent = is_before(psn, r.sent_hi);
  if (resent) {
    qp.ctr.inc(QpCounter::retransmitted_pkts);
    qp.ctr.inc(QpCounter::retransmitted_bytes, f->size());
  } else if (rc && pf.ackreq && r.probe_count < Requester::kProbes) {
    // A round-trip probe: a packet sent for the first time that asks for an ACK.
    r.probes[(r.probe_head + r.probe_count++) % Requester::kProbes] = {psn, now};
  }
  cc_event(qp, [now, f](cc::Algorithm& a) { a.on_tx(now, static_cast<std::uint32_t>(f->size())); });
  // One past what it occupies: a READ restarted part-way still ends at its last response.
  const Psn end = one_packet ? w.first_psn + w.npkts : psn + 1;
  if (!is_before(end, r.sent_hi)) r.sent_hi = end;

  if (one_packet || last) {
    ++r.cursor;
    r.cursor_pkt = 0;
  } else {
    ++r.cursor_pkt;
  }
  if (rc) {
    arm_retry(qp, now);
  } else if (one_packet || last) {
    // UC and UD: nothing comes back, the WQE is done once it is on the wire.
    complete_send(qp, IBV_WC_SUCCESS);
  }
  return true;
}

void Engine::go_back(Qp& qp, Psn from) {
  // Find the WQE holding `from`; the cursor restarts there, mid-message if
  // need be, and everything after it is sent again (IBTA 9.7.5.2.7).
  Requester& r = qp.req;
  r.probe_count = 0;  // their ACKs could now be the resent copies
  for (std::uint32_t i = qp.sq.head(); i != qp.sq.tail(); ++i) {
    SendWqe& w = qp.sq.at(i);
    if (!w.started) break;
    if (in_window(from, w.first_psn, w.npkts)) {
      r.cursor = i;
      r.cursor_pkt = static_cast<std::uint32_t>(distance(w.first_psn, from));
      if (w.kind == WqeKind::kRead && r.cursor_pkt > w.read_pkts_done) r.cursor_pkt = w.read_pkts_done;
      if (w.kind == WqeKind::kAtomic) r.cursor_pkt = 0;
      r.pkts_since_ackreq = 0;
      return;
    }
  }
}

}  // namespace uroce::transport
