// uroced --check: the host against the configuration, without starting.
// One line a check ("ok", "FAIL" with a fix, or "--" where it does not
// apply), and the count of failures: zero means the daemon would start as
// far as the host goes. It reads the kernel's files (under `root`, so that
// tests can present a host of their own) and opens nothing it would hold.
#pragma once

#include <ostream>
#include <string>

#include "control/node/options.h"

namespace uroce::control {

/// The host netdev's name as the node will make it ("" for none): --host-netdev,
/// or with "auto" one named after the application socket (uroce0.sock:
/// uroce0) for a daemon serving applications on one pipeline that is not
/// an af_packet port.
std::string host_netdev_name(const NodeOptions& o, bool embedded, std::size_t pipelines);

/// Runs every check; `root` prefixes /sys, /proc and /dev paths ("" for the host's own).
int preflight(const NodeOptions& o, const std::string& root, std::ostream& out);

}  // namespace uroce::control
