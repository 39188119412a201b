// liburoce: the application side of the session protocol and the shared
// rings. See uroce_verbs.h for the API and stack/abi for the contract.
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sched.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <atomic>
#include <string>
#include <vector>

#include "stack/abi/codec.h"
#include "stack/abi/doorbell.h"
#include "stack/abi/fd_msg.h"
#include "stack/abi/qp_attr.h"
#include "stack/abi/ring.h"
#include "stack/abi/send_entry.h"
#include "stack/abi/spin.h"
#include "stack/abi/work_ring.h"
#include "stack/abi/session_proto.h"
#include "stack/abi/wc_status.h"
#include "stack/verbs/embedded.h"
#include "stack/verbs/uroce_verbs.h"

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
namespace abi = uroce::abi;
using uroce::verbs_detail::set_error;
using uroce::verbs_detail::t_error;


/// The process's registered memory. Every page an MR covers lies in one
/// segment: a sealed memfd mapped where the application sees it, so every
/// daemon's mapping of that page shares the application's. A page never
/// moves once in a segment: an MR over pages of several segments (two
/// buffers sharing a page, registered in either order) maps them as pieces
/// (REG_MR_PIECES), and only pages no segment holds yet move onto a new one.
/// A segment lives while an MR (or a uroce_alloc_buf) pins it; after that
/// its pages go back to private memory, with their contents (unpin_locked).
///
/// fork: a shared mapping stays shared in a child, where private memory
/// would be copied. So that a child's pages are its own (as the kernel
/// copies pinned pages for a child), the fork handlers copy every segment
/// before the fork and, in the child, put the copy back as private memory
/// and forget the segments (the child's registrations are its own). A fork
/// costs a copy of the registered memory.
struct Segment {
  std::size_t len;
  int fd;
  std::uint32_t refs;
};
std::mutex g_seg_mu;
// By start address, never overlapping; never destroyed, so a thread still
// in the library while another calls exit() finds it intact.
std::map<std::uintptr_t, Segment>& g_segs = *new std::map<std::uintptr_t, Segment>;

/// Loads the embedded-mode plugin. When this process's libibverbs.so.1 is
/// uroce's drop-in (stack/ibverbs, put first by uroce-run), DPDK's EAL
/// would bind the mlx4 and mlx5 drivers it loads with every plugin to it,
/// and fail on rdma-core's private symbols. The plugin then goes into a
/// link-map namespace of its own (dlmopen), where rdma-core's own
/// libibverbs, libmlx5 and libmlx4 are loaded first by path, from the
/// folder of the system's C library or $UROCE_SYSTEM_LIB_DIR: the drivers
/// bind to those, and the application keeps uroce's.
/// Whether this process's libibverbs.so.1 is uroce's drop-in (it exports
/// uroce_ibv_context; rdma-core's does not).
bool under_dropin() { return ::dlsym(RTLD_DEFAULT, "uroce_ibv_context") != nullptr; }

void* load_plugin(const char* name) {
  if (!under_dropin()) return ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("UROCE_SYSTEM_LIB_DIR"); d && *d) dirs.emplace_back(d);
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&::printf), &info) != 0 && info.dli_fname) {
    std::string libc = info.dli_fname;
    const std::string dir = libc.substr(0, libc.rfind('/'));
    dirs.push_back(dir);
    if (dir.rfind("/lib/", 0) == 0) dirs.push_back("/usr" + dir);
  }
  Lmid_t lm = LM_ID_NEWLM;
  for (const char* lib : {"libibverbs.so.1", "libmlx5.so.1", "libmlx4.so.1"}) {
    for (const std::string& d : dirs) {
      const std::string path = d + "/" + lib;
      if (::access(path.c_str(), R_OK) != 0) continue;
      void* h = ::dlmopen(lm, path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h && lm == LM_ID_NEWLM && ::dlinfo(h, RTLD_DI_LMID, &lm) != 0) return nullptr;
      break;
    }
  }
  return ::dlmopen(lm, name, RTLD_NOW | RTLD_LOCAL);
}

/// Embedded mode: the process's one node, in the plugin (embedded.h). Every
/// liburoce call that posts, polls or waits turns its loop, whichever
/// context it is made on: progress is the process's, as in libfabric's
/// FI_PROGRESS_MANUAL. Opening and closing take the mutex; the data path
/// reads `node` only.
struct EmbeddedNode {
  std::mutex mu;
  void* lib = nullptr;
  const uroce_embedded_ops* ops = nullptr;
  std::atomic<void*> node{nullptr};
  std::atomic<int> inflight{0};  // calls into the node now: the stop at exit waits for them
  std::string options, sock;
  bool ended = false;  // started once and stopped: the EAL cannot start again
  bool atfork = false;  // the fork handler is registered
  bool atexit = false;  // the exit handler (which stops the node) is registered
  bool forked = false;  // this process is a fork() child of the node's
  // A thread that turns the node while the application blocks outside
  // liburoce (UROCE_EMBEDDED_PROGRESS=thread, and always under uroce's
  // drop-in libibverbs: unmodified programs block in their own TCP
  // exchanges, where manual progress would stop the node).
  pthread_t progress{};
  bool progress_running = false;
  std::atomic<bool> progress_stop{false};
  // Manual progress (no such thread): a burst of posts is handed to the
  // node in batches (embedded_posted). `deferred` counts the posts since
  // the last pass.
  std::atomic<bool> batch_posts{false};
  std::atomic<std::uint32_t> deferred{0};
};
EmbeddedNode g_emb;

/// Under manual progress, every kPostBatch-th post turns the node's loop;
/// the posts between wait for it, or for the next poll, wait or
/// uroce_progress. A pass per post cost about 4,600 instructions of
/// pipeline (a receive burst, the intake, timers, a transmit burst of one
/// frame) against about 1,000 for the message itself. Larger batches hold
/// the first posts of a burst back longer: with perftest's defaults (128
/// outstanding, a completion every 100) 16 gave 3.1 M 64-byte WRITEs a
/// second over memif, 8 gave 2.6 M, 32 gave 1.3 M, one pass a post 0.9 M.
constexpr std::uint32_t kPostBatch = 16;

/// In a child made by fork(), the parent's node is not this process's: its
/// memory is a copy, but its sockets and its port's descriptors are shared
/// with the parent, so a child that turned it would take the parent's
/// session requests (and answer them from its copy) or its frames. The
/// child forgets the node: it never turns it, and cannot start another (the
/// EAL's state was copied). Its embedded contexts are unusable, as verbs
/// objects are across fork; contexts it opens on a daemon work. The child
/// has one thread: the mutex, which another thread of the parent may have
/// held, is made anew.
void forget_node_in_child() {
  g_emb.node.store(nullptr);
  g_emb.inflight.store(0);
  g_emb.deferred.store(0);
  new (&g_emb.mu) std::mutex();
  g_emb.progress_running = false;  // the parent's thread, not this process's
  g_emb.forked = true;
}

/// The node, held for one call into it (nullptr: none). The stop at exit
/// takes the node away first and then waits until no call holds it, so a
/// thread inside the node never sees it freed.
class NodeRef {
 public:
  NodeRef() {
    g_emb.inflight.fetch_add(1);
    n_ = g_emb.node.load();
    if (!n_) g_emb.inflight.fetch_sub(1);
  }
  ~NodeRef() {
    if (n_) g_emb.inflight.fetch_sub(1);
  }
  NodeRef(const NodeRef&) = delete;
  NodeRef& operator=(const NodeRef&) = delete;
  void* get() const { return n_; }

 private:
  void* n_;
};

/// One turn of the embedded node's loop, if this process runs one.
inline std::size_t embedded_progress() {
  if (!g_emb.node.load(std::memory_order_relaxed)) return 0;  // daemon mode: one load
  g_emb.deferred.store(0, std::memory_order_relaxed);  // this pass takes them
  NodeRef n;
  return n.get() ? g_emb.ops->progress(n.get()) : 0;
}

/// Embedded mode, after a post: the post goes out now (a pass on this
/// thread), or, under manual progress, with the kPostBatch-th post of a
/// burst or at the next poll, wait or uroce_progress (a program that
/// blocks outside liburoce stops its node anyway: uroce_verbs.h).
inline void embedded_posted() {
  if (!g_emb.node.load(std::memory_order_relaxed)) return;  // daemon mode: one load
  if (g_emb.batch_posts.load(std::memory_order_relaxed) &&
      g_emb.deferred.fetch_add(1, std::memory_order_relaxed) + 1 < kPostBatch)
    return;
  (void)embedded_progress();
}

/// Whether posts wait for a pass (embedded_posted).
inline bool embedded_deferred() { return g_emb.deferred.load(std::memory_order_relaxed) != 0; }

/// Waits for `fd` to be readable (1), `timeout_ms` to pass (0; -1 without
/// end) or an error (-1, errno). With an embedded node the wait turns its
/// loop (nothing else would); otherwise it is poll(2).
int wait_fd(int fd, int timeout_ms) {
  {
    NodeRef n;
    if (n.get()) {
      g_emb.deferred.store(0, std::memory_order_relaxed);  // the wait's first pass takes them
      return g_emb.ops->wait(n.get(), fd, timeout_ms);
    }
  }
  if (fd < 0) {
    (void)::sched_yield();  // nothing to wait on: the core to whoever makes the event
    return 0;
  }
  using clk = std::chrono::steady_clock;
  const auto deadline = clk::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int ms = timeout_ms;
    if (timeout_ms > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clk::now()).count();
      ms = left > 0 ? static_cast<int>(left) : 0;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return 1;
    if (r == 0) return 0;
    if (errno != EINTR) return -1;  // a signal: wait out the rest
  }
}

/// Starts the embedded node (or shares the one running with the same
/// options) and gives the session socket to attach to; false and why.
/// The progress thread: turns the node, sleeping by the node's idle policy
/// in between (wait_fd on no descriptor), until told to stop.
void* progress_thread(void*) {
  using clk = std::chrono::steady_clock;
  while (!g_emb.progress_stop.load(std::memory_order_relaxed)) {
    const auto t0 = clk::now();
    (void)wait_fd(-1, 10);
    // Another thread may be turning the node (the wait returns at once):
    // give it the core rather than spin.
    if (clk::now() - t0 < std::chrono::microseconds(50)) ::usleep(100);
  }
  return nullptr;
}

void embedded_at_exit();

bool embedded_attach(const std::string& options, std::string& sock, std::string& why) {
  std::lock_guard<std::mutex> lk(g_emb.mu);
  if (g_emb.node.load()) {
    if (options != g_emb.options) {
      why = "an embedded node with other options already runs in this process (one per process)";
      return false;
    }
    sock = g_emb.sock;
    return true;
  }
  if (g_emb.forked) {
    why = "this process is a fork() child of one that runs an embedded node: the node is the parent's, and DPDK's EAL "
          "state was copied, so it cannot run one of its own";
    return false;
  }
  if (g_emb.ended) {
    why = "the embedded node of this process failed to start or stopped at exit, and DPDK's EAL cannot start twice in one process";
    return false;
  }
  if (!g_emb.lib) {
    const char* env = std::getenv("UROCE_EMBEDDED_PLUGIN");
    const char* name = env && *env ? env : "liburoce-embedded.so";
    g_emb.lib = load_plugin(name);
    if (!g_emb.lib) {
      const char* e = ::dlerror();
      why = std::string("cannot load the embedded-mode plugin (") + name + "): " + (e ? e : "?");
      return false;
    }
    auto entry = reinterpret_cast<uroce_embedded_entry_fn>(::dlsym(g_emb.lib, UROCE_EMBEDDED_ENTRY));
    g_emb.ops = entry ? entry() : nullptr;
    if (!g_emb.ops || g_emb.ops->version != UROCE_EMBEDDED_VERSION) {
      why = std::string("the embedded-mode plugin ") + name + " is not of this liburoce's version";
      g_emb.ops = nullptr;
      ::dlclose(g_emb.lib);
      g_emb.lib = nullptr;
      return false;
    }
  }
  char path[256] = {}, err[1024] = {};
  int spent = 0;
  void* n = g_emb.ops->start(options.c_str(), path, sizeof path, err, sizeof err, &spent);
  if (!n) {
    why = std::string("embedded mode: ") + err;
    g_emb.ended = spent != 0;  // a failure once the EAL was tried: it cannot be tried again
    return false;
  }
  g_emb.options = options;
  g_emb.sock = sock = path;
  if (!g_emb.atfork) g_emb.atfork = ::pthread_atfork(nullptr, nullptr, forget_node_in_child) == 0;
  if (!g_emb.atexit) g_emb.atexit = std::atexit(embedded_at_exit) == 0;
  const char* prog = std::getenv("UROCE_EMBEDDED_PROGRESS");
  const bool want_thread = (prog && std::strcmp(prog, "thread") == 0) ||
                           (!(prog && std::strcmp(prog, "manual") == 0) && under_dropin());
  // With the thread a program may block anywhere after a post: each post
  // goes out at once.
  g_emb.batch_posts.store(!want_thread);
  g_emb.node.store(n, std::memory_order_release);
  if (want_thread) {
    g_emb.progress_stop.store(false);
    g_emb.progress_running = ::pthread_create(&g_emb.progress, nullptr, progress_thread, nullptr) == 0;
  }
  return true;
}

/// The node outlives every context: closing the last one leaves it running,
/// as DPDK's EAL cannot start twice in one process and programs close their
/// device and open it again (rdma-core's test suite, per test;
/// ibv_get_device_guid opens and closes one). It stops when the process
/// exits.
void embedded_at_exit() {
  std::lock_guard<std::mutex> lk(g_emb.mu);
  if (g_emb.progress_running) {
    g_emb.progress_stop.store(true);
    if (void* live = g_emb.node.load()) g_emb.ops->interrupt(live);  // its wait ends early
    ::pthread_join(g_emb.progress, nullptr);
    g_emb.progress_running = false;
  }
  void* n = g_emb.node.exchange(nullptr);
  if (!n) return;  // a child of fork(): the node is the parent's
  // Threads inside the node (a wait on another context, a poll) leave it:
  // waits end early (their callers look again and find no node), passes
  // are short. Only then is it freed.
  g_emb.ops->interrupt(n);
  while (g_emb.inflight.load() > 0) ::usleep(50);
  g_emb.ops->stop(n);
  g_emb.ended = true;
}

/// The options of embedded mode from a device path ("embedded:OPTIONS"), or
/// from $UROCE_EMBEDDED, which makes every open this process makes embedded.
bool embedded_spec(const char* path, std::string& options) {
  if (const char* env = std::getenv("UROCE_EMBEDDED"); env && *env) {
    options = env;
    return true;
  }
  if (path && std::strncmp(path, "embedded:", 9) == 0) {
    options = path + 9;
    return true;
  }
  return false;
}

}  // namespace

struct uroce_context {
  int sock = -1;
  std::uint32_t seq = 0;
  std::uint32_t session = 0;
  std::uint16_t minor = 0;  // the daemon's ABI minor
  std::uint8_t gid[16] = {};
  std::vector<std::uintptr_t> bufs;  // uroce_alloc_buf's segments, pinned until the context closes
  // The session page and the doorbell (ABI minor 4): after a post, ring the
  // doorbell only while the page says the daemon may block.
  uroce_session_page* page = nullptr;
  int bell = -1;
  /// After publishing entries in the queue whose ring header is `queue`:
  /// names it (`what`, uroce_abi.h's work ring) for a daemon of minor 20 or
  /// later; an older one looks at every queue of a session whose posts word
  /// moved. Then the doorbell, if the daemon may be asleep.
  void posted(uroce_ring_header* queue, std::uint32_t what) const {
    if (minor >= 20) {
      if (page && queue) (void)abi::queue_work(page, queue, what);
      (void)abi::notify(page, bell);
    } else {
      (void)abi::bump_posts(page, bell);
    }
    embedded_posted();
  }
  /// After publishing receives: a daemon of minor 20 or later needs no name
  /// (the responder reads receive queues as requests come) unless the QP
  /// is in ERR, where the new receives are to be flushed. `queue` is the
  /// QP's send ring header, whose state is the QP's.
  void posted_recv(const abi::Ring<uroce_send_entry>* sq, std::uint32_t qpn) const {
    if (minor < 20) {
      (void)abi::bump_posts(page, bell);
      embedded_posted();
      return;
    }
    // The receives are published; the fence orders that before the look at
    // the state, against the daemon's state change before its flush.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sq && sq->valid() && sq->qp_state() == IBV_QPS_ERR) posted(sq->header(), qpn);
  }
  // For async events, which name a CQ or QP by its session handle.
  std::map<std::uint32_t, uroce_cq*> cqs;
  std::map<std::uint32_t, uroce_qp*> qps;
  // One request at a time on the session socket: an rdma_cm program waits
  // for CM events on one thread while another sets up its QPs.
  std::mutex call_mu;
  // And one process at a time, once this one has forked: a child shares the
  // socket, and its request and reply must not interleave with the parent's
  // or a sibling's (the kernel answers each command on a shared uverbs
  // descriptor alike). A POSIX record lock on this memfd: one per process,
  // so it excludes the processes that share the file, and it goes with a
  // process that dies holding it.
  int fork_lock_fd = -1;
  // The CM event channel (minor 7), made at the first CM call: our end is
  // readable when the daemon has queued a CM event for this session.
  std::once_flag cm_once;
  int cm_fd = -1;
  bool cm_pushed = false;  // the daemon rings cm_fd (false: an older daemon, asked every millisecond)
  std::uint16_t dev_flags = 0;  // UROCE_DEVICE_* as the last device query said (minor 16)
  bool mem_sent = false;        // the daemon holds this process's /proc/self/mem (the first ODP MR sent it)
};

struct uroce_pd {
  uroce_context* ctx;
  std::uint32_t handle;
};

struct uroce_mr {
  uroce_pd* pd;
  std::uint32_t handle, lkey, rkey;
  std::vector<std::uintptr_t> segs;  // the segments it pins
};

struct uroce_mw {
  uroce_pd* pd;
  std::uint32_t handle, rkey;
};

struct uroce_comp_channel {
  uroce_context* ctx;
  int fd;    // readable when an armed CQ got an entry (our end of a datagram socket pair)
  int peer;  // the daemon's end: handed over with each CQ on this channel
  std::vector<uroce_cq*> cqs;
};

/// What uroce_modify_qp writes over the opcode of a completion that is not
/// to be handed out (no ibv_wc_opcode has it; only this library writes it).
constexpr std::uint32_t kDiscardedCompletion = 0xffffffffu;

struct uroce_cq {
  uroce_context* ctx;
  std::uint32_t handle;
  void* map;
  std::size_t map_len;
  uroce::abi::Ring<uroce_cq_entry> ring;
  void* cq_context = nullptr;
  uroce_comp_channel* channel = nullptr;
  std::uint32_t events_seen = 0;  // notifications already returned by get_cq_event
  uroce::abi::AdaptiveSpin spin;  // uroce_poll_cq_wait's polling window, learnt from its waits
};

struct uroce_srq {
  uroce_context* ctx;
  std::uint32_t handle;
  void* map;
  std::size_t map_len;
  uroce::abi::Ring<uroce_recv_entry> ring;
  std::uint32_t srq_num = 0;  // an XRC SRQ's
  // A tag-matching SRQ's (uroce_abi.h): its operations ring, the daemon's
  // released words, and this side's count of ADDs of each tag.
  uroce::abi::Ring<uroce_tm_op> ops;
  const std::uint32_t* released = nullptr;
  std::vector<std::uint32_t> gen;
};

struct uroce_xrcd {
  uroce_context* ctx;
  std::uint32_t handle;
};

struct uroce_device {
  std::string name, path;
};

/// A UD address handle: rdma-core's ibv_ah first (what wr.ud.ah points at),
/// then the address vector a UD send entry carries.
struct uroce_ah {
  ibv_ah ah{};
  std::uint32_t magic = kAhMagic;  // cleared at destroy, so a stale handle is refused
  std::uint8_t dgid[16] = {};
  std::uint8_t dmac[6] = {};
  std::uint8_t traffic_class = 0;
  static constexpr std::uint32_t kAhMagic = 0x55414821;
};

struct uroce_qp {
  uroce_context* ctx;
  std::uint32_t handle, qpn;
  void* map;
  std::size_t map_len;
  uroce::abi::Ring<uroce_send_entry> sq;
  uroce::abi::Ring<uroce_recv_entry> rq;
  uroce_qp_init_attr init{};  // as created, for uroce_query_qp
};

namespace {

/// One request and its reply. `fds_out[0..nfds_out)` go with the request;
/// descriptors in the reply land in fd_in[0..nfd_in), in order (the rest
/// are closed).
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

int call_fds(uroce_context* ctx, std::uint16_t type, const void* body, std::uint32_t blen, const int* fds_out,
             std::size_t nfds_out, void* reply, std::size_t rlen, int* fd_in = nullptr, std::size_t nfd_in = 1) {
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

/// The same with at most one descriptor (`fd_out`, -1 for none).
int call(uroce_context* ctx, std::uint16_t type, const void* body, std::uint32_t blen, int fd_out, void* reply,
         std::size_t rlen, int* fd_in = nullptr, std::size_t nfd_in = 1) {
  return call_fds(ctx, type, body, blen, &fd_out, fd_out >= 0 ? 1 : 0, reply, rlen, fd_in, nfd_in);
}

/// A memfd of `len` bytes sealed at that size: the daemon maps registered
/// memory and refuses a memfd that could be shrunk under it.
int sealed_memfd(const char* name, std::size_t len) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(len)) != 0 || ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/// Maps the memfd of a ring the daemon made; false (errno set) on failure.
bool map_fd(int fd, void*& map, std::size_t& len, const char* what) {
  if (fd < 0) return set_error(EPROTO, std::string("no ") + what + " from uroced"), false;
  const off_t end = ::lseek(fd, 0, SEEK_END);
  map = end > 0 ? ::mmap(nullptr, static_cast<std::size_t>(end), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  ::close(fd);
  if (map == MAP_FAILED) return set_error(errno ? errno : EPROTO, std::string("cannot map the ") + what), false;
  len = static_cast<std::size_t>(end);
  return true;
}

/// Receive work requests into a ring (a QP's RQ or an SRQ).
/// More than `max_sge` SGEs (the queue's max_recv_sge or max_sge) is EINVAL.
int push_recvs(abi::Ring<uroce_recv_entry>& ring, ibv_recv_wr* wr, ibv_recv_wr** bad, int max_sge) {
  for (; wr; wr = wr->next) {
    if (wr->num_sge < 0 || wr->num_sge > UROCE_ABI_MAX_SGE || wr->num_sge > max_sge) {
      if (bad) *bad = wr;
      return set_error(EINVAL, "more SGEs than the queue's max_recv_sge");
    }
    uroce_recv_entry e{};
    e.wr_id = wr->wr_id;
    e.num_sge = static_cast<std::uint32_t>(wr->num_sge);
    for (int i = 0; i < wr->num_sge; ++i)
      e.sg_list[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
    if (!ring.push(e)) {
      if (bad) *bad = wr;
      return set_error(ENOMEM, "receive queue full");
    }
  }
  return 0;
}

/// Whether [start, start + len) is still mapped from `fd`'s memfd, readable
/// and writable, all of it: an application may unmap or remap memory
/// before it deregisters it (UCX's memory pools do), and nothing may then
/// be read or replaced there. From /proc/self/maps (not on the data path).
bool still_ours(std::uintptr_t start, std::size_t len, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return false;
  char line[512];
  std::uintptr_t covered = start;
  bool ok = true;
  while (ok && std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0, off = 0, ino = 0;
    unsigned dmaj = 0, dmin = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &dmaj, &dmin, &ino) != 7) continue;
    if (hi <= start || lo >= start + len) continue;
    if (lo > covered || ino != st.st_ino || perms[0] != 'r' || perms[1] != 'w') ok = false;
    covered = hi;
  }
  std::fclose(f);
  return ok && covered >= start + len;
}

/// A private copy of [start, start + len), or null when no memory could be had.
void* snapshot(std::uintptr_t start, std::size_t len) {
  void* c = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED) return nullptr;
  std::memcpy(c, reinterpret_cast<const void*>(start), len);
  return c;
}

/// Puts [start, start + len) back on private memory, keeping its contents
/// (from `copy`, a snapshot of len bytes, or one of its own when null).
void make_private(std::uintptr_t start, std::size_t len, const void* copy) {
  void* tmp = nullptr;
  if (!copy) {
    tmp = snapshot(start, len);
    if (!tmp) return;  // it stays shared memory: still the application's
    copy = tmp;
  }
  if (::mmap(reinterpret_cast<void*>(start), len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
      MAP_FAILED)
    std::memcpy(reinterpret_cast<void*>(start), copy, len);
  if (tmp) ::munmap(tmp, len);
}

void unpin_locked(std::uintptr_t start) {
  const auto it = g_segs.find(start);
  if (it == g_segs.end() || --it->second.refs != 0) return;
  if (still_ours(it->first, it->second.len, it->second.fd)) make_private(it->first, it->second.len, nullptr);
  ::close(it->second.fd);
  g_segs.erase(it);
}

/// The fork handlers (see Segment). The copies are made before the fork,
/// so the child's pages are what the parent's were at the fork.
struct ForkCopy {
  std::uintptr_t start;
  std::size_t len;
  void* copy;  // private memory, or null when it could not be had
};
std::vector<ForkCopy>& g_fork_copies = *new std::vector<ForkCopy>;
void seg_fork_prepare() {
  g_seg_mu.lock();
  g_fork_copies.clear();
  for (const auto& [start, s] : g_segs) {
    if (!still_ours(start, s.len, s.fd)) continue;  // not the application's memory there any more
    g_fork_copies.push_back({start, s.len, snapshot(start, s.len)});
  }
}
void seg_fork_parent() {
  for (const ForkCopy& f : g_fork_copies)
    if (f.copy) ::munmap(f.copy, f.len);
  g_fork_copies.clear();
  g_seg_mu.unlock();
}
void seg_fork_child() {
  for (const ForkCopy& f : g_fork_copies) {
    if (!f.copy) continue;  // no copy: the page stays shared with the parent
    make_private(f.start, f.len, f.copy);
    ::munmap(f.copy, f.len);
  }
  g_fork_copies.clear();
  for (const auto& [start, s] : g_segs) ::close(s.fd);
  g_segs.clear();
  g_seg_mu.unlock();
}
const bool g_seg_fork_handlers = pthread_atfork(seg_fork_prepare, seg_fork_parent, seg_fork_child) == 0;

void unpin(const std::vector<std::uintptr_t>& segs) {
  std::lock_guard<std::mutex> lock(g_seg_mu);
  for (std::uintptr_t s : segs) unpin_locked(s);
}

/// Moves the pages [start, end), which no segment holds, onto a new
/// segment in place, keeping their contents. 0 or an errno.
int new_segment_locked(std::uintptr_t start, std::uintptr_t end) {
  const std::size_t len = end - start;
  const int fd = sealed_memfd("uroce-mr", len);
  if (fd < 0) return set_error(errno, "memfd");
  void* tmp = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) return ::close(fd), set_error(errno, "mmap");
  std::memcpy(tmp, reinterpret_cast<void*>(start), len);
  ::munmap(tmp, len);
  if (::mmap(reinterpret_cast<void*>(start), len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
    return ::close(fd), set_error(errno, "cannot remap the memory onto shared memory");
  g_segs[start] = {len, fd, 0};
  return 0;
}

/// The memfd pieces behind the pages [start, end), in order, making
/// segments for pages no segment holds; pins each segment used (`segs`).
/// 0, or an errno with nothing pinned.
int pin(std::uintptr_t start, std::uintptr_t end, std::vector<uroce_reg_mr_piece>& pieces, std::vector<int>& fds,
        std::vector<std::uintptr_t>& segs) {
  std::lock_guard<std::mutex> lock(g_seg_mu);
  const auto undo = [&segs] {
    for (std::uintptr_t s : segs) unpin_locked(s);
    segs.clear();
  };
  for (std::uintptr_t pos = start; pos < end;) {
    auto next = g_segs.upper_bound(pos);
    auto it = next == g_segs.begin() ? g_segs.end() : std::prev(next);
    if (it == g_segs.end() || pos >= it->first + it->second.len) {
      const std::uintptr_t gap_end = next == g_segs.end() ? end : std::min(end, next->first);
      if (const int rc = new_segment_locked(pos, gap_end)) {
        undo();
        return rc;
      }
      it = g_segs.find(pos);
    }
    const std::uintptr_t take = std::min(end, it->first + it->second.len) - pos;
    if (pieces.size() == UROCE_MR_MAX_PIECES) {
      undo();
      return set_error(ENOMEM, "the MR spans more than 16 separately registered regions");
    }
    pieces.push_back({pos - it->first, take});
    fds.push_back(it->second.fd);
    ++it->second.refs;
    segs.push_back(it->first);
    pos += take;
  }
  return 0;
}

}  // namespace

extern "C" {

const char* uroce_last_error(void) { return t_error.c_str(); }

const char* uroce_wc_status_str(ibv_wc_status s) { return uroce_wc_status_name(s); }

}  // extern "C"

namespace {

/// A CM request with its parameters filled in.
int cm_call(uroce_context* ctx, std::uint16_t type, uroce_cm_msg& m, const uroce_cm_param* p, void* reply = nullptr,
            std::size_t rlen = 0) {
  if (p) {
    if (p->private_data_len > UROCE_CM_PRIVATE_MAX || (p->private_data_len && !p->private_data))
      return set_error(EINVAL, "CM private data is at most 56 bytes");
    m.private_len = p->private_data_len;
    if (p->private_data_len) std::memcpy(m.private_data, p->private_data, p->private_data_len);
    m.mtu = static_cast<std::uint8_t>(p->mtu);
    m.responder_resources = p->responder_resources;
    m.initiator_depth = p->initiator_depth;
    m.retry_cnt = p->retry_count;
    m.rnr_retry = p->rnr_retry_count;
    if (p->flags & ~(UROCE_CM_APP_QP | UROCE_CM_ACK_TIMEOUT)) return set_error(EINVAL, "unknown CM flags");
    if ((p->flags & UROCE_CM_APP_QP) && ctx->minor < 9)
      return set_error(EOPNOTSUPP, "this uroced cannot leave a QP to the application (ABI minor < 9)");
    if (p->flags & UROCE_CM_ACK_TIMEOUT) {
      if (ctx->minor < 12) return set_error(EOPNOTSUPP, "this uroced takes no ACK timeout for a CM connection (ABI minor < 12)");
      if (p->ack_timeout > 31) return set_error(EINVAL, "the ACK timeout is 0..31");
      m.ack_timeout = p->ack_timeout;
    }
    m.flags = p->flags;
  }
  return call(ctx, type, &m, sizeof m, -1, reply, rlen);
}

/// A listen or unlisten of a port, in RDMA_PS_UDP's space with UROCE_CM_UD.
int cm_port_call(uroce_context* ctx, std::uint16_t type, std::uint16_t port, std::uint8_t flags) {
  if (!ctx) return set_error(EINVAL, "no context");
  if (flags && ctx->minor < 9) return set_error(EOPNOTSUPP, "this uroced has no SIDR (ABI minor < 9)");
  uroce_cm_msg m{};
  m.port = port;
  m.flags = flags;
  return cm_call(ctx, type, m, nullptr);
}

}  // namespace

extern "C" {

int uroce_cm_listen(uroce_context* ctx, std::uint16_t port) { return cm_port_call(ctx, UROCE_MSG_CM_LISTEN, port, 0); }
int uroce_cm_unlisten(uroce_context* ctx, std::uint16_t port) {
  return cm_port_call(ctx, UROCE_MSG_CM_UNLISTEN, port, 0);
}
int uroce_cm_listen_ud(uroce_context* ctx, std::uint16_t port) {
  return cm_port_call(ctx, UROCE_MSG_CM_LISTEN, port, UROCE_CM_UD);
}
int uroce_cm_unlisten_ud(uroce_context* ctx, std::uint16_t port) {
  return cm_port_call(ctx, UROCE_MSG_CM_UNLISTEN, port, UROCE_CM_UD);
}

int uroce_cm_connect(uroce_qp* qp, const ibv_gid* dgid, std::uint16_t port, const uroce_cm_param* p,
                     std::uint32_t* id) {
  if (!qp || !dgid || !id) return set_error(EINVAL, "no QP, GID or id");
  uroce_cm_msg m{};
  m.qp = qp->handle;
  std::memcpy(m.dgid, dgid->raw, 16);
  m.port = port;
  uroce_cm_id_reply r{};
  const int rc = cm_call(qp->ctx, UROCE_MSG_CM_CONNECT, m, p, &r, sizeof r);
  if (rc == 0) *id = r.id;
  return rc;
}

int uroce_cm_accept(uroce_qp* qp, std::uint32_t id, const uroce_cm_param* p) {
  if (!qp) return set_error(EINVAL, "no QP");
  uroce_cm_msg m{};
  m.qp = qp->handle;
  m.id = id;
  return cm_call(qp->ctx, UROCE_MSG_CM_ACCEPT, m, p);
}

int uroce_cm_reject(uroce_context* ctx, std::uint32_t id, const void* priv, std::uint8_t len) {
  if (!ctx) return set_error(EINVAL, "no context");
  uroce_cm_msg m{};
  m.id = id;
  const uroce_cm_param p{priv, len, 0, 0, 0, 0, static_cast<ibv_mtu>(0)};
  return cm_call(ctx, UROCE_MSG_CM_REJECT, m, &p);
}

int uroce_cm_establish(uroce_context* ctx, std::uint32_t id) {
  if (!ctx) return set_error(EINVAL, "no context");
  uroce_cm_msg m{};
  m.id = id;
  return cm_call(ctx, UROCE_MSG_CM_ESTABLISH, m, nullptr);
}

int uroce_cm_disconnect(uroce_context* ctx, std::uint32_t id) {
  if (!ctx) return set_error(EINVAL, "no context");
  uroce_cm_msg m{};
  m.id = id;
  return cm_call(ctx, UROCE_MSG_CM_DISCONNECT, m, nullptr);
}

int uroce_cm_fd(uroce_context* ctx) {
  if (!ctx) return set_error(EINVAL, "no context"), -1;
  std::call_once(ctx->cm_once, [ctx] {
    // A datagram socket pair, as for a completion channel: the daemon rings
    // its end per queued event and never blocks on it.
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return;
    ctx->cm_fd = sv[0];
    ctx->cm_pushed = call(ctx, UROCE_MSG_CM_CHANNEL, nullptr, 0, sv[1], nullptr, 0) == 0;
    ::close(sv[1]);  // the daemon holds its own copy
  });
  if (ctx->cm_fd < 0) return set_error(EMFILE, "cannot create the CM channel"), -1;
  return ctx->cm_fd;
}

int uroce_cm_get_event(uroce_context* ctx, int timeout_ms, uroce_cm_event* ev) {
  if (!ctx || !ev) return set_error(EINVAL, "no context or event");
  // Events wait in the daemon (or the embedded node), which rings the CM
  // channel after queueing one: drain the channel, ask, and sleep on it if
  // there was none (a ring that comes after the drain wakes the sleep).
  const int fd = uroce_cm_fd(ctx);
  if (fd < 0) return errno;
  using clk = std::chrono::steady_clock;
  const auto deadline = clk::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    (void)abi::drain(fd);
    uroce_cm_event_msg r{};
    // An older daemon's event is shorter: what it lacks reads as 0.
    const std::size_t rlen = ctx->minor >= 9 ? sizeof r : offsetof(uroce_cm_event_msg, sq_psn);
    const int rc = call(ctx, UROCE_MSG_CM_EVENT, nullptr, 0, -1, &r, rlen);
    if (rc == 0) {
      *ev = uroce_cm_event{};
      ev->event = static_cast<uroce_cm_event_type>(r.event);
      ev->id = r.id;
      ev->status = r.status;
      ev->peer_qp_num = r.peer_qpn;
      std::memcpy(ev->peer_gid.raw, r.peer_gid, 16);
      ev->peer_port = r.peer_port;
      ev->local_port = r.local_port;
      ev->responder_resources = r.responder_resources;
      ev->initiator_depth = r.initiator_depth;
      ev->mtu = static_cast<ibv_mtu>(r.mtu);
      ev->private_data_len = std::min<std::uint8_t>(r.private_len, sizeof ev->private_data);
      std::memcpy(ev->private_data, r.private_data, ev->private_data_len);
      ev->sq_psn = r.sq_psn;
      ev->rq_psn = r.rq_psn;
      ev->retry_count = r.retry_cnt;
      ev->rnr_retry_count = r.rnr_retry;
      ev->timeout = r.ack_timeout;
      ev->max_rd_atomic = r.max_rd_atomic;
      ev->max_dest_rd_atomic = r.max_dest_rd_atomic;
      ev->ud = r.ud;
      ev->qkey = r.qkey;
      return 0;
    }
    if (rc != EAGAIN) return rc;
    if (timeout_ms == 0) return rc;
    int wait_ms = -1;
    if (timeout_ms > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clk::now()).count();
      if (left <= 0) return set_error(ETIMEDOUT, "no CM event in time");
      wait_ms = static_cast<int>(left);
    }
    if (!ctx->cm_pushed) wait_ms = wait_ms < 0 ? 1 : std::min(wait_ms, 1);  // an older daemon: ask again in 1 ms
    if (wait_fd(fd, wait_ms) < 0 && errno != EINTR) return set_error(errno, "cannot wait on the CM channel");
  }
}

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

int uroce_query_gid(uroce_context* ctx, std::uint8_t port_num, int index, ibv_gid* gid) {
  if (!ctx || !gid || port_num != 1 || index < 0 || index >= UROCE_GID_TABLE_LEN)
    return set_error(EINVAL, "port 1, a GID index under the table's length");
  if (index == 0) {
    std::memcpy(gid->raw, ctx->gid, 16);
  } else {
    *gid = ibv_gid{};  // an empty entry, as the kernel reads one
  }
  return 0;
}

uroce_pd* uroce_alloc_pd(uroce_context* ctx) {
  uroce_handle_reply r{};
  if (!ctx || call(ctx, UROCE_MSG_ALLOC_PD, nullptr, 0, -1, &r, sizeof r) != 0) return nullptr;
  return new uroce_pd{ctx, r.handle};
}

void* uroce_alloc_buf(uroce_context* ctx, std::size_t length) {
  if (!ctx || length == 0) return set_error(EINVAL, "empty buffer"), nullptr;
  const std::size_t len = (length + 4095) & ~std::size_t{4095};
  const int fd = sealed_memfd("uroce-buf", len);
  if (fd < 0) return set_error(errno, "memfd"), nullptr;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return set_error(errno, "mmap"), nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(g_seg_mu);
    g_segs[reinterpret_cast<std::uintptr_t>(p)] = {len, fd, 1};
  }
  ctx->bufs.push_back(reinterpret_cast<std::uintptr_t>(p));
  return p;
}

uroce_mr* uroce_reg_mr(uroce_pd* pd, void* addr, std::size_t length, int access) {
  return uroce_reg_mr_iova(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), access);
}

/// The memory of an MR of [addr, addr + length) that its peers address at
/// iova, as REG_MR_PIECES sends it: the segments' pieces (pinned: segs),
/// or for 0 bytes a page of its own (no application memory is shared).
struct MrMemory {
  uroce_reg_mr_pieces_msg m{};
  uroce_reg_mr_exact exact{};
  std::vector<int> fds;
  std::vector<std::uintptr_t> segs;
  int own_fd = -1;
  MrMemory() = default;
  MrMemory(const MrMemory&) = delete;
  MrMemory& operator=(const MrMemory&) = delete;
  ~MrMemory() {
    if (own_fd >= 0) ::close(own_fd);
  }
};

/// Fills `mem` for pd's MR: 0, or an errno with nothing pinned.
int mr_memory(uroce_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access, MrMemory& mem) {
  uroce_context* ctx = pd->ctx;
  if (length == 0 && ctx->minor < 15) return set_error(EINVAL, "this uroced registers no MR of 0 bytes");
  if (!addr && length != 0) return set_error(EINVAL, "bad MR arguments");
  if (iova + length < iova) return set_error(EINVAL, "the IOVA range wraps");
  // The daemon maps whole pages: register from the page holding addr,
  // which the MR's address space (its IOVA) reaches at iova - (addr - page).
  const auto page = reinterpret_cast<std::uintptr_t>(addr) & ~std::uintptr_t{4095};
  const auto end = (reinterpret_cast<std::uintptr_t>(addr) + length + 4095) & ~std::uintptr_t{4095};
  const std::uint64_t head = reinterpret_cast<std::uintptr_t>(addr) - page;
  // The MR is exactly [addr, addr + length) (ABI minor 14): its keys reach
  // nothing else on its pages. An older daemon registers the whole pages,
  // whose IOVA must then not wrap.
  if (ctx->minor < 14 && iova < head) return set_error(EINVAL, "the IOVA range wraps");
  mem.exact = {head, length};
  std::vector<uroce_reg_mr_piece> pieces;
  if (length == 0) {
    mem.own_fd = sealed_memfd("uroce-mr0", 4096);
    if (mem.own_fd < 0) return set_error(errno, "memfd");
    pieces.push_back({0, 4096});
    mem.fds.push_back(mem.own_fd);
  } else if (pin(page, end, pieces, mem.fds, mem.segs) != 0) {
    return errno;
  }
  const std::uint64_t span = length == 0 ? 4096 : end - page;
  mem.m.mr = {pd->handle, static_cast<std::uint32_t>(access), iova - head, span, 0};
  mem.m.count = static_cast<std::uint32_t>(pieces.size());
  std::copy(pieces.begin(), pieces.end(), mem.m.piece);
  return 0;
}

namespace {
/// An ODP MR (minor 16): nothing is shared; the daemon reaches the bytes
/// through this process's memory file, sent with the session's first one.
/// NULL with SIZE_MAX bytes: the whole address space (implicit ODP).
uroce_mr* reg_mr_odp(uroce_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access) {
  uroce_context* ctx = pd->ctx;
  if (ctx->minor < 16) return set_error(EOPNOTSUPP, "this uroced registers no ODP MR (ABI minor < 16)"), nullptr;
  const bool implicit = addr == nullptr && length == SIZE_MAX;
  if (length == 0 || (!addr && !implicit)) return set_error(EINVAL, "bad ODP MR arguments"), nullptr;
  uroce_reg_mr_odp_msg m{pd->handle, static_cast<std::uint32_t>(access), reinterpret_cast<std::uintptr_t>(addr),
                         implicit ? UINT64_MAX : length, implicit ? 0 : iova};
  uroce_reg_mr_reply r{};
  int fd = -1;
  if (!ctx->mem_sent) {
    fd = ::open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    if (fd < 0) return set_error(errno, "cannot open /proc/self/mem for the daemon"), nullptr;
  }
  const int rc = call(ctx, UROCE_MSG_REG_MR_ODP, &m, sizeof m, fd, &r, sizeof r);
  if (fd >= 0) ::close(fd);
  if (rc != 0) return nullptr;
  ctx->mem_sent = true;
  return new uroce_mr{pd, r.handle, r.lkey, r.rkey, {}};
}
}  // namespace

uroce_mr* uroce_reg_mr_iova(uroce_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access) {
  if (!pd) return set_error(EINVAL, "bad MR arguments"), nullptr;
  if (access & IBV_ACCESS_ON_DEMAND) return reg_mr_odp(pd, addr, length, iova, access);
  uroce_context* ctx = pd->ctx;
  MrMemory mem;
  if (mr_memory(pd, addr, length, iova, access, mem) != 0) return nullptr;
  uroce_reg_mr_reply r{};
  int rc;
  const std::uint32_t tail = ctx->minor >= 14 ? sizeof mem.exact : 0;  // the exact bytes follow the request
  if (mem.m.count == 1) {
    struct {
      uroce_reg_mr_msg mr;
      uroce_reg_mr_exact ex;
    } one{mem.m.mr, mem.exact};
    static_assert(sizeof one == sizeof(uroce_reg_mr_msg) + sizeof(uroce_reg_mr_exact));
    one.mr.offset = mem.m.piece[0].offset;
    rc = call(ctx, UROCE_MSG_REG_MR, &one, sizeof one.mr + tail, mem.fds[0], &r, sizeof r);
  } else {
    struct {
      uroce_reg_mr_pieces_msg m;
      uroce_reg_mr_exact ex;
    } many{mem.m, mem.exact};
    static_assert(sizeof many == sizeof(uroce_reg_mr_pieces_msg) + sizeof(uroce_reg_mr_exact));
    rc = call_fds(ctx, UROCE_MSG_REG_MR_PIECES, &many, sizeof many.m + tail, mem.fds.data(), mem.fds.size(), &r,
                  sizeof r);
  }
  if (rc != 0) {
    const int e = errno;
    unpin(mem.segs);
    errno = e;
    return nullptr;
  }
  return new uroce_mr{pd, r.handle, r.lkey, r.rkey, std::move(mem.segs)};
}

int uroce_rereg_mr(uroce_mr* mr, int flags, uroce_pd* pd, void* addr, std::size_t length, int access) {
  if (!mr) return set_error(EINVAL, "no MR");
  uroce_context* ctx = mr->pd->ctx;
  if (ctx->minor < 15) return set_error(EOPNOTSUPP, "this uroced cannot change an MR in place");
  const bool new_pd = (flags & IBV_REREG_MR_CHANGE_PD) != 0;
  const bool new_memory = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0;
  if (new_pd && (!pd || pd->ctx != ctx)) return set_error(EINVAL, "no PD, or one of another context");
  struct {
    uroce_rereg_mr_msg r;
    uroce_reg_mr_pieces_msg m;
    uroce_reg_mr_exact ex;
  } body{};
  body.r = {mr->handle, static_cast<std::uint32_t>(flags), new_pd ? pd->handle : 0, static_cast<std::uint32_t>(access)};
  std::uint32_t blen = sizeof body.r;
  MrMemory mem;
  if (new_memory) {
    if (mr_memory(new_pd ? pd : mr->pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), access, mem) != 0)
      return errno;
    body.m = mem.m;
    body.ex = mem.exact;
    blen = sizeof body;
  }
  uroce_reg_mr_reply r{};
  if (const int rc = call_fds(ctx, UROCE_MSG_REREG_MR, &body, blen, mem.fds.data(), mem.fds.size(), &r, sizeof r)) {
    unpin(mem.segs);
    errno = rc;
    return rc;
  }
  if (new_memory) {
    unpin(mr->segs);
    mr->segs = std::move(mem.segs);
  }
  if (new_pd) mr->pd = pd;
  mr->lkey = r.lkey;
  mr->rkey = r.rkey;
  return 0;
}

int uroce_dereg_mr(uroce_mr* mr) {
  if (!mr) return EINVAL;
  uroce_destroy_msg d{UROCE_OBJ_MR, mr->handle};
  const int rc = call(mr->pd->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) {
    unpin(mr->segs);
    delete mr;
  }
  return rc;
}

int uroce_dealloc_pd(uroce_pd* pd) {
  if (!pd) return set_error(EINVAL, "no PD");
  uroce_destroy_msg d{UROCE_OBJ_PD, pd->handle};
  const int rc = call(pd->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) delete pd;
  return rc;
}

int uroce_destroy_cq(uroce_cq* cq) {
  if (!cq) return set_error(EINVAL, "no CQ");
  uroce_destroy_msg d{UROCE_OBJ_CQ, cq->handle};
  const int rc = call(cq->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) {
    if (cq->channel) std::erase(cq->channel->cqs, cq);
    cq->ctx->cqs.erase(cq->handle);
    ::munmap(cq->map, cq->map_len);
    delete cq;
  }
  return rc;
}

int uroce_query_device(uroce_context* ctx, ibv_device_attr* attr) {
  if (!ctx || !attr) return set_error(EINVAL, "no context or attr");
  uroce_query_msg q{UROCE_OBJ_DEVICE, 0};
  uroce_device_attr r{};
  // A daemon before minor 18 answers 48 bytes (no SRQ bounds: 0).
  const std::size_t rlen = ctx->minor >= 18 ? sizeof r : offsetof(uroce_device_attr, max_srq);
  if (int rc = call(ctx, UROCE_MSG_QUERY, &q, sizeof q, -1, &r, rlen)) return rc;
  ctx->dev_flags = ctx->minor >= 16 ? r.flags : 0;
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "uroce abi %u.%u", UROCE_ABI_MAJOR, UROCE_ABI_MINOR);
  std::uint64_t guid = 0;  // EUI-64 from the MAC, as RoCE devices do
  const std::uint8_t eui[8] = {static_cast<std::uint8_t>(r.mac[0] ^ 2), r.mac[1], r.mac[2], 0xff, 0xfe,
                               r.mac[3], r.mac[4], r.mac[5]};
  std::memcpy(&guid, eui, 8);
  attr->node_guid = attr->sys_image_guid = guid;
  attr->max_mr_size = r.max_mr_size;
  attr->max_qp = static_cast<int>(r.max_qp);
  attr->max_qp_wr = static_cast<int>(r.max_qp_wr);
  attr->max_sge = static_cast<int>(r.max_sge);
  attr->max_cq = static_cast<int>(r.max_cq);
  attr->max_cqe = static_cast<int>(r.max_cqe);
  attr->max_mr = static_cast<int>(r.max_mr);
  attr->max_pd = static_cast<int>(r.max_pd);
  attr->max_qp_rd_atom = attr->max_qp_init_rd_atom = static_cast<int>(r.max_qp_rd_atom);
  attr->max_srq = static_cast<int>(r.max_srq);
  attr->max_srq_wr = static_cast<int>(r.max_srq_wr);
  attr->max_srq_sge = r.max_srq ? UROCE_ABI_MAX_SGE : 0;
  attr->atomic_cap = IBV_ATOMIC_HCA;
  // Memory windows (minor 8) share the MRs' key table and limit.
  attr->device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  attr->max_mw = attr->max_mr;
  if (ctx->minor >= 17) attr->device_cap_flags |= IBV_DEVICE_XRC;  // XRC domains, SRQs and QPs
  attr->phys_port_cnt = 1;
  attr->max_pkeys = 1;
  // MRs and MWs take any byte range: every power-of-two page size from 4 KiB
  // up is one uroce can map (rxe says the same).
  attr->page_size_cap = ~std::uint64_t{0xfff};
  // Multicast (minor 15): a UD QP joins groups; the daemon's default
  // --max-mcast-per-uid (64) bounds a user's attachments.
  if (ctx->minor >= 15) attr->max_mcast_grp = attr->max_mcast_qp_attach = attr->max_total_mcast_qp_attach = 64;
  return 0;
}

int uroce_mcast(uroce_qp* qp, const ibv_gid* gid, int attach) {
  if (!qp || !gid) return set_error(EINVAL, "no QP or GID");
  if (qp->ctx->minor < 15) return set_error(EOPNOTSUPP, "this uroced has no multicast");
  uroce_mcast_msg m{qp->handle, attach ? 1u : 0u, {}};
  std::memcpy(m.gid, gid->raw, 16);
  return call(qp->ctx, UROCE_MSG_MCAST, &m, sizeof m, -1, nullptr, 0);
}

int uroce_query_port(uroce_context* ctx, uint8_t port_num, ibv_port_attr* attr) {
  if (!ctx || !attr) return set_error(EINVAL, "no context or attr");
  if (port_num != 1) return set_error(EINVAL, "uroced serves one port: port_num must be 1");
  // The link as the daemon's driver reports it (minor 7); an older daemon
  // does not say: up, speed unknown.
  uroce_query_msg q{UROCE_OBJ_PORT, 0};
  uroce_port_attr pa{IBV_PORT_ACTIVE, 0, 0};
  if (call(ctx, UROCE_MSG_QUERY, &q, sizeof q, -1, &pa, sizeof pa) != 0) pa = {IBV_PORT_ACTIVE, 0, 0};
  *attr = ibv_port_attr{};
  attr->state = static_cast<ibv_port_state>(pa.state);
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = abi::roce_active_mtu(pa.mtu);  // as Linux sizes a RoCE port's
  attr->gid_tbl_len = UROCE_GID_TABLE_LEN;
  attr->pkey_tbl_len = 1;
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  attr->phys_state = pa.state == IBV_PORT_ACTIVE ? 5 : 3;  // LinkUp, or Disabled
  attr->max_msg_sz = 1u << 31;  // the largest RDMA message (IBTA: 2^31 bytes)
  attr->max_vl_num = 1;         // VL0 only
  // The Ethernet speed as IB widths and lane speeds, as Linux reports a
  // RoCE port's (ib_get_eth_speed): 1X/4X of SDR 2.5, DDR 5, FDR10 10,
  // EDR 25, HDR 50 or NDR 100 Gb/s lanes. Unknown counts as the slowest.
  struct Rate {
    std::uint32_t up_to_mbps;
    std::uint8_t width, speed;
  };
  static constexpr Rate kRates[] = {{2500, 1, 1},   {5000, 1, 2},   {10000, 1, 8},   {20000, 2, 2},
                                    {25000, 1, 32}, {40000, 2, 8},  {50000, 1, 64},  {100000, 2, 32},
                                    {200000, 2, 64}, {400000, 2, 128}};
  attr->active_width = 2;
  attr->active_speed = 128;  // beyond 400 Gb/s: NDR 4X
  for (const Rate& r : kRates)
    if (pa.speed_mbps <= r.up_to_mbps) {
      attr->active_width = r.width;
      attr->active_speed = r.speed;
      break;
    }
  return 0;
}

int uroce_query_qp(uroce_qp* qp, ibv_qp_attr* attr, int attr_mask, uroce_qp_init_attr* init_attr) {
  (void)attr_mask;  // everything is returned, as most providers do
  if (!qp || !attr) return set_error(EINVAL, "no QP or attr");
  uroce_query_msg q{UROCE_OBJ_QP, qp->handle};
  uroce_modify_qp_msg r{};
  if (int rc = call(qp->ctx, UROCE_MSG_QUERY, &q, sizeof q, -1, &r, sizeof r)) return rc;
  int mask = 0;
  *attr = abi::from_msg(r, mask);
  attr->cur_qp_state = attr->qp_state;
  attr->cap.max_send_wr = qp->init.cap.max_send_wr;
  attr->cap.max_recv_wr = qp->init.cap.max_recv_wr;
  attr->cap.max_send_sge = qp->init.cap.max_send_sge;
  attr->cap.max_recv_sge = qp->init.cap.max_recv_sge;
  attr->cap.max_inline_data = qp->init.cap.max_inline_data;
  if (init_attr) *init_attr = qp->init;
  return 0;
}

uroce_mw* uroce_alloc_mw(uroce_pd* pd, ibv_mw_type type) {
  if (!pd) return set_error(EINVAL, "no PD"), nullptr;
  uroce_alloc_mw_msg m{pd->handle, static_cast<std::uint32_t>(type)};
  uroce_alloc_mw_reply r{};
  if (call(pd->ctx, UROCE_MSG_ALLOC_MW, &m, sizeof m, -1, &r, sizeof r) != 0) return nullptr;
  return new uroce_mw{pd, r.handle, r.rkey};
}

int uroce_dealloc_mw(uroce_mw* mw) {
  if (!mw) return set_error(EINVAL, "no memory window");
  uroce_destroy_msg d{UROCE_OBJ_MW, mw->handle};
  const int rc = call(mw->pd->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) delete mw;
  return rc;
}

std::uint32_t uroce_mw_rkey(const uroce_mw* mw) { return mw->rkey; }

std::uint32_t uroce_mr_lkey(const uroce_mr* mr) { return mr->lkey; }
std::uint32_t uroce_mr_rkey(const uroce_mr* mr) { return mr->rkey; }

uroce_comp_channel* uroce_create_comp_channel(uroce_context* ctx) {
  if (!ctx) return set_error(EINVAL, "no context"), nullptr;
  // A datagram socket pair, not an eventfd: the daemon writes its end
  // with MSG_DONTWAIT, which no flag of ours can turn into a blocking write.
  // Our end stays blocking unless the application makes it non-blocking
  // (as UCX does): then uroce_get_cq_event says EAGAIN instead of waiting,
  // as rdma-core's read() on the channel does.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0)
    return set_error(errno, "cannot create the channel's socket pair"), nullptr;
  (void)::fcntl(sv[1], F_SETFL, ::fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  return new uroce_comp_channel{ctx, sv[0], sv[1], {}};
}

int uroce_destroy_comp_channel(uroce_comp_channel* ch) {
  if (!ch) return set_error(EINVAL, "no channel");
  if (!ch->cqs.empty()) return set_error(EBUSY, "CQs still use this channel");
  ::close(ch->fd);
  ::close(ch->peer);
  delete ch;
  return 0;
}

int uroce_comp_channel_fd(const uroce_comp_channel* ch) { return ch ? ch->fd : -1; }

uroce_cq* uroce_create_cq(uroce_context* ctx, int cqe, void* cq_context, uroce_comp_channel* channel,
                          int comp_vector) {
  // One daemon lcore serves the session: a single vector (num_comp_vectors 1).
  if (comp_vector != 0) return set_error(EINVAL, "comp_vector must be 0 (the device has one vector)"), nullptr;
  if (channel && channel->ctx != ctx) return set_error(EINVAL, "the channel belongs to another context"), nullptr;
  if (!ctx || cqe <= 0) return set_error(EINVAL, "cqe must be positive"), nullptr;
  uroce_create_cq_msg m{static_cast<std::uint32_t>(cqe)};
  uroce_handle_reply r{};
  int fd = -1;
  if (call(ctx, UROCE_MSG_CREATE_CQ, &m, sizeof m, channel ? channel->peer : -1, &r, sizeof r, &fd) != 0) return nullptr;
  void* map = nullptr;
  std::size_t len = 0;
  if (!map_fd(fd, map, len, "CQ ring")) return nullptr;
  auto cq = new uroce_cq{ctx, r.handle, map, len, {}};
  const auto e = uroce::abi::Ring<uroce_cq_entry>::attach(map, cq->map_len, UROCE_RING_CQ, cq->ring);
  if (e != uroce::abi::AttachError::kOk) {
    ::munmap(map, cq->map_len);
    delete cq;
    return set_error(EPROTO, uroce::abi::to_string(e)), nullptr;
  }
  cq->cq_context = cq_context;
  cq->channel = channel;
  if (channel) channel->cqs.push_back(cq);
  ctx->cqs[cq->handle] = cq;
  return cq;
}

int uroce_resize_cq(uroce_cq* cq, int cqe) {
  if (!cq || cqe <= 0) return set_error(EINVAL, "cqe must be positive");
  uroce_resize_cq_msg m{cq->handle, static_cast<std::uint32_t>(cqe)};
  uroce_handle_reply r{};
  int fd = -1;
  if (const int rc = call(cq->ctx, UROCE_MSG_RESIZE_CQ, &m, sizeof m, -1, &r, sizeof r, &fd)) return rc;
  // The daemon now fills the new ring, which holds what the old one had not
  // given out yet; the old one is only unmapped.
  void* map = nullptr;
  std::size_t len = 0;
  if (!map_fd(fd, map, len, "CQ ring")) return errno;
  uroce::abi::Ring<uroce_cq_entry> ring;
  const auto e = uroce::abi::Ring<uroce_cq_entry>::attach(map, len, UROCE_RING_CQ, ring);
  if (e != uroce::abi::AttachError::kOk) {
    ::munmap(map, len);
    return set_error(EPROTO, uroce::abi::to_string(e));
  }
  ::munmap(cq->map, cq->map_len);
  cq->map = map;
  cq->map_len = len;
  cq->ring = ring;
  return 0;
}

int uroce_cq_capacity(const uroce_cq* cq) { return cq ? static_cast<int>(cq->ring.capacity()) : 0; }

int uroce_req_notify_cq(uroce_cq* cq, int solicited_only) {
  (void)solicited_only;  // notified on the next completion of any kind (a superset, as verbs allows)
  if (!cq || !cq->channel) return set_error(EINVAL, "the CQ has no completion channel");
  cq->ring.arm_notify();
  return 0;
}

int uroce_get_cq_event(uroce_comp_channel* ch, uroce_cq** cq, void** cq_context) {
  if (!ch || !cq) return set_error(EINVAL, "no channel");
  for (;;) {
    // Drain the socket first: the daemon moves a CQ's notification count
    // before it writes, so the scan below sees everything drained here.
    (void)abi::drain(ch->fd);
    uroce_cq* hit = nullptr;
    bool more = false;
    for (uroce_cq* c : ch->cqs) {
      if (c->ring.notified() == c->events_seen) continue;
      if (hit) {
        more = true;
        break;
      }
      hit = c;
    }
    if (hit) {
      hit->events_seen = hit->ring.notified();
      *cq = hit;
      if (cq_context) *cq_context = hit->cq_context;
      if (more) (void)abi::ring(ch->peer);  // keep the fd readable for the next one
      return 0;
    }
    if (::fcntl(ch->fd, F_GETFL) & O_NONBLOCK) return set_error(EAGAIN, "no completion event (non-blocking channel)");
    // Block in a read, as rdma-core does (a read() of the channel): a
    // signal then ends the wait with EINTR unless its handler restarts
    // system calls (SA_RESTART), exactly as there. qperf's server ends its
    // test on SIGALRM so.
    char b;
    if (::recv(ch->fd, &b, 1, MSG_PEEK) < 0) return set_error(errno, "cannot wait on the completion channel");
  }
}

void uroce_ack_cq_events(uroce_cq* cq, unsigned int nevents) {
  (void)cq;  // events hold no reference here; kept for verbs compatibility
  (void)nevents;
}

uroce_qp* uroce_create_qp(uroce_pd* pd, uroce_qp_init_attr* a) {
  if (!a) return set_error(EINVAL, "no attributes"), nullptr;
  const bool xrc = a->qp_type == IBV_QPT_XRC_SEND || a->qp_type == IBV_QPT_XRC_RECV;
  uroce_context* const ctx = pd ? pd->ctx : a->xrcd ? a->xrcd->ctx : nullptr;
  if (xrc && ctx && ctx->minor < 17) return set_error(EOPNOTSUPP, "this uroced has no XRC (ABI minor < 17)"), nullptr;
  const bool rss = a->rss_log_size != 0;
  if (rss) {
    // Receive-side scaling: a PD and a table of work queues; nothing else.
    if (!pd || a->qp_type != IBV_QPT_RAW_PACKET || a->srq || a->xrcd || !a->rss_wqs || !a->rss_key ||
        a->rss_log_size > UROCE_RSS_MAX_LOG)
      return set_error(EINVAL, "an RSS QP is a raw packet QP with a PD, a key and 2 to 64 work queues"), nullptr;
    for (std::uint32_t i = 0; i < (1u << a->rss_log_size); ++i)
      if (!a->rss_wqs[i]) return set_error(EINVAL, "an RSS table names a work queue in every entry"), nullptr;
    if (ctx->minor < 18) return set_error(EOPNOTSUPP, "this uroced has no RSS (ABI minor < 18)"), nullptr;
  } else if (a->qp_type == IBV_QPT_XRC_RECV) {
    // The target: a domain, and nothing else of its own.
    if (!a->xrcd || a->srq) return set_error(EINVAL, "an XRC target QP needs an XRC domain, and no SRQ"), nullptr;
  } else if (a->qp_type == IBV_QPT_XRC_SEND) {
    if (!pd || !a->send_cq || a->srq || a->xrcd) return set_error(EINVAL, "an XRC send QP needs a PD and a send CQ"), nullptr;
  } else if (!pd || !a->send_cq || !a->recv_cq || a->xrcd) {
    return set_error(EINVAL, "PD and both CQs are required"), nullptr;
  }
  if (a->cap.max_send_sge > UROCE_ABI_MAX_SGE || a->cap.max_recv_sge > UROCE_ABI_MAX_SGE)
    return set_error(EINVAL, "at most 4 SGEs"), nullptr;
  if (a->cap.max_inline_data > UROCE_ABI_MAX_INLINE) return set_error(EINVAL, "max_inline_data is at most 64"), nullptr;
  if (a->qp_type == IBV_QPT_RAW_PACKET && ctx->minor < 16)
    return set_error(EOPNOTSUPP, "this uroced has no raw packet QPs (ABI minor < 16)"), nullptr;
  a->cap.max_inline_data = UROCE_ABI_MAX_INLINE;
  if (xrc) a->cap.max_recv_wr = a->cap.max_recv_sge = 0;  // no receive queue: XRC receives are the SRQs'
  if (a->qp_type == IBV_QPT_XRC_RECV || rss) a->cap = {};
  uroce_create_qp_msg m{pd && a->qp_type != IBV_QPT_XRC_RECV ? pd->handle : 0,
                        a->send_cq && a->qp_type != IBV_QPT_XRC_RECV ? a->send_cq->handle : 0,
                        a->recv_cq && !xrc ? a->recv_cq->handle : 0,
                        static_cast<std::uint32_t>(a->qp_type),
                        a->cap.max_send_wr,
                        a->srq ? 1 : a->cap.max_recv_wr,
                        static_cast<std::uint32_t>(a->sq_sig_all),
                        a->srq ? a->srq->handle : 0,
                        a->qp_type == IBV_QPT_XRC_RECV ? a->xrcd->handle : 0};
  if (rss) {
    m.rss_log_size = a->rss_log_size;
    m.rss_fields = static_cast<std::uint32_t>(a->rss_fields);
    if (m.rss_fields != a->rss_fields) return set_error(EOPNOTSUPP, "RSS hashes IPv4, IPv6, TCP and UDP fields only"), nullptr;
    std::memcpy(m.rss_key, a->rss_key, sizeof m.rss_key);
    for (std::uint32_t i = 0; i < (1u << a->rss_log_size); ++i) m.rss_wq[i] = a->rss_wqs[i]->handle;
  }
  // A daemon before minor 17 reads 32 bytes (it has no XRC, refused above);
  // the RSS fields go only for an RSS QP.
  const std::uint32_t mlen = ctx->minor < 17 ? offsetof(uroce_create_qp_msg, xrcd)
                             : rss           ? sizeof m
                                             : offsetof(uroce_create_qp_msg, rss_log_size);
  uroce_create_qp_reply r{};
  int fd = -1;
  if (call(ctx, UROCE_MSG_CREATE_QP, &m, mlen, -1, &r, sizeof r, &fd) != 0) return nullptr;
  void* map = nullptr;
  std::size_t len = 0;
  if (!map_fd(fd, map, len, "QP rings")) return nullptr;
  auto qp = new uroce_qp{ctx, r.handle, r.qpn, map, len, {}, {}, *a};
  using uroce::abi::AttachError;
  if (uroce::abi::Ring<uroce_send_entry>::attach(map, r.rq_offset, UROCE_RING_SEND, qp->sq) != AttachError::kOk ||
      uroce::abi::Ring<uroce_recv_entry>::attach(static_cast<std::uint8_t*>(map) + r.rq_offset,
                                                 static_cast<std::size_t>(len) - r.rq_offset, UROCE_RING_RECV,
                                                 qp->rq) != AttachError::kOk) {
    ::munmap(map, qp->map_len);
    delete qp;
    return set_error(EPROTO, "bad QP rings from uroced"), nullptr;
  }
  // The queues' real depths, as ibv_create_qp reports them (at least what
  // was asked: a power of two, and 1 for a queue asked with 0): a post past
  // them fails with ENOMEM exactly there.
  if (a->qp_type != IBV_QPT_XRC_RECV && !rss) a->cap.max_send_wr = qp->sq.capacity();
  if (!a->srq && !xrc && !rss) a->cap.max_recv_wr = qp->rq.capacity();
  qp->init.cap = a->cap;
  qp->init.rss_wqs = nullptr;  // the caller's: kept only for this call
  qp->init.rss_key = nullptr;
  ctx->qps[qp->handle] = qp;
  return qp;
}

std::uint32_t uroce_qp_num(const uroce_qp* qp) { return qp->qpn; }

int uroce_create_flow(uroce_qp* qp, std::uint32_t priority, const uroce_flow_key* value, const uroce_flow_key* mask,
                      std::uint32_t* handle) {
  if (!qp || !value || !mask || !handle) return set_error(EINVAL, "no QP, key or handle");
  if (qp->ctx->minor < 16) return set_error(EOPNOTSUPP, "this uroced has no flow rules (ABI minor < 16)");
  uroce_flow_msg m{qp->handle, priority, *value, *mask};
  uroce_handle_reply r{};
  if (const int rc = call(qp->ctx, UROCE_MSG_CREATE_FLOW, &m, sizeof m, -1, &r, sizeof r)) return rc;
  *handle = r.handle;
  return 0;
}

int uroce_destroy_flow(uroce_context* ctx, std::uint32_t handle) {
  if (!ctx) return set_error(EINVAL, "no context");
  uroce_destroy_msg d{UROCE_OBJ_FLOW, handle};
  return call(ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
}

ibv_ah* uroce_create_ah(uroce_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) return set_error(EINVAL, "no PD or attributes"), nullptr;
  if (!attr->is_global) return set_error(EINVAL, "RoCE needs a global address (ah_attr.is_global)"), nullptr;
  if (attr->port_num != 1) return set_error(EINVAL, "port_num must be 1"), nullptr;
  uroce_resolve_msg m{};
  std::memcpy(m.dgid, attr->grh.dgid.raw, 16);
  uroce_resolve_reply r{};
  if (call(pd->ctx, UROCE_MSG_RESOLVE, &m, sizeof m, -1, &r, sizeof r) != 0) return nullptr;
  auto* ah = new uroce_ah;
  std::memcpy(ah->dgid, attr->grh.dgid.raw, 16);
  std::memcpy(ah->dmac, r.mac, 6);
  ah->traffic_class = attr->grh.traffic_class;
  return &ah->ah;
}

int uroce_destroy_ah(ibv_ah* ibv) {
  auto* ah = reinterpret_cast<uroce_ah*>(ibv);
  if (!ah || ah->magic != uroce_ah::kAhMagic) return set_error(EINVAL, "not an address handle");
  ah->magic = 0;
  delete ah;
  return 0;
}

int uroce_modify_qp(uroce_qp* qp, ibv_qp_attr* a, int mask) {
  if (!qp || !a) return set_error(EINVAL, "no QP or attributes");
  // RoCE addresses by GID only: an address vector without a GRH is refused
  // here, as the kernel refuses it on a RoCE port (the message carries the
  // GID alone, and would be taken as a GID of zeros).
  if ((mask & IBV_QP_AV) && !a->ah_attr.is_global)
    return set_error(EINVAL, "RoCE needs a global address (ah_attr.is_global with the peer's GID)");
  const uroce_modify_qp_msg m = abi::to_msg(*a, mask, qp->handle);
  const int rc = call(qp->ctx, UROCE_MSG_MODIFY_QP, &m, sizeof m, -1, nullptr, 0);
  if (rc == 0 && (mask & IBV_QP_STATE) && a->qp_state == IBV_QPS_RESET) {
    // A QP made new forgets its past: completions of its own that its CQs
    // still hold (the flushes of its last error, say) are not handed out,
    // as ConnectX's provider cleans them from its CQs at this transition.
    // The daemon made every one of them before it answered.
    for (uroce_cq* cq : {qp->init.send_cq, qp->init.recv_cq})
      if (cq)
        cq->ring.edit_pending([qpn = qp->qpn](uroce_cq_entry& e) {
          if (e.qp_num == qpn) e.opcode = kDiscardedCompletion;
        });
  }
  return rc;
}

namespace {
int set_qp_opt(uroce_qp* qp, std::uint32_t opt, std::uint32_t value, const char* name) {
  if (!qp) return set_error(EINVAL, "no QP");
  if (qp->ctx->minor < 10) return set_error(ENOTSUP, "the daemon predates uroce's QP attributes (ABI minor 10)");
  uroce_qp_opt_msg m{};
  m.qp = qp->handle;
  m.opt = opt;
  m.value = value;
  if (name) {
    if (std::strlen(name) >= sizeof m.name) return set_error(EINVAL, "congestion control name too long");
    std::memcpy(m.name, name, std::strlen(name));
  }
  return call(qp->ctx, UROCE_MSG_SET_QP_OPT, &m, sizeof m, -1, nullptr, 0);
}
}  // namespace

int uroce_qp_set_cc(uroce_qp* qp, const char* name) {
  if (!name) return set_error(EINVAL, "no congestion control name");
  return set_qp_opt(qp, UROCE_QP_OPT_CC, 0, name);
}

int uroce_qp_set_selective_repeat(uroce_qp* qp, int on) {
  return set_qp_opt(qp, UROCE_QP_OPT_SR, on ? 1 : 0, nullptr);
}

int uroce_connect_qp(uroce_qp* qp, const uroce_rc_conn* c) {
  if (!qp || !c) return set_error(EINVAL, "connect_qp: no QP or no connection parameters");
  const auto pick = [](std::uint8_t v, std::uint8_t dflt) { return v != 0 ? v : dflt; };
  abi::Connect k;
  k.type = qp->init.qp_type;
  k.dest_qp_num = c->dest_qp_num;
  k.dgid = c->dgid;
  k.rq_psn = c->rq_psn;
  k.sq_psn = c->sq_psn;
  k.path_mtu = c->path_mtu != 0 ? c->path_mtu : IBV_MTU_1024;
  k.access = static_cast<unsigned>(c->access);
  k.timeout = pick(c->timeout, 14);
  k.retry_cnt = pick(c->retry_cnt, 7);
  k.rnr_retry = pick(c->rnr_retry, 7);
  k.min_rnr_timer = pick(c->min_rnr_timer, 12);
  k.max_rd_atomic = pick(c->max_rd_atomic, 4);
  k.max_dest_rd_atomic = pick(c->max_dest_rd_atomic, k.max_rd_atomic);
  return abi::bring_up(k, [&](const ibv_qp_attr& a, int mask) {
    ibv_qp_attr copy = a;
    return uroce_modify_qp(qp, &copy, mask);
  });
}

int uroce_destroy_qp(uroce_qp* qp) {
  if (!qp) return EINVAL;
  uroce_destroy_msg d{UROCE_OBJ_QP, qp->handle};
  const int rc = call(qp->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) {
    qp->ctx->qps.erase(qp->handle);
    ::munmap(qp->map, qp->map_len);
    delete qp;
  }
  return rc;
}

int uroce_post_send(uroce_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  if ((qp->init.qp_type == IBV_QPT_XRC_RECV || qp->init.rss_log_size) && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "an XRC target QP or an RSS QP has no send queue");
  }
  // The daemon publishes the QP's state; before RTS a send is refused here,
  // as rxe refuses it (in ERR it is taken, and flushed).
  if (const int st = qp->sq.qp_state(); st >= 0 && st < IBV_QPS_RTS && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "the QP is not ready to send (not in RTS)");
  }
  const abi::SendTarget to{qp->init.qp_type == IBV_QPT_UD, qp->init.qp_type == IBV_QPT_XRC_SEND};
  for (; wr; wr = wr->next) {
    abi::SendAv av;
    if (to.ud) {
      // The address vector, from the AH (the entry carries it: uroce_abi.h's op.ud).
      const auto* ah = reinterpret_cast<const uroce_ah*>(wr->wr.ud.ah);
      if (ah != nullptr && ah->magic == uroce_ah::kAhMagic) av = {ah->dgid, ah->dmac, ah->traffic_class};
    }
    uroce_send_entry e;
    if (const char* why = abi::encode_send(*wr, to, &av, e)) {
      if (bad) *bad = wr;
      qp->ctx->posted(qp->sq.header(), qp->qpn);  // what was posted before this one
      return set_error(EINVAL, why);
    }
    if (!qp->sq.push(e)) {
      if (bad) *bad = wr;
      qp->ctx->posted(qp->sq.header(), qp->qpn);  // what was posted before this one
      return set_error(ENOMEM, "send queue full");
    }
  }
  qp->ctx->posted(qp->sq.header(), qp->qpn);
  return 0;
}

int uroce_post_recv(uroce_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if ((qp->init.qp_type == IBV_QPT_XRC_SEND || qp->init.qp_type == IBV_QPT_XRC_RECV) && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "an XRC QP has no receive queue (its receives are the XRC SRQs')");
  }
  if (qp->init.srq) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "this QP receives from an SRQ: use uroce_post_srq_recv");
  }
  if (qp->init.rss_log_size && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "an RSS QP receives into its work queues: post to them");
  }
  if (qp->sq.qp_state() == IBV_QPS_RESET && wr) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "the QP is in RESET: receives are taken from INIT on");
  }
  // max_recv_sge as created bounds each receive (EINVAL past it, as rxe);
  // a QP created with 0 takes up to the ABI's 4 (liburoce's own callers
  // often leave it unset).
  const std::uint32_t max_sge = qp->init.cap.max_recv_sge ? qp->init.cap.max_recv_sge : UROCE_ABI_MAX_SGE;
  const int rc = push_recvs(qp->rq, wr, bad, static_cast<int>(max_sge));
  qp->ctx->posted_recv(&qp->sq, qp->qpn);
  return rc;
}

uroce_srq* uroce_create_srq(uroce_pd* pd, ibv_srq_init_attr* a) { return uroce_create_xrc_srq(pd, nullptr, nullptr, a); }

namespace {
uroce_srq* create_srq(uroce_pd* pd, uroce_xrcd* xrcd, uroce_cq* cq, ibv_srq_init_attr* a, std::uint32_t tm_tags,
                      std::uint32_t tm_ops);
}  // namespace

uroce_srq* uroce_create_xrc_srq(uroce_pd* pd, uroce_xrcd* xrcd, uroce_cq* cq, ibv_srq_init_attr* a) {
  return create_srq(pd, xrcd, cq, a, 0, 0);
}

uroce_srq* uroce_create_tm_srq(uroce_pd* pd, uroce_cq* cq, ibv_srq_init_attr* a, uint32_t max_tags, uint32_t max_ops) {
  if (!pd || !cq || !a) return set_error(EINVAL, "a tag-matching SRQ needs a PD, a CQ and attributes"), nullptr;
  if (pd->ctx->minor < 19) return set_error(EOPNOTSUPP, "this uroced has no tag matching (ABI minor < 19)"), nullptr;
  if (max_tags == 0 || max_tags > UROCE_TM_MAX_TAGS || max_ops == 0 || max_ops > UROCE_TM_MAX_OPS)
    return set_error(EINVAL, "tags 1..64 and operations 1..64"), nullptr;
  return create_srq(pd, nullptr, cq, a, max_tags, max_ops);
}

int uroce_post_srq_ops(uroce_srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad) {
  if (!srq || !srq->released) {
    if (bad) *bad = wr;
    return set_error(EINVAL, "not a tag-matching SRQ");
  }
  int rc = 0;
  for (; wr; wr = wr->next) {
    uroce_tm_op op{};
    op.wr_id = wr->wr_id;
    op.opcode = static_cast<std::uint8_t>(wr->opcode);
    op.flags = static_cast<std::uint8_t>(wr->flags);
    op.unexpected_cnt = wr->tm.unexpected_cnt;
    const bool known_flags = (wr->flags & ~(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC)) == 0;
    if (!known_flags || (wr->opcode != IBV_WR_TAG_ADD && wr->opcode != IBV_WR_TAG_DEL && wr->opcode != IBV_WR_TAG_SYNC)) {
      rc = set_error(EINVAL, "an unknown operation or flag");
      break;
    }
    if (wr->opcode == IBV_WR_TAG_ADD) {
      if (wr->tm.add.num_sge < 0 || wr->tm.add.num_sge > UROCE_TM_MAX_SGE ||
          (wr->tm.add.num_sge > 0 && !wr->tm.add.sg_list)) {
        rc = set_error(EINVAL, "a tag takes at most one SGE");
        break;
      }
      // A free index: the daemon has released its last use.
      std::uint32_t i = 0;
      const auto n = static_cast<std::uint32_t>(srq->gen.size());
      while (i < n && std::atomic_ref<const std::uint32_t>(srq->released[i]).load(std::memory_order_acquire) != srq->gen[i])
        ++i;
      if (i == n) {
        rc = set_error(ENOMEM, "every tag is in use");
        break;
      }
      op.handle = i;
      op.gen = srq->gen[i] + 1;
      op.tag = wr->tm.add.tag;
      op.mask = wr->tm.add.mask;
      op.recv_wr_id = wr->tm.add.recv_wr_id;
      op.num_sge = static_cast<std::uint8_t>(wr->tm.add.num_sge);
      if (op.num_sge)
        op.sge = {wr->tm.add.sg_list[0].addr, wr->tm.add.sg_list[0].length, wr->tm.add.sg_list[0].lkey};
      if (!srq->ops.push(op)) {
        rc = set_error(ENOMEM, "the operations queue is full");
        break;
      }
      srq->gen[i] = op.gen;
      wr->tm.handle = i;
      continue;
    }
    if (wr->opcode == IBV_WR_TAG_DEL) {
      if (wr->tm.handle >= srq->gen.size()) {
        rc = set_error(EINVAL, "no such tag");
        break;
      }
      op.handle = wr->tm.handle;
      op.gen = srq->gen[wr->tm.handle];
    }
    if (!srq->ops.push(op)) {
      rc = set_error(ENOMEM, "the operations queue is full");
      break;
    }
  }
  if (rc && bad) *bad = wr;
  srq->ctx->posted(srq->ops.header(), UROCE_WORK_TM_SRQ | srq->handle);
  return rc;
}

namespace {
uroce_srq* create_srq(uroce_pd* pd, uroce_xrcd* xrcd, uroce_cq* cq, ibv_srq_init_attr* a, std::uint32_t tm_tags,
                      std::uint32_t tm_ops) {
  if (!pd || !a) return set_error(EINVAL, "no PD or attributes"), nullptr;
  if (a->attr.srq_limit != 0) return set_error(EINVAL, "srq_limit (the low-watermark event) is not supported"), nullptr;
  if (xrcd && !cq) return set_error(EINVAL, "an XRC SRQ needs an XRC domain and a CQ"), nullptr;
  if (xrcd && pd->ctx->minor < 17) return set_error(EOPNOTSUPP, "this uroced has no XRC (ABI minor < 17)"), nullptr;
  if (cq && !xrcd && !tm_tags && pd->ctx->minor < 18)
    return set_error(EOPNOTSUPP, "this uroced has no work queues (ABI minor < 18)"), nullptr;
  uroce_create_srq_msg m{pd->handle, a->attr.max_wr, a->attr.max_sge, xrcd ? xrcd->handle : 0,
                         cq ? cq->handle : 0,   tm_tags,           tm_ops};
  // A daemon before minor 17 reads 12 bytes and answers the handle alone;
  // one before 19 reads 20.
  const bool old = pd->ctx->minor < 17;
  const std::size_t mlen = old ? offsetof(uroce_create_srq_msg, xrcd)
                           : pd->ctx->minor < 19 ? offsetof(uroce_create_srq_msg, tm_max_tags)
                                                 : sizeof m;
  uroce_create_srq_reply r{};
  int fd = -1;
  if (call(pd->ctx, UROCE_MSG_CREATE_SRQ, &m, mlen, -1, &r, old ? sizeof(uroce_handle_reply) : sizeof r, &fd) != 0)
    return nullptr;
  void* map = nullptr;
  std::size_t len = 0;
  if (!map_fd(fd, map, len, "SRQ ring")) return nullptr;
  auto srq = new uroce_srq{pd->ctx, r.handle, map, len, {}, r.srq_num};
  const std::uint32_t entries = std::bit_ceil(a->attr.max_wr);
  const std::uint32_t ops = tm_tags ? std::bit_ceil(tm_ops) : 0;
  const std::size_t ring_len = tm_tags ? uroce_ring_bytes(entries, sizeof(uroce_recv_entry)) : len;
  bool ok = len >= (tm_tags ? uroce_tm_srq_bytes(entries, ops, tm_tags) : ring_len) &&
            uroce::abi::Ring<uroce_recv_entry>::attach(map, ring_len, UROCE_RING_SRQ, srq->ring) ==
                uroce::abi::AttachError::kOk;
  if (ok && tm_tags) {
    auto* base = static_cast<std::uint8_t*>(map);
    ok = uroce::abi::Ring<uroce_tm_op>::attach(base + uroce_tm_ops_offset(entries),
                                               uroce_ring_bytes(ops, sizeof(uroce_tm_op)), UROCE_RING_TM_OPS,
                                               srq->ops) == uroce::abi::AttachError::kOk;
    srq->released = reinterpret_cast<const std::uint32_t*>(base + uroce_tm_released_offset(entries, ops));
    srq->gen.assign(tm_tags, 0);
  }
  if (!ok) {
    ::munmap(map, len);
    delete srq;
    return set_error(EPROTO, "bad SRQ ring from uroced"), nullptr;
  }
  a->attr.max_wr = srq->ring.capacity();
  return srq;
}
}  // namespace

std::uint32_t uroce_srq_num(const uroce_srq* srq) { return srq ? srq->srq_num : 0; }
std::uint32_t uroce_srq_handle(const uroce_srq* srq) { return srq ? srq->handle : 0; }

uroce_srq* uroce_create_wq(uroce_pd* pd, uroce_cq* cq, ibv_srq_init_attr* a) {
  if (!cq) return set_error(EINVAL, "a work queue needs a CQ"), nullptr;
  return uroce_create_xrc_srq(pd, nullptr, cq, a);
}

uroce_xrcd* uroce_open_xrcd(uroce_context* ctx, int fd, int oflags) {
  if (!ctx) return set_error(EINVAL, "no context"), nullptr;
  if (ctx->minor < 17) return set_error(EOPNOTSUPP, "this uroced has no XRC (ABI minor < 17)"), nullptr;
  uroce_open_xrcd_msg m{oflags, fd >= 0 ? 1u : 0u};
  uroce_handle_reply r{};
  if (call(ctx, UROCE_MSG_OPEN_XRCD, &m, sizeof m, fd, &r, sizeof r) != 0) return nullptr;
  return new uroce_xrcd{ctx, r.handle};
}

int uroce_close_xrcd(uroce_xrcd* xrcd) {
  if (!xrcd) return set_error(EINVAL, "no XRC domain");
  uroce_destroy_msg d{UROCE_OBJ_XRCD, xrcd->handle};
  const int rc = call(xrcd->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) delete xrcd;
  return rc;
}

int uroce_destroy_srq(uroce_srq* srq) {
  if (!srq) return set_error(EINVAL, "no SRQ");
  uroce_destroy_msg d{UROCE_OBJ_SRQ, srq->handle};
  const int rc = call(srq->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) {
    ::munmap(srq->map, srq->map_len);
    delete srq;
  }
  return rc;
}

int uroce_post_srq_recv(uroce_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  const int rc = push_recvs(srq->ring, wr, bad, UROCE_ABI_MAX_SGE);
  srq->ctx->posted_recv(nullptr, 0);  // an SRQ's receives are read as requests come
  return rc;
}

int uroce_poll_cq_wait(uroce_cq* cq, int num, ibv_wc* wc, int spin_us, int timeout_ms) {
  if (!cq || num <= 0 || !wc) return errno = EINVAL, -1;
  int n = uroce_poll_cq(cq, num, wc);
  if (n > 0 || timeout_ms == 0) return n;
  using clk = std::chrono::steady_clock;
  const auto start = clk::now();
  // What came, after how long: the CQ's polling window learns from it.
  const auto got = [&](int k) {
    cq->spin.gap(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - start).count()));
    return k;
  };
  if (spin_us > 0) {
    // Poll for the window (abi/spin.h), giving the core away between empty
    // polls: the daemon, or the peer, that makes the completion may need it.
    const auto until = start + std::chrono::nanoseconds(cq->spin.window_ns(std::uint64_t(spin_us) * 1000));
    do {
      if ((n = uroce_poll_cq(cq, num, wc)) > 0) return got(n);
      (void)::sched_yield();  // the core to whoever makes the completion (abi/spin.h)
    } while (clk::now() < until);
  }
  if (!cq->channel) {
    set_error(EINVAL, "the CQ has no completion channel to block on");
    return -1;
  }
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    // Arm, then look once more: a completion pushed before the daemon saw
    // the arm is found here, one after it makes the channel readable.
    cq->ring.arm_notify();
    if ((n = uroce_poll_cq(cq, num, wc)) > 0) return got(n);
    int wait_ms = -1;
    if (timeout_ms > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clk::now()).count();
      if (left <= 0) return 0;
      wait_ms = static_cast<int>(left) + 1;
    }
    if (wait_fd(cq->channel->fd, wait_ms) < 0) {
      set_error(errno, "cannot wait on the completion channel");
      return -1;
    }
    // Empty the channel (another CQ's notification may be drained with it:
    // a spurious wake-up for uroce_get_cq_event, which verbs allows).
    (void)abi::drain(cq->channel->fd);
    if ((n = uroce_poll_cq(cq, num, wc)) > 0) return got(n);
  }
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
namespace {
/// uroce_poll_cq, uroce_poll_cq_ts and uroce_poll_cq_ex: with kTs, each
/// entry's timestamp too; with kEx, its timestamp and tag.
template <bool kTs, bool kEx = false>
int poll_entries(uroce_cq* cq, int num, ibv_wc* wc, std::uint64_t* ts, uroce_wc_extra* ex = nullptr) {
  int n = 0;
  uroce_cq_entry e;
  const auto take = [&] {
    while (n < num && cq->ring.pop(e)) {
      if (e.opcode == kDiscardedCompletion) continue;  // its QP was reset since (uroce_modify_qp)
      if constexpr (kTs) ts[n] = e.timestamp;
      if constexpr (kEx) {
        const bool tm = e.opcode >= IBV_WC_TM_ADD && e.opcode <= IBV_WC_TM_NO_TAG && e.status == IBV_WC_SUCCESS;
        ex[n] = {e.timestamp, tm ? (std::uint64_t{e.tag_hi} << 32 | e.src_qp) : 0, tm ? e.vendor_err : 0, 0};
      }
      wc[n++] = abi::to_wc(e);
    }
  };
  take();
  // Embedded mode: nothing yet, or posts waiting for a pass
  // (embedded_posted), so turn the loop once and look again.
  if ((n == 0 || embedded_deferred()) && embedded_progress() > 0) take();
  return n;
}
}  // namespace
extern "C" {

int uroce_poll_cq_ts(uroce_cq* cq, int num, ibv_wc* wc, std::uint64_t* ts) { return poll_entries<true>(cq, num, wc, ts); }
int uroce_poll_cq_ex(uroce_cq* cq, int num, ibv_wc* wc, uroce_wc_extra* ex) {
  return poll_entries<false, true>(cq, num, wc, nullptr, ex);
}

int uroce_completion_timestamps(const uroce_context* ctx) { return ctx && ctx->minor >= 13 ? 1 : 0; }

int uroce_odp(const uroce_context* ctx) { return ctx && (ctx->dev_flags & UROCE_DEVICE_ODP) ? 1 : 0; }
int uroce_abi_minor(const uroce_context* ctx) { return ctx ? ctx->minor : 0; }

int uroce_poll_cq(uroce_cq* cq, int num, ibv_wc* wc) { return poll_entries<false>(cq, num, wc, nullptr); }

int uroce_wait_fd(int fd, int timeout_ms) {
  const int r = wait_fd(fd, timeout_ms);
  if (r < 0) set_error(errno, "cannot wait on the descriptor");
  return r;
}

int uroce_progress(uroce_context* ctx) {
  (void)ctx;  // progress is the process's: one embedded node serves every context
  return static_cast<int>(embedded_progress());
}

}  // extern "C"
