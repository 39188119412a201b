// liburoce's session with a daemon or an embedded node: why the last call
// failed, a request and its reply on the session socket (taken in turns by
// the processes that share it after a fork), the device list, opening and
// closing a context, and async events.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "stack/abi/fd_msg.h"
#include "stack/abi/session_proto.h"
#include "stack/verbs/liburoce_internal.h"

namespace uroce::verbs_detail {
thread_local std::string t_error;

/// Records why a call failed (uroce_last_error) and sets errno; returns err.
int set_error(int err, std::string why) {
  t_error = std::move(why);
  errno = err;
  return err;
}
}  // namespace uroce::verbs_detail

namespace {
using uroce::verbs_detail::call;
using uroce::verbs_detail::embedded_attach;
using uroce::verbs_detail::embedded_spec;
using uroce::verbs_detail::set_error;
using uroce::verbs_detail::t_error;
using uroce::verbs_detail::unpin;
using uroce::verbs_detail::wait_fd;

/// Set in the parent and the child by the first fork after a context opened.
std::atomic<bool> g_forked{false};
void note_fork() { g_forked.store(true, std::memory_order_relaxed); }

/// The socket to itself across the processes that share it (uroce_context::fork_lock_fd).
class ForkLock {
 public:
  explicit ForkLock(const uroce_context* ctx)
      : fd_(g_forked.load(std::memory_order_relaxed) ? ctx->fork_lock_fd : -1) {
    if (fd_ >= 0 && !set(F_WRLCK)) fd_ = -1;
  }
  ~ForkLock() {
    if (fd_ >= 0) (void)set(F_UNLCK);
  }
  ForkLock(const ForkLock&) = delete;
  ForkLock& operator=(const ForkLock&) = delete;

 private:
  bool set(short type) const {
    struct flock l{};
    l.l_type = type;
    l.l_whence = SEEK_SET;
    l.l_len = 1;
    int rc;
    do rc = ::fcntl(fd_, type == F_UNLCK ? F_SETLK : F_SETLKW, &l);
    while (rc != 0 && errno == EINTR);
    return rc == 0;
  }
  int fd_;
};

}  // namespace

namespace uroce::verbs_detail {

int call_fds(uroce_context* ctx, std::uint16_t type, const void* body, std::uint32_t blen, const int* fds_out,
             std::size_t nfds_out, void* reply, std::size_t rlen, int* fd_in, std::size_t nfd_in) {
  std::lock_guard<std::mutex> lock(ctx->call_mu);
  const ForkLock across(ctx);
  std::size_t fds_got = 0;
  std::uint8_t out[UROCE_MSG_MAX];
  const uroce_msg_hdr h{UROCE_MSG_MAGIC, UROCE_ABI_MAJOR, type, blen, ++ctx->seq};
  std::memcpy(out, &h, sizeof h);
  if (blen) std::memcpy(out + sizeof h, body, blen);
  if (abi::send_with_fds(ctx->sock, out, sizeof h + blen, fds_out, nfds_out) < 0)
    return set_error(errno, "cannot send to uroced");
  // The reply: header, status, body; a descriptor may ride with it.
  std::uint8_t in[UROCE_MSG_MAX];
  std::size_t got = 0, want = sizeof(uroce_msg_hdr);
  bool have_hdr = false;
  while (got < want) {
    // With an embedded node in this process the wait turns it: it may be
    // the one that answers (even for a context opened by its socket path).
    if (g_emb.node.load(std::memory_order_relaxed) && wait_fd(ctx->sock, -1) < 0)
      return set_error(errno, "waiting for the embedded node");
    const ssize_t n = abi::recv_with_fds(ctx->sock, in + got, want - got, 0, [&](int fd) {
      if (fd_in && fds_got < nfd_in) fd_in[fds_got++] = fd;
      else ::close(fd);
    });
    if (n <= 0) return set_error(n == 0 ? ECONNRESET : errno, "uroced closed the session");
    got += static_cast<std::size_t>(n);
    if (!have_hdr && got >= sizeof(uroce_msg_hdr)) {
      uroce_msg_hdr rh;
      std::memcpy(&rh, in, sizeof rh);
      if (rh.magic != UROCE_MSG_MAGIC || rh.len > UROCE_MSG_MAX - sizeof rh || rh.seq != h.seq)
        return set_error(EPROTO, "bad reply from uroced");
      want = sizeof rh + rh.len;
      have_hdr = true;
    }
  }
  uroce_reply_status st;
  std::memcpy(&st, in + sizeof(uroce_msg_hdr), sizeof st);
  if (st.err != 0) return set_error(st.err, st.why);
  const std::size_t body_len = want - sizeof(uroce_msg_hdr) - sizeof st;
  if (rlen > body_len) return set_error(EPROTO, "short reply from uroced");
  if (rlen) std::memcpy(reply, in + sizeof(uroce_msg_hdr) + sizeof st, rlen);
  return 0;
}

int call(uroce_context* ctx, std::uint16_t type, const void* body, std::uint32_t blen, int fd_out, void* reply,
         std::size_t rlen, int* fd_in, std::size_t nfd_in) {
  return call_fds(ctx, type, body, blen, &fd_out, fd_out >= 0 ? 1 : 0, reply, rlen, fd_in, nfd_in);
}

}  // namespace uroce::verbs_detail

extern "C" {

const char* uroce_last_error(void) { return t_error.c_str(); }

uroce_device** uroce_get_device_list(int* num) {
  std::vector<uroce_device*> devs;
  std::vector<std::string> seen;  // canonical paths: one device per socket, however it is named
  auto add = [&](const std::string& name, const std::string& path) {
    char real[PATH_MAX];
    const std::string key = ::realpath(path.c_str(), real) ? real : path;
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) return;
    seen.push_back(key);
    devs.push_back(new uroce_device{name, path});
  };
  if (const char* emb = std::getenv("UROCE_EMBEDDED"); emb && *emb) {
    // Embedded mode for every open: the one device is the node to be.
    devs.push_back(new uroce_device{"embedded", std::string("embedded:") + emb});
    if (num) *num = 1;
    auto out = new uroce_device*[2];
    out[0] = devs[0];
    out[1] = nullptr;
    return out;
  }
  const char* dir_env = std::getenv("UROCE_RUN_DIR");
  const std::string dir = dir_env && *dir_env ? dir_env : "/run/uroce";
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      struct stat st;
      if (n.size() > 5 && n.ends_with(".sock") && ::stat((dir + "/" + n).c_str(), &st) == 0 && S_ISSOCK(st.st_mode))
        names.push_back(n);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) add(n.substr(0, n.size() - 5), dir + "/" + n);
  }
  if (const char* list = std::getenv("UROCE_DEVICES")) {
    std::string rest = list;
    while (!rest.empty()) {
      const std::size_t colon = rest.find(':');
      const std::string path = rest.substr(0, colon);
      rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
      if (path.empty()) continue;
      std::string base = path.substr(path.find_last_of('/') + 1);
      if (base.ends_with(".sock")) base.resize(base.size() - 5);
      add(base, path);
    }
  }
  if (num) *num = static_cast<int>(devs.size());
  auto out = new uroce_device*[devs.size() + 1];
  std::copy(devs.begin(), devs.end(), out);
  out[devs.size()] = nullptr;
  return out;
}

void uroce_free_device_list(uroce_device** list) {
  if (!list) return;
  for (uroce_device** d = list; *d; ++d) delete *d;
  delete[] list;
}

const char* uroce_get_device_name(const uroce_device* d) { return d ? d->name.c_str() : nullptr; }
const char* uroce_get_device_path(const uroce_device* d) { return d ? d->path.c_str() : nullptr; }

uroce_context* uroce_open_device_by_name(const char* name) {
  const std::string want = name ? name : "";
  if (want.find('/') != std::string::npos || want.rfind("embedded:", 0) == 0) return uroce_open_device(want.c_str());
  int n = 0;
  uroce_device** list = uroce_get_device_list(&n);
  std::string path;
  for (int i = 0; i < n && path.empty(); ++i)
    if (want.empty() || want == list[i]->name) path = list[i]->path;
  uroce_free_device_list(list);
  if (path.empty()) {
    set_error(ENODEV, want.empty() ? "no uroce device (see UROCE_RUN_DIR and UROCE_DEVICES)" : "no device named " + want);
    return nullptr;
  }
  return uroce_open_device(path.c_str());
}

uroce_context* uroce_open_device(const char* path) {
  std::string options, emb_sock;
  const bool embedded = embedded_spec(path, options);
  if (embedded) {
    std::string why;
    if (!embedded_attach(options, emb_sock, why)) return set_error(EIO, why), nullptr;
    path = emb_sock.c_str();
  }
  auto ctx = new uroce_context();
  static std::once_flag fork_hook;
  std::call_once(fork_hook, [] { (void)::pthread_atfork(nullptr, note_fork, note_fork); });
  ctx->fork_lock_fd = ::memfd_create("uroce-session-lock", MFD_CLOEXEC);
  ctx->sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path, sizeof a.sun_path - 1);
  if (ctx->sock < 0 || ::connect(ctx->sock, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    set_error(errno, std::string("cannot connect to uroced at ") + path + ": " + std::strerror(errno));
    const int e = errno;
    uroce_close_device(ctx);
    errno = e;
    return nullptr;
  }
  uroce_hello_msg hello{UROCE_ABI_MAJOR, UROCE_ABI_MINOR, static_cast<std::uint32_t>(::getpid())};
  uroce_hello_reply r{};
  int fds[2] = {-1, -1};  // the session page and the doorbell (minor 4)
  if (call(ctx, UROCE_MSG_HELLO, &hello, sizeof hello, -1, &r, sizeof r, fds, 2) != 0) {
    const int e = errno;
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    uroce_close_device(ctx);
    errno = e;
    return nullptr;
  }
  if (fds[0] >= 0) {
    // The daemon sealed the memfd, so it stays whole; the application
    // writes only the posts word.
    void* page = ::mmap(nullptr, UROCE_SESSION_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    ::close(fds[0]);
    if (page != MAP_FAILED && static_cast<uroce_session_page*>(page)->magic == UROCE_ABI_MAGIC) {
      ctx->page = static_cast<uroce_session_page*>(page);
      ctx->bell = fds[1];
      fds[1] = -1;
    } else if (page != MAP_FAILED) {
      ::munmap(page, UROCE_SESSION_PAGE_BYTES);
    }
  }
  if (fds[1] >= 0) ::close(fds[1]);
  ctx->session = r.session;
  ctx->minor = r.minor;
  std::memcpy(ctx->gid, r.gid, 16);
  return ctx;
}

int uroce_close_device(uroce_context* ctx) {
  if (!ctx) return EINVAL;
  if (ctx->sock >= 0) ::close(ctx->sock);  // the daemon frees everything the session held
  if (ctx->fork_lock_fd >= 0) ::close(ctx->fork_lock_fd);
  if (ctx->page) ::munmap(ctx->page, UROCE_SESSION_PAGE_BYTES);
  if (ctx->bell >= 0) ::close(ctx->bell);
  if (ctx->cm_fd >= 0) ::close(ctx->cm_fd);
  unpin(ctx->bufs);
  // An embedded context leaves the node running (embedded_at_exit).
  delete ctx;
  return 0;
}

int uroce_async_fd(const uroce_context* ctx) { return ctx ? ctx->bell : -1; }

int uroce_get_async_event(uroce_context* ctx, uroce_async_event* ev) {
  if (!ctx || !ev) return set_error(EINVAL, "no context or event");
  if (ctx->bell < 0) return set_error(EOPNOTSUPP, "this uroced sends no async events (ABI minor < 5)");
  for (;;) {
    uroce_async_msg m{};
    const ssize_t n = ::recv(ctx->bell, &m, sizeof m, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      // The descriptor is non-blocking (it is also the doorbell): wait for it.
      if (wait_fd(ctx->bell, -1) < 0) return set_error(errno, "poll on the async event socket");
      continue;
    }
    if (n < 0) return set_error(errno, "reading the async event socket");
    if (n != sizeof m) continue;  // not an event (nothing else is sent this way)
    *ev = uroce_async_event{};
    ev->event_type = static_cast<ibv_event_type>(m.event_type);
    if (auto c = ctx->cqs.find(m.handle); m.event_type == IBV_EVENT_CQ_ERR && c != ctx->cqs.end()) ev->cq = c->second;
    const bool port = m.event_type == IBV_EVENT_PORT_ACTIVE || m.event_type == IBV_EVENT_PORT_ERR;
    if (port) ev->port_num = static_cast<std::uint8_t>(m.handle);
    if (auto q = ctx->qps.find(m.handle); !port && m.event_type != IBV_EVENT_CQ_ERR && q != ctx->qps.end())
      ev->qp = q->second;
    return 0;
  }
}

}  // extern "C"
