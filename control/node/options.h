// A node's options: what uroced takes on its command line or in its config
// file, and what an embedded-mode application gives in its device spec
// (UROCE_EMBEDDED or "embedded:OPTIONS"). One parser for both, so the two
// modes cannot drift: every option means the same in each. A program that
// hosts a node itself (uroce-traffic) adds its own options to the same parser.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "stack/pipeline/dataplane.h"
#include "stack/pipeline/fault.h"
#include "stack/wire/addr.h"

namespace boost::program_options {
class options_description;
}

namespace uroce::control {

/// What applications may hold, per session, per uid and in all. Every limit
/// is an option (and so a config-file key) and is reported in the status.
struct SessionLimits {
  std::uint32_t max_qps = 256, max_cqs = 256, max_mrs = 1024, max_pds = 64, max_srqs = 64;  // per session
  /// MODIFY_QP(RTR)s parked while the peer's address resolves: per session, and in all.
  std::uint32_t max_pending_rtr = 16, max_pending_rtr_total = 256, max_pending_rtr_per_uid = 64;  // and per uid
  std::uint64_t max_mr_bytes = 1ull << 32;  // per session
  std::uint32_t max_sessions = 256, max_sessions_per_uid = 64;
  std::uint32_t max_qps_per_uid = 512;  // the engine's table holds 1024: one user cannot take it all
  std::uint32_t max_mcast_per_uid = 64;  // multicast attachments one uid may hold (the engine's table holds 1024)
  std::uint32_t max_flows_per_uid = 64;  // raw packet QPs' flow rules one uid may hold (the engine's table holds 256)
  /// ODP MRs (--odp): the node reads and writes an application's memory
  /// through its /proc/self/mem as each access happens. Off in a daemon by
  /// default (a mapping whose faults wait, FUSE or NFS, would stall the
  /// data path for every tenant); on in embedded mode.
  bool odp = false;
  /// Connections that have not said hello yet, in all and per uid (so one
  /// uid's silent connections cannot keep another uid from connecting),
  /// and how long one may wait.
  std::uint32_t max_unhelloed = 64, max_unhelloed_per_uid = 8, hello_timeout_ms = 2000;
  /// Each uid's weight in the transmit share (Engine::set_tenant): a uid
  /// not named has tx_weight_default.
  std::map<std::uint32_t, std::uint32_t> tx_weights;
  std::uint32_t tx_weight_default = 1;
  [[nodiscard]] std::uint32_t tx_weight(std::uint32_t uid) const {
    const auto w = tx_weights.find(uid);
    return w == tx_weights.end() ? tx_weight_default : w->second;
  }
  friend bool operator==(const SessionLimits&, const SessionLimits&) = default;
};

struct NodeOptions {
  std::vector<std::string> ports;  // ethdev names, one pipeline each (times shards)
  std::vector<wire::IpAddr> ips;   // one per port
  std::vector<unsigned> prefixes;  // each address's prefix length (--ip ADDR/LEN); 0: none given
  /// The host netdev (drivers/host): a TAP with the first port's address.
  /// "auto": one named after the application socket (uroce0.sock: uroce0)
  /// when the node serves applications as a daemon, none otherwise (an
  /// embedded node, a host program, or a net_af_packet port, whose kernel
  /// netdev already sees every frame). "" (--no-host-netdev): none.
  std::string host_netdev = "auto";
  unsigned shards = 1;
  std::vector<unsigned> lcores;  // one per pipeline; the first is the main lcore
  std::string app_socket;        // where liburoce sessions attach (empty: none)
  unsigned app_socket_mode = 0660;
  gid_t app_socket_gid = static_cast<gid_t>(-1);
  std::vector<std::string> vdevs;
  bool no_huge = false;
  unsigned mem_mb = 512;
  std::string file_prefix, eal_extra;
  std::vector<std::pair<wire::IpAddr, wire::MacAddr>> neighbors;  // static entries
  unsigned vlan = 0, pcp = 0, dscp = 0, ecn = 2;
  unsigned cnp_interval_us = 50, cnp_dscp = 48;  // the notification point (EngineConfig)
  std::string cc = "none";       // every new RC/UC QP's congestion control (cc::registry)
  std::uint64_t line_rate_mbps = 0;  // the rate congestion control starts from; 0: the link's speed
  std::string capture, ctl_socket;
  bool check = false;        // --check: the preflight (preflight.h), then exit
  std::string check_root;    // --check-root: where the preflight reads /sys, /proc and /dev (tests)
  std::string metrics;            // --metrics ADDR:PORT: the Prometheus endpoint (empty: none)
  std::uint32_t metrics_qps = 0;  // --metrics-qps: per-QP series for at most this many QPs a pipeline
  pipeline::FaultConfig fault_rx, fault_tx;
  bool tx_copy = false;
  std::uint32_t mtu = 0;  // the ports' Ethernet MTU (--link-mtu); 0: as the driver has it
  bool rx_interrupts = true;  // block on the port's RX interrupt where the PMD has one
  pipeline::IdleConfig idle;
  double duration = 0;  // seconds; 0 = until stopped
  int log_level = 1;    // 0 debug, 1 info, 2 warn, 3 error
  bool log_json = false;  // --log-format json: one JSON object a line (log.h)
  SessionLimits limits;
  /// The command line as given, after the program's name: a reload parses
  /// it again, and so reads its --config file again.
  std::vector<std::string> args;
};

enum class ParseResult { kOk, kHelp, kError };

/// Options a host program adds to the node's (uroce-traffic's): parsed in
/// the same pass, from flags and the config file alike, and listed in the
/// help. `check` runs after the node's own options are good, with the
/// number of pipelines; it returns "" or why the program's options are wrong.
struct ExtraOptions {
  const boost::program_options::options_description* desc = nullptr;
  std::function<std::string(std::size_t pipelines)> check;
};

/// Parses uroced's options (argv[0] is the program name and is skipped), a
/// config file named by --config included, and checks them. `out` holds the
/// defaults on entry (embedded mode prefers warnings-only logging); an
/// option given replaces its default. On kHelp, `text` is the help; on
/// kError, why.
ParseResult parse_options(int argc, const char* const* argv, NodeOptions& out, std::string& text,
                          const ExtraOptions& extra = {});

/// The same from one string, split as a shell would (quotes kept together).
ParseResult parse_options(const std::string& line, NodeOptions& out, std::string& text,
                          const ExtraOptions& extra = {});

/// Whether a port names a PCI device (DDDD:BB:DD.F or BB:DD.F), not a vdev.
[[nodiscard]] bool is_pci(const std::string& port);
/// An argument of the --vdev that creates `port` (`iface` of
/// "net_af_packet0,iface=veth0": "veth0"), or "".
[[nodiscard]] std::string vdev_arg(const NodeOptions& o, const std::string& port, const std::string& key);

}  // namespace uroce::control
