// The QP state machine (IBTA 10.3.1): the transitions and attributes
// modify_qp accepts, what each transition does to the QP, the one bring-up
// sequence, query_qp, and the move to ERR the engine makes on its own.
#include <cerrno>
#include <cstring>

#include "stack/transport/engine.h"
#include "stack/transport/engine_internal.h"

namespace uroce::transport {

using detail::can_post_send;
using wire::Psn;

namespace {

// IBTA 10.3.1 / table of ib_modify_qp_is_ok: attributes required and allowed
// per transition and transport.
struct Transition {
  int required;
  int optional;
};

constexpr int kRcUcRtrReq = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
constexpr int kRcRtrReq = kRcUcRtrReq | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRcRtsReq = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;

bool legal(ibv_qp_state from, ibv_qp_state to) {
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return true;
  switch (from) {
    case IBV_QPS_RESET: return to == IBV_QPS_INIT;
    case IBV_QPS_INIT: return to == IBV_QPS_INIT || to == IBV_QPS_RTR;
    case IBV_QPS_RTR: return to == IBV_QPS_RTS;
    case IBV_QPS_RTS: return to == IBV_QPS_RTS || to == IBV_QPS_SQD;
    case IBV_QPS_SQD: return to == IBV_QPS_SQD || to == IBV_QPS_RTS;
    case IBV_QPS_SQE: return to == IBV_QPS_RTS;
    default: return false;
  }
}

Transition transition(ibv_qp_type t, ibv_qp_state from, ibv_qp_state to) {
  // The kernel's qp_state_table (ib_modify_qp_is_ok) transcribes IBTA 10.3.1.
  const bool rc = t == IBV_QPT_RC, ud = t == IBV_QPT_UD;
  constexpr int kCur = IBV_QP_CUR_STATE;
  if (t == IBV_QPT_RAW_PACKET) {
    // No address, PSN or keys: the port at INIT, and the state alone after.
    if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) return {IBV_QP_PORT, 0};
    if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) return {0, IBV_QP_PORT};
    if ((from == IBV_QPS_RTS || from == IBV_QPS_SQE) && to == IBV_QPS_RTS) return {0, kCur};
    return {0, 0};
  }
  constexpr int kPath = IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
  if (t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV) {
    // The kernel's table for XRC_INI and XRC_TGT: RC's, less the responder's
    // attributes at an initiator's RTR and the requester's at a target's
    // RTS (which each may still give, as RC's, and which go unused).
    const Transition r = transition(IBV_QPT_RC, from, to);
    const bool ini = t == IBV_QPT_XRC_SEND;
    if (from == IBV_QPS_INIT && to == IBV_QPS_RTR && ini)
      return {kRcUcRtrReq, r.optional | (kRcRtrReq & ~kRcUcRtrReq)};
    if (from == IBV_QPS_RTR && to == IBV_QPS_RTS && !ini)
      return {IBV_QP_SQ_PSN | IBV_QP_TIMEOUT, r.optional | (kRcRtsReq & ~(IBV_QP_SQ_PSN | IBV_QP_TIMEOUT))};
    return r;
  }
  const int base_init = IBV_QP_PKEY_INDEX | IBV_QP_PORT | (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) return {base_init, 0};
  if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) return {0, base_init};
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    if (ud) return {0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY};
    return {rc ? kRcRtrReq : kRcUcRtrReq, IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH};
  }
  if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    if (ud) return {IBV_QP_SQ_PSN, kCur | IBV_QP_QKEY};
    return {rc ? kRcRtsReq : IBV_QP_SQ_PSN,
            kCur | IBV_QP_ACCESS_FLAGS | kPath | (rc ? IBV_QP_MIN_RNR_TIMER : 0)};
  }
  if ((from == IBV_QPS_RTS || from == IBV_QPS_SQD) && to == IBV_QPS_RTS) {
    if (ud) return {0, kCur | IBV_QP_QKEY};
    return {0, kCur | IBV_QP_ACCESS_FLAGS | kPath | (rc ? IBV_QP_MIN_RNR_TIMER : 0)};
  }
  if (from == IBV_QPS_SQE && to == IBV_QPS_RTS) return {0, kCur | (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS)};
  if (from == IBV_QPS_RTS && to == IBV_QPS_SQD) return {0, IBV_QP_EN_SQD_ASYNC_NOTIFY};
  if (from == IBV_QPS_SQD && to == IBV_QPS_SQD) {
    if (ud) return {0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY};
    const int both = IBV_QP_PORT | IBV_QP_AV | kCur | kPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    return {0, rc ? both | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER
                  : both};
  }
  return {0, 0};  // to RESET or ERR
}

}  // namespace

ModifyResult Engine::modify_qp(Qp* qp, const ibv_qp_attr& a, int mask) {
  if (qp == nullptr) return {EINVAL, "no such QP"};
  const ibv_qp_state from = qp->state;
  if ((mask & IBV_QP_CUR_STATE) && a.cur_qp_state != from) return {EINVAL, "cur_qp_state does not match"};
  const ibv_qp_state to = (mask & IBV_QP_STATE) ? a.qp_state : from;
  if (to > IBV_QPS_ERR) return {EINVAL, "unknown target state"};
  if (!legal(from, to)) return {EINVAL, "illegal state transition"};
  const Transition tr = transition(qp->xrc == Xrc::kSend   ? IBV_QPT_XRC_SEND
                                   : qp->xrc == Xrc::kRecv ? IBV_QPT_XRC_RECV
                                                           : qp->type,
                                   from, to);
  const int given = mask & ~IBV_QP_STATE;  // CUR_STATE only where the table allows it
  if ((given & tr.required) != tr.required) return {EINVAL, "a required attribute for this transition is missing"};
  if ((given & ~(tr.required | tr.optional)) != 0) return {EINVAL, "an attribute not allowed for this transition"};

  // Validate every given attribute before changing anything.
  if ((mask & IBV_QP_PATH_MTU) && mtu_bytes(a.path_mtu) == 0) return {EINVAL, "path_mtu must be 256..4096"};
  if ((mask & IBV_QP_DEST_QPN) && a.dest_qp_num > wire::Psn::kMask) return {EINVAL, "dest_qp_num over 24 bits"};
  if ((mask & IBV_QP_RQ_PSN) && a.rq_psn > wire::Psn::kMask) return {EINVAL, "rq_psn over 24 bits"};
  if ((mask & IBV_QP_SQ_PSN) && a.sq_psn > wire::Psn::kMask) return {EINVAL, "sq_psn over 24 bits"};
  if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return {EINVAL, "timeout must be 0..31"};
  if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return {EINVAL, "retry_cnt must be 0..7"};
  if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return {EINVAL, "rnr_retry must be 0..7"};
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return {EINVAL, "min_rnr_timer must be 0..31"};
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > kMaxRdAtomic)
    return {EINVAL, "max_rd_atomic over the device limit (16)"};
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > kMaxRdAtomic)
    return {EINVAL, "max_dest_rd_atomic over the device limit (16)"};
  if ((mask & IBV_QP_PORT) && a.port_num != 1) return {EINVAL, "port_num must be 1"};
  if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index != 0) return {EINVAL, "pkey_index must be 0"};
  if ((mask & IBV_QP_ACCESS_FLAGS) &&
      (a.qp_access_flags & ~unsigned(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                     IBV_ACCESS_LOCAL_WRITE | UROCE_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_ON_DEMAND)))
    return {EINVAL, "unsupported qp_access_flags"};
  wire::MacAddr mac{};
  wire::IpAddr dip{};
  if (mask & IBV_QP_AV) {
    if (!a.ah_attr.is_global) return {EINVAL, "RoCE needs a global address (ah_attr.is_global)"};
    std::memcpy(dip.b.data(), a.ah_attr.grh.dgid.raw, 16);
    const auto found = neighbors_.lookup(dip);
    if (!found) return {EHOSTUNREACH, "no neighbour entry for the destination GID"};
    mac = *found;
  }

  if (mask & IBV_QP_PATH_MTU) {
    qp->path_mtu = a.path_mtu;
    qp->mtu = mtu_bytes(a.path_mtu);
  }
  if (mask & IBV_QP_DEST_QPN) qp->dest_qp_num = a.dest_qp_num;
  if (mask & IBV_QP_QKEY) qp->qkey = a.qkey;
  if (mask & IBV_QP_TIMEOUT) qp->timeout = a.timeout;
  if (mask & IBV_QP_RETRY_CNT) qp->retry_cnt = a.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) qp->rnr_retry = a.rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER) qp->min_rnr_timer = a.min_rnr_timer;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) qp->max_rd_atomic = a.max_rd_atomic;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) qp->max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & IBV_QP_ACCESS_FLAGS) qp->access = a.qp_access_flags;  // ON_DEMAND among them: the MRs' business, as on rxe
  if (mask & IBV_QP_AV) {
    qp->remote_ip = dip;
    qp->remote_mac = mac;
    qp->traffic_class = a.ah_attr.grh.traffic_class;
    qp->hop_limit = a.ah_attr.grh.hop_limit;
    qp->flow_label = a.ah_attr.grh.flow_label & 0xfffff;
    qp->sl = a.ah_attr.sl;
  }
  if (mask & IBV_QP_RQ_PSN) {
    qp->rq_psn = Psn(a.rq_psn);
    qp->resp.epsn = qp->rq_psn;
  }
  if (mask & IBV_QP_SQ_PSN) {
    qp->sq_psn = Psn(a.sq_psn);
    qp->req.next_psn = qp->req.sent_hi = qp->req.una = qp->sq_psn;
  }

  if (to == IBV_QPS_RESET && from != IBV_QPS_RESET) {
    // Back to a clean slate: queues emptied without completions (IBTA 10.3.1).
    std::erase(active_, qp);
    std::erase(ack_waiters_, qp);
    wheel_.cancel(*qp);
    qp->active = false;
    // What was posted is dropped: the shadow, and whatever is still in the rings.
    // At most one ring's worth each: a producer refilling as fast as this
    // drains must not keep the engine here.
    tm_drop_internal(*qp);
    std::uint32_t i = qp->sq.tail() - qp->sq_internal_in;
    uroce_send_entry e;
    for (std::uint32_t n = 0; n < qp->sq_ring.capacity() && qp->sq_ring.peek(i, e); ++n) ++i;
    qp->sq.reset_to(i);
    qp->sq_ring.release(i);
    qp->sq_internal_in = qp->sq_internal_out = 0;
    RecvWqe r;
    bool bad;
    for (std::uint32_t n = 0; n < qp->rq.capacity() && qp->rq.take(r, bad); ++n) {
    }
    qp->req = Requester{};
    qp->req.cursor = qp->sq.head();  // the shadow's indices go on from the ring's
    qp->resp = Responder{};
    qp->rtt = cc::RttStats{};
    if (qp->sr) *qp->sr = SrState{};
  }
  if (to == IBV_QPS_RTS && from == IBV_QPS_RTR) {
    renew_retries(*qp);
    qp->udp_sport = wire::udp_sport_for(qp->qpn, qp->dest_qp_num);
  }
  if (to == IBV_QPS_RTR && qp->type == IBV_QPT_UD) qp->udp_sport = wire::udp_sport_for(qp->qpn, qp->qpn);
  // The algorithm starts afresh on the path it now has (its MTU).
  if (to == IBV_QPS_RTR && from != IBV_QPS_RTR && qp->cc) set_cc(qp, qp->cc->name());
  // Sends an application published before RTS are refused now, in the old
  // state, whether or not they were taken before: they never run.
  if (to == IBV_QPS_RTS && !can_post_send(from)) take_posts(qp);
  qp->state = to;
  qp->sq_ring.publish_qp_state(to);  // the application's posts check it
  // The headers of its packets, from what this modify set (spec_for's fields).
  if (qp->type == IBV_QPT_UD || qp->type == IBV_QPT_RAW_PACKET || to == IBV_QPS_RESET || to == IBV_QPS_INIT ||
      !qp->tmpl.build(spec_for(*qp, 0, Psn{})))
    qp->tmpl.clear();
  if (to == IBV_QPS_ERR && from != IBV_QPS_ERR) flush_wqes(*qp);
  if (to == IBV_QPS_RTS) activate(*qp);
  return {};
}

ModifyResult Engine::bring_up(Qp* qp, const abi::Connect& c) {
  if (qp == nullptr) return {EINVAL, "no such QP"};
  ModifyResult res;
  abi::bring_up(
      c,
      [&](const ibv_qp_attr& a, int mask) {
        res = modify_qp(qp, a, mask);
        return res.err;
      },
      nullptr, qp->state == IBV_QPS_INIT);
  return res;
}

int Engine::query_qp(const Qp* qp, ibv_qp_attr& a) const {
  if (qp == nullptr) return EINVAL;
  a = ibv_qp_attr{};
  a.qp_state = a.cur_qp_state = qp->state;
  a.path_mtu = qp->path_mtu;
  a.qkey = qp->qkey;
  a.rq_psn = qp->resp.epsn.value();
  a.sq_psn = qp->req.next_psn.value();
  a.dest_qp_num = qp->dest_qp_num;
  a.qp_access_flags = qp->access;
  a.cap.max_send_wr = qp->cap.max_send_wr;
  a.cap.max_recv_wr = qp->cap.max_recv_wr;
  a.cap.max_send_sge = qp->cap.max_send_sge;
  a.cap.max_recv_sge = qp->cap.max_recv_sge;
  a.cap.max_inline_data = qp->cap.max_inline_data;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, qp->remote_ip.b.data(), 16);
  a.ah_attr.grh.traffic_class = qp->traffic_class;
  a.ah_attr.grh.hop_limit = qp->hop_limit;
  a.ah_attr.grh.flow_label = qp->flow_label;
  a.ah_attr.sl = qp->sl;
  a.ah_attr.port_num = qp->port_num;
  a.pkey_index = qp->pkey_index;
  a.max_rd_atomic = qp->max_rd_atomic;
  a.max_dest_rd_atomic = qp->max_dest_rd_atomic;
  a.min_rnr_timer = qp->min_rnr_timer;
  a.port_num = qp->port_num;
  a.timeout = qp->timeout;
  a.retry_cnt = qp->retry_cnt;
  a.rnr_retry = qp->rnr_retry;
  return 0;
}

void Engine::set_error(Qp& qp) {
  if (qp.state == IBV_QPS_ERR) return;
  qp.state = IBV_QPS_ERR;
  qp.sq_ring.publish_qp_state(IBV_QPS_ERR);
  flush_wqes(qp);
}

}  // namespace uroce::transport
