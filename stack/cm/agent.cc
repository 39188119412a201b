#include "stack/cm/agent.h"

#include <algorithm>
#include <cerrno>

namespace uroce::cm {

using transport::Qp;

const char* to_string(CmEvent::Type t) {
  switch (t) {
    case CmEvent::Type::kConnectRequest: return "connect_request";
    case CmEvent::Type::kConnectResponse: return "connect_response";
    case CmEvent::Type::kEstablished: return "established";
    case CmEvent::Type::kRejected: return "rejected";
    case CmEvent::Type::kDisconnected: return "disconnected";
    case CmEvent::Type::kUnreachable: return "unreachable";
  }
  return "?";
}

const char* to_string(CmCounter c) {
  switch (c) {
#define X(n) \
  case CmCounter::n: return #n;
    UROCE_CM_COUNTERS(X)
#undef X
    case CmCounter::kCount: break;
  }
  return "?";
}

namespace {

constexpr std::uint8_t kCmResponseTimeout = 20;  // 4.096 us * 2^20 = 4.3 s, as Linux advertises
constexpr std::uint8_t kMaxCmRetries = 15;
constexpr std::uint8_t kMsgReq = 0, kMsgRep = 1, kMsgOther = 2;  // REJ's "message rejected"
constexpr unsigned kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void copy_priv(std::uint8_t* dst, std::size_t cap, wire::ConstBytes priv) {
  if (!priv.empty()) std::memcpy(dst, priv.data(), std::min(cap, priv.size()));  // an empty span may be null
}

}  // namespace

CmAgent::CmAgent(transport::Engine& eng, const CmConfig& cfg) : eng_(eng), cfg_(cfg), rng_(cfg.seed) {
  next_comm_id = [this] {
    std::uint32_t v;
    do v = static_cast<std::uint32_t>(splitmix(rng_));
    while (v == 0 || conns_.count(v));
    return v;
  };
  next_psn = [this] { return static_cast<std::uint32_t>(splitmix(rng_)) & 0xffffff; };
  next_tid = [this] { return splitmix(rng_); };
  next_src_port = [this] { return static_cast<std::uint16_t>(0x8000 | (splitmix(rng_) & 0x7fff)); };

  mem_.assign((kRecvSlots + kSendSlots) * kSlot, 0);
  pd_ = eng_.alloc_pd();
  cq_ = eng_.create_cq(2 * (kRecvSlots + kSendSlots));
  mr_ = eng_.reg_mr(pd_, mem_.data(), mem_.size(), IBV_ACCESS_LOCAL_WRITE);
  transport::QpInitAttr ia;
  ia.qp_type = IBV_QPT_UD;
  ia.send_cq = ia.recv_cq = cq_;
  ia.cap.max_send_wr = kSendSlots;
  ia.cap.max_recv_wr = kRecvSlots;
  ia.gsi = true;
  qp_ = pd_ && cq_ && mr_ ? eng_.create_qp(pd_, ia) : nullptr;
  if (!qp_) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.qkey = transport::kGsiQkey;
  a.port_num = 1;
  bool up = eng_.modify_qp(qp_, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY).err == 0;
  a.qp_state = IBV_QPS_RTR;
  up = up && eng_.modify_qp(qp_, a, IBV_QP_STATE).err == 0;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  up = up && eng_.modify_qp(qp_, a, IBV_QP_STATE | IBV_QP_SQ_PSN).err == 0;
  for (std::uint32_t i = 0; up && i < kRecvSlots; ++i) {
    const transport::Sge sg{reinterpret_cast<std::uint64_t>(mem_.data() + i * kSlot), kSlot, mr_->lkey};
    up = eng_.post_recv(qp_, transport::RecvWr{i, {&sg, 1}}) == 0;
  }
  if (!up) {
    eng_.destroy_qp(qp_);
    qp_ = nullptr;
  }
}

CmAgent::~CmAgent() {
  if (qp_) eng_.destroy_qp(qp_);
  if (mr_) eng_.dereg_mr(mr_);
  if (cq_) eng_.destroy_cq(cq_);
  if (pd_) eng_.dealloc_pd(pd_);
}

// ------------------------------------------------------------ sending

bool CmAgent::post(const wire::IpAddr& dst, const wire::MacAddr& mac, const Mad& m) {
  if (send_outstanding_ >= kSendSlots) {
    inc(CmCounter::send_full);
    return false;
  }
  std::uint8_t* slot = mem_.data() + (kRecvSlots + send_next_ % kSendSlots) * kSlot;
  ++send_next_;
  std::memcpy(slot, &m, kMadBytes);
  const transport::Sge sg{reinterpret_cast<std::uint64_t>(slot), kMadBytes, mr_->lkey};
  const transport::Ah ah{dst, mac, 0};
  transport::SendWr wr;
  wr.wr_id = (1ull << 32) | send_next_;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = {&sg, 1};
  wr.ah = &ah;
  wr.remote_qpn = transport::kGsiQpn;
  wr.remote_qkey = transport::kGsiQkey;
  if (eng_.post_send(qp_, wr) != 0) {
    inc(CmCounter::send_full);
    return false;
  }
  ++send_outstanding_;
  inc(CmCounter::mads_tx);
  return true;
}

void CmAgent::send(const wire::IpAddr& dst, const Mad& m, std::uint64_t now) {
  wire::MacAddr mac;
  if (eng_.neighbor(dst, mac)) {
    post(dst, mac, m);
    return;
  }
  // The peer's MAC is not known yet: ask, and send when it is.
  eng_.want_neighbor(dst, now, now + cfg_.resolve_ns);
  pending_.push_back({dst, m, now + cfg_.resolve_ns});
}

void CmAgent::send_conn(Conn& c, const Mad& m, std::uint64_t now) {
  c.last = m;
  c.sends = 1;
  c.deadline = now + cfg_.resend_ns;
  send(c.peer, m, now);
}

void CmAgent::send_rej(const wire::IpAddr& dst, std::uint64_t tid, std::uint32_t local_id, std::uint32_t remote_id,
                       std::uint8_t msg, std::uint16_t reason, wire::ConstBytes priv, std::uint64_t now) {
  Mad m = Mad::make(Attr::kRej, tid);
  Rej& r = m.as<Rej>();
  r.local_comm_id.set(local_id);
  r.remote_comm_id.set(remote_id);
  r.b8 = static_cast<std::uint8_t>(msg << 6);
  r.reason.set(reason);
  copy_priv(r.private_data, sizeof r.private_data, priv);
  inc(CmCounter::rejects_sent);
  send(dst, m, now);
}

void CmAgent::event(const Conn& c, CmEvent::Type t, std::uint16_t reason, wire::ConstBytes priv) {
  if (c.owner == 0) return;  // its owner is gone
  CmEvent e;
  e.type = t;
  e.id = c.local_id;
  e.peer = c.peer;
  e.peer_port = c.peer_port;
  e.local_port = c.local_port;
  e.peer_qpn = c.peer_qpn;
  e.responder_resources = c.responder_resources;
  e.initiator_depth = c.initiator_depth;
  e.mtu = c.mtu;
  e.sq_psn = c.sq_psn;
  e.rq_psn = c.rq_psn;
  e.retry_cnt = c.retry_cnt;
  e.rnr_retry = c.rnr_retry;
  e.ack_timeout = c.ack_timeout;
  e.max_rd_atomic = c.max_rd_atomic;
  e.max_dest_rd_atomic = c.max_dest_rd_atomic;
  e.ud = c.ud;
  e.qkey = c.qkey;
  e.reason = reason;
  e.private_len = static_cast<std::uint8_t>(std::min(priv.size(), sizeof e.private_data));
  if (e.private_len) std::memcpy(e.private_data, priv.data(), e.private_len);
  if (t == CmEvent::Type::kEstablished) inc(CmCounter::established);
  if (t == CmEvent::Type::kDisconnected) inc(CmCounter::disconnected);
  events_[c.owner].push_back(e);
  if (event_hook_) event_hook_(event_hook_ctx_, c.owner);
}

// ------------------------------------------------------------ QP moves

int CmAgent::bring_up(Qp* qp, const Conn& c, std::uint8_t max_rd_atomic, std::uint8_t max_dest_rd_atomic) {
  if (!qp) return EINVAL;
  return eng_.bring_up(qp, connect_params(c, max_rd_atomic, max_dest_rd_atomic)).err;
}

abi::Connect CmAgent::connect_params(const Conn& c, std::uint8_t max_rd_atomic, std::uint8_t max_dest_rd_atomic) {
  abi::Connect k;
  k.type = IBV_QPT_RC;
  k.access = kAccess;
  k.path_mtu = c.mtu;
  k.dest_qp_num = c.peer_qpn;
  k.rq_psn = c.rq_psn;
  k.sq_psn = c.sq_psn;
  std::memcpy(k.dgid.raw, c.peer.b.data(), 16);
  k.hop_limit = 64;
  k.min_rnr_timer = 12;
  k.timeout = c.ack_timeout;
  k.retry_cnt = c.retry_cnt;
  k.rnr_retry = c.rnr_retry;
  k.max_rd_atomic = max_rd_atomic;
  k.max_dest_rd_atomic = max_dest_rd_atomic;
  return k;
}

Qp* CmAgent::qp_of(const Conn& c) const {
  Qp* qp = eng_.find_qp(c.qpn);
  return qp && qp->handle == c.qp_handle ? qp : nullptr;
}

int CmAgent::to_init(Qp* qp) {
  // The first step of the one bring-up: the CM's peer is not known yet.
  abi::Connect k;
  k.access = kAccess;
  const abi::Step init = abi::bring_up_steps(k)[0];
  return eng_.modify_qp(qp, init.attr, init.mask).err;
}

void CmAgent::qp_to_error(const Conn& c) {
  if (c.app_qp) return;  // the application's to move, as rdma_cm leaves a QP it did not make
  Qp* qp = qp_of(c);
  if (!qp || qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_ERR) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  eng_.modify_qp(qp, a, IBV_QP_STATE);
}

// ------------------------------------------------------------ the API

namespace {
std::uint32_t listen_key(std::uint16_t port, bool ud) { return port | (ud ? 1u << 16 : 0u); }
}  // namespace

int CmAgent::listen(std::uint16_t port, std::uint32_t owner, bool ud) {
  if (owner == 0) return EINVAL;
  if (listens_.count(listen_key(port, ud))) return EADDRINUSE;
  listens_[listen_key(port, ud)] = owner;
  return 0;
}

int CmAgent::unlisten(std::uint16_t port, std::uint32_t owner, bool ud) {
  auto it = listens_.find(listen_key(port, ud));
  if (it == listens_.end() || it->second != owner) return EINVAL;
  listens_.erase(it);
  return 0;
}

int CmAgent::connect(Qp* qp, const wire::IpAddr& dst, std::uint16_t port, wire::ConstBytes priv,
                     std::uint32_t owner, const ConnParams& p, std::uint64_t now, std::uint32_t& id, bool app_qp) {
  if (ok() && qp && qp->type == IBV_QPT_UD && owner != 0 && !app_qp) return sidr_connect(qp, dst, port, priv, owner, now, id);
  // A QP the application brings up itself (rdma_connect with no id->qp,
  // naming conn_param->qp_num) lends its number to the REQ, as with
  // librdmacm, whose kernel does not look at that QP's type: UCX names a
  // small UD QP that it never uses, to reserve a number. Only a QP in ERR
  // is refused.
  if (!ok() || !qp || owner == 0) return EINVAL;
  if (app_qp ? qp->state == IBV_QPS_ERR
             : qp->type != IBV_QPT_RC || (qp->state != IBV_QPS_RESET && qp->state != IBV_QPS_INIT))
    return EINVAL;
  if (priv.size() > kReqUserPrivate || transport::mtu_bytes(p.mtu) == 0) return EINVAL;
  if (qp->state == IBV_QPS_RESET && !app_qp) {
    if (const int err = to_init(qp)) return err;
  }
  Conn c = active_conn(qp, dst, port, owner, State::kReqSent);
  c.app_qp = app_qp;
  c.rq_psn = next_psn() & 0xffffff;
  c.mtu = std::min(p.mtu, cfg_.max_mtu);
  c.responder_resources = std::min<std::uint8_t>(p.responder_resources, transport::kMaxRdAtomic);
  c.initiator_depth = std::min<std::uint8_t>(p.initiator_depth, transport::kMaxRdAtomic);
  c.retry_cnt = p.retry_cnt & 7;
  c.rnr_retry = p.rnr_retry & 7;
  c.ack_timeout = p.ack_timeout & 31;

  Mad m = Mad::make(Attr::kReq, c.tid);
  Req& r = m.as<Req>();
  r.local_comm_id.set(c.local_id);
  r.service_id.set(service_id(kPortSpaceTcp, port));
  r.local_ca_guid.set(cfg_.ca_guid);
  r.local_qpn.set(c.qpn);
  r.responder_resources = c.responder_resources;
  r.initiator_depth = c.initiator_depth;
  r.b43 = static_cast<std::uint8_t>(kCmResponseTimeout << 3);  // transport RC (0), no end-to-end flow control
  r.starting_psn.set(c.rq_psn);
  r.b47 = static_cast<std::uint8_t>((kCmResponseTimeout << 3) | c.retry_cnt);
  r.pkey.set(0xffff);
  r.b50 = static_cast<std::uint8_t>((c.mtu << 4) | c.rnr_retry);
  r.b51 = static_cast<std::uint8_t>(kMaxCmRetries << 4);
  r.primary.local_lid.set(0xffff);  // RoCE: the permissive LID, the GIDs route
  r.primary.remote_lid.set(0xffff);
  std::memcpy(r.primary.local_gid, eng_.config().ip.b.data(), 16);
  std::memcpy(r.primary.remote_gid, dst.b.data(), 16);
  r.primary.flow_label_rate.set(17);  // packet rate 200 Gb/s, what Linux advertises for a soft port
  r.primary.hop_limit = 64;
  r.primary.ack_timeout = static_cast<std::uint8_t>(c.ack_timeout << 3);
  put_cma_hdr(r.private_data, dst, c.local_port);
  copy_priv(r.private_data + sizeof(CmaHdr), kReqUserPrivate, priv);
  id = c.local_id;
  auto& stored = conns_[c.local_id] = c;
  send_conn(stored, m, now);
  return 0;
}

int CmAgent::accept(std::uint32_t id, Qp* qp, wire::ConstBytes priv, std::uint32_t owner, std::uint64_t now,
                    bool app_qp, int ack_timeout) {
  auto it = conns_.find(id);
  if (it != conns_.end() && it->second.owner == owner && it->second.state == State::kSidrRcvd) {
    // UD: the answer names the QP and its Q_Key; nothing to bring up.
    if (!qp || qp->type != IBV_QPT_UD || app_qp || qp->state == IBV_QPS_ERR) return EINVAL;
    if (priv.size() > sizeof(SidrRep::private_data)) return EINVAL;
    send_sidr_rep(it->second, kSidrOk, qp->qpn, qp->qkey, priv, now);
    return 0;
  }
  if (it == conns_.end() || it->second.owner != owner || it->second.state != State::kReqRcvd) return EINVAL;
  if (!qp) return EINVAL;
  // As in connect: an application's QP lends its number to the REP.
  if (app_qp ? qp->state == IBV_QPS_ERR
             : qp->type != IBV_QPT_RC || (qp->state != IBV_QPS_RESET && qp->state != IBV_QPS_INIT))
    return EINVAL;
  if (priv.size() > sizeof(Rep::private_data)) return EINVAL;
  if (ack_timeout > 31) return EINVAL;
  Conn& c = it->second;
  if (ack_timeout >= 0) c.ack_timeout = static_cast<std::uint8_t>(ack_timeout);
  c.qpn = qp->qpn;
  c.qp_handle = qp->handle;
  c.app_qp = app_qp;
  const std::uint8_t our_depth = c.max_rd_atomic, our_resources = c.max_dest_rd_atomic;
  if (!app_qp) {
    if (const int err = bring_up(qp, c, our_depth, our_resources); err != 0) return err;
  }
  Mad m = Mad::make(Attr::kRep, c.tid);
  Rep& r = m.as<Rep>();
  r.local_comm_id.set(c.local_id);
  r.remote_comm_id.set(c.remote_id);
  r.local_qpn.set(c.qpn);
  r.starting_psn.set(c.rq_psn);
  r.responder_resources = our_resources;
  r.initiator_depth = our_depth;
  r.b26 = static_cast<std::uint8_t>(15 << 3);  // target ACK delay; failover not accepted; no flow control
  r.b27 = static_cast<std::uint8_t>(c.rnr_retry << 5);
  r.local_ca_guid.set(cfg_.ca_guid);
  copy_priv(r.private_data, sizeof r.private_data, priv);
  c.responder_resources = our_resources;
  c.initiator_depth = our_depth;
  c.state = State::kRepSent;
  c.qp_rx_at_rep = qp->ctr[transport::QpCounter::rcvd_pkts];
  send_conn(c, m, now);
  return 0;
}

int CmAgent::establish(std::uint32_t id, std::uint32_t owner, std::uint64_t now) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second.owner != owner || it->second.state != State::kRepRcvd) return EINVAL;
  Conn& c = it->second;
  Mad rtu = Mad::make(Attr::kRtu, c.tid);
  rtu.as<Rtu>().local_comm_id.set(c.local_id);
  rtu.as<Rtu>().remote_comm_id.set(c.remote_id);
  c.last = rtu;
  c.deadline = 0;
  c.state = State::kEstablished;
  inc(CmCounter::established);  // rdma_cm gives the active side no event for it
  send(c.peer, rtu, now);
  return 0;
}

int CmAgent::reject(std::uint32_t id, wire::ConstBytes priv, std::uint32_t owner, std::uint64_t now) {
  auto it = conns_.find(id);
  if (it != conns_.end() && it->second.owner == owner && it->second.state == State::kSidrRcvd) {
    if (priv.size() > sizeof(SidrRep::private_data)) return EINVAL;
    send_sidr_rep(it->second, kSidrRejected, 0, 0, priv, now);
    return 0;
  }
  if (it == conns_.end() || it->second.owner != owner || it->second.state != State::kReqRcvd) return EINVAL;
  if (priv.size() > sizeof(Rej::private_data)) return EINVAL;
  send_rej(it->second.peer, it->second.tid, id, it->second.remote_id, kMsgReq, kRejConsumer, priv, now);
  conns_.erase(it);
  return 0;
}

int CmAgent::disconnect(std::uint32_t id, std::uint32_t owner, std::uint64_t now) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second.owner != owner) return EINVAL;
  Conn& c = it->second;
  switch (c.state) {
    case State::kEstablished:
    case State::kRepSent: {
      qp_to_error(c);
      // A DREQ opens a transaction of its sender's: the active side goes on
      // with its REQ's ID, the passive side takes one of its own (as Linux).
      if (!c.active) c.tid = next_tid();
      Mad m = Mad::make(Attr::kDreq, c.tid);
      Dreq& d = m.as<Dreq>();
      d.local_comm_id.set(c.local_id);
      d.remote_comm_id.set(c.remote_id);
      d.remote_qpn.set(c.peer_qpn);
      c.state = State::kDreqSent;
      send_conn(c, m, now);
      return 0;
    }
    case State::kReqSent:  // give up connecting
      send_rej(c.peer, c.tid, c.local_id, 0, kMsgOther, kRejConsumer, {}, now);
      conns_.erase(it);
      return 0;
    case State::kReqRcvd:
    case State::kSidrRcvd: return reject(id, {}, owner, now);
    case State::kSidrSent:  // stop asking
      conns_.erase(it);
      return 0;
    case State::kRepRcvd:  // the application never said establish: refuse the REP
      send_rej(c.peer, c.tid, c.local_id, c.remote_id, kMsgRep, kRejConsumer, {}, now);
      conns_.erase(it);
      return 0;
    default: return EINVAL;  // already closing
  }
}

void CmAgent::drop_owner(std::uint32_t owner, std::uint64_t now) {
  std::vector<std::uint32_t> ids;
  for (const auto& [id, c] : conns_)
    if (c.owner == owner) ids.push_back(id);
  for (std::uint32_t id : ids) {
    disconnect(id, owner, now);
    if (auto it = conns_.find(id); it != conns_.end()) it->second.owner = 0;
  }
  std::erase_if(listens_, [owner](const auto& l) { return l.second == owner; });
  events_.erase(owner);
}

bool CmAgent::next_event(std::uint32_t owner, CmEvent& out) {
  auto it = events_.find(owner);
  if (it == events_.end() || it->second.empty()) return false;
  out = it->second.front();
  it->second.pop_front();
  return true;
}

// ------------------------------------------------------------ receiving

CmAgent::Conn* CmAgent::find(std::uint32_t local_id, const wire::IpAddr& src) {
  auto it = conns_.find(local_id);
  if (it == conns_.end() || !(it->second.peer == src)) {
    inc(CmCounter::unmatched);
    return nullptr;
  }
  return &it->second;
}

void CmAgent::on_req(const Mad& m, const wire::IpAddr& src, std::uint64_t now) {
  const Req& r = m.as<Req>();
  const std::uint32_t rid = r.local_comm_id.get();
  for (auto& [id, c] : conns_) {
    if (c.active || c.remote_id != rid || !(c.peer == src)) continue;
    // A resent REQ: our REP was lost (answer it again) or the application
    // has not decided yet (stay quiet; the peer keeps waiting).
    inc(CmCounter::duplicates);
    if (c.state == State::kRepSent || c.state == State::kEstablished) send(c.peer, c.last, now);
    return;
  }
  const std::uint64_t sid = r.service_id.get();
  const std::uint16_t port = static_cast<std::uint16_t>(sid);
  auto l = listens_.find(listen_key(port, false));
  if ((sid & ~0xffffffull) != kServiceIdPrefix || ((sid >> 16) & 0xff) != kPortSpaceTcp || l == listens_.end())
    return send_rej(src, m.hdr.tid.get(), 0, rid, kMsgReq, kRejInvalidServiceId, {}, now);
  if (r.transport() != 0) return send_rej(src, m.hdr.tid.get(), 0, rid, kMsgReq, kRejInvalidTransport, {}, now);
  if (!(ip_from_gid(r.primary.remote_gid) == eng_.config().ip))
    return send_rej(src, m.hdr.tid.get(), 0, rid, kMsgReq, kRejInvalidGid, {}, now);
  const auto* h = reinterpret_cast<const CmaHdr*>(r.private_data);
  const std::uint8_t ipv = h->ip_version >> 4;
  if (transport::mtu_bytes(static_cast<ibv_mtu>(r.path_mtu())) == 0)
    return send_rej(src, m.hdr.tid.get(), 0, rid, kMsgReq, kRejInvalidMtu, {}, now);
  Conn c;
  c.local_id = next_comm_id();
  c.remote_id = rid;
  c.tid = m.hdr.tid.get();
  c.owner = l->second;
  c.state = State::kReqRcvd;
  c.peer = src;
  c.local_port = port;
  c.peer_port = (ipv == 4 || ipv == 6) ? h->src_port.get() : 0;
  c.peer_qpn = r.local_qpn.get();
  c.sq_psn = r.starting_psn.get();
  c.mtu = std::min(static_cast<ibv_mtu>(r.path_mtu()), cfg_.max_mtu);
  c.responder_resources = r.responder_resources;
  c.initiator_depth = r.initiator_depth;
  c.retry_cnt = r.retry_count();
  c.rnr_retry = r.rnr_retry();
  c.ack_timeout = r.primary.ack_timeout >> 3;
  if (c.ack_timeout == 0) c.ack_timeout = 14;
  // Chosen now, so that the request's event already says what the QP is to
  // be brought up with (an application that brings up its own QP asks
  // rdma_init_qp_attr before it accepts). Our READ depth is bounded by what
  // the peer accepts, and we accept what it issues.
  c.rq_psn = next_psn() & 0xffffff;
  c.max_rd_atomic = std::min<std::uint8_t>(c.responder_resources, transport::kMaxRdAtomic);
  c.max_dest_rd_atomic = std::min<std::uint8_t>(c.initiator_depth, transport::kMaxRdAtomic);
  const Conn& stored = conns_[c.local_id] = c;
  event(stored, CmEvent::Type::kConnectRequest, 0,
        wire::ConstBytes(r.private_data + sizeof(CmaHdr), kReqUserPrivate));
}

void CmAgent::on_rep(const Mad& m, const wire::IpAddr& src, std::uint64_t now) {
  const Rep& r = m.as<Rep>();
  Conn* c = find(r.remote_comm_id.get(), src);
  if (!c || !c->active) return;
  if (c->state == State::kEstablished && c->remote_id == r.local_comm_id.get()) {
    inc(CmCounter::duplicates);  // our RTU was lost: send it again
    send(c->peer, c->last, now);
    return;
  }
  if (c->state == State::kRepRcvd) {
    inc(CmCounter::duplicates);  // the application has not said establish yet
    return;
  }
  if (c->state != State::kReqSent) return;
  c->remote_id = r.local_comm_id.get();
  c->peer_qpn = r.local_qpn.get();
  c->sq_psn = r.starting_psn.get();
  c->max_rd_atomic = std::min(r.responder_resources, c->initiator_depth);
  c->max_dest_rd_atomic = c->responder_resources;
  if (c->app_qp) {
    // The application brings its QP up with what the event says, then
    // establish() sends the RTU.
    c->state = State::kRepRcvd;
    c->deadline = 0;
    event(*c, CmEvent::Type::kConnectResponse, 0, wire::ConstBytes(r.private_data, kReqUserPrivate));
    return;
  }
  const int err = bring_up(qp_of(*c), *c, c->max_rd_atomic, c->max_dest_rd_atomic);
  if (err != 0) {
    send_rej(c->peer, c->tid, c->local_id, c->remote_id, kMsgRep, kRejNoResources, {}, now);
    qp_to_error(*c);
    event(*c, CmEvent::Type::kUnreachable, kRejNoResources);
    conns_.erase(c->local_id);
    return;
  }
  Mad rtu = Mad::make(Attr::kRtu, c->tid);
  rtu.as<Rtu>().local_comm_id.set(c->local_id);
  rtu.as<Rtu>().remote_comm_id.set(c->remote_id);
  c->last = rtu;
  c->deadline = 0;
  c->state = State::kEstablished;
  send(c->peer, rtu, now);
  event(*c, CmEvent::Type::kEstablished, 0, wire::ConstBytes(r.private_data, kReqUserPrivate));
}

void CmAgent::on_rtu(const Mad& m, const wire::IpAddr& src) {
  const Rtu& r = m.as<Rtu>();
  Conn* c = find(r.remote_comm_id.get(), src);
  if (!c || c->active || c->remote_id != r.local_comm_id.get()) return;
  if (c->state != State::kRepSent) {
    inc(CmCounter::duplicates);
    return;
  }
  c->state = State::kEstablished;
  c->deadline = 0;
  event(*c, CmEvent::Type::kEstablished);
}

void CmAgent::on_rej(const Mad& m, const wire::IpAddr& src) {
  const Rej& r = m.as<Rej>();
  Conn* c = find(r.remote_comm_id.get(), src);
  if (!c || (c->state != State::kReqSent && c->state != State::kRepSent && c->state != State::kRepRcvd)) return;
  if (c->state == State::kRepSent) qp_to_error(*c);
  event(*c, CmEvent::Type::kRejected, r.reason.get(), wire::ConstBytes(r.private_data, kReqUserPrivate));
  conns_.erase(c->local_id);
}

void CmAgent::on_dreq(const Mad& m, const wire::IpAddr& src, std::uint64_t now) {
  const Dreq& d = m.as<Dreq>();
  Mad rep = Mad::make(Attr::kDrep, m.hdr.tid.get());
  rep.as<Drep>().local_comm_id.set(d.remote_comm_id.get());
  rep.as<Drep>().remote_comm_id.set(d.local_comm_id.get());
  auto it = conns_.find(d.remote_comm_id.get());
  if (it == conns_.end() || !(it->second.peer == src) || it->second.remote_id != d.local_comm_id.get()) {
    // Nothing of ours (or long gone): answer anyway so the peer can finish.
    inc(CmCounter::unmatched);
    send(src, rep, now);
    return;
  }
  Conn& c = it->second;
  switch (c.state) {
    case State::kEstablished:
    case State::kRepSent:
    case State::kDreqSent:
      qp_to_error(c);
      event(c, CmEvent::Type::kDisconnected);
      c.state = State::kTimeWait;
      c.deadline = now + cfg_.timewait_ns;
      c.last = rep;
      send(c.peer, rep, now);
      return;
    case State::kTimeWait:
      inc(CmCounter::duplicates);  // our DREP was lost
      send(c.peer, rep, now);
      return;
    default: inc(CmCounter::unmatched); return;
  }
}

void CmAgent::on_drep(const Mad& m, const wire::IpAddr& src, std::uint64_t now) {
  const Drep& d = m.as<Drep>();
  Conn* c = find(d.remote_comm_id.get(), src);
  if (!c || c->state != State::kDreqSent) return;
  event(*c, CmEvent::Type::kDisconnected);
  c->state = State::kTimeWait;
  c->deadline = now + cfg_.timewait_ns;
}

void CmAgent::on_mra(const Mad& m, const wire::IpAddr& src) {
  const Mra& r = m.as<Mra>();
  Conn* c = find(r.remote_comm_id.get(), src);
  if (!c || c->deadline == 0) return;
  // The peer needs more time: 4.096 us * 2^timeout, at most a minute.
  const std::uint64_t extra = std::min<std::uint64_t>(4096ull << std::min<std::uint8_t>(r.service_timeout(), 31),
                                                      60'000'000'000ull);
  c->deadline += extra;
}

// ------------------------------------------------------------ SIDR (UD)

CmAgent::Conn CmAgent::active_conn(const Qp* qp, const wire::IpAddr& dst, std::uint16_t port, std::uint32_t owner,
                                   State state) {
  Conn c;
  c.local_id = next_comm_id();
  c.tid = next_tid();
  c.owner = owner;
  c.active = true;
  c.state = state;
  c.qpn = qp->qpn;
  c.qp_handle = qp->handle;
  c.peer = dst;
  c.peer_port = port;
  c.local_port = next_src_port();
  return c;
}

void CmAgent::put_cma_hdr(std::uint8_t* priv, const wire::IpAddr& dst, std::uint16_t src_port) const {
  auto* h = reinterpret_cast<CmaHdr*>(priv);
  h->cma_version = 0;
  h->ip_version = dst.is_v4_mapped() ? 0x40 : 0x60;
  h->src_port.set(src_port);
  cma_addr(eng_.config().ip, h->src_addr);
  cma_addr(dst, h->dst_addr);
}

int CmAgent::sidr_connect(Qp* qp, const wire::IpAddr& dst, std::uint16_t port, wire::ConstBytes priv,
                          std::uint32_t owner, std::uint64_t now, std::uint32_t& id) {
  if (priv.size() > kSidrUserPrivate) return EINVAL;
  Conn c = active_conn(qp, dst, port, owner, State::kSidrSent);
  c.ud = true;
  Mad m = Mad::make(Attr::kSidrReq, c.tid);
  SidrReq& r = m.as<SidrReq>();
  r.request_id.set(c.local_id);
  r.pkey.set(0xffff);
  r.service_id.set(service_id(kPortSpaceUdp, port));
  put_cma_hdr(r.private_data, dst, c.local_port);
  copy_priv(r.private_data + sizeof(CmaHdr), kSidrUserPrivate, priv);
  id = c.local_id;
  auto& stored = conns_[c.local_id] = c;
  send_conn(stored, m, now);
  return 0;
}

void CmAgent::send_sidr_rep(Conn& c, std::uint8_t status, std::uint32_t qpn, std::uint32_t qkey,
                            wire::ConstBytes priv, std::uint64_t now) {
  Mad m = Mad::make(Attr::kSidrRep, c.tid);
  SidrRep& r = m.as<SidrRep>();
  r.request_id.set(c.remote_id);
  r.status = status;
  r.qpn.set(qpn);
  r.service_id.set(service_id(kPortSpaceUdp, c.local_port));
  r.qkey.set(qkey);
  copy_priv(r.private_data, sizeof r.private_data, priv);
  if (status != kSidrOk) inc(CmCounter::rejects_sent);
  // Kept a while to answer a resent request again (its sender lost ours).
  c.last = m;
  c.state = State::kTimeWait;
  c.deadline = now + cfg_.timewait_ns;
  send(c.peer, m, now);
}

void CmAgent::on_sidr_req(const Mad& m, const wire::IpAddr& src, std::uint64_t now) {
  const SidrReq& r = m.as<SidrReq>();
  const std::uint32_t rid = r.request_id.get();
  for (auto& [id, c] : conns_) {
    if (!c.ud || c.active || c.remote_id != rid || !(c.peer == src) || c.tid != m.hdr.tid.get()) continue;
    inc(CmCounter::duplicates);  // answered: answer again; undecided: stay quiet
    if (c.state == State::kTimeWait) send(c.peer, c.last, now);
    return;
  }
  Conn c;
  c.local_id = next_comm_id();
  c.remote_id = rid;
  c.tid = m.hdr.tid.get();
  c.ud = true;
  c.peer = src;
  const std::uint64_t sid = r.service_id.get();
  c.local_port = static_cast<std::uint16_t>(sid);
  const auto l = listens_.find(listen_key(c.local_port, true));
  const bool ours = (sid & ~0xffffffull) == kServiceIdPrefix && ((sid >> 16) & 0xff) == kPortSpaceUdp;
  if (!ours || l == listens_.end()) {
    inc(CmCounter::rejects_sent);
    Mad rep = Mad::make(Attr::kSidrRep, c.tid);
    rep.as<SidrRep>().request_id.set(rid);
    rep.as<SidrRep>().status = kSidrNoService;
    rep.as<SidrRep>().service_id.set(sid);
    send(src, rep, now);
    return;
  }
  const auto* h = reinterpret_cast<const CmaHdr*>(r.private_data);
  const std::uint8_t ipv = h->ip_version >> 4;
  c.owner = l->second;
  c.state = State::kSidrRcvd;
  c.peer_port = (ipv == 4 || ipv == 6) ? h->src_port.get() : 0;
  const Conn& stored = conns_[c.local_id] = c;
  event(stored, CmEvent::Type::kConnectRequest, 0,
        wire::ConstBytes(r.private_data + sizeof(CmaHdr), kSidrUserPrivate));
}

void CmAgent::on_sidr_rep(const Mad& m, const wire::IpAddr& src) {
  const SidrRep& r = m.as<SidrRep>();
  Conn* c = find(r.request_id.get(), src);
  if (!c || !c->ud || c->state != State::kSidrSent) {
    if (c) inc(CmCounter::duplicates);
    return;
  }
  c->peer_qpn = r.qpn.get();
  c->qkey = r.qkey.get();
  if (r.status == kSidrOk) {
    inc(CmCounter::established);
    event(*c, CmEvent::Type::kEstablished, 0, wire::ConstBytes(r.private_data, sizeof r.private_data));
  } else {
    // As rdma_cm: UNREACHABLE, with the SIDR status.
    event(*c, CmEvent::Type::kUnreachable, r.status, wire::ConstBytes(r.private_data, sizeof r.private_data));
  }
  conns_.erase(c->local_id);
}

void CmAgent::on_mad(const Mad& m, const wire::IpAddr& src, std::uint64_t now) {
  switch (m.attr()) {
    case Attr::kReq: return on_req(m, src, now);
    case Attr::kRep: return on_rep(m, src, now);
    case Attr::kRtu: return on_rtu(m, src);
    case Attr::kRej: return on_rej(m, src);
    case Attr::kDreq: return on_dreq(m, src, now);
    case Attr::kDrep: return on_drep(m, src, now);
    case Attr::kMra: return on_mra(m, src);
    case Attr::kSidrReq: return on_sidr_req(m, src, now);
    case Attr::kSidrRep: return on_sidr_rep(m, src);
  }
}

void CmAgent::on_timer(Conn& c, std::uint64_t now, bool& erase) {
  const bool retry = c.sends < cfg_.max_sends;
  switch (c.state) {
    case State::kRepSent: {
      // Traffic on the QP means the RTU was lost but the peer is up (IBTA
      // 12.9.6: communication established).
      const Qp* qp = qp_of(c);
      if (qp && qp->ctr[transport::QpCounter::rcvd_pkts] > c.qp_rx_at_rep) {
        c.state = State::kEstablished;
        c.deadline = 0;
        event(c, CmEvent::Type::kEstablished);
        return;
      }
      if (!retry) {
        qp_to_error(c);
        send_rej(c.peer, c.tid, c.local_id, c.remote_id, kMsgRep, kRejTimeout, {}, now);
        event(c, CmEvent::Type::kUnreachable, kRejTimeout);
        erase = true;
        return;
      }
      break;
    }
    case State::kSidrSent:
      if (!retry) {
        event(c, CmEvent::Type::kUnreachable, kRejTimeout);
        erase = true;
        return;
      }
      break;
    case State::kReqSent:
      if (!retry) {
        send_rej(c.peer, c.tid, c.local_id, 0, kMsgOther, kRejTimeout, {}, now);
        event(c, CmEvent::Type::kUnreachable, kRejTimeout);
        erase = true;
        return;
      }
      break;
    case State::kDreqSent:
      if (!retry) {  // the peer is gone: we are disconnected all the same
        event(c, CmEvent::Type::kDisconnected);
        c.state = State::kTimeWait;
        c.deadline = now + cfg_.timewait_ns;
        return;
      }
      break;
    case State::kTimeWait: erase = true; return;
    default: c.deadline = 0; return;
  }
  ++c.sends;
  // Back off (0.5, 1, then 2 s apart): a Linux peer that lost our REQ's
  // answer resends it only after the local CM response timeout we advertise
  // (kCmResponseTimeout, 4.3 s), and ignores duplicate REQs meanwhile, so
  // eight sends must span more than that (13.5 s in all with the defaults).
  c.deadline = now + std::min(cfg_.resend_ns << std::min<std::uint32_t>(c.sends - 1, 2), cfg_.resend_ns * 4);
  inc(CmCounter::resends);
  send(c.peer, c.last, now);
}

std::uint64_t CmAgent::next_deadline() const {
  std::uint64_t d = 0;
  for (const auto& [id, c] : conns_)
    if (c.deadline != 0 && (d == 0 || c.deadline < d)) d = c.deadline;
  for (const Pending& p : pending_)
    if (d == 0 || p.give_up < d) d = p.give_up;
  return d;
}

std::size_t CmAgent::poll(std::uint64_t now) {
  if (!ok()) return 0;
  std::size_t work = 0;
  ibv_wc wc[16];
  int n;
  while ((n = eng_.poll_cq(cq_, std::span<ibv_wc>(wc, 16))) > 0) {
    for (int i = 0; i < n; ++i) {
      ++work;
      if (wc[i].wr_id >> 32) {  // a send slot is free again
        if (send_outstanding_) --send_outstanding_;
        continue;
      }
      const std::uint32_t slot = static_cast<std::uint32_t>(wc[i].wr_id);
      std::uint8_t* buf = mem_.data() + slot * kSlot;
      if (wc[i].status == IBV_WC_SUCCESS && wc[i].src_qp == transport::kGsiQpn &&
          wc[i].byte_len >= transport::kGrhBytes) {
        inc(CmCounter::mads_rx);
        // The GRH area: an IPv6 header, or 20 zero bytes then the IPv4 header.
        const bool v4 = buf[20] == 0x45;
        const wire::IpAddr src = v4 ? wire::IpAddr::from_v4_bytes(buf + 20 + 12) : wire::IpAddr::from_v6_bytes(buf + 8);
        Mad m;
        if (parse_mad(buf + transport::kGrhBytes, wc[i].byte_len - transport::kGrhBytes, m) == MadError::kOk)
          on_mad(m, src, now);
        else
          inc(CmCounter::bad_mads);
      } else if (wc[i].status == IBV_WC_SUCCESS) {
        inc(CmCounter::bad_mads);
      }
      const transport::Sge sg{reinterpret_cast<std::uint64_t>(buf), kSlot, mr_->lkey};
      eng_.post_recv(qp_, transport::RecvWr{slot, {&sg, 1}});
    }
  }
  for (auto it = conns_.begin(); it != conns_.end();) {
    bool erase = false;
    if (it->second.deadline != 0 && now >= it->second.deadline) {
      on_timer(it->second, now, erase);
      ++work;
    }
    it = erase ? conns_.erase(it) : std::next(it);
  }
  for (std::size_t i = 0; i < pending_.size();) {
    wire::MacAddr mac;
    const bool known = eng_.neighbor(pending_[i].dst, mac);
    if (known) post(pending_[i].dst, mac, pending_[i].mad);
    else if (now >= pending_[i].give_up) inc(CmCounter::unresolved);
    if (known || now >= pending_[i].give_up) {
      pending_[i] = pending_.back();
      pending_.pop_back();
      ++work;
    } else {
      ++i;
    }
  }
  return work;
}

}  // namespace uroce::cm
