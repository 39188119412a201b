// uroced: the uroce dataplane daemon. One node (control/node) for every
// application on the host.
//
//   uroced --port net_memif0 --vdev net_memif0,role=server,socket=/tmp/m.sock
//          --ip 10.0.0.1 --no-huge [--config FILE] [--app-socket PATH ...]
//
// Every option can also come from a config file (key = value, same names).

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "control/node/node.h"
#include "control/node/options.h"

using namespace uroce;

namespace {

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

/// A crash leaves a backtrace on stderr (async-signal-safe calls only), so a
/// rare failure in CI can be read from the log.
void on_fatal_signal(int sig) {
  static const char kMsg[] = "uroced: fatal signal, backtrace:\n";
  (void)!::write(2, kMsg, sizeof kMsg - 1);
  void* frames[48];
  backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGSEGV, on_fatal_signal);
  ::signal(SIGBUS, on_fatal_signal);
  ::signal(SIGABRT, on_fatal_signal);
  control::NodeOptions o;
  std::string text;
  switch (control::parse_options(argc, argv, o, text)) {
    case control::ParseResult::kHelp:
      std::cout << text << "\n";
      return 0;
    case control::ParseResult::kError:
      std::fprintf(stderr, "uroced: %s\n", text.c_str());
      return 2;
    case control::ParseResult::kOk:
      break;
  }
  std::string err;
  auto node = control::Node::start(o, /*embedded=*/false, err);
  if (!node) {
    std::fprintf(stderr, "uroced: %s\n", err.c_str());
    return 2;
  }
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);
  const int rc = node->run(g_stop);
  node.reset();
  return rc;
}
