// The embedded-mode plugin: a node (control/node) inside the application,
// behind the table of stack/verbs/embedded.h. Its session socket is private
// (a fresh 0700 directory) unless the options name one with --app-socket.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "control/node/node.h"
#include "control/node/options.h"
#include "stack/verbs/embedded.h"

namespace {

using uroce::control::Node;
using uroce::control::NodeOptions;
using uroce::control::ParseResult;

struct Embedded {
  std::unique_ptr<Node> node;
  std::string dir;  // the private directory of the session socket, if ours
  std::string sock;
};

/// The private socket directory, for a process that exits with the device
/// still open (the node itself goes with the process).
char g_dir_at_exit[64], g_sock_at_exit[96];
void remove_socket_at_exit() {
  if (g_sock_at_exit[0]) ::unlink(g_sock_at_exit);
  if (g_dir_at_exit[0]) ::rmdir(g_dir_at_exit);
}

void put(char* out, std::size_t len, const std::string& s) {
  if (!out || len == 0) return;
  std::snprintf(out, len, "%s", s.c_str());
}

void* start(const char* options, char* sock, std::size_t sock_len, char* err, std::size_t err_len, int* spent) {
  if (spent) *spent = 0;
  NodeOptions o;
  o.log_level = 2;  // an application's stderr gets warnings and errors only, unless it asks
  std::string text;
  const ParseResult pr = uroce::control::parse_options(options ? options : "", o, text);
  if (pr != ParseResult::kOk) {
    put(err, err_len, pr == ParseResult::kHelp ? "embedded mode takes uroced's options:\n" + text : text);
    return nullptr;
  }
  o.limits.odp = true;  // in the application's own process, a stalled fault stalls only it
  if (o.ports.size() != 1 || o.shards != 1) {
    put(err, err_len, "embedded mode runs one pipeline: one --port, --shards 1");
    return nullptr;
  }
  if (o.duration > 0) {
    put(err, err_len, "--duration has no place in embedded mode: the node runs until the application exits");
    return nullptr;
  }
  auto e = std::make_unique<Embedded>();
  if (o.app_socket.empty()) {
    char tmpl[] = "/tmp/uroce-embedded-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      put(err, err_len, std::string("cannot make a directory for the session socket: ") + std::strerror(errno));
      return nullptr;
    }
    e->dir = tmpl;
    o.app_socket = e->dir + "/app.sock";
    o.app_socket_mode = 0600;
  }
  e->sock = o.app_socket;
  std::string why;
  e->node = Node::start(o, /*embedded=*/true, why);
  if (!e->node) {
    if (!e->dir.empty()) {
      ::unlink(e->sock.c_str());
      ::rmdir(e->dir.c_str());
    }
    if (spent) *spent = 1;  // the EAL was tried (Node::start's first step)
    put(err, err_len, why);
    return nullptr;
  }
  put(sock, sock_len, e->sock);
  if (!e->dir.empty()) {
    static bool registered = false;
    std::snprintf(g_dir_at_exit, sizeof g_dir_at_exit, "%s", e->dir.c_str());
    std::snprintf(g_sock_at_exit, sizeof g_sock_at_exit, "%s", e->sock.c_str());
    if (!registered) registered = std::atexit(remove_socket_at_exit) == 0;  // the plugin is never unloaded
  }
  return e.release();
}

std::size_t progress(void* h) { return static_cast<Embedded*>(h)->node->progress(); }

int wait(void* h, int fd, int timeout_ms) { return static_cast<Embedded*>(h)->node->wait_readable(fd, timeout_ms); }

void interrupt(void* h) { static_cast<Embedded*>(h)->node->interrupt_waits(); }

void stop(void* h) {
  auto* e = static_cast<Embedded*>(h);
  e->node.reset();
  if (!e->dir.empty()) {
    ::unlink(e->sock.c_str());
    ::rmdir(e->dir.c_str());
    g_dir_at_exit[0] = g_sock_at_exit[0] = '\0';
  }
  delete e;
}

constexpr uroce_embedded_ops kOps = {UROCE_EMBEDDED_VERSION, start, progress, wait, interrupt, stop};

}  // namespace

extern "C" __attribute__((visibility("default"))) const uroce_embedded_ops* uroce_embedded_entry(void) { return &kOps; }
