// What a node needs of its process's privileges. Root may do everything; a
// daemon run as its own user (the units' User=uroce) gets the capabilities
// its ports need from systemd (AmbientCapabilities=) and nothing more. The
// port types and what each needs:
//   net_memif, net_ring, net_null, a pcap file   nothing (file permissions)
//   net_af_packet                                CAP_NET_RAW, CAP_NET_ADMIN
//   net_tap, net_tun, the host netdev            CAP_NET_ADMIN
//   a PCI device bound to vfio-pci               its /dev/vfio group file, CAP_IPC_LOCK
//   net_af_xdp, PCI devices on uio or a vendor   root
// Named before the EAL starts (a clear error, not a driver's) and by
// uroced --check, each with its fix.
#pragma once

#include <string>
#include <vector>

#include "control/node/options.h"

namespace uroce::control {

/// One thing the node opens and the privileges it needs.
struct PrivilegeNeed {
  std::string what;     // "port net_af_packet0", "host netdev uroce0"
  std::string needs;    // "CAP_NET_RAW, CAP_NET_ADMIN", "root", ...
  std::string missing;  // what of it this process lacks ("": nothing)
};

/// Whether this process is root (effective uid 0).
[[nodiscard]] bool is_root();
/// The capabilities this process holds, by name ("CAP_NET_RAW, ..."), or "none".
[[nodiscard]] std::string held_capabilities();
/// What each port and the host netdev (`host_netdev`: its name, "" for
/// none) need, and what this process lacks of it; `root` prefixes /sys and
/// /dev (tests present a host of their own).
[[nodiscard]] std::vector<PrivilegeNeed> privileges(const NodeOptions& o, const std::string& host_netdev,
                                                    const std::string& root = "");

}  // namespace uroce::control
