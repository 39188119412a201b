#include "control/node/sessions.h"

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

namespace {

constexpr std::uint32_t kMaxSrqWr = 4096;  // an SRQ's (and work queue's) deepest ring

struct Mapping {
  void* addr = nullptr;
  std::size_t len = 0;
  int guard = -1;  // an application's own memory: its sigbus_guard slot
  void unmap() {
    sigbus_guard::unguard(guard);
    guard = -1;
    if (addr && addr != MAP_FAILED) ::munmap(addr, len);
    addr = nullptr;
  }
};

std::uint64_t now_ms() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// A memfd with `len` bytes mapped here; the fd goes to the application.
/// It is sealed at that size, so an application cannot shrink it under the
/// daemon's mapping (which would turn the daemon's next access into SIGBUS).
bool make_shared(std::size_t len, Mapping& m, int& fd) {
  fd = ::memfd_create("uroce-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return false;
  if (::ftruncate(fd, static_cast<off_t>(len)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    ::close(fd);
    return false;
  }
  m.addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  m.len = len;
  if (m.addr == MAP_FAILED) {
    ::close(fd);
    m.addr = nullptr;
    return false;
  }
  return true;
}

}  // namespace

struct SessionServer::Session {
  explicit Session(asio::local::stream_protocol::socket s) : sock(std::move(s)) {}
  asio::local::stream_protocol::socket sock;
  std::uint32_t id = 0;
  bool hello = false;
  std::uint32_t next_handle = 1;
  struct MrRes {
    Mr* mr;
    Mapping map;
  };
  // What the session holds besides the engine's objects: the mapping of
  // each ring (the engine reads and writes the rings themselves).
  struct CqRes {
    Cq* cq;
    Mapping map;
    int chan = -1;  // the completion channel (a Unix datagram socket), when the CQ has one
    std::uint32_t handle = 0;
    Session* session = nullptr;
  };
  struct SrqRes {
    Srq* srq;
    Mapping map;
  };
  struct QpRes {
    Qp* qp;
    Mapping map;
    std::uint32_t handle = 0;
    Session* session = nullptr;
    std::vector<wire::IpAddr> groups;  // the multicast groups it is in (the engine drops them with the QP)
    std::vector<std::uint32_t> flows;  // a raw packet QP's flow rules (the engine drops them with the QP)
  };
  std::map<std::uint32_t, Pd*> pds;
  std::map<std::uint32_t, MrRes> mrs;
  std::map<std::uint32_t, Mr*> mws;  // memory windows (minor 8): in the MRs' key table, under their limit
  std::map<std::uint32_t, CqRes> cqs;
  std::map<std::uint32_t, QpRes> qps;
  std::map<std::uint32_t, SrqRes> srqs;
  std::map<std::uint32_t, Xrcd*> xrcds;  // the XRC domains it opened (minor 17), under its PD limit
  std::uint64_t mr_bytes = 0;
  int mem_fd = -1;  // the application's /proc/self/mem, for its ODP MRs (minor 16)
  int pid = -1;  // the application's, from SO_PEERCRED
  int uid = -1;
  std::uint64_t accepted_ms = 0;  // a session that has not said hello by hello_timeout_ms is closed
  // The session page and the doorbell (minor 4): the application rings the
  // doorbell after a post only while the page says the daemon may block.
  Mapping page_map;
  uroce_session_page* page = nullptr;
  std::unique_ptr<asio::posix::stream_descriptor> bell;  // the daemon's end
  int cm_chan = -1;  // the CM event channel (minor 7): a Unix datagram socket rung per CM event
  std::uint64_t doorbells = 0, notify_failed = 0, events_failed = 0;
  std::vector<std::uint8_t> in;  // bytes received, not yet a whole message
  std::vector<int> in_fds;
};

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

void SessionServer::on_cm_event(void* ctx, std::uint32_t owner) {
  auto* self = static_cast<SessionServer*>(ctx);
  const auto it = self->sessions_.find(owner);
  if (it == self->sessions_.end() || it->second->cm_chan < 0) return;
  // Never blocking: a full socket already holds a wake-up for this event.
  (void)abi::ring(it->second->cm_chan);
}

void SessionServer::on_cq_notify(void* ctx, Cq& cq) {
  auto* c = static_cast<Session::CqRes*>(cq.owner);
  if (c && c->chan >= 0 && !abi::ring(c->chan)) ++c->session->notify_failed;
  (void)ctx;
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

namespace {

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
                std::size_t blen, int fd = -1) {
  send_reply_fds(sock, req, err, why, body, blen, &fd, 1);
}

}  // namespace

namespace {

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

/// What one uid holds over all its sessions' QPs: the sum of `per_qp`.
template <class Sessions, class F>
std::size_t held_by(const Sessions& all, int uid, F per_qp) {
  std::size_t n = 0;
  for (const auto& [id, o] : all)
    if (o->uid == uid)
      for (const auto& [qh, q] : o->qps) n += per_qp(q);
  return n;
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

}  // namespace

void SessionServer::release_xrcd(Xrcd* x) {
  auto it = xrcds_.find(x);
  if (it == xrcds_.end() || --it->second.openers != 0) return;
  xrcds_.erase(it);
  (void)eng_.dealloc_xrcd(x);  // nothing is left in it: its SRQs and target QPs went with their sessions
}

void SessionServer::handle(Session& s, const uroce_msg_hdr& h, const std::uint8_t* body, std::vector<int>& fds) {
  const int sock = s.sock.native_handle();
  auto fail = [&](int err, const std::string& why) { send_reply(sock, h, err, why, nullptr, 0); };
  // Copies the request's body into its struct, or answers that it is too
  // short. Fields a newer minor appended after `min` bytes read as zero when
  // an older library leaves them out.
  auto take = [&](auto& m, std::size_t min = sizeof m) {
    if (h.len < min) {
      fail(EINVAL, "message too short for its type");
      return false;
    }
    std::memset(&m, 0, sizeof m);
    std::memcpy(&m, body, std::min<std::size_t>(h.len, sizeof m));
    return true;
  };
  if (h.major != UROCE_ABI_MAJOR) return fail(EPROTO, "ABI major version mismatch");
  if (!s.hello && h.type != UROCE_MSG_HELLO) return fail(EPROTO, "say hello first");
  switch (h.type) {
    case UROCE_MSG_HELLO: {
      uroce_hello_msg m;
      if (!take(m)) return;
      if (!uroce_abi_compatible(m.major, m.minor)) return fail(EPROTO, "ABI major version mismatch");
      if (s.hello) return fail(EPROTO, "hello twice");
      if (s.uid < 0) return fail(EACCES, "cannot read the peer's credentials (SO_PEERCRED)");
      {
        std::uint32_t all = 0, mine = 0;
        for (const auto& [id, o] : sessions_)
          if (o->hello) {
            ++all;
            mine += o->uid == s.uid ? 1 : 0;
          }
        if (all >= limits_.max_sessions) {
          ++refused_.sessions;
          return fail(EUSERS, "too many sessions on this daemon (max_sessions " + std::to_string(limits_.max_sessions) + ")");
        }
        if (mine >= limits_.max_sessions_per_uid) {
          ++refused_.sessions_per_uid;
          return fail(EUSERS, "too many sessions for uid " + std::to_string(s.uid) + " (max_sessions_per_uid " +
                                  std::to_string(limits_.max_sessions_per_uid) + ")");
        }
      }
      int page_fd = -1, pair[2] = {-1, -1};
      if (!make_shared(UROCE_SESSION_PAGE_BYTES, s.page_map, page_fd)) return fail(ENOMEM, "cannot create the session page");
      if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
        ::close(page_fd);
        s.page_map.unmap();
        return fail(errno, "cannot create the doorbell");
      }
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
      const int give[2] = {page_fd, pair[1]};
      send_reply_fds(sock, h, 0, "", &r, sizeof r, give, 2);
      ::close(page_fd);
      ::close(pair[1]);
      wait_bell(s);
      return;
    }
    case UROCE_MSG_ALLOC_PD: {
      if (s.pds.size() >= limits_.max_pds) return fail(EDQUOT, "too many PDs for this session");
      uroce_handle_reply r{s.next_handle++};
      s.pds[r.handle] = eng_.alloc_pd();
      return send_reply(sock, h, 0, "", &r, sizeof r);
    }
    case UROCE_MSG_REG_MR:
    case UROCE_MSG_REG_MR_PIECES: {
      // One memfd (REG_MR), or several mapped one after another
      // (REG_MR_PIECES: memory the application registered before in
      // pieces, which must stay where it is).
      uroce_reg_mr_pieces_msg pm{};
      uroce_reg_mr_exact ex{};
      if (const char* why = parse_mr_memory(h.type == UROCE_MSG_REG_MR, body, h.len, pm, ex)) return fail(EINVAL, why);
      const uroce_reg_mr_msg& m = pm.mr;
      auto pd = s.pds.find(m.pd);
      if (pd == s.pds.end()) return fail(EINVAL, "no such PD in this session");
      if (s.mrs.size() + s.mws.size() >= limits_.max_mrs || s.mr_bytes + m.length > limits_.max_mr_bytes)
        return fail(EDQUOT, "over this session's MR limit");
      Mapping map;
      int err = 0;
      if (const char* why = map_mr_memory(pm, fds, map, err)) return fail(err, why);
      map.guard = sigbus_guard::guard(map.addr, map.len, s.id);  // a fault in it costs the session, not the daemon
      Mr* mr = eng_.reg_mr_iova(pd->second, static_cast<std::uint8_t*>(map.addr) + ex.head, ex.byte_length, m.access,
                                m.app_va + ex.head);
      if (!mr) {
        map.unmap();
        return fail(EINVAL, "bad MR access flags or range");
      }
      uroce_reg_mr_reply r{s.next_handle++, mr->lkey, mr->rkey, 0};
      s.mrs[r.handle] = {mr, map};
      s.mr_bytes += m.length;
      return send_reply(sock, h, 0, "", &r, sizeof r);
    }
    case UROCE_MSG_CREATE_FLOW: {
      uroce_flow_msg m;
      if (!take(m)) return;
      auto q = s.qps.find(m.qp);
      if (q == s.qps.end()) return fail(EINVAL, "no such QP in this session");
      if (q->second.qp->type != IBV_QPT_RAW_PACKET) return fail(EINVAL, "a flow rule steers to a raw packet QP");
      if (held_by(sessions_, s.uid, [](const auto& q) { return q.flows.size(); }) >= limits_.max_flows_per_uid) {
        ++refused_.flows_per_uid;
        return fail(EDQUOT, "too many flow rules for uid " + std::to_string(s.uid) + " (max_flows_per_uid " +
                                std::to_string(limits_.max_flows_per_uid) + ")");
      }
      const std::uint32_t fh = eng_.create_flow(q->second.qp, m.priority, m.value, m.mask);
      if (fh == 0) return fail(ENOMEM, "the port's flow table is full");
      q->second.flows.push_back(fh);
      uroce_handle_reply r{fh};
      return send_reply(sock, h, 0, "", &r, sizeof r);
    }
    case UROCE_MSG_REG_MR_ODP: {
      uroce_reg_mr_odp_msg m;
      if (!take(m)) return;
      if (!limits_.odp) return fail(EOPNOTSUPP, "this uroced registers no ODP MR (it runs without --odp)");
      auto pd = s.pds.find(m.pd);
      if (pd == s.pds.end()) return fail(EINVAL, "no such PD in this session");
      if (s.mrs.size() + s.mws.size() >= limits_.max_mrs) return fail(EDQUOT, "over this session's MR limit");
      if (s.mem_fd < 0) {
        // The application's memory file: procfs, opened read-write by the
        // application (which could open only what it may write anyway).
        struct statfs fs {};
        struct stat st {};
        if (fds.empty() || ::fstatfs(fds.front(), &fs) != 0 || fs.f_type != PROC_SUPER_MAGIC ||
            ::fstat(fds.front(), &st) != 0 || !S_ISREG(st.st_mode) ||
            (::fcntl(fds.front(), F_GETFL) & O_ACCMODE) != O_RDWR)
          return fail(EINVAL, "the first ODP MR needs the application's /proc/self/mem, open for reading and writing");
        s.mem_fd = fds.front();
        fds.erase(fds.begin());
      }
      Mr* mr = eng_.reg_mr_odp(pd->second, m.addr, m.length, m.iova, m.access, s.mem_fd);
      if (!mr) return fail(EINVAL, "bad MR access flags or range");
      uroce_reg_mr_reply r{s.next_handle++, mr->lkey, mr->rkey, 0};
      s.mrs[r.handle] = {mr, Mapping{}};  // nothing mapped, nothing counted against the MR bytes
      return send_reply(sock, h, 0, "", &r, sizeof r);
    }
    case UROCE_MSG_REREG_MR: {
      // ibv_rereg_mr: the same MR (and keys), with another PD, access, or
      // memory (sent as REG_MR_PIECES sends it).
      uroce_rereg_mr_msg m;
      if (!take(m)) return;
      const auto r = s.mrs.find(m.handle);
      if (r == s.mrs.end()) return fail(EINVAL, "no such MR in this session");
      Pd* pd = nullptr;
      if (m.flags & IBV_REREG_MR_CHANGE_PD) {
        const auto p = s.pds.find(m.pd);
        if (p == s.pds.end()) return fail(EINVAL, "no such PD in this session");
        pd = p->second;
      }
      if ((m.flags & IBV_REREG_MR_CHANGE_TRANSLATION) && r->second.mr->odp_fd >= 0)
        return fail(EOPNOTSUPP, "an ODP MR keeps its range: register another");
      Mapping map;
      uroce_reg_mr_pieces_msg pm{};
      uroce_reg_mr_exact ex{};
      if (m.flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        if (const char* why = parse_mr_memory(false, body + sizeof m, h.len - sizeof m, pm, ex)) return fail(EINVAL, why);
        if (s.mr_bytes - r->second.map.len + pm.mr.length > limits_.max_mr_bytes)
          return fail(EDQUOT, "over this session's MR limit");
        int err = 0;
        if (const char* why = map_mr_memory(pm, fds, map, err)) return fail(err, why);
        map.guard = sigbus_guard::guard(map.addr, map.len, s.id);
      }
      const int rc = eng_.rereg_mr(r->second.mr, static_cast<int>(m.flags), pd, m.access,
                                   map.addr ? static_cast<std::uint8_t*>(map.addr) + ex.head : nullptr, ex.byte_length,
                                   pm.mr.app_va + ex.head);
      if (rc != 0) {
        map.unmap();
        return fail(rc, rc == EBUSY ? "memory windows are bound to the MR" : "bad rereg flags, PD, access or range");
      }
      if (map.addr) {
        s.mr_bytes = s.mr_bytes - r->second.map.len + map.len;
        r->second.map.unmap();  // the engine no longer reaches it
        r->second.map = map;
      }
      uroce_reg_mr_reply rr{m.handle, r->second.mr->lkey, r->second.mr->rkey, 0};
      return send_reply(sock, h, 0, "", &rr, sizeof rr);
    }
    case UROCE_MSG_ALLOC_MW: {
      uroce_alloc_mw_msg m;
      if (!take(m)) return;
      const auto pd = s.pds.find(m.pd);
      if (pd == s.pds.end()) return fail(EINVAL, "no such PD in this session");
      if (m.type != IBV_MW_TYPE_1 && m.type != IBV_MW_TYPE_2) return fail(EINVAL, "a memory window is of type 1 or 2");
      if (s.mrs.size() + s.mws.size() >= limits_.max_mrs) return fail(EDQUOT, "over this session's MR limit (windows count)");
      Mr* mw = eng_.alloc_mw(pd->second, m.type);
      if (!mw) return fail(ENOMEM, "the daemon's key table is full");
      uroce_alloc_mw_reply r{s.next_handle++, mw->rkey};
      s.mws[r.handle] = mw;
      return send_reply(sock, h, 0, "", &r, sizeof r);
    }
    case UROCE_MSG_RESIZE_CQ: {
      uroce_resize_cq_msg m;
      if (!take(m)) return;
      const auto c = s.cqs.find(m.handle);
      if (c == s.cqs.end()) return fail(EINVAL, "no such CQ in this session");
      if (m.entries == 0 || m.entries > (1u << 16)) return fail(EINVAL, "CQ entries must be 1..65536");
      const std::uint32_t entries = std::bit_ceil(m.entries);
      // What the application posted before asking is done first, as a
      // post completes before the next verb on a kernel device's queue
      // (rxe's UD sends complete at once): the completions waiting then
      // include those of the posts made before the resize.
      for (auto& qp_entry : s.qps) (void)eng_.take_posts(qp_entry.second.qp);
      eng_.poll(now_ns());
      Mapping map;
      int fd = -1;
      if (!make_shared(uroce_ring_bytes(entries, sizeof(uroce_cq_entry)), map, fd))
        return fail(ENOMEM, "cannot create the CQ ring");
      const auto ring = abi::Ring<uroce_cq_entry>::create(map.addr, entries, UROCE_RING_CQ, m.handle);
      if (c->second.cq->resize(ring) != 0) {
        map.unmap();
        ::close(fd);
        return fail(EINVAL, "the new size has no room for the completions waiting");
      }
      c->second.map.unmap();
      c->second.map = map;
      uroce_handle_reply r{m.handle};
      send_reply(sock, h, 0, "", &r, sizeof r, fd);
      ::close(fd);
      return;
    }
    case UROCE_MSG_CREATE_CQ: {
      uroce_create_cq_msg m;
      if (!take(m)) return;
      if (s.cqs.size() >= limits_.max_cqs) return fail(EDQUOT, "too many CQs for this session");
      if (m.entries == 0 || m.entries > (1u << 16)) return fail(EINVAL, "CQ entries must be 1..65536");
      const std::uint32_t entries = std::bit_ceil(m.entries);
      // A completion channel may come along: it must be a Unix datagram
      // socket, which the daemon writes to without ever blocking.
      int chan = -1;
      if (!fds.empty()) {
        if (!abi::is_unix_dgram(fds.front())) return fail(EINVAL, "a completion channel must be a Unix datagram socket");
        chan = fds.front();
        fds.erase(fds.begin());
      }
      Mapping map;
      int fd = -1;
      if (!make_shared(uroce_ring_bytes(entries, sizeof(uroce_cq_entry)), map, fd)) {
        if (chan >= 0) ::close(chan);
        return fail(ENOMEM, "cannot create the CQ ring");
      }
      uroce_handle_reply r{s.next_handle++};
      const auto ring = abi::Ring<uroce_cq_entry>::create(map.addr, entries, UROCE_RING_CQ, r.handle);
      Cq* cq = eng_.create_cq(entries, &ring);
      if (!cq) {
        map.unmap();
        ::close(fd);
        if (chan >= 0) ::close(chan);
        return fail(ENOMEM, "cannot create the CQ");
      }
      s.cqs[r.handle] = {cq, map, chan, r.handle, &s};
      cq->owner = &s.cqs[r.handle];
      cq->want_notify(chan >= 0);
      send_reply(sock, h, 0, "", &r, sizeof r, fd);
      ::close(fd);
      return;
    }
    case UROCE_MSG_OPEN_XRCD: {
      uroce_open_xrcd_msg m;
      if (!take(m)) return;
      if (s.pds.size() + s.xrcds.size() >= limits_.max_pds)
        return fail(EDQUOT, "too many PDs and XRC domains for this session");
      Xrcd* x = nullptr;
      if (m.has_fd) {
        if (fds.empty()) return fail(EINVAL, "an XRC domain of a file needs the file's descriptor");
        struct stat st {};
        const int rc = ::fstat(fds.front(), &st);
        ::close(fds.front());
        fds.erase(fds.begin());
        if (rc != 0) return fail(EBADF, "cannot stat the XRC domain's file");
        for (auto& [dom, share] : xrcds_)
          if (share.file && share.dev == st.st_dev && share.ino == st.st_ino) x = dom;
        // As the kernel's ib_uverbs_open_xrcd: none without O_CREAT, or
        // one with O_CREAT | O_EXCL, is EINVAL.
        if (!x && !(m.oflags & O_CREAT)) return fail(EINVAL, "the file has no XRC domain and O_CREAT is not set");
        if (x && (m.oflags & O_CREAT) && (m.oflags & O_EXCL))
          return fail(EINVAL, "the file has an XRC domain already (O_EXCL)");
        if (!x) {
          x = eng_.alloc_xrcd();
          xrcds_[x] = {true, static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino), 0};
        }
      } else {
        x = eng_.alloc_xrcd();
        xrcds_[x] = {};
      }
      ++xrcds_[x].openers;
      uroce_handle_reply r{s.next_handle++};
      s.xrcds[r.handle] = x;
      return send_reply(sock, h, 0, "", &r, sizeof r);
    }
    case UROCE_MSG_CREATE_SRQ: {
      uroce_create_srq_msg m;
      if (!take(m, offsetof(uroce_create_srq_msg, xrcd))) return;  // minor 16 and older send 12 bytes
      if (s.srqs.size() >= limits_.max_srqs) return fail(EDQUOT, "too many SRQs for this session");
      auto pd = s.pds.find(m.pd);
      if (pd == s.pds.end()) return fail(EINVAL, "no such PD in this session");
      Xrcd* xrcd = nullptr;
      Cq* xcq = nullptr;
      const bool tm = m.tm_max_tags != 0;  // tag matching (minor 19): `cq` is where its operations complete
      Cq* tm_cq = nullptr;
      if (tm) {
        auto c = s.cqs.find(m.cq);
        if (c == s.cqs.end()) return fail(EINVAL, "a tag-matching SRQ needs a CQ of this session");
        if (m.xrcd != 0) return fail(EINVAL, "a tag-matching SRQ has no XRC domain");
        if (m.tm_max_tags > UROCE_TM_MAX_TAGS || m.tm_max_ops == 0 || m.tm_max_ops > UROCE_TM_MAX_OPS)
          return fail(EINVAL, "a tag-matching SRQ takes 1.." + std::to_string(UROCE_TM_MAX_TAGS) + " tags and 1.." +
                                  std::to_string(UROCE_TM_MAX_OPS) + " operations");
        tm_cq = c->second.cq;
      } else if (m.xrcd != 0 || m.cq != 0) {
        // An XRC SRQ (a domain and a CQ), or a receive work queue (a CQ alone, minor 18).
        auto c = s.cqs.find(m.cq);
        if (c == s.cqs.end()) return fail(EINVAL, "an XRC SRQ or a work queue needs a CQ of this session");
        xcq = c->second.cq;
        if (m.xrcd != 0) {
          auto x = s.xrcds.find(m.xrcd);
          if (x == s.xrcds.end()) return fail(EINVAL, "no such XRC domain in this session");
          xrcd = x->second;
        }
      }
      if (m.max_wr == 0 || m.max_wr > kMaxSrqWr || m.max_sge == 0 || m.max_sge > UROCE_ABI_MAX_SGE)
        return fail(EINVAL, "SRQ max_wr must be 1..4096 and max_sge 1..4");
      const std::uint32_t entries = std::bit_ceil(m.max_wr);
      const std::uint32_t ops = tm ? std::bit_ceil(m.tm_max_ops) : 0;
      Mapping map;
      int fd = -1;
      const std::size_t bytes = tm ? uroce_tm_srq_bytes(entries, ops, m.tm_max_tags)
                                   : uroce_ring_bytes(entries, sizeof(uroce_recv_entry));
      if (!make_shared(bytes, map, fd)) return fail(ENOMEM, "cannot create the SRQ ring");
      uroce_handle_reply r{s.next_handle++};
      const auto ring = abi::Ring<uroce_recv_entry>::create(map.addr, entries, UROCE_RING_SRQ, r.handle);
      Srq* srq = eng_.create_srq(pd->second, entries, m.max_sge, &ring, xrcd, xcq);
      if (srq && tm) {
        auto* base = static_cast<std::uint8_t*>(map.addr);
        const auto op_ring =
            abi::Ring<uroce_tm_op>::create(base + uroce_tm_ops_offset(entries), ops, UROCE_RING_TM_OPS, r.handle);
        auto* released = reinterpret_cast<std::uint32_t*>(base + uroce_tm_released_offset(entries, ops));
        if (!eng_.make_tm(srq, tm_cq, m.tm_max_tags, op_ring, released)) {
          eng_.destroy_srq(srq);
          srq = nullptr;
        }
      }
      if (!srq) {
        map.unmap();
        ::close(fd);
        return fail(ENOMEM, "cannot create the SRQ");
      }
      s.srqs[r.handle] = {srq, map};
      srq->owner = &s.srqs[r.handle];
      if (tm) intake_.add_tm_srq(s.id, r.handle, srq);
      const uroce_create_srq_reply rr{r.handle, srq->srq_num()};  // a library before minor 17 reads the handle alone
      send_reply(sock, h, 0, "", &rr, sizeof rr, fd);
      ::close(fd);
      return;
    }
    case UROCE_MSG_CREATE_QP: {
      uroce_create_qp_msg m;
      if (!take(m, offsetof(uroce_create_qp_msg, srq))) return;
      if (s.qps.size() >= limits_.max_qps) return fail(EDQUOT, "too many QPs for this session");
      {
        if (held_by(sessions_, s.uid, [](const auto&) { return std::size_t{1}; }) >= limits_.max_qps_per_uid) {
          ++refused_.qps_per_uid;
          return fail(EDQUOT, "too many QPs for uid " + std::to_string(s.uid) + " (max_qps_per_uid " +
                                  std::to_string(limits_.max_qps_per_uid) + ")");
        }
      }
      // XRC (minor 17): a send QP has no receive CQ (its send CQ stands in);
      // a target has no PD or CQs, only its domain.
      if (m.qp_type == IBV_QPT_XRC_SEND && m.recv_cq == 0) m.recv_cq = m.send_cq;
      Xrcd* xrcd = nullptr;
      if (m.qp_type == IBV_QPT_XRC_RECV) {
        auto x = s.xrcds.find(m.xrcd);
        if (x == s.xrcds.end()) return fail(EINVAL, "an XRC target QP needs an XRC domain of this session");
        xrcd = x->second;
      } else if (m.xrcd != 0) {
        return fail(EINVAL, "only an XRC target QP names an XRC domain");
      }
      // RSS (minor 18): a receive-only raw packet QP over work queues.
      transport::RssConf rss;
      const bool is_rss = m.rss_log_size != 0;
      if (is_rss) {
        if (m.qp_type != IBV_QPT_RAW_PACKET || m.srq != 0)
          return fail(EINVAL, "RSS is for a raw packet QP without an SRQ");
        if (m.rss_log_size > UROCE_RSS_MAX_LOG) return fail(EINVAL, "an RSS table has at most 64 work queues");
        constexpr std::uint32_t kFields = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 |
                                          IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP |
                                          IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP;
        if (m.rss_fields & ~kFields) return fail(EOPNOTSUPP, "RSS hashes IPv4, IPv6, TCP and UDP fields only");
        std::memcpy(rss.key.data(), m.rss_key, rss.key.size());
        rss.fields = m.rss_fields;
        for (std::uint32_t i = 0; i < (1u << m.rss_log_size); ++i) {
          auto w = s.srqs.find(m.rss_wq[i]);
          if (w == s.srqs.end() || w->second.srq->cq() == nullptr || w->second.srq->xrcd())
            return fail(EINVAL, "an RSS table names work queues of this session");
          rss.table.push_back(w->second.srq);
        }
      }
      auto pd = s.pds.find(m.pd);
      auto scq = s.cqs.find(m.send_cq), rcq = s.cqs.find(m.recv_cq);
      if (is_rss && pd == s.pds.end()) return fail(EINVAL, "no such PD in this session");
      if (!xrcd && !is_rss && (pd == s.pds.end() || scq == s.cqs.end() || rcq == s.cqs.end()))
        return fail(EINVAL, "no such PD or CQ in this session");
      if (m.qp_type != IBV_QPT_RC && m.qp_type != IBV_QPT_UC && m.qp_type != IBV_QPT_UD &&
          m.qp_type != IBV_QPT_RAW_PACKET && m.qp_type != IBV_QPT_XRC_SEND && m.qp_type != IBV_QPT_XRC_RECV)
        return fail(EINVAL, "QP type must be RC, UC, UD, RAW_PACKET, XRC_SEND or XRC_RECV");
      if (m.qp_type == IBV_QPT_RAW_PACKET && !may_use_raw(s.pid))
        return fail(EPERM, "a raw packet QP needs CAP_NET_RAW");
      Srq* srq = nullptr;
      if (m.srq != 0 && (m.qp_type == IBV_QPT_XRC_SEND || m.qp_type == IBV_QPT_XRC_RECV))
        return fail(EINVAL, "an XRC QP has no SRQ of its own (its requests name XRC SRQs)");
      if (m.srq != 0) {
        auto sr = s.srqs.find(m.srq);
        if (sr == s.srqs.end()) return fail(EINVAL, "no such SRQ in this session");
        srq = sr->second.srq;
        m.max_recv_wr = 1;  // the QP's own receive ring stays unused
      }
      if (m.max_send_wr > 4096 || m.max_recv_wr > 4096) return fail(EINVAL, "max_send_wr and max_recv_wr must be 0..4096");
      // A send-only or receive-only QP is legal: a queue asked with 0 gets
      // one slot, as the depths reported are at least those asked.
      m.max_send_wr = std::max<std::uint32_t>(m.max_send_wr, 1);
      m.max_recv_wr = std::max<std::uint32_t>(m.max_recv_wr, 1);
      const std::uint32_t sqn = std::bit_ceil(m.max_send_wr), rqn = std::bit_ceil(m.max_recv_wr);
      const std::size_t sq_bytes = (uroce_ring_bytes(sqn, sizeof(uroce_send_entry)) + 4095) & ~std::size_t{4095};
      Mapping map;
      int fd = -1;
      if (!make_shared(sq_bytes + uroce_ring_bytes(rqn, sizeof(uroce_recv_entry)), map, fd))
        return fail(ENOMEM, "cannot create the QP's rings");
      const std::uint32_t handle = s.next_handle++;
      const auto sq = abi::Ring<uroce_send_entry>::create(map.addr, sqn, UROCE_RING_SEND, handle);
      const auto rq = abi::Ring<uroce_recv_entry>::create(static_cast<std::uint8_t*>(map.addr) + sq_bytes, rqn,
                                                          UROCE_RING_RECV, handle);
      QpInitAttr ia;
      ia.qp_type = static_cast<ibv_qp_type>(m.qp_type);
      ia.send_cq = xrcd || is_rss ? nullptr : scq->second.cq;
      ia.recv_cq = xrcd || is_rss ? nullptr : rcq->second.cq;
      ia.cap.max_send_wr = sqn;
      ia.cap.max_recv_wr = rqn;
      ia.sq_sig_all = m.sq_sig_all != 0;
      ia.srq = srq;
      ia.xrcd = xrcd;
      ia.sq_ring = xrcd || is_rss ? nullptr : &sq;  // an XRC target or RSS QP sends nothing: the engine gives it no ring
      ia.rq_ring = srq || m.qp_type == IBV_QPT_XRC_SEND || xrcd || is_rss ? nullptr : &rq;
      ia.rss = is_rss ? &rss : nullptr;
      Qp* qp = eng_.create_qp(xrcd ? nullptr : pd->second, ia);
      if (!qp) {
        map.unmap();
        ::close(fd);
        return fail(ENOMEM, "cannot create the QP");
      }
      // Its uid's transmit share (a full table leaves it in the shared entry).
      (void)eng_.set_tenant(qp, static_cast<std::uint32_t>(s.uid), limits_.tx_weight(s.uid));
      uroce_create_qp_reply r{handle, qp->qpn, sqn, rqn, sq_bytes};
      s.qps[handle] = {qp, map, handle, &s};
      qp->owner = &s.qps[handle];
      intake_.add_qp(s.id, qp);
      send_reply(sock, h, 0, "", &r, sizeof r, fd);
      ::close(fd);
      return;
    }
    case UROCE_MSG_MODIFY_QP: {
      uroce_modify_qp_msg m;
      if (!take(m, offsetof(uroce_modify_qp_msg, flow_label))) return;  // minor 4 sends 64 bytes
      auto q = s.qps.find(m.qp);
      if (q == s.qps.end()) return fail(EINVAL, "no such QP in this session");
      // The one codec (stack/abi/qp_attr.h); the engine checks every value
      // the mask names, so nothing is defaulted or forced here.
      int mask = 0;
      const ibv_qp_attr a = abi::from_msg(m, mask);
      // A controlled Q_Key (high bit set, IBTA 10.2.5) is the daemon's own:
      // QP1 speaks the CM with one, and an application must not pose as it.
      if ((mask & IBV_QP_QKEY) && (a.qkey & 0x80000000u))
        return fail(EPERM, "a Q_Key with the high bit set is controlled (IBTA 10.2.5): not for applications");
      const ModifyResult res = eng_.modify_qp(q->second.qp, a, mask);
      if (res.err == EHOSTUNREACH && eng_.resolves()) {
        // Resolve the peer (ARP or ND) and answer when it is known, as a
        // kernel RDMA stack does while it resolves the address.
        wire::IpAddr dgid;
        std::memcpy(dgid.b.data(), m.dgid, 16);
        if (!park(s, m.qp, h, a, mask, dgid))
          return fail(EAGAIN, "too many requests already waiting for address resolution; try again");
        return;
      }
      return send_reply(sock, h, res.err, res.err ? res.why : "", nullptr, 0);
    }
    case UROCE_MSG_SET_QP_OPT: {
      uroce_qp_opt_msg m;
      if (!take(m)) return;
      auto q = s.qps.find(m.qp);
      if (q == s.qps.end()) return fail(EINVAL, "no such QP in this session");
      if (m.opt == UROCE_QP_OPT_CC) {
        const std::string name(m.name, strnlen(m.name, sizeof m.name));
        if (cc::find(name) == nullptr) return fail(EINVAL, "no such congestion control");
        const int rc = eng_.set_cc(q->second.qp, name);
        // The engine's one refusal of a known name: an algorithm that needs ACKs, on UD.
        if (rc == EOPNOTSUPP) return fail(rc, cc::ud_refusal(name));
        return send_reply(sock, h, rc, rc ? "refused" : "", nullptr, 0);
      }
      if (m.opt == UROCE_QP_OPT_SR) {
        if (m.value > 1) return fail(EINVAL, "selective repeat is 0 or 1");
        const int rc = eng_.set_selective_repeat(q->second.qp, m.value == 1);
        return send_reply(sock, h, rc,
                          rc == EBUSY       ? "selective repeat is set before RTR"
                          : rc == EOPNOTSUPP ? "selective repeat is for RC QPs without an SRQ"
                          : rc               ? "refused"
                                             : "",
                          nullptr, 0);
      }
      return fail(EINVAL, "unknown QP option");
    }
    case UROCE_MSG_MCAST: {
      uroce_mcast_msg m;
      if (!take(m)) return;
      auto q = s.qps.find(m.qp);
      if (q == s.qps.end()) return fail(EINVAL, "no such QP in this session");
      wire::IpAddr gid;
      std::memcpy(gid.b.data(), m.gid, 16);
      auto& groups = q->second.groups;
      const auto in = std::find(groups.begin(), groups.end(), gid);
      if (m.attach == 0) {
        if (in == groups.end()) return fail(EINVAL, "the QP is not in that multicast group");
        (void)eng_.detach_mcast(q->second.qp, gid);
        groups.erase(in);
        return send_reply(sock, h, 0, "", nullptr, 0);
      }
      if (m.attach != 1) return fail(EINVAL, "attach is 0 or 1");
      if (in != groups.end()) return send_reply(sock, h, 0, "", nullptr, 0);  // already in it
      if (held_by(sessions_, s.uid, [](const auto& q) { return q.groups.size(); }) >= limits_.max_mcast_per_uid) {
        ++refused_.mcast_per_uid;
        return fail(EDQUOT, "too many multicast attachments for uid " + std::to_string(s.uid) + " (max_mcast_per_uid " +
                                std::to_string(limits_.max_mcast_per_uid) + ")");
      }
      const int rc = eng_.attach_mcast(q->second.qp, gid);
      if (rc == EINVAL) return fail(rc, "only a UD QP joins a group, and a group is a multicast address");
      if (rc != 0) return fail(rc, "the daemon's multicast table is full");
      groups.push_back(gid);
      return send_reply(sock, h, 0, "", nullptr, 0);
    }
    case UROCE_MSG_RESOLVE: {
      // A UD address handle's MAC, as the kernel resolves one at
      // ibv_create_ah: from the one neighbour table (the port's own address
      // is in it, for loopback), or after ARP/ND.
      uroce_resolve_msg m;
      if (!take(m)) return;
      wire::IpAddr dgid;
      std::memcpy(dgid.b.data(), m.dgid, 16);
      uroce_resolve_reply r{};
      if (dgid.is_multicast()) {  // a group's MAC is its address's (RFC 1112, RFC 2464): nothing to ask
        const wire::MacAddr mac = dgid.multicast_mac();
        std::memcpy(r.mac, mac.data(), 6);
        return send_reply(sock, h, 0, "", &r, sizeof r);
      }
      if (dgid.is_v4_mapped() ? dgid.b[12] == 0 || dgid.b[12] >= 240 : false)
        return fail(EINVAL, "not a unicast address");
      wire::MacAddr mac{};
      if (eng_.neighbor(dgid, mac)) {
        std::memcpy(r.mac, mac.data(), 6);
        return send_reply(sock, h, 0, "", &r, sizeof r);
      }
      if (!eng_.resolves()) return fail(EHOSTUNREACH, "no neighbour entry for the GID, and no way to resolve it");
      if (!park(s, 0, h, ibv_qp_attr{}, 0, dgid))
        return fail(EAGAIN, "too many requests already waiting for address resolution; try again");
      return;
    }
    case UROCE_MSG_DESTROY: {
      uroce_destroy_msg m;
      if (!take(m)) return;
      if (m.object == UROCE_OBJ_QP) {
        auto q = s.qps.find(m.handle);
        if (q == s.qps.end()) return fail(EINVAL, "no such QP in this session");
        for (const ClosingQp& c : closing_)
          if (c.session == s.id && c.qp_handle == m.handle) return fail(EBUSY, "the QP is being destroyed");
        if (eng_.datagrams_unsent(q->second.qp)) {
          // Its datagrams first (finish_closing replies): an application may
          // post unsignaled sends and destroy at once (rdmacm-utils' mckey).
          eng_.take_posts(q->second.qp);
          closing_.push_back({s.id, m.handle, h, now_ms() + kClosingMs});
          return;
        }
        destroy_qp(s, m.handle);
        return send_reply(sock, h, 0, "", nullptr, 0);
      }
      if (m.object == UROCE_OBJ_FLOW) {
        for (auto& [qh, q] : s.qps) {
          const auto it = std::find(q.flows.begin(), q.flows.end(), m.handle);
          if (it == q.flows.end()) continue;
          eng_.destroy_flow(m.handle);
          q.flows.erase(it);
          return send_reply(sock, h, 0, "", nullptr, 0);
        }
        return fail(EINVAL, "no such flow rule in this session");
      }
      if (m.object == UROCE_OBJ_MW) {
        auto w = s.mws.find(m.handle);
        if (w == s.mws.end()) return fail(EINVAL, "no such memory window in this session");
        eng_.dealloc_mw(w->second);  // a bound window comes unbound
        s.mws.erase(w);
        return send_reply(sock, h, 0, "", nullptr, 0);
      }
      if (m.object == UROCE_OBJ_MR) {
        auto r = s.mrs.find(m.handle);
        if (r == s.mrs.end()) return fail(EINVAL, "no such MR in this session");
        if (const int rc = eng_.dereg_mr(r->second.mr); rc != 0) return fail(rc, "memory windows are bound to the MR");
        s.mr_bytes -= r->second.map.len;
        r->second.map.unmap();
        s.mrs.erase(r);
        return send_reply(sock, h, 0, "", nullptr, 0);
      }
      if (m.object == UROCE_OBJ_CQ) {
        auto c = s.cqs.find(m.handle);
        if (c == s.cqs.end()) return fail(EINVAL, "no such CQ in this session");
        if (const int rc = eng_.destroy_cq(c->second.cq); rc != 0) return fail(rc, "the CQ is still used by a QP");
        c->second.map.unmap();
        if (c->second.chan >= 0) ::close(c->second.chan);
        s.cqs.erase(c);
        return send_reply(sock, h, 0, "", nullptr, 0);
      }
      if (m.object == UROCE_OBJ_SRQ) {
        auto q = s.srqs.find(m.handle);
        if (q == s.srqs.end()) return fail(EINVAL, "no such SRQ in this session");
        if (const int rc = eng_.destroy_srq(q->second.srq); rc != 0) return fail(rc, "the SRQ is still used by a QP");
        intake_.remove_srq(q->second.srq);
        q->second.map.unmap();
        s.srqs.erase(q);
        return send_reply(sock, h, 0, "", nullptr, 0);
      }
      if (m.object == UROCE_OBJ_XRCD) {
        auto x = s.xrcds.find(m.handle);
        if (x == s.xrcds.end()) return fail(EINVAL, "no such XRC domain in this session");
        for (const auto& [hq, q] : s.srqs)
          if (q.srq->xrcd() == x->second) return fail(EBUSY, "an XRC SRQ of this session is in the domain");
        for (const auto& [hq, q] : s.qps)
          if (q.qp->xrcd == x->second) return fail(EBUSY, "an XRC target QP of this session is in the domain");
        release_xrcd(x->second);
        s.xrcds.erase(x);
        return send_reply(sock, h, 0, "", nullptr, 0);
      }
      if (m.object == UROCE_OBJ_PD) {
        auto p = s.pds.find(m.handle);
        if (p == s.pds.end()) return fail(EINVAL, "no such PD in this session");
        if (const int rc = eng_.dealloc_pd(p->second); rc != 0) return fail(rc, "the PD still has QPs or MRs");
        s.pds.erase(p);
        return send_reply(sock, h, 0, "", nullptr, 0);
      }
      return fail(EINVAL, "unknown object kind");
    }
    case UROCE_MSG_CM_LISTEN:
    case UROCE_MSG_CM_CONNECT:
    case UROCE_MSG_CM_ACCEPT:
    case UROCE_MSG_CM_REJECT:
    case UROCE_MSG_CM_DISCONNECT:
    case UROCE_MSG_CM_ESTABLISH: {
      uroce_cm_msg m;
      if (!take(m, offsetof(uroce_cm_msg, flags))) return;  // minor 8 and older send 88 bytes
      if (m.flags & ~(UROCE_CM_APP_QP | UROCE_CM_UD | UROCE_CM_ACK_TIMEOUT)) return fail(EINVAL, "unknown CM flags");
      if ((m.flags & UROCE_CM_ACK_TIMEOUT) && m.ack_timeout > 31) return fail(EINVAL, "the ACK timeout is 0..31");
      const int ack_timeout = (m.flags & UROCE_CM_ACK_TIMEOUT) ? m.ack_timeout : -1;
      const bool app_qp = (m.flags & UROCE_CM_APP_QP) != 0;
      const bool ud = (m.flags & UROCE_CM_UD) != 0;
      if (!cm_->ok()) return fail(ENODEV, "the CM agent has no QP1");
      if (m.private_len > UROCE_CM_PRIVATE_MAX) return fail(EINVAL, "CM private data is at most 56 bytes");
      const wire::ConstBytes priv(m.private_data, m.private_len);
      const std::uint64_t t = now_ns();
      Qp* qp = nullptr;
      if (h.type == UROCE_MSG_CM_CONNECT || h.type == UROCE_MSG_CM_ACCEPT) {
        auto q = s.qps.find(m.qp);
        if (q == s.qps.end()) return fail(EINVAL, "no such QP in this session");
        qp = q->second.qp;
      }
      int rc = 0;
      switch (h.type) {
        case UROCE_MSG_CM_LISTEN:
          rc = cm_->listen(m.port, s.id, ud);
          if (rc == EADDRINUSE) return fail(rc, "another application listens on this port");
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
          if (rc != 0) return fail(rc, "cannot connect: the QP must be RC in RESET or INIT, or UD, or the application's own (UROCE_CM_APP_QP) not in ERR, and the MTU valid");
          return send_reply(sock, h, 0, "", &r, sizeof r);
        }
        case UROCE_MSG_CM_ACCEPT:
          rc = cm_->accept(m.id, qp, priv, s.id, t, app_qp, ack_timeout);
          if (rc != 0)
            return fail(rc, app_qp ? "cannot accept: no such request of this session, or the QP is in ERR"
                                   : "cannot accept: no such request of this session, or the QP is not RC in RESET/INIT");
          break;
        case UROCE_MSG_CM_ESTABLISH:
          rc = cm_->establish(m.id, s.id, t);
          if (rc != 0) return fail(rc, "no connection of this session waits for establish (a connect with UROCE_CM_APP_QP)");
          break;
        case UROCE_MSG_CM_REJECT:
          rc = cm_->reject(m.id, priv, s.id, t);
          if (rc != 0) return fail(rc, "no such connect request of this session");
          break;
        default:
          rc = cm_->disconnect(m.id, s.id, t);
          if (rc != 0) return fail(rc, "no such connection of this session, or it is already closing");
          break;
      }
      return send_reply(sock, h, 0, "", nullptr, 0);
    }
    case UROCE_MSG_CM_UNLISTEN: {
      uroce_cm_msg m;
      if (!take(m, offsetof(uroce_cm_msg, flags))) return;
      if (!cm_->ok()) return fail(ENODEV, "the CM agent has no QP1");
      if (const int rc = cm_->unlisten(m.port, s.id, (m.flags & UROCE_CM_UD) != 0))
        return fail(rc, "this session does not listen on that port");
      return send_reply(sock, h, 0, "", nullptr, 0);
    }
    case UROCE_MSG_CM_CHANNEL: {
      if (fds.empty() || !abi::is_unix_dgram(fds.front()))
        return fail(EINVAL, "a CM channel must be a Unix datagram socket");
      if (s.cm_chan >= 0) ::close(s.cm_chan);  // a second one replaces the first
      s.cm_chan = fds.front();
      fds.erase(fds.begin());
      return send_reply(sock, h, 0, "", nullptr, 0);
    }
    case UROCE_MSG_CM_EVENT: {
      cm::CmEvent e;
      if (!cm_->next_event(s.id, e)) return fail(EAGAIN, "no CM event");
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
    case UROCE_MSG_QUERY: {
      uroce_query_msg m;
      if (!take(m)) return;
      if (m.object == UROCE_OBJ_PORT) {
        const pipeline::LinkInfo l = link_ ? link_(link_ctx_) : pipeline::LinkInfo{};
        const uroce_port_attr r{static_cast<std::uint32_t>(l.up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN), l.speed_mbps, l.mtu};
        return send_reply(sock, h, 0, "", &r, sizeof r);
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
        return send_reply(sock, h, 0, "", &r, sizeof r);
      }
      if (m.object == UROCE_OBJ_QP) {
        auto q = s.qps.find(m.handle);
        if (q == s.qps.end()) return fail(EINVAL, "no such QP in this session");
        ibv_qp_attr a{};
        if (const int rc = eng_.query_qp(q->second.qp, a); rc != 0) return fail(rc, "cannot query the QP");
        const uroce_modify_qp_msg r = abi::to_msg(a, 0, m.handle);
        return send_reply(sock, h, 0, "", &r, sizeof r);
      }
      return fail(EINVAL, "only the device and QPs can be queried");
    }
    default: return fail(EOPNOTSUPP, "unknown request type");
  }
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
