// uroced: the uroce dataplane daemon. One node (control/node) for every
// application on the host.
//
//   uroced --port net_memif0 --vdev net_memif0,role=server,socket=/tmp/m.sock
//          --ip 10.0.0.1 --no-huge [--config FILE] [--app-socket PATH ...]
//
// Every option can also come from a config file (key = value, same names).

#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "control/node/node.h"
#include "control/node/options.h"

using namespace uroce;

namespace {
volatile sig_atomic_t g_stop = 0;
}  // namespace

int main(int argc, char** argv) {
  control::host_crash_signals("uroced");
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
  control::host_stop_signals(&g_stop);
  const int rc = node->run(g_stop);
  node.reset();
  return rc;
}
