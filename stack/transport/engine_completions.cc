// Completions out: send WQEs retired into their CQ, the CQ writes and the
// notifications and overflows they note, and the flush of every
// outstanding WQE of a QP in ERR.
#include "stack/transport/engine.h"

namespace uroce::transport {

namespace {
ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
  switch (static_cast<int>(op)) {  // an int: UROCE_WR_FLUSH is past rdma-core 44's enum
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_WRITE: return IBV_WC_ATOMIC_WRITE;
    case UROCE_WR_FLUSH: return static_cast<ibv_wc_opcode>(UROCE_WC_FLUSH);
    case IBV_WR_BIND_MW: return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV: return IBV_WC_LOCAL_INV;
    default: return IBV_WC_SEND;
  }
}
}  // namespace

void Engine::complete_send(Qp& qp, ibv_wc_status status) {
  SendWqe& w = qp.sq.front();
  if (w.internal) [[unlikely]] return complete_internal(qp, status);
  const bool signal = status != IBV_WC_SUCCESS || qp.sq_sig_all || (w.flags & IBV_SEND_SIGNALED);
  // The ring's entry itself (uroce_abi.h), not an ibv_wc converted.
  uroce_cq_entry e{};
  if (signal) {
    e.wr_id = w.wr_id;
    e.status = status;
    e.opcode = wc_opcode(w.opcode);
    e.byte_len = (w.kind == WqeKind::kRead || w.kind == WqeKind::kAtomic) ? static_cast<std::uint32_t>(w.length) : 0;
    e.qp_num = qp.qpn;
    e.timestamp = last_now_;
  }
  if (w.started && (w.kind == WqeKind::kRead || w.kind == WqeKind::kAtomic) && qp.req.rd_atomic_inflight > 0)
    --qp.req.rd_atomic_inflight;
  // Keep the cursor at or after the head.
  if (qp.req.cursor == qp.sq.head()) {
    ++qp.req.cursor;
    qp.req.cursor_pkt = 0;
  }
  qp.sq.pop();
  // The slot goes back to the producer before the completion is published:
  // an application that posts again the moment it sees a completion (as
  // perftest does, counting its room by completions) must find the room
  // there. The other order lost that race under load (ib_write_bw through
  // the drop-in: "Couldn't post send", 3 runs in 15).
  qp.sq_ring.release(qp.sq.head() - qp.sq_internal_out);
  if (signal) {
    push_cqe(*qp.send_cq, e);
    qp.ctr.inc(QpCounter::completions);
  }
}

void Engine::push_cqe(Cq& cq, const uroce_cq_entry& e) {
  // The common case, a push with no one to tell, touches nothing else (and
  // saves no registers: the rest is out of line).
  if (!cq.push(e)) [[unlikely]] {
    cq_dropped(cq);
  } else if (cq.notify_ && !cq.noted_) {
    cq_note(cq);
  }
}

void Engine::cq_dropped(Cq& cq) {
  // Never silent: counted, and the owner hears of it (cq_events()).
  port_ctr_.inc(PortCounter::cqe_dropped);
  if (!cq.overflow_noted_) {
    cq.overflow_noted_ = true;
    port_ctr_.inc(PortCounter::cq_overflows);
    cq_overflowed_.push_back(&cq);
  }
}

void Engine::cq_note(Cq& cq) {
  cq.noted_ = true;
  cq_noted_.push_back(&cq);
}

void Engine::cq_events() {
  // Overflows first: the flush completions they cause are then notified below.
  // IBTA 11.6.2: a CQ overrun is an affiliated asynchronous error; the QPs
  // that complete into it can no longer report, so they go to ERR.
  for (std::size_t k = 0; k < cq_overflowed_.size(); ++k) {
    Cq* cq = cq_overflowed_[k];
    if (async_event_) async_event_(hooks_ctx_, IBV_EVENT_CQ_ERR, cq, nullptr);
    for (const auto& q : qps_) {
      if (!q || q->quarantine_until || (q->send_cq != cq && q->recv_cq != cq) || q->state == IBV_QPS_ERR) continue;
      set_error(*q);
      if (async_event_) async_event_(hooks_ctx_, IBV_EVENT_QP_FATAL, nullptr, q.get());
    }
  }
  cq_overflowed_.clear();
  for (Cq* cq : cq_noted_) {
    cq->noted_ = false;
    if (cq_notify_ && cq->ring_.take_notify()) cq_notify_(hooks_ctx_, *cq);
  }
  cq_noted_.clear();
}

void Engine::flush_wqes(Qp& qp) {
  // IBTA 10.3.1.8: in ERR every outstanding WQE completes with WR_FLUSH_ERR.
  qp.req.retry_deadline = qp.req.rnr_until = 0;
  fetch_sends(qp);  // what is still in the ring is flushed too
  while (!qp.sq.empty()) complete_send(qp, IBV_WC_WR_FLUSH_ERR);
  qp.req.cursor = qp.sq.head();
  qp.req.cursor_pkt = 0;
  qp.req.rd_atomic_inflight = 0;
  if (qp.resp.have_rwqe) {
    complete_recv(qp, qp.resp.rwqe, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
    qp.resp.have_rwqe = false;
  }
  if (qp.sr) {
    // Selective repeat took these ahead of their turn: they flush first, in order.
    SrState& s = *qp.sr;
    for (; s.rmsn != s.rwqe_taken; ++s.rmsn)
      complete_recv(qp, s.rwqes[s.rmsn % SrState::kRwqes], IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
  }
  if (!qp.srq) {
    RecvWqe r;
    bool bad;
    for (std::uint32_t n = 0; n < qp.rq.capacity() && qp.rq.take(r, bad); ++n)
      complete_recv(qp, r, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
  }
  qp.resp.out.clear();
  qp.resp.ack_pending = false;
  qp.resp.in_msg = Responder::InMsg::kNone;
}

}  // namespace uroce::transport
