// Verbs objects, on the control path (it may allocate): PDs, MRs and memory
// windows, CQs, SRQs, XRC domains, and QPs from creation to destruction,
// with the quarantine that keeps a destroyed RC QP's number from reuse.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <memory>
#include <vector>

#include "stack/transport/engine.h"

namespace uroce::transport {

namespace {
template <class T>
auto find_owned(std::vector<std::unique_ptr<T>>& v, const T* p) {
  return std::find_if(v.begin(), v.end(), [p](const auto& o) { return o.get() == p; });
}
template <class T>
T* adopt(std::vector<std::unique_ptr<T>>& v, std::uint32_t handle) {
  v.push_back(std::make_unique<T>());
  v.back()->handle = handle;
  return v.back().get();
}
/// A PD or an XRC domain: refused while anything holds it.
template <class T>
int release_held(std::vector<std::unique_ptr<T>>& v, T* p) {
  const auto it = find_owned(v, p);
  if (it == v.end()) return EINVAL;
  if (p->refs != 0) return EBUSY;
  v.erase(it);
  return 0;
}
}  // namespace

Pd* Engine::alloc_pd() { return adopt(pds_, next_handle_++); }

int Engine::dealloc_pd(Pd* pd) { return release_held(pds_, pd); }

Mr* Engine::reg_mr(Pd* pd, void* addr, std::uint64_t len, unsigned access) {
  return reg_mr_iova(pd, addr, len, access, reinterpret_cast<std::uint64_t>(addr));
}

namespace {
bool mr_access_ok(unsigned access) {
  // IBTA 10.6.3.1: remote write or atomic access needs local write too.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) return false;
  // FLUSH to persistence needs persistent memory, which uroce does not have.
  return (access & UROCE_ACCESS_FLUSH_PERSISTENT) == 0;
}
bool mr_range_ok(const void* addr, std::uint64_t len, std::uint64_t iova) {
  return (addr != nullptr || len == 0) && iova + len >= iova;  // no memory, or wrapping the address space
}
}  // namespace

Mr* Engine::reg_mr_iova(Pd* pd, void* addr, std::uint64_t len, unsigned access, std::uint64_t iova) {
  if (pd == nullptr || !mr_range_ok(addr, len, iova) || !mr_access_ok(access)) return nullptr;
  return mrs_.reg(pd, addr, len, access, iova);
}

Mr* Engine::reg_mr_odp(Pd* pd, std::uint64_t app_addr, std::uint64_t len, std::uint64_t iova, unsigned access,
                       int mem_fd) {
  const bool implicit = app_addr == 0 && iova == 0 && len == UINT64_MAX;
  if (pd == nullptr || mem_fd < 0 || len == 0 || (!implicit && (app_addr + len < app_addr || iova + len < iova)) ||
      !mr_access_ok(access))
    return nullptr;
  ensure_bounce();
  return mrs_.reg(pd, reinterpret_cast<void*>(app_addr), len, access, iova, mem_fd);
}

int Engine::rereg_mr(Mr* mr, int flags, Pd* pd, unsigned access, void* addr, std::uint64_t len, std::uint64_t iova) {
  constexpr int kAll = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  if (mr == nullptr || flags == 0 || (flags & ~kAll) != 0) return EINVAL;
  const bool pd_too = (flags & IBV_REREG_MR_CHANGE_PD) != 0;
  const bool memory_too = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0;
  if (pd_too && pd == nullptr) return EINVAL;
  if (!(flags & IBV_REREG_MR_CHANGE_ACCESS))
    access = mr->access;
  else if (!mr_access_ok(access))
    return EINVAL;
  if (memory_too && (addr == nullptr || !mr_range_ok(addr, len, iova))) return EINVAL;
  return mrs_.rereg(mr, pd_too ? pd : nullptr, access, memory_too ? static_cast<std::uint8_t*>(addr) : nullptr, len,
                    iova);
}

int Engine::dereg_mr(Mr* mr) {
  if (mr == nullptr || !mr->valid || mr->mw_type != 0) return EINVAL;
  return mrs_.dereg(mr);  // EBUSY while windows are bound to it
}

Mr* Engine::alloc_mw(Pd* pd, unsigned type) {
  if (pd == nullptr) return nullptr;
  return mrs_.alloc_mw(pd, type);
}

int Engine::dealloc_mw(Mr* mw) {
  if (mw == nullptr || !mw->valid || mw->mw_type == 0) return EINVAL;
  return mrs_.dereg(mw);  // a bound window comes unbound
}

Cq* Engine::create_cq(std::uint32_t cqe, const abi::Ring<uroce_cq_entry>* shared) {
  if (cqe == 0 || cqe > (1u << 20)) return nullptr;
  if (shared && (!shared->valid() || shared->capacity() < cqe)) return nullptr;
  cqs_.push_back(std::make_unique<Cq>(cqe, shared));
  cqs_.back()->handle = next_handle_++;
  // Room to note every CQ between two cq_events() without allocating.
  cq_noted_.reserve(cqs_.size());
  cq_overflowed_.reserve(cqs_.size());
  return cqs_.back().get();
}

int Engine::destroy_cq(Cq* cq) {
  for (const auto& q : qps_)
    if (q && !q->quarantine_until && (q->send_cq == cq || q->recv_cq == cq)) return EBUSY;
  for (const auto& s : srqs_)
    if (s->cq() == cq || (s->tm && s->tm->cq == cq)) return EBUSY;  // an XRC SRQ's, a work queue's, a TM SRQ's
  const auto it = find_owned(cqs_, cq);
  if (it == cqs_.end()) return EINVAL;
  std::erase(cq_noted_, cq);
  std::erase(cq_overflowed_, cq);
  cqs_.erase(it);
  return 0;
}

Srq* Engine::create_srq(Pd* pd, std::uint32_t max_wr, std::uint32_t max_sge,
                        const abi::Ring<uroce_recv_entry>* shared, Xrcd* xrcd, Cq* cq) {
  if (pd == nullptr || max_wr == 0 || max_wr > (1u << 16) || max_sge == 0 || max_sge > kMaxSge) return nullptr;
  if (shared && !shared->valid()) return nullptr;
  if (xrcd && cq == nullptr) return nullptr;  // an XRC SRQ has both; a work queue a CQ alone
  std::uint32_t num = 0;
  if (xrcd) {
    // The XRCETH's 24 bits: the next number nobody holds (never 0).
    if (xrc_srqs_.size() >= (1u << 24) - 1) return nullptr;
    do next_srq_num_ = (next_srq_num_ + 1) & 0xffffffu;
    while (next_srq_num_ == 0 || xrc_srqs_.contains(next_srq_num_));
    num = next_srq_num_;
  }
  srqs_.push_back(std::make_unique<Srq>(pd, max_wr, max_sge, shared));
  Srq* s = srqs_.back().get();
  s->handle = next_handle_++;
  ++pd->refs;
  if (xrcd) {
    s->make_xrc(xrcd, cq, num);
    xrc_srqs_[num] = s;
    ++xrcd->refs;
  } else if (cq) {
    s->make_wq(cq);
  }
  return s;
}

int Engine::destroy_srq(Srq* srq) {
  if (srq->rss_refs) return EBUSY;  // in an RSS QP's table
  for (const auto& q : qps_)
    if (q && !q->quarantine_until && q->srq == srq && q->xrc != Xrc::kRecv) return EBUSY;
  const auto it = find_owned(srqs_, srq);
  if (it == srqs_.end()) return EINVAL;
  if (srq->xrcd()) {
    // XRC targets that took requests for it forget it: a message in
    // progress for it ends there (its next packet names no SRQ there is).
    for (const auto& q : qps_) {
      if (!q || q->srq != srq) continue;
      q->srq = nullptr;
      q->recv_cq = nullptr;
      q->pd = nullptr;
      q->resp.have_rwqe = false;
    }
    xrc_srqs_.erase(srq->srq_num());
    --srq->xrcd()->refs;
  }
  --srq->pd()->refs;
  srqs_.erase(it);
  return 0;
}

Xrcd* Engine::alloc_xrcd() { return adopt(xrcds_, next_handle_++); }

int Engine::dealloc_xrcd(Xrcd* x) { return release_held(xrcds_, x); }

Qp* Engine::create_qp(Pd* pd, const QpInitAttr& attr_in) {
  QpInitAttr attr = attr_in;
  Xrc xrc = Xrc::kNone;
  if (attr.qp_type == IBV_QPT_XRC_SEND || attr.qp_type == IBV_QPT_XRC_RECV) {
    // An RC QP underneath. The initiator has no receive side; the target
    // no PD, CQs or queues of its own (a one-slot SQ it never uses).
    if (attr.gsi || attr.srq) return nullptr;
    xrc = attr.qp_type == IBV_QPT_XRC_SEND ? Xrc::kSend : Xrc::kRecv;
    if (xrc == Xrc::kSend) {
      if (attr.xrcd) return nullptr;
      attr.recv_cq = attr.send_cq;
    } else {
      if (attr.xrcd == nullptr || pd || attr.sq_ring || attr.rq_ring) return nullptr;
      attr.send_cq = attr.recv_cq = nullptr;
      attr.cap = QpCap{1, 0, 1, 0, 0};
    }
    attr.qp_type = IBV_QPT_RC;
  } else if (attr.xrcd) {
    return nullptr;
  }
  const bool rss = attr.rss != nullptr;
  if (rss) {
    // Receive only, into its table's work queues: no CQs or queues of its own.
    const std::size_t n = attr.rss->table.size();
    if (attr.qp_type != IBV_QPT_RAW_PACKET || attr.srq || attr.gsi || attr.sq_ring || attr.rq_ring || pd == nullptr ||
        n == 0 || n > RssConf::kMaxTable || !std::has_single_bit(n))
      return nullptr;
    for (const Srq* s : attr.rss->table)
      if (s == nullptr || s->cq() == nullptr || s->xrcd()) return nullptr;
    attr.send_cq = attr.recv_cq = nullptr;
    attr.cap = QpCap{1, 0, 1, 0, 0};
  }
  // A work queue or an XRC SRQ serves no QP as its SRQ; a tag-matching
  // SRQ serves RC QPs only (its rendezvous READs need a reliable connection).
  if (attr.srq && attr.srq->cq()) return nullptr;
  if (attr.srq && attr.srq->tm && attr.qp_type != IBV_QPT_RC) return nullptr;
  if (xrc != Xrc::kRecv && !rss && (pd == nullptr || attr.send_cq == nullptr || attr.recv_cq == nullptr)) return nullptr;
  // An overflowed CQ has lost completions for good: no new QP reports into it.
  if (xrc != Xrc::kRecv && !rss && (attr.send_cq->overflowed() || attr.recv_cq->overflowed())) return nullptr;
  if (attr.qp_type != IBV_QPT_RC && attr.qp_type != IBV_QPT_UC && attr.qp_type != IBV_QPT_UD &&
      attr.qp_type != IBV_QPT_RAW_PACKET)
    return nullptr;
  if (attr.qp_type == IBV_QPT_RAW_PACKET && attr.gsi) return nullptr;
  const QpCap& c = attr.cap;
  if (c.max_send_wr == 0 || c.max_send_wr > (1u << 15) || c.max_recv_wr > (1u << 15) || c.max_send_sge > kMaxSge ||
      c.max_recv_sge > kMaxSge || c.max_inline_data > kMaxInline)
    return nullptr;
  if (attr.srq == nullptr && c.max_recv_wr == 0 && xrc == Xrc::kNone && !rss) return nullptr;
  if (attr.gsi && (attr.qp_type != IBV_QPT_UD || gsi_)) return nullptr;
  auto slot = std::find(qps_.begin(), qps_.end(), nullptr);
  if (!attr.gsi && slot == qps_.end()) {
    // No free number: take back the one whose quarantine ended first, if it has.
    Qp* oldest = nullptr;
    for (const auto& q : qps_)
      if (q && q->quarantine_until && q->quarantine_until <= last_now_ &&
          (!oldest || q->quarantine_until < oldest->quarantine_until))
        oldest = q.get();
    if (oldest == nullptr) return nullptr;
    const std::uint32_t qpn = oldest->qpn;
    release(*oldest);
    std::uint32_t idx = 0;
    (void)cfg_.qpns.index(qpn, idx);
    slot = qps_.begin() + idx;
  }
  auto qp = std::make_unique<Qp>();
  qp->qpn = attr.gsi ? kGsiQpn : cfg_.qpns.qpn(static_cast<std::uint32_t>(slot - qps_.begin()));
  qp->type = attr.qp_type;
  qp->xrc = xrc;
  qp->xrcd = attr.xrcd;
  if (qp->type == IBV_QPT_UD) qp->mtu = cfg_.ud_mtu;  // UD has no path MTU: the port's bounds a message
  qp->pd = pd;
  qp->send_cq = attr.send_cq;
  qp->recv_cq = attr.recv_cq;
  qp->srq = attr.srq;
  qp->cap = c;
  qp->sq_sig_all = attr.sq_sig_all;
  if (attr.sq_ring) {
    if (!attr.sq_ring->valid() || attr.sq_ring->capacity() < c.max_send_wr) return nullptr;
    qp->sq_ring = *attr.sq_ring;
  } else {
    qp->sq_heap = abi::HeapRing<uroce_send_entry>(std::bit_ceil(c.max_send_wr), UROCE_RING_SEND, 0);
    qp->sq_ring = qp->sq_heap.ring();
  }
  qp->sq_ring.publish_qp_state(IBV_QPS_RESET);
  // The shadow has a slot for every ring slot, so taking an entry never
  // waits for room; on a tag-matching SRQ's QP, one more for each tag's
  // rendezvous (a READ, then its FIN, one at a time).
  qp->sq = Fifo<SendWqe>(qp->sq_ring.capacity() + (attr.srq && attr.srq->tm ? UROCE_TM_MAX_TAGS : 0));
  if (!attr.srq && xrc == Xrc::kNone && !rss) {
    if (attr.rq_ring && !attr.rq_ring->valid()) return nullptr;
    qp->rq = RecvQueue(c.max_recv_wr, c.max_recv_sge, UROCE_RING_RECV, attr.rq_ring);
  }
  qp->handle = next_handle_++;
  qp->window = cfg_.send_window;
  if (pd) ++pd->refs;
  if (qp->xrcd) ++qp->xrcd->refs;
  if (rss) {
    qp->rss = std::make_unique<RssConf>(*attr.rss);
    for (Srq* s : qp->rss->table) ++s->rss_refs;
  }
  if (attr.gsi) {  // not counted in qp_count(): it belongs to the port, not to an application
    qp->qkey = kGsiQkey;
    gsi_ = std::move(qp);
    return gsi_.get();
  }
  ++qps_live_;
  *slot = std::move(qp);
  Qp* made = slot->get();
  if (made->type == IBV_QPT_RAW_PACKET) {
    // Its frames are copied into the TX slots (and its own flows' copies
    // into a scratch frame): made with the first such QP.
    ensure_bounce();
    if (!raw_scratch_) raw_scratch_ = std::make_unique<std::uint8_t[]>(TxFrame::kMaxRawFrame);
  } else if (made->type != IBV_QPT_UD) {
    set_cc(made, cfg_.cc);  // the port's default (checked when the engine was made)
  }
  return made;
}

int Engine::destroy_qp(Qp* qp) {
  if (qp == nullptr || qp->quarantine_until) return EINVAL;
  const bool gsi = qp == gsi_.get();
  std::uint32_t idx = 0;
  if (!gsi && (!cfg_.qpns.index(qp->qpn, idx) || idx >= qps_.size() || qps_[idx].get() != qp)) return EINVAL;
  for (std::size_t i = 0; i < dead_qp_ctr_.v.size(); ++i) dead_qp_ctr_.v[i] += qp->ctr.v[i];
  std::erase(active_, qp);
  std::erase(ack_waiters_, qp);
  wheel_.cancel(*qp);
  qp->active = false;
  qp->resp.ack_listed = false;
  leave_tenant(*qp);
  mrs_.unbind_qp(qp->handle);  // its type 2 windows serve nobody now
  std::erase_if(mcast_, [qp](const McastAttach& m) { return m.qp == qp; });  // it leaves its groups
  std::erase_if(flows_, [qp](const RawFlow& f) { return f.qp == qp; });     // and its flow rules go
  if (qp->rss) {
    for (Srq* s : qp->rss->table) --s->rss_refs;
    qp->rss.reset();
    qp->srq = nullptr;
    qp->recv_cq = nullptr;
  }
  if (qp->xrc == Xrc::kRecv) {
    --qp->xrcd->refs;  // its pd is its last XRC SRQ's, not its own
    qp->xrcd = nullptr;
  } else {
    --qp->pd->refs;
  }
  if (gsi) {
    gsi_.reset();
    return 0;
  }
  --qps_live_;
  if (qp->type == IBV_QPT_RC && (qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_SQD)) {
    // QPN quarantine, as TCP's TIME_WAIT: the peer may still retry the last
    // message it sent us (its ACK was lost), so for about its retry budget
    // -- our own (retry_cnt + 1) x ACK timeout stands in for the peer's --
    // the number is not reused and such a retry is ACKed again. Nothing of
    // the QP's but its responder state is used meanwhile: the PD, CQs and
    // SRQ may go, and its own work is dropped.
    const std::uint64_t timeout_ns = 4096ull << std::min<std::uint8_t>(qp->timeout, 31);
    const std::uint64_t hold =
        std::clamp<std::uint64_t>((qp->retry_cnt + 1ull) * timeout_ns, 100'000'000, 10'000'000'000ull);
    qp->quarantine_until = last_now_ + hold;
    ++quarantined_;
    qp->ctr = QpCounters{};  // counted from here for the quarantine only (its totals went to dead_qp_ctr_)
    qp->pd = nullptr;
    qp->send_cq = qp->recv_cq = nullptr;
    qp->srq = nullptr;
    qp->owner = nullptr;
    // Its rings may be unmapped as soon as this returns: nothing reads them again.
    qp->sq_ring = abi::Ring<uroce_send_entry>{};
    tm_drop_internal(*qp);
    qp->sq.reset_to(0);
    qp->rq = RecvQueue{};
    qp->req.retry_deadline = qp->req.rnr_until = 0;  // its own work is dropped
    qp->resp.out.clear();
    qp->resp.in_msg = Responder::InMsg::kNone;
    qp->resp.have_rwqe = false;
    return 0;
  }
  qps_[idx].reset();
  return 0;
}

void Engine::release(Qp& qp) {
  if (qp.quarantine_until) --quarantined_;
  for (std::size_t i = 0; i < dead_qp_ctr_.v.size(); ++i) dead_qp_ctr_.v[i] += qp.ctr.v[i];
  std::erase(active_, &qp);
  std::erase(ack_waiters_, &qp);
  wheel_.cancel(qp);
  std::uint32_t idx = 0;
  if (cfg_.qpns.index(qp.qpn, idx) && idx < qps_.size()) qps_[idx].reset();
}

}  // namespace uroce::transport
