// liburoce's embedded mode: loading the plugin (embedded.h), starting the
// process's one node and stopping it at exit, the wait that turns it, and
// the progress thread for programs that block outside liburoce.
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "stack/verbs/liburoce_internal.h"

namespace {
using uroce::verbs_detail::g_emb;
using uroce::verbs_detail::wait_fd;

/// Whether this process's libibverbs.so.1 is uroce's drop-in (it exports
/// uroce_ibv_context; rdma-core's does not).
bool under_dropin() { return ::dlsym(RTLD_DEFAULT, "uroce_ibv_context") != nullptr; }

/// Loads the embedded-mode plugin. When this process's libibverbs.so.1 is
/// uroce's drop-in (stack/ibverbs, put first by uroce-run), DPDK's EAL
/// would bind the mlx4 and mlx5 drivers it loads with every plugin to it,
/// and fail on rdma-core's private symbols. The plugin then goes into a
/// link-map namespace of its own (dlmopen), where rdma-core's own
/// libibverbs, libmlx5 and libmlx4 are loaded first by path, from the
/// folder of the system's C library or $UROCE_SYSTEM_LIB_DIR: the drivers
/// bind to those, and the application keeps uroce's.
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

}  // namespace

namespace uroce::verbs_detail {

EmbeddedNode g_emb;

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

}  // namespace uroce::verbs_detail
