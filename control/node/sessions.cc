#include "control/node/sessions.h"
#include "control/node/session.h"

#include "stack/cc/cc.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <utility>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "stack/abi/doorbell.h"
#include "stack/abi/fd_msg.h"
#include "stack/abi/qp_attr.h"
#include "control/node/sigbus_guard.h"

namespace uroce::control {

namespace asio = boost::asio;
using namespace transport;
using namespace sessions_internal;



SessionServer::SessionServer(asio::io_context& io, const std::string& path, unsigned mode, Engine& eng,
                             pipeline::Intake& intake, const SessionLimits& limits, Link link, void* link_ctx)
    : link_(link), link_ctx_(link_ctx), acceptor_(io), eng_(eng), intake_(intake), limits_(limits),
      accept_pause_(io),
      path_(path) {
  ::unlink(path.c_str());
  asio::local::stream_protocol::endpoint ep(path);
  acceptor_.open(ep.protocol());
  acceptor_.bind(ep);
  // The socket's permissions decide who may connect.
  ::chmod(path.c_str(), mode);
  acceptor_.listen();
  accept();
  cm::CmConfig cc;
  const auto& mac = eng.config().mac;  // the CA GUID: the MAC's EUI-64
  cc.ca_guid = (std::uint64_t{mac[0] ^ 2u} << 56) | (std::uint64_t{mac[1]} << 48) | (std::uint64_t{mac[2]} << 40) |
               (0xfffeull << 24) | (std::uint64_t{mac[3]} << 16) | (std::uint64_t{mac[4]} << 8) | mac[5];
  cc.seed = static_cast<std::uint64_t>(::getpid()) ^ static_cast<std::uint64_t>(now_ns());
  cm_ = std::make_unique<cm::CmAgent>(eng, cc);
  eng_.set_hooks(&SessionServer::on_cq_notify, &SessionServer::on_async_event, this);
  cm_->set_event_hook(&SessionServer::on_cm_event, this);
}

void SessionServer::on_cq_notify(void* ctx, Cq& cq) {
  auto* c = static_cast<Session::CqRes*>(cq.owner);
  if (!c || c->chan < 0) return;
  if (abi::ring(c->chan)) ++static_cast<SessionServer*>(ctx)->cq_notifies_;
  else ++c->session->notify_failed;
}

void SessionServer::on_async_event(void* ctx, ibv_event_type type, Cq* cq, Qp* qp) {
  (void)ctx;
  Session* s = nullptr;
  uroce_async_msg ev{static_cast<std::uint32_t>(type), 0};
  if (cq && cq->owner) {
    auto* c = static_cast<Session::CqRes*>(cq->owner);
    s = c->session;
    ev.handle = c->handle;
  } else if (qp && qp->owner) {
    auto* q = static_cast<Session::QpRes*>(qp->owner);
    s = q->session;
    ev.handle = q->handle;
  }
  if (!s || !s->bell) return;
  // On the doorbell socket, never blocking: a full socket loses the event,
  // and that is counted (the CQ's overflow is in the port counters too).
  if (::send(s->bell->native_handle(), &ev, sizeof ev, MSG_DONTWAIT | MSG_NOSIGNAL) != sizeof ev) ++s->events_failed;
}

SessionServer::~SessionServer() {
  for (auto& [id, s] : sessions_) close(*s);
  ::unlink(path_.c_str());
}

void SessionServer::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, asio::local::stream_protocol::socket sock) {
    if (ec == asio::error::operation_aborted) return;  // the server is going away
    // Out of descriptors, or any other failure: shed what waits, pause,
    // accept again; never a spin (accept_guard.h).
    if (guard_.retry_on_failure(ec, acceptor_.native_handle(), accept_pause_, [this] { accept(); })) return;
    // Who connected (the kernel's word, SO_PEERCRED): a peer whose
    // credentials cannot be read counts as uid -1, and is refused at hello.
    ucred cred{};
    socklen_t clen = sizeof cred;
    const bool have_cred = ::getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0;
    const int uid = have_cred ? static_cast<int>(cred.uid) : -1;
    std::size_t unhelloed = 0, mine = 0;
    for (const auto& [id, o] : sessions_)
      if (!o->hello) {
        ++unhelloed;
        mine += o->uid == uid ? 1 : 0;
      }
    // Too many connections that have not said hello, from this uid or in
    // all: this one is closed at once. The per-uid bound comes first, so a
    // uid that floods silent connections fills its own share, never the
    // others'.
    const bool per_uid = mine >= limits_.max_unhelloed_per_uid;
    if (per_uid || unhelloed >= limits_.max_unhelloed) {
      ++(per_uid ? refused_.unhelloed_per_uid : refused_.unhelloed);
      boost::system::error_code ignored;
      sock.close(ignored);
    } else {
      auto s = std::make_shared<Session>(std::move(sock));
      s->id = next_session_++;
      s->accepted_ms = now_ms();
      s->pid = have_cred ? cred.pid : -1;
      s->uid = uid;
      sessions_[s->id] = s;
      wait_read(s);
    }
    accept();
  });
}

void SessionServer::wait_read(const std::shared_ptr<Session>& s) {
  s->sock.async_wait(asio::socket_base::wait_read, [this, s](boost::system::error_code ec) {
    if (ec) return;
    on_readable(s);
  });
}

void SessionServer::on_readable(const std::shared_ptr<Session>& s) {
  std::uint8_t buf[UROCE_MSG_MAX];
  const ssize_t n = abi::recv_with_fds(s->sock.native_handle(), buf, sizeof buf, MSG_DONTWAIT,
                                       [&](int fd) { s->in_fds.push_back(fd); });
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    close(*s);  // the application exited or crashed
    sessions_.erase(s->id);
    return;
  }
  if (n > 0) {
    s->in.insert(s->in.end(), buf, buf + n);
  }
  // No request carries more than a few descriptors: a client that keeps
  // sending them with an unfinished request is cut off (and they are closed).
  if (s->in_fds.size() > abi::kMaxFdsPerMsg) {
    close(*s);
    sessions_.erase(s->id);
    return;
  }
  // Whole messages only; anything malformed ends the session (the daemon goes on).
  while (s->in.size() >= sizeof(uroce_msg_hdr)) {
    uroce_msg_hdr h;
    std::memcpy(&h, s->in.data(), sizeof h);
    if (h.magic != UROCE_MSG_MAGIC || h.len > UROCE_MSG_MAX) {
      close(*s);
      sessions_.erase(s->id);
      return;
    }
    if (s->in.size() < sizeof h + h.len) break;
    std::vector<int> fds;
    fds.swap(s->in_fds);
    handle(*s, h, s->in.data() + sizeof h, fds);
    for (int fd : fds) ::close(fd);  // whatever the handler did not keep
    s->in.erase(s->in.begin(), s->in.begin() + static_cast<long>(sizeof h + h.len));
  }
  wait_read(s);
}

namespace sessions_internal {

void send_reply_fds(int sock, const uroce_msg_hdr& req, int err, const std::string& why, const void* body,
                    std::size_t blen, const int* fds, std::size_t nfds) {
  std::uint8_t out[UROCE_MSG_MAX];
  uroce_msg_hdr h{UROCE_MSG_MAGIC, UROCE_ABI_MAJOR, static_cast<std::uint16_t>(req.type | UROCE_MSG_REPLY),
                  static_cast<std::uint32_t>(sizeof(uroce_reply_status) + blen), req.seq};
  uroce_reply_status st{};
  st.err = err;
  std::strncpy(st.why, why.c_str(), sizeof st.why - 1);
  std::memcpy(out, &h, sizeof h);
  std::memcpy(out + sizeof h, &st, sizeof st);
  if (blen) std::memcpy(out + sizeof h + sizeof st, body, blen);
  // Never blocks on a client: one that does not read its replies (the
  // protocol is one request, one reply) fills its socket, and is cut off;
  // its session then closes as after a disconnect.
  if (abi::send_with_fds(sock, out, sizeof h + sizeof st + blen, fds, nfds, MSG_DONTWAIT) < 0) ::shutdown(sock, SHUT_RDWR);
}

void send_reply(int sock, const uroce_msg_hdr& req, int err, const std::string& why, const void* body,
                std::size_t blen, int fd) {
  send_reply_fds(sock, req, err, why, body, blen, &fd, 1);
}

}  // namespace sessions_internal

namespace sessions_internal {

/// The memory part of REG_MR (`one`: a single memfd) or REG_MR_PIECES (and
/// of REREG_MR after its own fields): the pieces and the MR's exact bytes
/// within their pages (minor 14; else all of them; minor 15: maybe none).
/// Null, or why the request is malformed.
const char* parse_mr_memory(bool one, const std::uint8_t* body, std::size_t len, uroce_reg_mr_pieces_msg& pm,
                            uroce_reg_mr_exact& ex) {
  std::size_t fixed = 0;
  if (one) {
    if (len < sizeof pm.mr) return "message too short for its type";
    std::memcpy(&pm.mr, body, sizeof pm.mr);
    pm.count = 1;
    pm.piece[0] = {pm.mr.offset, pm.mr.length};
    fixed = sizeof pm.mr;
  } else {
    if (len < sizeof pm) return "message too short for its type";
    std::memcpy(&pm, body, sizeof pm);
    if (pm.count == 0 || pm.count > UROCE_MR_MAX_PIECES) return "an MR has 1..16 pieces";
    fixed = sizeof pm;
  }
  if (pm.mr.length == 0) return "MR length 0";
  ex = {0, pm.mr.length};
  if (len >= fixed + sizeof ex) {
    std::memcpy(&ex, body + fixed, sizeof ex);
    if (ex.head > 4095 || ex.head > pm.mr.length || ex.byte_length > pm.mr.length - ex.head)
      return "the MR's bytes are not within its pages";
  }
  return nullptr;
}

/// Maps the pieces of `pm` from `fds`, one after another. Null, or why
/// not, with `err` the errno to answer.
const char* map_mr_memory(const uroce_reg_mr_pieces_msg& pm, const std::vector<int>& fds, Mapping& map, int& err) {
  const uroce_reg_mr_msg& m = pm.mr;
  err = EINVAL;
  if (fds.size() < pm.count) return "REG_MR needs the memory's file descriptor (one per piece)";
  std::uint64_t sum = 0;
  for (std::uint32_t i = 0; i < pm.count; ++i) {
    const uroce_reg_mr_piece& p = pm.piece[i];
    if ((p.offset & 4095) || p.length == 0 || (pm.count > 1 && (p.length & 4095)))
      return "MR offset not page aligned, or a piece not whole pages";
    // The memory must be there, and stay there: the memfd must hold the
    // whole range and be sealed against shrinking, or a client could
    // truncate it under the daemon's mapping (SIGBUS on the next access).
    struct stat st {};
    if (::fstat(fds[i], &st) != 0 || !S_ISREG(st.st_mode)) return "REG_MR needs a memfd (or a regular file)";
    const int seals = ::fcntl(fds[i], F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) return "the MR's memfd must be sealed against shrinking (F_SEAL_SHRINK)";
    if (p.offset > static_cast<std::uint64_t>(st.st_size) || p.length > static_cast<std::uint64_t>(st.st_size) - p.offset)
      return "the MR's range is beyond the end of its memfd";
    if (p.length > m.length - sum) return "the MR's pieces add up to more than its length";
    sum += p.length;
  }
  if (sum != m.length) return "the MR's pieces do not add up to its length";
  map.len = m.length;
  if (pm.count == 1) {
    map.addr = ::mmap(nullptr, m.length, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], static_cast<off_t>(m.offset));
  } else {
    // Reserve the whole range, then map each piece over its part.
    map.addr = ::mmap(nullptr, m.length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    std::uint64_t at = 0;
    for (std::uint32_t i = 0; map.addr != MAP_FAILED && i < pm.count; ++i) {
      void* want = static_cast<std::uint8_t*>(map.addr) + at;
      if (::mmap(want, pm.piece[i].length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fds[i],
                 static_cast<off_t>(pm.piece[i].offset)) == MAP_FAILED) {
        const int e = errno;
        map.unmap();
        errno = e;
        map.addr = MAP_FAILED;
      }
      at += pm.piece[i].length;
    }
  }
  if (map.addr == MAP_FAILED) {
    err = errno;
    map.addr = nullptr;
    return "cannot map the MR's memory";
  }
  err = 0;
  return nullptr;
}

/// Whether the application may have raw packet QPs and flow rules: with
/// CAP_NET_RAW in its effective set, as the kernel asks (it could send any
/// frame it likes), read from its /proc status when it asks.
bool may_use_raw(int pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "re");
  if (f == nullptr) return false;
  char line[256];
  unsigned long long eff = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "CapEff: %llx", &eff) == 1) break;
  std::fclose(f);
  return (eff >> 13) & 1;  // CAP_NET_RAW
}

}  // namespace sessions_internal

void SessionServer::release_xrcd(Xrcd* x) {
  auto it = xrcds_.find(x);
  if (it == xrcds_.end() || --it->second.openers != 0) return;
  xrcds_.erase(it);
  (void)eng_.dealloc_xrcd(x);  // nothing is left in it: its SRQs and target QPs went with their sessions
}

void SessionServer::Req::fail(int err, const std::string& why) const { send_reply(sock, h, err, why, nullptr, 0); }
void SessionServer::Req::reply(int err, const std::string& why, const void* body, std::size_t len, int fd) const {
  send_reply(sock, h, err, why, body, len, fd);
}
void SessionServer::Req::reply_fds(int err, const std::string& why, const void* body, std::size_t len, const int* fds,
                                   std::size_t nfds) const {
  send_reply_fds(sock, h, err, why, body, len, fds, nfds);
}

void SessionServer::handle(Session& s, const uroce_msg_hdr& h, const std::uint8_t* body, std::vector<int>& fds) {
  const Req req{h, s.sock.native_handle(), fds, body};
  if (h.major != UROCE_ABI_MAJOR) return req.fail(EPROTO, "ABI major version mismatch");
  if (!s.hello && h.type != UROCE_MSG_HELLO) return req.fail(EPROTO, "say hello first");
  switch (h.type) {
    case UROCE_MSG_HELLO: return on_hello(s, req);
    case UROCE_MSG_ALLOC_PD: return on_alloc_pd(s, req);
    case UROCE_MSG_REG_MR:
    case UROCE_MSG_REG_MR_PIECES: return on_reg_mr(s, req);
    case UROCE_MSG_CREATE_FLOW: return on_create_flow(s, req);
    case UROCE_MSG_REG_MR_ODP: return on_reg_mr_odp(s, req);
    case UROCE_MSG_REREG_MR: return on_rereg_mr(s, req);
    case UROCE_MSG_ALLOC_MW: return on_alloc_mw(s, req);
    case UROCE_MSG_RESIZE_CQ: return on_resize_cq(s, req);
    case UROCE_MSG_CREATE_CQ: return on_create_cq(s, req);
    case UROCE_MSG_OPEN_XRCD: return on_open_xrcd(s, req);
    case UROCE_MSG_CREATE_SRQ: return on_create_srq(s, req);
    case UROCE_MSG_CREATE_QP: return on_create_qp(s, req);
    case UROCE_MSG_MODIFY_QP: return on_modify_qp(s, req);
    case UROCE_MSG_SET_QP_OPT: return on_set_qp_opt(s, req);
    case UROCE_MSG_MCAST: return on_mcast(s, req);
    case UROCE_MSG_RESOLVE: return on_resolve(s, req);
    case UROCE_MSG_DESTROY: return on_destroy(s, req);
    case UROCE_MSG_CM_LISTEN:
    case UROCE_MSG_CM_CONNECT:
    case UROCE_MSG_CM_ACCEPT:
    case UROCE_MSG_CM_REJECT:
    case UROCE_MSG_CM_DISCONNECT:
    case UROCE_MSG_CM_ESTABLISH: return on_cm_call(s, req);
    case UROCE_MSG_CM_UNLISTEN: return on_cm_unlisten(s, req);
    case UROCE_MSG_CM_CHANNEL: return on_cm_channel(s, req);
    case UROCE_MSG_CM_EVENT: return on_cm_event(s, req);
    case UROCE_MSG_QUERY: return on_query(s, req);
    default: return req.fail(EOPNOTSUPP, "unknown request type");
  }
}

void SessionServer::on_cm_event(Session& s, const Req& req) {
  const uroce_msg_hdr& h = req.h;
  const int sock = req.sock;
  cm::CmEvent e;
  if (!cm_->next_event(s.id, e)) return req.fail(EAGAIN, "no CM event");
  // rdma_cm_event_type's values
  static constexpr std::uint32_t kType[] = {4 /* CONNECT_REQUEST */, 9 /* ESTABLISHED */, 8 /* REJECTED */,
                                            10 /* DISCONNECTED */, 7 /* UNREACHABLE */, 5 /* CONNECT_RESPONSE */};
  uroce_cm_event_msg r{};
  r.event = kType[static_cast<int>(e.type)];
  r.id = e.id;
  r.status = e.reason;
  r.peer_qpn = e.peer_qpn;
  std::memcpy(r.peer_gid, e.peer.b.data(), 16);
  r.peer_port = e.peer_port;
  r.local_port = e.local_port;
  r.responder_resources = e.responder_resources;
  r.initiator_depth = e.initiator_depth;
  r.mtu = static_cast<std::uint8_t>(e.mtu);
  r.private_len = e.private_len;
  std::memcpy(r.private_data, e.private_data, e.private_len);
  r.sq_psn = e.sq_psn;
  r.rq_psn = e.rq_psn;
  r.retry_cnt = e.retry_cnt;
  r.rnr_retry = e.rnr_retry;
  r.ack_timeout = e.ack_timeout;
  r.max_rd_atomic = e.max_rd_atomic;
  r.max_dest_rd_atomic = e.max_dest_rd_atomic;
  r.ud = e.ud ? 1 : 0;
  r.qkey = e.qkey;
  return send_reply(sock, h, 0, "", &r, sizeof r);
}


nlohmann::ordered_json SessionServer::limits_status() const {
  const SessionLimits& l = limits_;
  return {{"max_sessions", l.max_sessions},
          {"max_sessions_per_uid", l.max_sessions_per_uid},
          {"max_unhelloed", l.max_unhelloed},
          {"max_unhelloed_per_uid", l.max_unhelloed_per_uid},
          {"hello_timeout_ms", l.hello_timeout_ms},
          {"max_qps", l.max_qps},
          {"max_qps_per_uid", l.max_qps_per_uid},
          {"max_mcast_per_uid", l.max_mcast_per_uid},
          {"max_flows_per_uid", l.max_flows_per_uid},
          {"max_cqs", l.max_cqs},
          {"max_mrs", l.max_mrs},
          {"max_mr_bytes", l.max_mr_bytes},
          {"max_pds", l.max_pds},
          {"max_srqs", l.max_srqs},
          {"max_pending_rtr", l.max_pending_rtr},
          {"max_pending_rtr_total", l.max_pending_rtr_total},
          {"max_pending_rtr_per_uid", l.max_pending_rtr_per_uid},
          {"refused",
           {{"sessions", refused_.sessions},
            {"sessions_per_uid", refused_.sessions_per_uid},
            {"unhelloed", refused_.unhelloed},
            {"unhelloed_per_uid", refused_.unhelloed_per_uid},
            {"hello_timeouts", refused_.hello_timeouts},
            {"mcast_per_uid", refused_.mcast_per_uid},
            {"flows_per_uid", refused_.flows_per_uid},
            {"qps_per_uid", refused_.qps_per_uid},
            {"pending_rtr_per_uid", refused_.pending_rtr_per_uid},
            {"accept_errors", guard_.errors()},
            {"emfile_drops", guard_.dropped()}}},
          {"closed", {{"memory_faults", memory_fault_closes_}}},
          {"tx_share", tx_share_status()}};
}

nlohmann::ordered_json SessionServer::tx_share_status() const {
  auto tenants = nlohmann::ordered_json::array();
  eng_.for_each_tenant([&](const transport::TenantReport& t) {
    tenants.push_back({{"uid", t.uid},
                       {"weight", t.weight},
                       {"qps", t.qps},
                       {"tx_bytes", t.tx_bytes},
                       {"tx_frames", t.tx_frames},
                       {"throttled", t.throttled}});
  });
  auto weights = nlohmann::ordered_json::object();
  for (const auto& [uid, w] : limits_.tx_weights) weights[std::to_string(uid)] = w;
  return {{"quantum_bytes", eng_.config().tx_quantum},
          {"default_weight", limits_.tx_weight_default},
          {"weights", weights},
          {"tenants", tenants}};
}

void SessionServer::set_limits(const SessionLimits& limits) {
  limits_ = limits;
  for (const auto& [id, s] : sessions_)
    if (s->uid >= 0) eng_.set_tenant_weight(static_cast<std::uint32_t>(s->uid), limits_.tx_weight(s->uid));
}

nlohmann::ordered_json SessionServer::describe() const {
  auto list = nlohmann::ordered_json::array();
  for (const auto& [id, s] : sessions_) {
    auto qpns = nlohmann::ordered_json::array();
    for (const auto& [h, q] : s->qps) qpns.push_back(q.qp->qpn);
    list.push_back({{"id", id},
                    {"pid", s->pid},
                    {"uid", s->uid},
                    {"pds", s->pds.size()},
                    {"mrs", s->mrs.size()},
                    {"mws", s->mws.size()},
                    {"mr_bytes", s->mr_bytes},
                    {"cqs", s->cqs.size()},
                    {"srqs", s->srqs.size()},
                    {"doorbells", s->doorbells},
                    {"notify_failed", s->notify_failed},
                    {"qpns", qpns}});
  }
  return list;
}

void SessionServer::close(Session& s) {
  // The application is gone: its CM connections are closed (the peers get a
  // DREQ), its QPs go to ERR (peers not connected by CM then fail with
  // retry-exceeded, as with a dead host), then everything is freed.
  if (cm_) cm_->drop_owner(s.id, now_ns());
  intake_.remove_session(s.id);  // nothing it posts is taken from here on
  for (auto& [h, q] : s.qps) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    eng_.modify_qp(q.qp, a, IBV_QP_STATE);
    eng_.destroy_qp(q.qp);
    q.map.unmap();
  }
  s.qps.clear();
  for (auto& [h, q] : s.srqs) {
    eng_.destroy_srq(q.srq);
    q.map.unmap();
  }
  s.srqs.clear();
  for (auto& [h, x] : s.xrcds) release_xrcd(x);  // after its SRQs and QPs in them
  s.xrcds.clear();
  for (auto& [h, w] : s.mws) eng_.dealloc_mw(w);  // before the MRs they are bound to
  s.mws.clear();
  for (auto& [h, r] : s.mrs) {
    eng_.dereg_mr(r.mr);  // its keys stop working at once
    r.map.unmap();
  }
  s.mrs.clear();
  if (s.mem_fd >= 0) ::close(s.mem_fd);  // no MR reaches through it any more
  s.mem_fd = -1;
  for (auto& [h, c] : s.cqs) {
    eng_.destroy_cq(c.cq);
    c.map.unmap();
    if (c.chan >= 0) ::close(c.chan);
  }
  s.cqs.clear();
  for (auto& [h, pd] : s.pds) eng_.dealloc_pd(pd);
  s.pds.clear();
  for (int fd : s.in_fds) ::close(fd);  // descriptors that came with an unfinished request
  s.in_fds.clear();
  boost::system::error_code ec;
  s.sock.close(ec);
  s.bell.reset();  // closes the daemon's end; a pending wait ends aborted
  if (s.cm_chan >= 0) ::close(s.cm_chan);
  s.cm_chan = -1;
  s.page = nullptr;
  s.page_map.unmap();
}

bool SessionServer::park(const Session& s, std::uint32_t qp_handle, const uroce_msg_hdr& h, const ibv_qp_attr& a,
                         int mask, const wire::IpAddr& dgid) {
  // Bounded: per session and in all, so a client cannot park requests (and
  // their ARP traffic) without end.
  // And per uid, so one uid's sessions cannot fill the table for the others.
  std::size_t mine = 0, uid_mine = 0;
  for (const PendingRequest& p : pending_) {
    mine += p.session == s.id ? 1 : 0;
    const auto o = sessions_.find(p.session);
    uid_mine += o != sessions_.end() && o->second->uid == s.uid ? 1 : 0;
  }
  if (uid_mine >= limits_.max_pending_rtr_per_uid) {
    ++refused_.pending_rtr_per_uid;
    return false;
  }
  if (mine >= limits_.max_pending_rtr || pending_.size() >= limits_.max_pending_rtr_total) return false;
  // The engine's one neighbour wait asks (and asks again) for as long as
  // this request waits; each pass looks the neighbour up again.
  const std::uint64_t t = now_ms();
  eng_.want_neighbor(dgid, now_ns(), now_ns() + 3'000'000'000ull);
  pending_.push_back({s.id, qp_handle, h, a, mask, dgid, t + 3000});
  return true;
}

void SessionServer::destroy_qp(Session& s, std::uint32_t qp_handle) {
  auto q = s.qps.find(qp_handle);
  if (q == s.qps.end()) return;
  intake_.remove_qp(q->second.qp);
  eng_.destroy_qp(q->second.qp);
  q->second.map.unmap();
  s.qps.erase(q);
}

std::size_t SessionServer::finish_closing() {
  if (closing_.empty()) return 0;
  const std::uint64_t t = now_ms();
  std::size_t done = 0;
  for (std::size_t i = 0; i < closing_.size();) {
    const ClosingQp& c = closing_[i];
    const auto it = sessions_.find(c.session);
    Session* s = it == sessions_.end() ? nullptr : it->second.get();  // null: its session ended meanwhile
    const auto q = s ? s->qps.find(c.qp_handle) : decltype(s->qps.end()){};
    if (s && q != s->qps.end() && eng_.datagrams_unsent(q->second.qp) && t < c.deadline_ms) {
      ++i;
      continue;
    }
    if (s) {
      destroy_qp(*s, c.qp_handle);
      send_reply(s->sock.native_handle(), c.hdr, 0, "", nullptr, 0);
    }
    closing_[i] = closing_.back();
    closing_.pop_back();
    ++done;
  }
  return done;
}

std::size_t SessionServer::retry_pending() {
  if (pending_.empty()) return 0;
  const std::uint64_t t = now_ms();
  std::size_t done = 0;
  for (std::size_t i = 0; i < pending_.size();) {
    PendingRequest& p = pending_[i];
    auto s = sessions_.find(p.session);
    const bool resolve = p.qp_handle == 0;
    const bool gone = s == sessions_.end() || (!resolve && s->second->qps.count(p.qp_handle) == 0);
    ModifyResult res{EHOSTUNREACH, "no ARP/ND answer from the destination GID within 3 s"};
    uroce_resolve_reply r{};
    if (!gone && resolve) {
      wire::MacAddr mac{};
      if (eng_.neighbor(p.dgid, mac)) {
        std::memcpy(r.mac, mac.data(), 6);
        res = {};
      }
    } else if (!gone) {
      res = eng_.modify_qp(s->second->qps[p.qp_handle].qp, p.attr, p.mask);
    }
    if (gone || res.err != EHOSTUNREACH || t >= p.deadline_ms) {
      if (!gone)
        send_reply(s->second->sock.native_handle(), p.hdr, res.err, res.err ? res.why : "", resolve && !res.err ? &r : nullptr,
                   resolve && !res.err ? sizeof r : 0);
      pending_[i] = pending_.back();
      pending_.pop_back();
      ++done;
      continue;
    }
    ++i;
  }
  return done;
}

nlohmann::ordered_json SessionServer::cm_status() const {
  nlohmann::ordered_json o = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < static_cast<std::size_t>(cm::CmCounter::kCount); ++i) {
    const auto c = static_cast<cm::CmCounter>(i);
    o[cm::to_string(c)] = cm_->counter(c);
  }
  o["connections"] = cm_->connections();
  return o;
}

void SessionServer::wait_bell(Session& s) {
  if (!s.bell) return;
  // The handler holds the session by id, not by pointer: the session may be
  // gone (and its descriptor closed) when an aborted wait completes.
  const std::uint32_t id = s.id;
  s.bell->async_wait(asio::posix::descriptor_base::wait_read, [this, id](boost::system::error_code ec) {
    if (ec) return;
    auto it = sessions_.find(id);
    if (it == sessions_.end() || !it->second->bell) return;
    Session& t = *it->second;
    const std::size_t rung = abi::drain(t.bell->native_handle());
    t.doorbells += rung;
    doorbells_ += rung;
    wait_bell(t);
  });
}

void SessionServer::watch_link() {
  if (link_ == nullptr) return;
  const std::uint64_t now = now_ms();
  if (now - link_checked_ms_ < 200) return;
  link_checked_ms_ = now;
  const bool up = link_(link_ctx_).up;
  if (up == link_up_) return;
  link_up_ = up;
  const uroce_async_msg ev{static_cast<std::uint32_t>(up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR), 1};
  for (auto& [id, s] : sessions_)
    if (s->bell && ::send(s->bell->native_handle(), &ev, sizeof ev, MSG_DONTWAIT | MSG_NOSIGNAL) != sizeof ev)
      ++s->events_failed;
}

std::size_t SessionServer::step() {
  watch_link();
  std::size_t work = retry_pending() + finish_closing() + cm_->poll(now_ns());
  // An application's memory that faulted (SIGBUS, caught by sigbus_guard
  // and replaced): its session ends, as if the application had died.
  if (const std::uint64_t c = sigbus_guard::caught(); c != sigbus_seen_) {
    sigbus_seen_ = c;
    std::vector<std::uint32_t> owners;
    sigbus_guard::take_poisoned([&owners](std::uint32_t owner) { owners.push_back(owner); });
    for (std::uint32_t id : owners) {
      auto it = sessions_.find(id);
      if (it == sessions_.end()) continue;
      ++memory_fault_closes_;
      close(*it->second);
      sessions_.erase(it);
      ++work;
    }
  }
  // Connections that never say hello are closed after hello_timeout_ms
  // (looked for every 100 ms), so silent clients cannot hold descriptors.
  if (const std::uint64_t t = now_ms(); t - last_sweep_ms_ >= 100) {
    last_sweep_ms_ = t;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      Session& s = *it->second;
      if (!s.hello && t - s.accepted_ms > limits_.hello_timeout_ms) {
        ++refused_.hello_timeouts;
        close(s);
        it = sessions_.erase(it);
        ++work;
      } else {
        ++it;
      }
    }
  }
  return work;
}

}  // namespace uroce::control
