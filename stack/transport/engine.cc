#include "stack/transport/engine.h"

#include "stack/abi/send_entry.h"
#include "stack/abi/wc_status.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>

#include "stack/wire/icrc.h"

namespace uroce::transport {

namespace {
bool can_post_send(ibv_qp_state s) {
  // Verbs: a send WR may be posted in RTS, SQD and SQE; in ERR it is flushed.
  return s == IBV_QPS_RTS || s == IBV_QPS_SQD || s == IBV_QPS_SQE || s == IBV_QPS_ERR;
}
}  // namespace


using wire::Psn;

const char* to_string(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET: return "RESET";
    case IBV_QPS_INIT: return "INIT";
    case IBV_QPS_RTR: return "RTR";
    case IBV_QPS_RTS: return "RTS";
    case IBV_QPS_SQD: return "SQD";
    case IBV_QPS_SQE: return "SQE";
    case IBV_QPS_ERR: return "ERR";
    default: return "UNKNOWN";
  }
}

const char* to_string(ibv_wc_status s) { return uroce_wc_status_name(s); }

std::size_t TxFrame::copy_to(wire::Bytes out) const {
  const std::size_t n = size();
  if (out.size() < n) return 0;
  std::uint8_t* p = out.data();
  std::memcpy(p, hdr, hdr_len);
  p += hdr_len;
  for (std::uint8_t i = 0; i < nseg; ++i) {
    if (seg[i].len) std::memcpy(p, seg[i].p, seg[i].len);
    p += seg[i].len;
  }
  std::memcpy(p, trailer, trailer_len);
  return n;
}

Engine::Engine(const EngineConfig& cfg) : cfg_(cfg), mrs_(cfg.max_mrs, cfg.seed), tx_(cfg.tx_ring) {
  if (cc::find(cfg_.cc) == nullptr) cfg_.cc = "none";  // callers check the name first (the daemon's options do)
  if (cfg_.qpns.shards == 0) cfg_.qpns.shards = 1;
  // The port's own address, for QPs connected on this device (loopback):
  // the driver turns frames to its own MAC around.
  if (cfg_.ip != wire::IpAddr{}) neighbors_.add_static(cfg_.ip, cfg_.mac);
  qps_.resize(cfg.max_qps);
  active_.reserve(cfg.max_qps + 1);  // and QP1
  still_active_.reserve(cfg.max_qps + 1);
  tenants_.resize(std::clamp<std::uint32_t>(cfg.max_tenants, 1, 65535) + 1);
  live_.reserve(tenants_.size());
  mcast_.reserve(cfg.max_mcast_attach);
  flows_.reserve(cfg.max_flows);
  mcast_loop_.resize(16384);
  ack_waiters_.reserve(cfg.max_qps);
}

Engine::~Engine() = default;

// ---------------------------------------------------------------- objects

Pd* Engine::alloc_pd() {
  auto pd = std::make_unique<Pd>();
  pd->handle = next_handle_++;
  pds_.push_back(std::move(pd));
  return pds_.back().get();
}

int Engine::dealloc_pd(Pd* pd) {
  auto it = std::find_if(pds_.begin(), pds_.end(), [pd](const auto& p) { return p.get() == pd; });
  if (it == pds_.end()) return EINVAL;
  if (pd->refs != 0) return EBUSY;
  pds_.erase(it);
  return 0;
}

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

void Engine::ensure_bounce() {
  if (!odp_bounce_) odp_bounce_ = std::make_unique<std::uint8_t[]>(std::size_t{tx_.slot_count()} * TxFrame::kMaxPayload);
}

bool Engine::add_odp_seg(TxFrame& f, MemRef src, std::uint32_t len) {
  std::uint8_t* b = bounce_of(f);
  for (std::uint8_t i = 0; i < f.nseg; ++i)
    if (f.seg[i].p >= b && f.seg[i].p < b + TxFrame::kMaxPayload) b = const_cast<std::uint8_t*>(f.seg[i].p) + f.seg[i].len;
  if (!get_bytes(src, b, len)) return false;
  f.seg[f.nseg++] = {b, len};
  f.bounced = true;
  return true;
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
  auto it = std::find_if(cqs_.begin(), cqs_.end(), [cq](const auto& c) { return c.get() == cq; });
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
  auto it = std::find_if(srqs_.begin(), srqs_.end(), [srq](const auto& s) { return s.get() == srq; });
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

Xrcd* Engine::alloc_xrcd() {
  xrcds_.push_back(std::make_unique<Xrcd>());
  xrcds_.back()->handle = next_handle_++;
  return xrcds_.back().get();
}

int Engine::dealloc_xrcd(Xrcd* x) {
  auto it = std::find_if(xrcds_.begin(), xrcds_.end(), [x](const auto& p) { return p.get() == x; });
  if (it == xrcds_.end()) return EINVAL;
  if (x->refs != 0) return EBUSY;
  xrcds_.erase(it);
  return 0;
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


Qp* Engine::find_qp(std::uint32_t qpn) const {
  Qp* qp = slot_qp(qpn);
  return qp && !qp->quarantine_until ? qp : nullptr;
}

Qp* Engine::slot_qp(std::uint32_t qpn) const {
  if (qpn == kGsiQpn) return gsi_.get();
  std::uint32_t idx = 0;
  if (!cfg_.qpns.index(qpn, idx)) return nullptr;
  return idx < qps_.size() ? qps_[idx].get() : nullptr;
}

std::uint64_t Engine::qp_counter_total(QpCounter c) const {
  std::uint64_t n = dead_qp_ctr_[c];
  for (const auto& q : qps_)
    if (q) n += q->ctr[c];  // a quarantined QP's counters restarted at zero
  return n;
}


// ------------------------------------------------------- QP state machine

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

// ------------------------------------------------------------------ post

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

// ------------------------------------------------------------ completions

namespace {
ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
  switch (op) {
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

void Engine::set_error(Qp& qp) {
  if (qp.state == IBV_QPS_ERR) return;
  qp.state = IBV_QPS_ERR;
  qp.sq_ring.publish_qp_state(IBV_QPS_ERR);
  flush_wqes(qp);
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

void Engine::activate(Qp& qp) {
  if (!qp.active) {
    qp.active = true;
    active_.push_back(&qp);
  }
}

// -------------------------------------------------------------- transmit

TxFrame* Engine::tx_slot() {
  TxFrame* f = tx_.size() < tx_limit() ? tx_.emplace() : nullptr;
  if (f == nullptr) {
    tx_full_ = true;
    port_ctr_.inc(PortCounter::tx_ring_full);
    return nullptr;
  }
  f->nseg = 0;
  f->trailer_len = 0;
  f->bounced = false;
  f->raw = false;
  return f;
}

wire::FrameSpec Engine::spec_for(const Qp& qp, std::uint8_t opcode, Psn psn) const {
  wire::FrameSpec s;
  s.eth_src = cfg_.mac;
  s.eth_dst = qp.remote_mac;
  s.vlan = cfg_.vlan_tci != 0;
  s.vlan_tci = cfg_.vlan_tci;
  s.ipver = qp.remote_ip.is_v4_mapped() ? wire::IpVersion::kV4 : wire::IpVersion::kV6;
  s.src = cfg_.ip;
  s.dst = qp.remote_ip;
  s.dscp = cfg_.dscp;
  s.ecn = cfg_.ecn;
  s.ipv4_checksum = !cfg_.ipv4_checksum_offload;
  s.udp_sport = qp.udp_sport;
  if (qp.hop_limit != 0) s.ttl = qp.hop_limit;  // 0: the default (64)
  s.flow_label = qp.flow_label;
  s.opcode = opcode;
  s.destqp = qp.dest_qp_num;
  s.psn = psn;
  return s;
}

void Engine::finish_frame(TxFrame& f, Qp& qp, const wire::FrameSpec& spec, std::uint32_t payload_len) {
  f.hdr_len = static_cast<std::uint16_t>(wire::build_headers(wire::Bytes(f.hdr, sizeof f.hdr), spec, payload_len));
  if (f.hdr_len == 0) return unbuilt(f);
  const std::uint8_t pad = wire::pad_for(payload_len);
  std::memset(f.trailer, 0, pad);
  // ICRC over L3..payload+pad, as scatter-gather: no copy of the payload.
  const std::size_t l3 = spec.vlan ? 18 : 14;
  wire::ConstBytes segs[kMaxSge + 3];
  std::size_t n = 0;
  segs[n++] = wire::ConstBytes(f.hdr + l3, f.hdr_len - l3);
  for (std::uint8_t i = 0; i < f.nseg; ++i) segs[n++] = wire::ConstBytes(f.seg[i].p, f.seg[i].len);
  if (pad) segs[n++] = wire::ConstBytes(f.trailer, pad);
  seal_frame(f, qp, spec.opcode, spec.psn, pad, wire::icrc_compute(std::span<const wire::ConstBytes>(segs, n)).value_or(0));
}

void Engine::unbuilt(TxFrame& f) {
  f.hdr_len = 0;
  f.nseg = 0;
  f.trailer_len = 0;
  port_ctr_.inc(PortCounter::tx_unbuilt);
}

void Engine::seal_frame(TxFrame& f, Qp& qp, std::uint8_t opcode, Psn psn, std::uint8_t pad, std::uint32_t icrc) {
  wire::icrc_store(f.trailer + pad, icrc);
  f.trailer_len = static_cast<std::uint8_t>(pad + wire::kIcrcLen);
  f.qpn = qp.qpn;
  f.psn = psn;
  f.opcode = opcode;
  qp.ctr.inc(QpCounter::sent_pkts);
  port_ctr_.inc(PortCounter::tx_frames);
}

wire::FrameSpec Engine::full_spec(const Qp& qp, const wire::PacketFields& p, const wire::ExtFields& ext) const {
  wire::FrameSpec s = spec_for(qp, p.opcode, p.psn);
  s.se = p.se;
  s.ackreq = p.ackreq;
  s.ext = ext;
  return s;
}

void Engine::finish_packet(TxFrame& f, Qp& qp, const wire::PacketFields& p_in, const wire::ExtFields& ext,
                           std::uint32_t payload_len) {
  wire::PacketFields p = p_in;
  // An XRC QP sends RC's packets under XRC's opcodes (the XRCETH, on
  // requests, comes from ext).
  if (qp.xrc != Xrc::kNone && p.opcode < 0x20) [[unlikely]]
    p.opcode = static_cast<std::uint8_t>(p.opcode + wire::op::kXrcBase);
  if (!qp.tmpl.valid()) return finish_frame(f, qp, full_spec(qp, p, ext), payload_len);
  const std::size_t hlen = qp.tmpl.emit(f.hdr, p, ext, payload_len);
  if (hlen == 0) return unbuilt(f);
  const std::uint8_t pad = wire::pad_for(payload_len);
  if (hlen + payload_len + 4 <= sizeof f.hdr) {
    // Small enough to copy after the headers: one buffer, one CRC, and
    // no segment for the driver to chain (its bytes are read now, as a NIC
    // would read them on the way out).
    std::uint8_t* b = f.hdr + hlen;
    for (std::uint8_t i = 0; i < f.nseg; ++i) {
      std::memcpy(b, f.seg[i].p, f.seg[i].len);
      b += f.seg[i].len;
    }
    std::memset(b, 0, 4);  // the pad (writing 4 is cheaper than 0..3)
    f.nseg = 0;
    f.hdr_len = static_cast<std::uint16_t>(hlen + payload_len + pad);
    seal_frame(f, qp, p.opcode, p.psn, 0, qp.tmpl.icrc(f.hdr, f.hdr_len, {}, 0));
    return;
  }
  f.hdr_len = static_cast<std::uint16_t>(hlen);
  std::memset(f.trailer, 0, pad);
  wire::ConstBytes segs[kMaxSge + 1];
  for (std::uint8_t i = 0; i < f.nseg; ++i) segs[i] = wire::ConstBytes(f.seg[i].p, f.seg[i].len);
  seal_frame(f, qp, p.opcode, p.psn, pad,
             qp.tmpl.icrc(f.hdr, f.hdr_len, std::span<const wire::ConstBytes>(segs, f.nseg), pad));
}

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

// --------------------------------------------------------------- receive

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

// ------------------------------------------------------------------ poll

void Engine::poll(std::uint64_t now) {
  last_now_ = now;
  send_coalesced_acks();
  // Quarantined numbers whose time is up are freed a few slots a pass, so
  // they do not pile up (their memory, the status) until the table fills.
  // Nothing to look at, and nothing done, while none is quarantined.
  if (quarantined_) {
    for (int k = 0; k < 8 && quarantined_; ++k) {
      reap_cursor_ = (reap_cursor_ + 1) % qps_.size();
      Qp* q = qps_[reap_cursor_].get();
      if (q && q->quarantine_until && q->quarantine_until <= now) release(*q);
    }
  }
  // Neighbours still waited for, asked again on their backoff.
  if (neighbors_.waiting())
    neighbors_.due(now, [this](const wire::IpAddr& ip) {
      if (resolver_) resolver_(resolver_ctx_, ip);
    });
  // QPs whose time has come join those with work.
  wheel_.expire(now, [this](Qp& qp) { activate(qp); });
  if (!metered()) {
    serve_active(now, true);
    cq_events();
    return;
  }
  // Deficit round robin between tenants. Each starts the poll with its
  // quantum (what it saved is capped at that, and a debt is carried). The
  // first pass serves every QP within its tenant's share, so a tenant with
  // one packet to send gets it out behind at most a quantum of any other's.
  // While two or more tenants have work left, the ones with work share the
  // ring's remaining room by weight and are served again, so a poll takes
  // a round or two however full the ring gets; when only one has, it takes
  // what room is left.
  for_each_share([this](std::uint16_t, Tenant& t) {
    const std::int64_t q = std::int64_t{cfg_.tx_quantum} * t.weight;
    t.deficit = std::min(t.deficit + q, q);
    t.backlog = false;
  });
  unmetered_ = -1;
  poll_bytes_ = poll_frames_ = 0;
  serve_active(now, true);
  for (int round = 1; round < 16 && tx_.size() < tx_limit(); ++round) {
    std::size_t waiting = 0, last = 0;
    std::int64_t weights = 0;
    for_each_share([&](std::uint16_t i, Tenant& t) {
      t.serve = t.backlog;
      t.backlog = false;
      if (!t.serve) return;
      ++waiting;
      last = i;
      weights += t.weight;
    });
    if (waiting == 0) break;
    if (waiting == 1) {
      unmetered_ = static_cast<std::int64_t>(last);
    } else {
      // The room left in the TX ring, in bytes at this poll's mean frame,
      // shared by weight (at least a quantum each): a round or two fills
      // it, each tenant its share, whatever order its QPs are listed in.
      const std::int64_t mean = poll_frames_ ? static_cast<std::int64_t>(poll_bytes_ / poll_frames_) : 1024;
      const std::int64_t room = std::int64_t{tx_limit() - tx_.size()} * mean;
      for_each_share([&](std::uint16_t, Tenant& t) {
        if (t.serve) t.deficit += std::max<std::int64_t>(std::int64_t{cfg_.tx_quantum} * t.weight, room * t.weight / weights);
      });
    }
    serve_active(now, false);
  }
  // A tenant that has sent all it had keeps no credit (only a debt).
  for_each_share([](std::uint16_t, Tenant& t) {
    if (!t.backlog) t.deficit = std::min<std::int64_t>(t.deficit, 0);
  });
  unmetered_ = -1;
  cq_events();
}

void Engine::serve_active(std::uint64_t now, bool first) {
  // In turn from the second QP listed: the first pass of each poll starts one
  // further on, so the QPs that fill the TX ring (or a tenant's share) take
  // turns. Those that stay are listed again in the order served.
  const std::size_t n = active_.size();
  const std::size_t start = first && n > 1 ? 1 : 0;
  still_active_.clear();
  for (std::size_t k = 0; k < n; ++k) {
    Qp& qp = *active_[(start + k) % n];
    if (!first && !tenants_[qp.tenant].serve) {
      still_active_.push_back(&qp);
      continue;
    }
    const bool live = qp.quarantine_until == 0;  // a quarantined QP only sends its re-ACKs
    tx_full_ = false;
    qp_throttled_ = false;
    if (live && first) on_timers(qp, now);
    if (live && (qp.state == IBV_QPS_RTS || qp.state == IBV_QPS_SQD)) run_requester(qp, now);
    const std::uint32_t from = tx_.tail();
    run_responses(qp);
    if (metered()) charge(qp, from);
    // It stays only while it could do more now: responses not yet sent, or
    // requests the TX ring (or its tenant's share) had no room for. Anything
    // else it waits for comes as an event that activates it again (a post,
    // an ACK or response, a CNP, a modify) or as a deadline, which the
    // wheel keeps.
    const bool dead = qp.state == IBV_QPS_ERR || qp.state == IBV_QPS_RESET;
    if (!dead && (!qp.resp.out.empty() || (live && (tx_full_ || qp_throttled_)))) {
      still_active_.push_back(&qp);
      continue;
    }
    qp.active = false;
    if (dead || !live) {
      wheel_.cancel(qp);
    } else {
      settle_timer(qp, now);
    }
  }
  // QPs activated while serving (a looped datagram's receiver) were listed
  // after the n served.
  for (std::size_t i = n; i < active_.size(); ++i) still_active_.push_back(active_[i]);
  active_.swap(still_active_);
}

bool Engine::tx_share_left(Qp& qp) {
  Tenant& t = tenants_[qp.tenant];
  if (t.deficit > 0 || unmetered_ == qp.tenant) return true;
  t.backlog = true;
  ++t.throttled;
  qp_throttled_ = true;
  return false;
}

bool Engine::last_in_turn(const Qp& qp, std::uint32_t payload) const {
  if (tx_.size() + 1 >= tx_limit()) return true;
  if (!metered() || unmetered_ == qp.tenant) return false;
  return tenants_[qp.tenant].deficit <= static_cast<std::int64_t>(payload) + 128;  // its headers and trailer
}

void Engine::charge(const Qp& qp, std::uint32_t from) {
  std::uint64_t bytes = 0;
  const std::uint32_t end = tx_.tail();
  // The wire's bytes: the frame, its FCS, and the preamble and gap (24).
  for (std::uint32_t i = from; i != end; ++i) bytes += tx_.at(i).size() + 24;
  Tenant& t = tenants_[qp.tenant];
  t.deficit -= static_cast<std::int64_t>(bytes);
  t.tx_bytes += bytes;
  t.tx_frames += end - from;
  poll_bytes_ += bytes;
  poll_frames_ += end - from;
}

int Engine::set_tenant(Qp* qp, std::uint32_t uid, std::uint32_t weight) {
  if (qp == nullptr || qp->quarantine_until || weight == 0 || weight > kMaxWeight) return EINVAL;
  leave_tenant(*qp);
  // Its uid's entry, or a free one.
  std::uint16_t at = tenant_of(uid);
  if (at == 0) {
    for (std::size_t i = 1; i < tenants_.size() && at == 0; ++i)
      if (tenants_[i].qps == 0) at = static_cast<std::uint16_t>(i);
    if (at == 0) return ENOSPC;  // every entry held: it stays in entry 0
    static_cast<TenantReport&>(tenants_[at]) = TenantReport{uid, weight, 0, 0, 0, 0};
    tenants_[at].deficit = 0;
    live_.push_back(at);
  }
  Tenant& t = tenants_[at];
  t.weight = weight;
  ++t.qps;
  qp->tenant = static_cast<std::uint16_t>(at);
  return 0;
}

bool Engine::set_tenant_weight(std::uint32_t uid, std::uint32_t weight) {
  if (weight == 0 || weight > kMaxWeight) return false;
  const std::uint16_t at = tenant_of(uid);
  if (at == 0) return false;
  tenants_[at].weight = weight;
  return true;
}

std::uint16_t Engine::tenant_of(std::uint32_t uid) const {
  for (const std::uint16_t i : live_)
    if (tenants_[i].uid == uid) return i;
  return 0;
}

void Engine::leave_tenant(Qp& qp) {
  if (qp.tenant != 0 && --tenants_[qp.tenant].qps == 0) std::erase(live_, qp.tenant);
  qp.tenant = 0;
}

std::uint64_t Engine::deadline_of(const Qp& qp, std::uint64_t now) const {
  std::uint64_t best = 0;
  // The pacer's next slot, while something could be sent in it.
  const std::uint64_t pace = qp.rate_bps != 0 && qp.req.pace_next > now ? qp.req.pace_next : 0;
  const std::uint64_t cct = qp.cc ? qp.cc->next_timer() : 0;
  for (std::uint64_t d : {qp.req.retry_deadline, qp.req.rnr_until, pace, cct})
    if (d != 0 && (best == 0 || d < best)) best = d;
  return best;
}

void Engine::settle_timer(Qp& qp, std::uint64_t now) {
  if (const std::uint64_t at = deadline_of(qp, now)) {
    wheel_.schedule(qp, at);
  } else {
    wheel_.cancel(qp);
  }
}

std::uint64_t Engine::next_deadline() const {
  std::uint64_t best = wheel_.next_at();
  for (const Qp* qp : active_) {
    // A paced QP with packets to send wakes at its next packet's time.
    const std::uint64_t pace = qp->rate_bps != 0 && qp->req.cursor != qp->sq.tail() ? qp->req.pace_next : 0;
    const std::uint64_t cct = qp->cc ? qp->cc->next_timer() : 0;
    for (std::uint64_t d : {qp->req.retry_deadline, qp->req.rnr_until, pace, cct})
      if (d != 0 && (best == 0 || d < best)) best = d;
  }
  return best;
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
