// Tag matching (uroce_abi.h: tag matching), as ConnectX offers it through
// ibv_post_srq_ops: a tag-matching SRQ's list of tagged buffers, the
// operations that change it, and the messages that reach it. A message
// starts with a TMH; an EAGER one that matches a tag lands in that tag's
// buffer, a RNDV one has the engine READ the data from the sender into it
// and then SEND the sender a FIN, and anything else takes a receive, whole.
#include <algorithm>
#include <cstring>

#include <infiniband/tm_types.h>

#include "stack/abi/send_entry.h"
#include "stack/transport/engine.h"
#include "stack/wire/be.h"

namespace uroce::transport {

namespace {
/// The tag-matching header and the rendezvous header after it (struct
/// ibv_tmh, struct ibv_rvh), as they are on the wire.
struct Tmh {
  std::uint8_t opcode;  // enum ibv_tmh_op
  std::uint8_t reserved[3];
  wire::be32 app_ctx;
  wire::be64 tag;
};
struct Rvh {
  wire::be64 va;
  wire::be32 rkey;
  wire::be32 len;
};
static_assert(sizeof(Tmh) == UROCE_TMH_BYTES && sizeof(Rvh) == UROCE_RVH_BYTES && alignof(Tmh) == 1);
}  // namespace

bool Engine::make_tm(Srq* srq, Cq* cq, std::uint32_t max_tags, const abi::Ring<uroce_tm_op>& ops,
                     std::uint32_t* released) {
  if (srq == nullptr || cq == nullptr || srq->tm || srq->cq() || srq->xrcd() || max_tags == 0 ||
      max_tags > UROCE_TM_MAX_TAGS || !ops.valid() || released == nullptr)
    return false;
  // Its QPs get their rendezvous slots when they are made: none yet.
  for (const auto& q : qps_)
    if (q && q->srq == srq) return false;
  auto tm = std::make_unique<TagMatch>();
  tm->ops = ops;
  tm->released = released;
  tm->tags.resize(max_tags);
  tm->cq = cq;
  srq->tm = std::move(tm);
  return true;
}

std::size_t Engine::run_tm_ops(Srq& srq) {
  if (!srq.tm) return 0;
  TagMatch& tm = *srq.tm;
  std::size_t n = 0;
  uroce_tm_op op;
  // One ring's worth at most: a producer refilling as fast as this takes
  // cannot keep the engine here.
  while (n < tm.ops.capacity() && tm.ops.pop(op)) {
    exec_tm_op(tm, op);
    ++n;
  }
  return n;
}

void Engine::exec_tm_op(TagMatch& tm, const uroce_tm_op& op) {
  ibv_wc_status st = IBV_WC_SUCCESS;
  ibv_wc_opcode wop = IBV_WC_TM_SYNC;
  unsigned flags = 0;
  const bool known_tag = op.handle < tm.tags.size();
  switch (op.opcode) {
    case IBV_WR_TAG_ADD: {
      wop = IBV_WC_TM_ADD;
      if (op.flags & IBV_OPS_TM_SYNC) tm.synced = op.unexpected_cnt;
      if (!known_tag || tm.tags[op.handle].valid || tm.tags[op.handle].busy || op.num_sge > UROCE_TM_MAX_SGE) {
        st = IBV_WC_TM_ERR;
        break;
      }
      TagEntry& t = tm.tags[op.handle];
      t.valid = true;
      t.gen = op.gen;
      t.tag = op.tag;
      t.mask = op.mask;
      t.order = tm.next_order++;
      t.buf = RecvWqe{};
      t.buf.wr_id = op.recv_wr_id;
      t.buf.nsge = op.num_sge;
      if (op.num_sge) {
        t.buf.sge[0] = {op.sge.addr, op.sge.length, op.sge.lkey};
        t.buf.length = op.sge.length;
      }
      break;
    }
    case IBV_WR_TAG_DEL:
      wop = IBV_WC_TM_DEL;
      if (!known_tag || !tm.tags[op.handle].valid || tm.tags[op.handle].gen != op.gen) {
        st = IBV_WC_TM_ERR;  // matched already, or never added
        break;
      }
      tm.release(tm.tags[op.handle]);
      break;
    case IBV_WR_TAG_SYNC: tm.synced = op.unexpected_cnt; break;
    default: st = IBV_WC_TM_ERR; break;
  }
  // Out of sync: the application has not yet said it saw every unexpected
  // message, and nothing matches until it does.
  if (!tm.in_sync()) flags |= IBV_WC_TM_SYNC_REQ;
  if ((op.flags & IBV_OPS_SIGNALED) || st != IBV_WC_SUCCESS)
    push_tm_cqe(*tm.cq, op.wr_id, st, wop, 0, flags, 0, 0, 0);
}

void Engine::push_tm_cqe(Cq& cq, std::uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode op, std::uint32_t byte_len,
                         unsigned flags, std::uint32_t qpn, std::uint64_t tag, std::uint32_t ctx) {
  uroce_cq_entry e{};
  e.wr_id = wr_id;
  e.status = status;
  e.opcode = op;
  e.byte_len = byte_len;
  e.wc_flags = flags;
  e.qp_num = qpn;
  e.src_qp = static_cast<std::uint32_t>(tag);
  e.tag_hi = static_cast<std::uint32_t>(tag >> 32);
  e.vendor_err = status == IBV_WC_SUCCESS ? ctx : 0;
  e.timestamp = last_now_;
  push_cqe(cq, e);
}

bool Engine::push_internal(Qp& qp, ibv_wr_opcode op, std::uint16_t tag, uroce_send_entry e) {
  SendWqe* w = qp.sq.emplace();
  if (w == nullptr) return false;
  e.opcode = static_cast<std::uint8_t>(op);
  w->reset();
  fill_send_wqe(qp, e, *w);
  w->internal = true;
  w->tm_tag = tag;
  ++qp.sq_internal_in;
  activate(qp);
  return true;
}

void Engine::complete_internal(Qp& qp, ibv_wc_status status) {
  SendWqe& w = qp.sq.front();
  const bool read = w.kind == WqeKind::kRead;
  const std::uint16_t idx = w.tm_tag;
  const auto len = static_cast<std::uint32_t>(w.length);
  if (w.started && read && qp.req.rd_atomic_inflight > 0) --qp.req.rd_atomic_inflight;
  if (qp.req.cursor == qp.sq.head()) {
    ++qp.req.cursor;
    qp.req.cursor_pkt = 0;
  }
  qp.sq.pop();
  ++qp.sq_internal_out;
  // A FIN's completion says nothing the application hears of.
  if (!read || !qp.srq || !qp.srq->tm || idx >= qp.srq->tm->tags.size()) return;
  TagMatch& tm = *qp.srq->tm;
  TagEntry& t = tm.tags[idx];
  if (status == IBV_WC_SUCCESS) {
    // The data is in: the sender hears so by a FIN (a TMH alone).
    Tmh tmh{};
    tmh.opcode = IBV_TMH_FIN;
    tmh.tag.set(t.tag);
    ibv_sge sg{reinterpret_cast<std::uint64_t>(&tmh), UROCE_TMH_BYTES, 0};
    ibv_send_wr fin{};
    fin.opcode = IBV_WR_SEND;
    fin.send_flags = IBV_SEND_INLINE;
    fin.sg_list = &sg;
    fin.num_sge = 1;
    uroce_send_entry e;
    if (abi::encode_send(fin, {}, nullptr, e) != nullptr || !push_internal(qp, IBV_WR_SEND, idx, e))
      status = IBV_WC_TM_RNDV_INCOMPLETE;
  }
  push_tm_cqe(*qp.recv_cq, t.buf.wr_id, status, IBV_WC_TM_RECV, status == IBV_WC_SUCCESS ? len : 0,
              status == IBV_WC_SUCCESS ? IBV_WC_TM_DATA_VALID : 0, qp.qpn, 0, 0);
  tm.release(t);
}

void Engine::tm_drop_internal(Qp& qp) {
  if (qp.sq_internal_in == qp.sq_internal_out || !qp.srq || !qp.srq->tm) return;
  TagMatch& tm = *qp.srq->tm;
  // A rendezvous READ dropped unfinished (the QP reset or destroyed): its
  // tag leaves the list, so the application may add the index again.
  for (std::uint32_t i = qp.sq.head(); i != qp.sq.tail(); ++i) {
    const SendWqe& w = qp.sq.at(i);
    if (w.internal && w.kind == WqeKind::kRead && w.tm_tag < tm.tags.size() && tm.tags[w.tm_tag].busy)
      tm.release(tm.tags[w.tm_tag]);
  }
}

bool Engine::tm_start(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  TagMatch& tm = *qp.srq->tm;
  using Tm = Responder::Tm;
  const auto p = pkt.payload();
  s.tm = Tm::kNoTag;  // a short message, a FIN or an unknown opcode: a receive, whole
  s.tm_ctx = 0;
  s.tm_msg_tag = 0;
  if (p.size() >= UROCE_TMH_BYTES) {
    const auto& tmh = *reinterpret_cast<const Tmh*>(p.data());
    const std::uint8_t op = tmh.opcode;
    if (op == IBV_TMH_EAGER || op == IBV_TMH_RNDV) {
      s.tm = Tm::kUnexpected;
      const bool has_rvh = p.size() >= UROCE_TMH_BYTES + UROCE_RVH_BYTES;
      TagEntry* t = tm.in_sync() && (op == IBV_TMH_EAGER || has_rvh) ? tm.match(tmh.tag.get()) : nullptr;
      if (t) {
        t->valid = false;
        t->busy = true;
        s.tm = op == IBV_TMH_EAGER ? Tm::kEager : Tm::kRndv;
        s.tm_tag = static_cast<std::uint16_t>(t - tm.tags.data());
        s.tm_ctx = tmh.app_ctx.get();
        s.tm_msg_tag = tmh.tag.get();
        s.rwqe = t->buf;
        if (op == IBV_TMH_RNDV) {
          const auto& rvh = *reinterpret_cast<const Rvh*>(p.data() + UROCE_TMH_BYTES);
          s.rndv_va = rvh.va.get();
          s.rndv_rkey = rvh.rkey.get();
          s.rndv_len = rvh.len.get();
        }
        return true;
      }
    }
  }
  return take_recv(qp, s.rwqe);
}

Engine::Exec Engine::tm_place(Qp& qp, const wire::Packet& pkt) {
  Responder& s = qp.resp;
  if (s.tm == Responder::Tm::kRndv) return Exec::kOk;  // the header: read, never placed
  // EAGER: the bytes after the TMH, from the start of the tag's buffer.
  auto data = pkt.payload();
  std::uint64_t at = s.offset;
  if (at < UROCE_TMH_BYTES) {
    const std::size_t drop = std::min<std::uint64_t>(UROCE_TMH_BYTES - at, data.size());
    data = data.subspan(drop);
    at += drop;
  }
  at -= UROCE_TMH_BYTES;
  if (at + data.size() > s.rwqe.length) {
    push_tm_cqe(*qp.recv_cq, s.rwqe.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_TM_RECV, 0, 0, qp.qpn, 0, 0);
    tm_abort(qp);
    return Exec::kNakInvalid;
  }
  if (!data.empty() && !scatter_recv(mrs_, qp.pd, s.rwqe, at, data)) {
    push_tm_cqe(*qp.recv_cq, s.rwqe.wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_TM_RECV, 0, 0, qp.qpn, 0, 0);
    tm_abort(qp);
    return Exec::kNakOp;
  }
  return Exec::kOk;
}

void Engine::tm_finish(Qp& qp, std::uint32_t byte_len, unsigned flags, std::uint32_t extra) {
  Responder& s = qp.resp;
  TagMatch& tm = *qp.srq->tm;
  using Tm = Responder::Tm;
  const Tm kind = s.tm;
  s.tm = Tm::kNone;
  if (kind == Tm::kNoTag || kind == Tm::kUnexpected) {
    // A receive's, whole; an unexpected tagged one stops matching until the
    // application syncs.
    if (kind == Tm::kUnexpected) ++tm.unexpected;
    complete_recv(qp, s.rwqe, IBV_WC_SUCCESS, kind == Tm::kNoTag ? IBV_WC_TM_NO_TAG : IBV_WC_TM_RECV, byte_len, flags,
                  extra);
    return;
  }
  TagEntry& t = tm.tags[s.tm_tag];
  if (kind == Tm::kEager) {
    const std::uint32_t data = byte_len > UROCE_TMH_BYTES ? byte_len - UROCE_TMH_BYTES : 0;
    push_tm_cqe(*qp.recv_cq, t.buf.wr_id, IBV_WC_SUCCESS, IBV_WC_TM_RECV, data,
                flags | IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID, qp.qpn, s.tm_msg_tag, s.tm_ctx);
    tm.release(t);
    return;
  }
  // RNDV: matched now, the data after the READ (complete_internal).
  push_tm_cqe(*qp.recv_cq, t.buf.wr_id, IBV_WC_SUCCESS, IBV_WC_TM_RECV, 0, flags | IBV_WC_TM_MATCH, qp.qpn,
              s.tm_msg_tag, s.tm_ctx);
  ibv_sge sg[kMaxSge];
  ibv_send_wr rd{};
  rd.opcode = IBV_WR_RDMA_READ;
  rd.sg_list = sg;
  rd.wr.rdma = {s.rndv_va, s.rndv_rkey};
  // The tag's buffer, cut to the length the sender offers.
  std::uint64_t left = s.rndv_len;
  for (std::uint32_t i = 0; i < t.buf.nsge && i < kMaxSge && left > 0; ++i) {
    const auto take = static_cast<std::uint32_t>(std::min<std::uint64_t>(left, t.buf.sge[i].length));
    sg[rd.num_sge++] = {t.buf.sge[i].addr, take, t.buf.sge[i].lkey};
    left -= take;
  }
  uroce_send_entry e;
  ibv_wc_status st = IBV_WC_SUCCESS;
  if (left > 0) st = IBV_WC_LOC_LEN_ERR;  // more than the tag's buffer holds
  else if (abi::encode_send(rd, {}, nullptr, e) != nullptr || !push_internal(qp, IBV_WR_RDMA_READ, s.tm_tag, e))
    st = IBV_WC_TM_RNDV_INCOMPLETE;
  if (st != IBV_WC_SUCCESS) {
    push_tm_cqe(*qp.recv_cq, t.buf.wr_id, st, IBV_WC_TM_RECV, 0, 0, qp.qpn, 0, 0);
    tm.release(t);
  }
}

void Engine::tm_abort(Qp& qp) {
  Responder& s = qp.resp;
  if ((s.tm == Responder::Tm::kEager || s.tm == Responder::Tm::kRndv) && qp.srq && qp.srq->tm &&
      s.tm_tag < qp.srq->tm->tags.size())
    qp.srq->tm->release(qp.srq->tm->tags[s.tm_tag]);
  s.tm = Responder::Tm::kNone;
}

}  // namespace uroce::transport
