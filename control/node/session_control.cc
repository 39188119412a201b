// The session server's handlers of everything but objects: HELLO (the
// session page and the doorbell), QP changes (MODIFY_QP, uroce's own
// options), multicast, address resolution, the RDMA CM calls and their
// event channel, and QUERY.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "control/node/session.h"
#include "stack/abi/doorbell.h"
#include "stack/abi/fd_msg.h"
#include "stack/abi/qp_attr.h"
#include "stack/cc/cc.h"

namespace uroce::control {

namespace asio = boost::asio;
using namespace transport;
using namespace sessions_internal;

void SessionServer::on_hello(Session& s, const Req& req) {
  uroce_hello_msg m;
  if (!req.take(m)) return;
  if (!uroce_abi_compatible(m.major, m.minor)) return req.fail(EPROTO, "ABI major version mismatch");
  if (s.hello) return req.fail(EPROTO, "hello twice");
  if (s.uid < 0) return req.fail(EACCES, "cannot read the peer's credentials (SO_PEERCRED)");
  {
    std::uint32_t all = 0, mine = 0;
    for (const auto& [id, o] : sessions_)
      if (o->hello) {
        ++all;
        mine += o->uid == s.uid ? 1 : 0;
      }
    if (all >= limits_.max_sessions) {
      ++refused_.sessions;
      return req.fail(EUSERS, "too many sessions on this daemon (max_sessions " + std::to_string(limits_.max_sessions) + ")");
    }
    if (mine >= limits_.max_sessions_per_uid) {
      ++refused_.sessions_per_uid;
      return req.fail(EUSERS, "too many sessions for uid " + std::to_string(s.uid) + " (max_sessions_per_uid " +
                              std::to_string(limits_.max_sessions_per_uid) + ")");
    }
  }
  Fd page_fd;
  Mapping page;
  if (!make_shared(UROCE_SESSION_PAGE_BYTES, page, page_fd)) return req.fail(ENOMEM, "cannot create the session page");
  int pair[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0)
    return req.fail(errno, "cannot create the doorbell");
  const Fd theirs(pair[1]);
  s.page_map = std::move(page);
  s.page = static_cast<uroce_session_page*>(s.page_map.addr);
  s.page->magic = UROCE_ABI_MAGIC;
  s.page->major = UROCE_ABI_MAJOR;
  s.page->minor = UROCE_ABI_MINOR;
  // Its posts are the pipeline's from here, as its minor says it names them.
  intake_.add_session(s.id, s.page, m.minor);
  s.bell = std::make_unique<asio::posix::stream_descriptor>(s.sock.get_executor(), pair[0]);
  s.hello = true;
  uroce_hello_reply r{};
  r.session = s.id;
  std::memcpy(r.gid, eng_.config().ip.b.data(), 16);
  std::memcpy(r.mac, eng_.config().mac.data(), 6);
  r.minor = UROCE_ABI_MINOR;
  const int give[2] = {page_fd.get(), theirs.get()};
  req.reply_fds(0, "", &r, sizeof r, give, 2);
  wait_bell(s);
  return;
}

void SessionServer::on_modify_qp(Session& s, const Req& req) {
  const uroce_msg_hdr& h = req.h;
  uroce_modify_qp_msg m;
  if (!req.take(m, offsetof(uroce_modify_qp_msg, flow_label))) return;  // minor 4 sends 64 bytes
  auto q = s.qps.find(m.qp);
  if (q == s.qps.end()) return req.fail(EINVAL, "no such QP in this session");
  // The one codec (stack/abi/qp_attr.h); the engine checks every value
  // the mask names, so nothing is defaulted or forced here.
  int mask = 0;
  const ibv_qp_attr a = abi::from_msg(m, mask);
  // A controlled Q_Key (high bit set, IBTA 10.2.5) is the daemon's own:
  // QP1 speaks the CM with one, and an application must not pose as it.
  if ((mask & IBV_QP_QKEY) && (a.qkey & 0x80000000u))
    return req.fail(EPERM, "a Q_Key with the high bit set is controlled (IBTA 10.2.5): not for applications");
  const ModifyResult res = eng_.modify_qp(q->second.qp, a, mask);
  if (res.err == EHOSTUNREACH && eng_.resolves()) {
    // Resolve the peer (ARP or ND) and answer when it is known, as a
    // kernel RDMA stack does while it resolves the address.
    wire::IpAddr dgid;
    std::memcpy(dgid.b.data(), m.dgid, 16);
    if (!park(s, m.qp, h, a, mask, dgid))
      return req.fail(EAGAIN, "too many requests already waiting for address resolution; try again");
    return;
  }
  return req.reply(res.err, res.err ? res.why : "", nullptr, 0);
}

void SessionServer::on_set_qp_opt(Session& s, const Req& req) {
  uroce_qp_opt_msg m;
  if (!req.take(m)) return;
  auto q = s.qps.find(m.qp);
  if (q == s.qps.end()) return req.fail(EINVAL, "no such QP in this session");
  if (m.opt == UROCE_QP_OPT_CC) {
    const std::string name(m.name, strnlen(m.name, sizeof m.name));
    if (cc::find(name) == nullptr) return req.fail(EINVAL, "no such congestion control");
    const int rc = eng_.set_cc(q->second.qp, name);
    // The engine's one refusal of a known name: an algorithm that needs ACKs, on UD.
    if (rc == EOPNOTSUPP) return req.fail(rc, cc::ud_refusal(name));
    return req.reply(rc, rc ? "refused" : "", nullptr, 0);
  }
  if (m.opt == UROCE_QP_OPT_SR) {
    if (m.value > 1) return req.fail(EINVAL, "selective repeat is 0 or 1");
    const int rc = eng_.set_selective_repeat(q->second.qp, m.value == 1);
    return req.reply(rc,
                      rc == EBUSY       ? "selective repeat is set before RTR"
                      : rc == EOPNOTSUPP ? "selective repeat is for RC QPs without an SRQ"
                      : rc               ? "refused"
                                         : "",
                      nullptr, 0);
  }
  return req.fail(EINVAL, "unknown QP option");
}

void SessionServer::on_mcast(Session& s, const Req& req) {
  uroce_mcast_msg m;
  if (!req.take(m)) return;
  auto q = s.qps.find(m.qp);
  if (q == s.qps.end()) return req.fail(EINVAL, "no such QP in this session");
  wire::IpAddr gid;
  std::memcpy(gid.b.data(), m.gid, 16);
  auto& groups = q->second.groups;
  const auto in = std::find(groups.begin(), groups.end(), gid);
  if (m.attach == 0) {
    if (in == groups.end()) return req.fail(EINVAL, "the QP is not in that multicast group");
    (void)eng_.detach_mcast(q->second.qp, gid);
    groups.erase(in);
    return req.reply(0, "", nullptr, 0);
  }
  if (m.attach != 1) return req.fail(EINVAL, "attach is 0 or 1");
  if (in != groups.end()) return req.reply(0, "", nullptr, 0);  // already in it
  if (held_by(sessions_, s.uid, [](const auto& q) { return q.groups.size(); }) >= limits_.max_mcast_per_uid) {
    ++refused_.mcast_per_uid;
    return req.fail(EDQUOT, "too many multicast attachments for uid " + std::to_string(s.uid) + " (max_mcast_per_uid " +
                            std::to_string(limits_.max_mcast_per_uid) + ")");
  }
  const int rc = eng_.attach_mcast(q->second.qp, gid);
  if (rc == EINVAL) return req.fail(rc, "only a UD QP joins a group, and a group is a multicast address");
  if (rc != 0) return req.fail(rc, "the daemon's multicast table is full");
  groups.push_back(gid);
  return req.reply(0, "", nullptr, 0);
}

void SessionServer::on_resolve(Session& s, const Req& req) {
  const uroce_msg_hdr& h = req.h;
  // A UD address handle's MAC, as the kernel resolves one at
  // ibv_create_ah: from the one neighbour table (the port's own address
  // is in it, for loopback), or after ARP/ND.
  uroce_resolve_msg m;
  if (!req.take(m)) return;
  wire::IpAddr dgid;
  std::memcpy(dgid.b.data(), m.dgid, 16);
  uroce_resolve_reply r{};
  if (dgid.is_multicast()) {  // a group's MAC is its address's (RFC 1112, RFC 2464): nothing to ask
    const wire::MacAddr mac = dgid.multicast_mac();
    std::memcpy(r.mac, mac.data(), 6);
    return req.reply(0, "", &r, sizeof r);
  }
  if (dgid.is_v4_mapped() ? dgid.b[12] == 0 || dgid.b[12] >= 240 : false)
    return req.fail(EINVAL, "not a unicast address");
  wire::MacAddr mac{};
  if (eng_.neighbor(dgid, mac)) {
    std::memcpy(r.mac, mac.data(), 6);
    return req.reply(0, "", &r, sizeof r);
  }
  if (!eng_.resolves()) return req.fail(EHOSTUNREACH, "no neighbour entry for the GID, and no way to resolve it");
  if (!park(s, 0, h, ibv_qp_attr{}, 0, dgid))
    return req.fail(EAGAIN, "too many requests already waiting for address resolution; try again");
  return;
}

void SessionServer::on_cm_call(Session& s, const Req& req) {
  const uroce_msg_hdr& h = req.h;
  uroce_cm_msg m;
  if (!req.take(m, offsetof(uroce_cm_msg, flags))) return;  // minor 8 and older send 88 bytes
  if (m.flags & ~(UROCE_CM_APP_QP | UROCE_CM_UD | UROCE_CM_ACK_TIMEOUT)) return req.fail(EINVAL, "unknown CM flags");
  if ((m.flags & UROCE_CM_ACK_TIMEOUT) && m.ack_timeout > 31) return req.fail(EINVAL, "the ACK timeout is 0..31");
  const int ack_timeout = (m.flags & UROCE_CM_ACK_TIMEOUT) ? m.ack_timeout : -1;
  const bool app_qp = (m.flags & UROCE_CM_APP_QP) != 0;
  const bool ud = (m.flags & UROCE_CM_UD) != 0;
  if (!cm_->ok()) return req.fail(ENODEV, "the CM agent has no QP1");
  if (m.private_len > UROCE_CM_PRIVATE_MAX) return req.fail(EINVAL, "CM private data is at most 56 bytes");
  const wire::ConstBytes priv(m.private_data, m.private_len);
  const std::uint64_t t = now_ns();
  Qp* qp = nullptr;
  if (h.type == UROCE_MSG_CM_CONNECT || h.type == UROCE_MSG_CM_ACCEPT) {
    auto q = s.qps.find(m.qp);
    if (q == s.qps.end()) return req.fail(EINVAL, "no such QP in this session");
    qp = q->second.qp;
  }
  int rc = 0;
  switch (h.type) {
    case UROCE_MSG_CM_LISTEN:
      rc = cm_->listen(m.port, s.id, ud);
      if (rc == EADDRINUSE) return req.fail(rc, "another application listens on this port");
      break;
    case UROCE_MSG_CM_CONNECT: {
      cm::ConnParams p;
      if (m.mtu != 0) p.mtu = static_cast<ibv_mtu>(m.mtu);
      p.responder_resources = m.responder_resources;
      p.initiator_depth = m.initiator_depth;
      p.retry_cnt = m.retry_cnt ? m.retry_cnt : 7;
      p.rnr_retry = m.rnr_retry ? m.rnr_retry : 7;
      if (ack_timeout >= 0) p.ack_timeout = static_cast<std::uint8_t>(ack_timeout);
      uroce_cm_id_reply r{};
      rc = cm_->connect(qp, wire::IpAddr::from_v6_bytes(m.dgid), m.port, priv, s.id, p, t, r.id, app_qp);
      if (rc != 0) return req.fail(rc, "cannot connect: the QP must be RC in RESET or INIT, or UD, or the application's own (UROCE_CM_APP_QP) not in ERR, and the MTU valid");
      return req.reply(0, "", &r, sizeof r);
    }
    case UROCE_MSG_CM_ACCEPT:
      rc = cm_->accept(m.id, qp, priv, s.id, t, app_qp, ack_timeout);
      if (rc != 0)
        return req.fail(rc, app_qp ? "cannot accept: no such request of this session, or the QP is in ERR"
                               : "cannot accept: no such request of this session, or the QP is not RC in RESET/INIT");
      break;
    case UROCE_MSG_CM_ESTABLISH:
      rc = cm_->establish(m.id, s.id, t);
      if (rc != 0) return req.fail(rc, "no connection of this session waits for establish (a connect with UROCE_CM_APP_QP)");
      break;
    case UROCE_MSG_CM_REJECT:
      rc = cm_->reject(m.id, priv, s.id, t);
      if (rc != 0) return req.fail(rc, "no such connect request of this session");
      break;
    default:
      rc = cm_->disconnect(m.id, s.id, t);
      if (rc != 0) return req.fail(rc, "no such connection of this session, or it is already closing");
      break;
  }
  return req.reply(0, "", nullptr, 0);
}

void SessionServer::on_cm_unlisten(Session& s, const Req& req) {
  uroce_cm_msg m;
  if (!req.take(m, offsetof(uroce_cm_msg, flags))) return;
  if (!cm_->ok()) return req.fail(ENODEV, "the CM agent has no QP1");
  if (const int rc = cm_->unlisten(m.port, s.id, (m.flags & UROCE_CM_UD) != 0))
    return req.fail(rc, "this session does not listen on that port");
  return req.reply(0, "", nullptr, 0);
}

void SessionServer::on_cm_channel(Session& s, const Req& req) {
  std::vector<int>& fds = req.fds;
  if (fds.empty() || !abi::is_unix_dgram(fds.front()))
    return req.fail(EINVAL, "a CM channel must be a Unix datagram socket");
  if (s.cm_chan >= 0) ::close(s.cm_chan);  // a second one replaces the first
  s.cm_chan = fds.front();
  fds.erase(fds.begin());
  return req.reply(0, "", nullptr, 0);
}

void SessionServer::on_cm_event(void* ctx, std::uint32_t owner) {
  auto* self = static_cast<SessionServer*>(ctx);
  const auto it = self->sessions_.find(owner);
  if (it == self->sessions_.end() || it->second->cm_chan < 0) return;
  // Never blocking: a full socket already holds a wake-up for this event.
  (void)abi::ring(it->second->cm_chan);
}

void SessionServer::on_query(Session& s, const Req& req) {
  uroce_query_msg m;
  if (!req.take(m)) return;
  if (m.object == UROCE_OBJ_PORT) {
    const pipeline::LinkInfo l = link_ ? link_(link_ctx_) : pipeline::LinkInfo{};
    const uroce_port_attr r{static_cast<std::uint32_t>(l.up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN), l.speed_mbps, l.mtu};
    return req.reply(0, "", &r, sizeof r);
  }
  if (m.object == UROCE_OBJ_DEVICE) {
    uroce_device_attr r{};
    r.max_qp = limits_.max_qps;
    r.max_cq = limits_.max_cqs;
    r.max_mr = limits_.max_mrs;
    r.max_pd = limits_.max_pds;
    r.max_qp_wr = 4096;  // CREATE_QP's bound
    r.max_sge = UROCE_ABI_MAX_SGE;
    r.max_cqe = 1u << 16;  // CREATE_CQ's bound
    r.max_qp_rd_atom = transport::kMaxRdAtomic;
    r.max_mr_size = limits_.max_mr_bytes;
    std::memcpy(r.mac, eng_.config().mac.data(), 6);
    r.flags = limits_.odp ? UROCE_DEVICE_ODP : 0;
    r.max_srq = limits_.max_srqs;  // SRQs, XRC SRQs and work queues
    r.max_srq_wr = kMaxSrqWr;
    return req.reply(0, "", &r, sizeof r);
  }
  if (m.object == UROCE_OBJ_QP) {
    auto q = s.qps.find(m.handle);
    if (q == s.qps.end()) return req.fail(EINVAL, "no such QP in this session");
    ibv_qp_attr a{};
    if (const int rc = eng_.query_qp(q->second.qp, a); rc != 0) return req.fail(rc, "cannot query the QP");
    const uroce_modify_qp_msg r = abi::to_msg(a, 0, m.handle);
    return req.reply(0, "", &r, sizeof r);
  }
  return req.fail(EINVAL, "only the device and QPs can be queried");
}

}  // namespace uroce::control
