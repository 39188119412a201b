// liburoce's internals, shared by its files (README.md lists them): the
// objects behind the API's handles, the embedded node's state that the
// data path reads inline, and the helpers more than one file calls.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "stack/abi/doorbell.h"
#include "stack/abi/ring.h"
#include "stack/abi/spin.h"
#include "stack/abi/work_ring.h"
#include "stack/verbs/embedded.h"
#include "stack/verbs/uroce_verbs.h"

namespace uroce::verbs_detail {
/// Records why a call failed (uroce_last_error) and sets errno; returns
/// err (liburoce_session.cc; oob.cc calls it too). Unlike the rest of this
/// header it is exported: liburoce.so always has, and its exported
/// symbols do not change with how its sources are laid out.
int set_error(int err, std::string why);
}  // namespace uroce::verbs_detail

// The rest is liburoce's own, so it is hidden: liburoce.so does not export
// it, and calls to it go straight to it, not through the PLT.
#pragma GCC visibility push(hidden)
namespace uroce::verbs_detail {

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
/// The process's one node (liburoce_embedded.cc).
extern EmbeddedNode g_emb;

/// Under manual progress, every kPostBatch-th post turns the node's loop;
/// the posts between wait for it, or for the next poll, wait or
/// uroce_progress. A pass per post cost about 4,600 instructions of
/// pipeline (a receive burst, the intake, timers, a transmit burst of one
/// frame) against about 1,000 for the message itself. Larger batches hold
/// the first posts of a burst back longer: with perftest's defaults (128
/// outstanding, a completion every 100) 16 gave 3.1 M 64-byte WRITEs a
/// second over memif, 8 gave 2.6 M, 32 gave 1.3 M, one pass a post 0.9 M.
constexpr std::uint32_t kPostBatch = 16;

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

// liburoce_embedded.cc:

/// Waits for `fd` to be readable (1), `timeout_ms` to pass (0; -1 without
/// end) or an error (-1, errno). With an embedded node the wait turns its
/// loop (nothing else would); otherwise it is poll(2).
int wait_fd(int fd, int timeout_ms);

/// Starts the embedded node (or shares the one running with the same
/// options) and gives the session socket to attach to; false and why.
bool embedded_attach(const std::string& options, std::string& sock, std::string& why);

/// The options of embedded mode from a device path ("embedded:OPTIONS"), or
/// from $UROCE_EMBEDDED, which makes every open this process makes embedded.
bool embedded_spec(const char* path, std::string& options);

// liburoce_session.cc:

/// One request and its reply. `fds_out[0..nfds_out)` go with the request;
/// descriptors in the reply land in fd_in[0..nfd_in), in order (the rest
/// are closed).
int call_fds(uroce_context* ctx, std::uint16_t type, const void* body, std::uint32_t blen, const int* fds_out,
             std::size_t nfds_out, void* reply, std::size_t rlen, int* fd_in = nullptr, std::size_t nfd_in = 1);

/// The same with at most one descriptor (`fd_out`, -1 for none).
int call(uroce_context* ctx, std::uint16_t type, const void* body, std::uint32_t blen, int fd_out, void* reply,
         std::size_t rlen, int* fd_in = nullptr, std::size_t nfd_in = 1);

// liburoce_memory.cc:

/// Drops the pins of an MR's (or a context's buffers') segments.
void unpin(const std::vector<std::uintptr_t>& segs);

}  // namespace uroce::verbs_detail
#pragma GCC visibility pop

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
      if (page && queue) (void)uroce::abi::queue_work(page, queue, what);
      (void)uroce::abi::notify(page, bell);
    } else {
      (void)uroce::abi::bump_posts(page, bell);
    }
    uroce::verbs_detail::embedded_posted();
  }
  /// After publishing receives: a daemon of minor 20 or later needs no name
  /// (the responder reads receive queues as requests come) unless the QP
  /// is in ERR, where the new receives are to be flushed. `queue` is the
  /// QP's send ring header, whose state is the QP's.
  void posted_recv(const uroce::abi::Ring<uroce_send_entry>* sq, std::uint32_t qpn) const {
    if (minor < 20) {
      (void)uroce::abi::bump_posts(page, bell);
      uroce::verbs_detail::embedded_posted();
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
