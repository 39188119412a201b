// The daemon's side of one application session, shared by the session
// server's files: sessions.cc (the sockets, the dispatch of requests, the
// teardown, the parked requests), session_objects.cc (the handlers that
// make and destroy verbs objects) and session_control.cc (hello, QP
// changes, address resolution, the CM, multicast and queries). Internal to
// control/node.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "control/node/sessions.h"
#include "control/node/sigbus_guard.h"

namespace uroce::control {

namespace sessions_internal {

constexpr std::uint32_t kMaxSrqWr = 4096;  // an SRQ's (and work queue's) deepest ring

/// Memory mapped here (a shared ring, or an application's MR), unmapped
/// when its owner lets go of it: on every way out of a request that fails
/// half-way, and when the object that holds it goes.
struct Mapping {
  void* addr = nullptr;
  std::size_t len = 0;
  int guard = -1;  // an application's own memory: its sigbus_guard slot
  Mapping() = default;
  Mapping(Mapping&& o) noexcept : addr(std::exchange(o.addr, nullptr)), len(o.len), guard(std::exchange(o.guard, -1)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      unmap();
      addr = std::exchange(o.addr, nullptr);
      len = o.len;
      guard = std::exchange(o.guard, -1);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { unmap(); }
  void unmap() {
    sigbus_guard::unguard(guard);
    guard = -1;
    if (addr && addr != MAP_FAILED) ::munmap(addr, len);
    addr = nullptr;
  }
};

/// A descriptor this process holds until it goes (closed then).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  [[nodiscard]] int get() const { return fd_; }
  /// Gives the descriptor up to the caller, who closes it.
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

inline std::uint64_t now_ms() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

inline std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// A memfd with `len` bytes mapped here; the fd goes to the application.
/// It is sealed at that size, so an application cannot shrink it under the
/// daemon's mapping (which would turn the daemon's next access into SIGBUS).
inline bool make_shared(std::size_t len, Mapping& m, Fd& fd) {
  fd = Fd(::memfd_create("uroce-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.get() < 0) return false;
  if (::ftruncate(fd.get(), static_cast<off_t>(len)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    fd.reset();
    return false;
  }
  m.addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  m.len = len;
  if (m.addr == MAP_FAILED) {
    fd.reset();
    m.addr = nullptr;
    return false;
  }
  return true;
}


/// Answers a request (its type with UROCE_MSG_REPLY, its seq): the status,
/// `err` and `why`, then `body`, with descriptors. Never blocks on a client.
void send_reply_fds(int sock, const uroce_msg_hdr& req, int err, const std::string& why, const void* body,
                    std::size_t blen, const int* fds, std::size_t nfds);
void send_reply(int sock, const uroce_msg_hdr& req, int err, const std::string& why, const void* body,
                std::size_t blen, int fd = -1);
/// The memory part of REG_MR (`one`: a single memfd) or REG_MR_PIECES (and
/// of REREG_MR after its own fields). Null, or why the request is malformed.
const char* parse_mr_memory(bool one, const std::uint8_t* body, std::size_t len, uroce_reg_mr_pieces_msg& pm,
                            uroce_reg_mr_exact& ex);
/// Maps the pieces of `pm` from `fds`. Null, or why not, with `err` the
/// errno to answer.
const char* map_mr_memory(const uroce_reg_mr_pieces_msg& pm, const std::vector<int>& fds, Mapping& map, int& err);
/// Whether the application may have raw packet QPs and flow rules
/// (CAP_NET_RAW in its effective set).
bool may_use_raw(int pid);

/// What one uid holds over all its sessions' QPs: the sum of `per_qp`.
template <class Sessions, class F>
std::size_t held_by(const Sessions& all, int uid, F per_qp) {
  std::size_t n = 0;
  for (const auto& [id, o] : all)
    if (o->uid == uid)
      for (const auto& [qh, q] : o->qps) n += per_qp(q);
  return n;
}

}  // namespace sessions_internal

struct SessionServer::Session {
  explicit Session(boost::asio::local::stream_protocol::socket s) : sock(std::move(s)) {}
  boost::asio::local::stream_protocol::socket sock;
  std::uint32_t id = 0;
  bool hello = false;
  std::uint32_t next_handle = 1;
  struct MrRes {
    transport::Mr* mr;
    sessions_internal::Mapping map;
  };
  // What the session holds besides the engine's objects: the mapping of
  // each ring (the engine reads and writes the rings themselves).
  struct CqRes {
    transport::Cq* cq;
    sessions_internal::Mapping map;
    int chan = -1;  // the completion channel (a Unix datagram socket), when the CQ has one
    std::uint32_t handle = 0;
    Session* session = nullptr;
  };
  struct SrqRes {
    transport::Srq* srq;
    sessions_internal::Mapping map;
  };
  struct QpRes {
    transport::Qp* qp;
    sessions_internal::Mapping map;
    std::uint32_t handle = 0;
    Session* session = nullptr;
    std::vector<wire::IpAddr> groups;  // the multicast groups it is in (the engine drops them with the QP)
    std::vector<std::uint32_t> flows;  // a raw packet QP's flow rules (the engine drops them with the QP)
  };
  std::map<std::uint32_t, transport::Pd*> pds;
  std::map<std::uint32_t, MrRes> mrs;
  std::map<std::uint32_t, transport::Mr*> mws;  // memory windows (minor 8): in the MRs' key table, under their limit
  std::map<std::uint32_t, CqRes> cqs;
  std::map<std::uint32_t, QpRes> qps;
  std::map<std::uint32_t, SrqRes> srqs;
  std::map<std::uint32_t, transport::Xrcd*> xrcds;  // the XRC domains it opened (minor 17), under its PD limit
  std::uint64_t mr_bytes = 0;
  int mem_fd = -1;  // the application's /proc/self/mem, for its ODP MRs (minor 16)
  int pid = -1;  // the application's, from SO_PEERCRED
  int uid = -1;
  std::uint64_t accepted_ms = 0;  // a session that has not said hello by hello_timeout_ms is closed
  // The session page and the doorbell (minor 4): the application rings the
  // doorbell after a post only while the page says the daemon may block.
  sessions_internal::Mapping page_map;
  uroce_session_page* page = nullptr;
  std::unique_ptr<boost::asio::posix::stream_descriptor> bell;  // the daemon's end
  int cm_chan = -1;  // the CM event channel (minor 7): a Unix datagram socket rung per CM event
  std::uint64_t doorbells = 0, notify_failed = 0, events_failed = 0;
  std::vector<std::uint8_t> in;  // bytes received, not yet a whole message
  std::vector<int> in_fds;
};

}  // namespace uroce::control
