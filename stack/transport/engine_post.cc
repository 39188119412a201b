// Work requests in: the heap rings' producers (post_*), the taking of what
// an application published in its shared rings, the one check every send
// entry passes before it is a WQE, the taking of receives, and a WQE's
// local part (its SGEs translated, a bind or local invalidate executed).
#include <cerrno>
#include <cstring>
#include <optional>

#include "stack/transport/engine.h"
#include "stack/transport/engine_internal.h"
#include "stack/abi/send_entry.h"

namespace uroce::transport {

using detail::can_post_send;

namespace {

/// What a send entry asks for, or nullopt if the QP cannot do it (IBTA
/// 10.8.2: the WR's opcode must suit the QP's service type).
std::optional<WqeKind> send_kind(ibv_qp_type type, std::uint8_t opcode) {
  if (type == IBV_QPT_RAW_PACKET) {  // a whole frame, as written
    if (opcode == IBV_WR_SEND) return WqeKind::kSend;
    return std::nullopt;
  }
  switch (opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: return WqeKind::kSend;
    case IBV_WR_SEND_WITH_INV:
      if (type != IBV_QPT_RC) return std::nullopt;
      return WqeKind::kSend;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      if (type == IBV_QPT_UD) return std::nullopt;
      return WqeKind::kWrite;
    case IBV_WR_RDMA_READ:
      if (type != IBV_QPT_RC) return std::nullopt;
      return WqeKind::kRead;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      if (type != IBV_QPT_RC) return std::nullopt;
      return WqeKind::kAtomic;
    case IBV_WR_ATOMIC_WRITE:  // IBTA 1.5: an 8-byte WRITE the responder stores at once; acknowledged as a WRITE
      if (type != IBV_QPT_RC) return std::nullopt;
      return WqeKind::kWrite;
    case UROCE_WR_FLUSH:  // IBTA 1.5: RC only; acknowledged as a WRITE, with no payload
      if (type != IBV_QPT_RC) return std::nullopt;
      return WqeKind::kWrite;
    case IBV_WR_BIND_MW:  // IBTA 10.6.7.2: windows are bound through connected QPs
    case IBV_WR_LOCAL_INV:
      if (type == IBV_QPT_UD) return std::nullopt;
      return WqeKind::kLocal;
    default: return std::nullopt;
  }
}

/// Whether a send entry is well formed for this QP: the one check for a WR
/// posted here and for an entry an application wrote into a shared ring.
bool send_entry_ok(const Qp& qp, const uroce_send_entry& e) {
  const auto kind = send_kind(qp.type, e.opcode);
  if (!kind) return false;
  const bool inl = (e.send_flags & IBV_SEND_INLINE) != 0;
  if (*kind == WqeKind::kLocal) return e.num_sge == 0 && !inl;  // no data: the fields say what to do
  if (inl) {
    if (e.num_sge != 0 || e.inline_len > qp.cap.max_inline_data || e.inline_len > kMaxInline) return false;
    if (*kind == WqeKind::kRead || *kind == WqeKind::kAtomic) return false;
  } else if (e.num_sge > qp.cap.max_send_sge || e.num_sge > kMaxSge) {
    return false;
  }
  if (*kind == WqeKind::kAtomic) {
    if (e.num_sge != 1 || e.sg_list[0].length != 8) return false;
  }
  if (e.opcode == UROCE_WR_FLUSH) {
    // No data; a known placement type and selectivity level, nothing else in the FETH.
    const std::uint32_t type = e.imm_or_inv & 0xf, level = (e.imm_or_inv >> 4) & 3;
    return e.num_sge == 0 && !inl && type != 0 && (type & ~3u) == 0 && level <= UROCE_FLUSH_MR &&
           (e.imm_or_inv & ~0x3fu) == 0 && e.op.flush.length <= 0xffffffffu;
  }
  if (e.opcode == IBV_WR_ATOMIC_WRITE) {
    // Exactly 8 bytes, from one SGE or inline, to an 8-byte aligned address.
    const std::uint64_t len = inl ? e.inline_len : (e.num_sge == 1 ? e.sg_list[0].length : 0);
    if (len != 8 || (e.op.rdma.remote_addr & 7) != 0) return false;
  }
  return true;
}

}  // namespace

int Engine::post_send(Qp* qp, const SendWr& wr) {
  if (qp == nullptr || !can_post_send(qp->state)) return EINVAL;
  // The heap ring's producer: the WR as verbs has it, written by the one
  // encoder (abi/send_entry.h), then checked as the engine checks every
  // entry it takes.
  if (wr.sg_list.size() > kMaxSge || wr.opcode > 0xff) return EINVAL;
  ibv_sge sg[kMaxSge];
  for (std::size_t i = 0; i < wr.sg_list.size(); ++i)
    sg[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
  ibv_send_wr v{};
  v.wr_id = wr.wr_id;
  v.opcode = wr.opcode;
  v.send_flags = wr.send_flags;
  v.sg_list = sg;
  v.num_sge = static_cast<int>(wr.sg_list.size());
  if (wr.opcode == IBV_WR_SEND_WITH_INV || wr.opcode == IBV_WR_LOCAL_INV) v.invalidate_rkey = wr.invalidate_rkey;
  else v.imm_data = htonl(wr.imm_data);
  ibv_mw mw{};
  ibv_mr mr{};
  if (wr.opcode == IBV_WR_BIND_MW) {
    mw.rkey = wr.bind_mw_rkey;
    mr.lkey = wr.bind_mr_lkey;
    v.bind_mw.mw = &mw;
    v.bind_mw.rkey = wr.bind_new_rkey;
    v.bind_mw.bind_info = {&mr, wr.bind_addr, wr.bind_length, wr.bind_access};
  } else if (qp->type == IBV_QPT_UD) {
    v.wr.ud.remote_qpn = wr.remote_qpn;
    v.wr.ud.remote_qkey = wr.remote_qkey;
  } else if (wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
             wr.opcode == static_cast<ibv_wr_opcode>(UROCE_WR_FLUSH)) {
    v.wr.atomic = {wr.remote_addr, wr.compare_add, wr.opcode == static_cast<ibv_wr_opcode>(UROCE_WR_FLUSH) ? wr.imm_data : wr.swap,
                   wr.rkey};
  } else {
    v.wr.rdma = {wr.remote_addr, wr.rkey};
  }
  v.qp_type.xrc.remote_srqn = wr.xrc_srqn;
  abi::SendAv av;
  if (wr.ah) av = {wr.ah->dgid.b.data(), wr.ah->dmac.data(), wr.ah->traffic_class};
  uroce_send_entry e;
  if (abi::encode_send(v, {qp->type == IBV_QPT_UD, qp->xrc == Xrc::kSend}, &av, e) != nullptr) return EINVAL;
  if (!send_entry_ok(*qp, e)) return EINVAL;
  if (qp->sq_ring.used() >= qp->cap.max_send_wr || !qp->sq_ring.push(e)) return ENOMEM;
  take_posts(qp);
  return 0;
}

void Engine::to_send_wqe(const Qp& qp, const uroce_send_entry& e, SendWqe& w) const {
  w.reset();
  w.wr_id = e.wr_id;
  if (!send_entry_ok(qp, e)) {
    w.refused = true;
    return;
  }
  fill_send_wqe(qp, e, w);
}

void Engine::fill_send_wqe(const Qp& qp, const uroce_send_entry& e, SendWqe& w) {
  w.opcode = static_cast<ibv_wr_opcode>(e.opcode);
  w.kind = *send_kind(qp.type, e.opcode);
  w.flags = e.send_flags;
  if (e.send_flags & IBV_SEND_INLINE) {
    std::memcpy(w.inline_data, e.sg_list, e.inline_len);
    w.length = e.inline_len;
    w.is_inline = true;
  } else {
    w.nsge = e.num_sge;
    for (std::uint32_t i = 0; i < w.nsge; ++i) {
      w.sge[i] = {e.sg_list[i].addr, e.sg_list[i].length, e.sg_list[i].lkey};
      w.length += e.sg_list[i].length;
    }
  }
  w.imm = e.imm_or_inv;
  w.invalidate_rkey = e.imm_or_inv;
  // Each operation's fields from its own layout (abi/send_entry.h wrote them).
  if (qp.type == IBV_QPT_UD) {
    std::memcpy(w.ah.dgid.b.data(), e.op.ud.dgid, 16);
    std::memcpy(w.ah.dmac.data(), e.op.ud.dmac, 6);
    w.ah.traffic_class = e.op.ud.traffic_class;
    w.remote_qpn = e.op.ud.remote_qpn;
    w.remote_qkey = e.op.ud.remote_qkey;
    return;
  }
  if (e.opcode == IBV_WR_BIND_MW) {
    w.bind = {e.imm_or_inv, e.op.bind.new_rkey, e.op.bind.mr_lkey, e.op.bind.addr, e.op.bind.length, e.op.bind.access};
  } else if (e.opcode == UROCE_WR_FLUSH) {
    w.remote_addr = e.op.flush.remote_addr;
    w.rkey = e.op.flush.rkey;
    w.compare_add = e.op.flush.length;
  } else if (w.kind == WqeKind::kAtomic) {
    w.remote_addr = e.op.atomic.remote_addr;
    w.rkey = e.op.atomic.rkey;
    w.compare_add = e.op.atomic.compare_add;
    w.swap = e.op.atomic.swap;
  } else if (w.kind != WqeKind::kLocal) {
    w.remote_addr = e.op.rdma.remote_addr;
    w.rkey = e.op.rdma.rkey;
  }
  // The same place in every layout that has one (uroce_abi.h).
  if (qp.xrc == Xrc::kSend) w.xrc_srqn = e.op.rdma.xrc_srqn & 0xffffffu;
}

ibv_wc_status Engine::exec_local(Qp& qp, const SendWqe& w) {
  if (w.opcode == IBV_WR_LOCAL_INV)
    return mrs_.invalidate(w.invalidate_rkey, qp.pd, qp.handle) ? IBV_WC_SUCCESS : IBV_WC_LOC_QP_OP_ERR;
  return mrs_.bind(w.bind, qp.pd, qp.handle);
}

std::size_t Engine::fetch_sends(Qp& qp) {
  if (!can_post_send(qp.state) || !qp.sq_ring.valid()) return 0;  // taken once the QP reaches RTS
  std::size_t n = 0;
  uroce_send_entry e;
  // The shadow has as many slots as the ring, and the producer cannot get
  // more than that ahead of what completed, so a slot is always free here.
  while (!qp.sq.full() && qp.sq_ring.peek(qp.sq.tail() - qp.sq_internal_in, e)) {
    to_send_wqe(qp, e, *qp.sq.emplace());
    ++n;
  }
  return n;
}

std::size_t Engine::take_posts(Qp* qp, bool* more) {
  if (qp == nullptr || qp->quarantine_until) return 0;
  if (!can_post_send(qp->state) || qp->state == IBV_QPS_RESET) {
    // Posted where verbs refuses a post (sends before RTS, receives in
    // RESET): the application hears of each as a LOC_QP_OP_ERR completion,
    // in order, and nothing touches the wire. One ring's worth per call, so
    // a producer that refills as fast as this refuses cannot keep the
    // engine here; `more` tells the caller to look again.
    std::size_t n = 0;
    uroce_send_entry e;
    const std::uint32_t cap = qp->sq_ring.valid() ? qp->sq_ring.capacity() : 0;
    while (n < cap && !can_post_send(qp->state) && qp->sq_ring.peek(qp->sq.tail() - qp->sq_internal_in, e)) {
      SendWqe* w = qp->sq.emplace();
      w->reset();
      w->wr_id = e.wr_id;
      port_ctr_.inc(PortCounter::bad_wqe);
      complete_send(*qp, IBV_WC_LOC_QP_OP_ERR);
      ++n;
    }
    if (more && n >= cap && cap != 0) *more = true;
    RecvWqe r;
    bool bad;
    std::uint32_t k = 0;
    for (; k < qp->rq.capacity() && qp->state == IBV_QPS_RESET && !qp->srq && qp->rq.take(r, bad); ++k) {
      port_ctr_.inc(PortCounter::bad_wqe);
      complete_recv(*qp, r, IBV_WC_LOC_QP_OP_ERR, IBV_WC_RECV, 0);
      ++n;
    }
    if (more && k != 0 && k >= qp->rq.capacity()) *more = true;
    return n;
  }
  const std::size_t n = fetch_sends(*qp);
  if (qp->state == IBV_QPS_ERR) {
    flush_wqes(*qp);  // and what was posted to the RQ meanwhile
    // flush takes one ring's worth of each; what a refilling producer
    // published meanwhile is looked at again on the next pass.
    if (more && (qp->rq.depth() > 0 || qp->sq_ring.pending() > 0)) *more = true;
  } else if (n) {
    activate(*qp);
  }
  return n;
}

bool Engine::datagrams_unsent(const Qp* qp) const {
  if (qp == nullptr || qp->quarantine_until || (qp->type != IBV_QPT_UD && qp->type != IBV_QPT_UC)) return false;
  if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD) return false;
  return !qp->sq.empty() || (qp->sq_ring.valid() && qp->sq_ring.pending() > 0);
}

int Engine::post_recv(Qp* qp, const RecvWr& wr) {
  if (qp == nullptr || qp->srq != nullptr || qp->state == IBV_QPS_RESET) return EINVAL;
  if (const int rc = qp->rq.post(wr)) return rc;
  if (qp->state == IBV_QPS_ERR) flush_wqes(*qp);
  return 0;
}

int Engine::post_srq_recv(Srq* srq, const RecvWr& wr) {
  if (srq == nullptr) return EINVAL;
  return srq->post(wr);
}

bool Engine::translate_sges(Qp& qp, SendWqe& w) {
  if (w.is_inline) return true;
  // SGE addresses are in the application's address space (the MR's IOVA);
  // the MR translates them to where the bytes are for us.
  const unsigned need = (w.kind == WqeKind::kRead || w.kind == WqeKind::kAtomic) ? IBV_ACCESS_LOCAL_WRITE : 0;
  for (std::uint32_t i = 0; i < w.nsge; ++i)
    if (mrs_.check(w.sge[i].lkey, false, qp.pd, 0, w.sge[i].addr, w.sge[i].length, need, &w.local[i]) != KeyCheck::kOk)
      return false;
  return true;
}

bool Engine::take_recv(Qp& qp, RecvWqe& out) {
  // Straight from the ring the application posts to: a receive posted an
  // instant before the SEND arrived is found, not answered with an RNR NAK.
  RecvQueue& q = qp.srq ? qp.srq->queue() : qp.rq;
  bool bad = false;
  if (!q.take(out, bad)) return false;
  return !bad || take_recv_past_bad(qp, q, out);
}

bool Engine::take_recv_past_bad(Qp& qp, RecvQueue& q, RecvWqe& out) {
  // Each malformed entry completes in error. Past one ring's worth of them:
  // no receive now (RNR), so a producer refilling garbage cannot keep the
  // responder here.
  bool bad = true;
  for (std::uint32_t n = 1, cap = q.capacity();; ++n) {
    port_ctr_.inc(PortCounter::bad_wqe);
    complete_recv(qp, out, IBV_WC_LOC_QP_OP_ERR, IBV_WC_RECV, 0);
    if (n >= cap || !q.take(out, bad)) return false;
    if (!bad) return true;
  }
}

}  // namespace uroce::transport
