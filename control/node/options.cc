#include "control/node/options.h"

#include "control/node/metrics_server.h"

#include "stack/cc/cc.h"
#include "stack/transport/engine.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>

#include <boost/program_options.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string_view>
#include <tuple>

#include <rte_config.h>  // RTE_MAX_LCORE

namespace po = boost::program_options;

namespace uroce::control {

namespace {

bool parse_mac(const std::string& s, wire::MacAddr& m) {
  unsigned v[6];
  if (std::sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) return false;
  for (int i = 0; i < 6; ++i) {
    if (v[i] > 255) return false;
    m[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v[i]);
  }
  return true;
}

constexpr long kMaxConfigBytes = 1 << 20;  // a config file larger than this is refused

/// Whether `s` holds a %name% token. Boost.ProgramOptions (1.74) fills such
/// placeholders in its error messages in a loop, and an option named
/// "%original_token%" makes that loop endless (found by fuzz_options): such
/// input is refused before Boost sees it.
bool has_placeholder(std::string_view s) {
  for (std::size_t i = s.find('%'); i != std::string_view::npos; i = s.find('%', i + 1)) {
    std::size_t j = i + 1;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
    if (j > i + 1 && j < s.size() && s[j] == '%') return true;
  }
  return false;
}

}  // namespace

ParseResult parse_options(const std::string& line, NodeOptions& out, std::string& text, const ExtraOptions& extra) {
  std::vector<std::string> words;
  try {
    words = po::split_unix(line);
  } catch (const std::exception& e) {  // an unfinished quote or escape: refused, not thrown at the caller
    text = std::string("cannot split the options into words: ") + e.what();
    return ParseResult::kError;
  }
  std::vector<const char*> argv = {"uroce"};
  for (const auto& w : words) argv.push_back(w.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data(), out, text, extra);
}

ParseResult parse_options(int argc, const char* const* argv, NodeOptions& out, std::string& text,
                          const ExtraOptions& extra) {
  std::vector<std::string> port_names, ip_texts;
  std::string lcores_text, app_socket;
  std::string app_socket_mode_text = "0660", app_socket_group;
  unsigned shards = 1;
  std::string config, capture_path, ctl_path, fault_rx, fault_tx, eal_extra, file_prefix, log_level, metrics, log_format;
  std::uint32_t metrics_qps = 0;
  bool check = false;
  std::string check_root;
  std::vector<std::string> vdevs, neighbors, tx_weights;
  bool no_huge = out.no_huge, tx_copy = out.tx_copy, no_rx_intr = !out.rx_interrupts;
  pipeline::IdleConfig idle_cfg = out.idle;
  SessionLimits lim = out.limits;
  std::uint64_t max_mr_mb = lim.max_mr_bytes >> 20;
  bool busy_poll = false, no_host_netdev = false;
  std::string host_netdev = out.host_netdev;
  unsigned mem_mb = out.mem_mb, vlan = out.vlan, pcp = out.pcp, dscp = out.dscp, ecn = out.ecn, lcore = 0;
  unsigned cnp_interval_us = out.cnp_interval_us, cnp_dscp = out.cnp_dscp;
  std::string cc = out.cc;
  std::uint64_t line_rate_mbps = out.line_rate_mbps;
  unsigned mtu = out.mtu;
  double duration = 0;

  po::options_description opts("node options");
  opts.add_options()("help,h", "show this help")("config,c", po::value(&config), "config file (key = value)")
      ("port", po::value(&port_names)->composing(), "ethdev to use, e.g. net_memif0, net_af_packet0 or a PCI address (repeatable)")
      ("shards", po::value(&shards), "pipelines per port, one lcore each; QPs sharded by QPN (default 1)")
      ("lcores", po::value(&lcores_text), "lcores for the pipelines, e.g. 0,1 (default: --lcore and the next ones)")
      ("app-socket", po::value(&app_socket), "Unix socket where applications (liburoce) attach")
      ("app-socket-mode", po::value(&app_socket_mode_text), "permissions of the application socket, octal (default 0660)")
      ("app-socket-group", po::value(&app_socket_group), "group that owns the application socket (default: the daemon's)")
      ("vdev", po::value(&vdevs)->composing(), "create a DPDK vdev (repeatable), e.g. net_af_packet0,iface=veth0")
      ("no-huge", po::bool_switch(&no_huge), "run without hugepages")
      ("mem-mb", po::value(&mem_mb), "EAL memory in MB (default 512)")
      ("lcore", po::value(&lcore), "the first lcore to run on (default 0)")
      ("file-prefix", po::value(&file_prefix), "EAL file prefix (needed for several daemons on one host)")
      ("eal", po::value(&eal_extra), "extra EAL arguments, space separated")
      ("ip", po::value(&ip_texts)->composing(),
       "the RoCE address (GID), IPv4 or IPv6, with its prefix length if the host netdev is to route the subnet "
       "(10.0.0.1/24): one per --port, in order")
      ("host-netdev", po::value(&host_netdev),
       "the kernel netdev (TAP) that carries the first port's address, so that the host's own stack answers ARP, ND "
       "and ICMP on it and runs TCP and UDP sockets on it (default: one named after the application socket, for a "
       "daemon that serves applications)")
      ("no-host-netdev", po::bool_switch(&no_host_netdev), "no host netdev: the node answers ARP, ND and ICMP itself")
      ("neighbor", po::value(&neighbors)->composing(), "static neighbour IP=MAC (repeatable)")
      ("vlan", po::value(&vlan), "802.1Q VLAN ID for all traffic, 1..4094 (default: untagged)")
      ("pcp", po::value(&pcp), "802.1Q priority with --vlan, 0..7 (default 0)")
      ("dscp", po::value(&dscp), "DSCP for RoCE traffic, 0..63 (default 0)")
      ("ecn", po::value(&ecn), "ECN bits on data, 0..3 (default 2 = ECT(0))")
      ("cnp-interval-us", po::value(&cnp_interval_us),
       "a CE-marked packet makes a CNP to the peer QP, at most one per QP per this many us, 0..1000000; 0 sends none "
       "(default 50, as the DCQCN paper)")
      ("cnp-dscp", po::value(&cnp_dscp), "DSCP of the CNPs sent, 0..63 (default 48, as mlx5)")
      ("cc", po::value(&cc), "congestion control of every new RC and UC QP: none, dcqcn or swift (default none; "
                             "uroce-ctl cc changes one QP's)")
      ("line-rate-mbps", po::value(&line_rate_mbps),
       "the rate congestion control starts from, in Mb/s (default: the link's speed, or 10000 if it reports none)")
      ("capture", po::value(&capture_path), "write all RoCE traffic, both directions, to this pcap file")
      ("ctl-socket", po::value(&ctl_path), "Unix socket for status and control (status, fault, stop)")
      ("check", po::bool_switch(&check),
       "check the host against the configuration (hugepages, ports and their drivers, lcores, socket paths, the host "
       "netdev, another daemon), one line a check with a fix for each failure, and exit: 0 if uroced would start")
      ("check-root", po::value(&check_root), "--check reads /sys, /proc and /dev under this folder (for tests)")
      ("metrics", po::value(&metrics),
       "serve Prometheus metrics at http://ADDR:PORT/metrics (ADDR:PORT, an IPv6 address in brackets; default: none)")
      ("metrics-qps", po::value(&metrics_qps),
       "per-QP series (counters, congestion control) for at most this many QPs a pipeline, 0..10000 (default 0: none)")
      ("fault-rx", po::value(&fault_rx), "RX fault injection, e.g. drop=0.01,dup=0.01,reorder=0.02")
      ("fault-tx", po::value(&fault_tx), "TX fault injection, same syntax")
      ("tx-copy", po::bool_switch(&tx_copy), "always copy payloads into mbufs (no external-buffer zero-copy)")
      ("link-mtu", po::value(&mtu),
       "the links' Ethernet MTU, 576..9600 (set on the driver where it takes it; default: the driver's, often 1500); "
       "the verbs port's active MTU follows it")
      ("max-sessions", po::value(&lim.max_sessions), "application sessions in all (default 256)")
      ("max-sessions-per-uid", po::value(&lim.max_sessions_per_uid), "sessions one uid may hold (default 64)")
      ("max-unhelloed", po::value(&lim.max_unhelloed), "connections yet to say hello (default 64)")
      ("max-unhelloed-per-uid", po::value(&lim.max_unhelloed_per_uid),
       "connections yet to say hello from one uid (default 8): one uid's silent connections cannot lock the others out")
      ("hello-timeout-ms", po::value(&lim.hello_timeout_ms), "a connection silent this long is closed (default 2000)")
      ("tx-weight", po::value(&tx_weights)->composing(),
       "a tenant's weight in the transmit share, UID=W or USER=W, or default=W, W 1..1000 (repeatable; default 1): "
       "while several uids have work, each sends about its weight's share of the wire's bytes")
      ("max-qps", po::value(&lim.max_qps), "QPs per session (default 256)")
      ("max-qps-per-uid", po::value(&lim.max_qps_per_uid), "QPs one uid may hold over its sessions (default 512)")
      ("max-mcast-per-uid", po::value(&lim.max_mcast_per_uid), "multicast attachments one uid may hold (default 64)")
      ("max-flows-per-uid", po::value(&lim.max_flows_per_uid), "flow rules (ibv_create_flow) one uid may hold (default 64)")
      ("odp", po::bool_switch(&lim.odp),
       "let applications register MRs on demand (IBV_ACCESS_ON_DEMAND): each access is made through the "
       "application's /proc/self/mem when it happens; a page fault that waits (FUSE, NFS) then stalls this daemon")
      ("max-cqs", po::value(&lim.max_cqs), "CQs per session (default 256)")
      ("max-mrs", po::value(&lim.max_mrs), "MRs per session (default 1024)")
      ("max-mr-mb", po::value(&max_mr_mb), "registered MiB per session (default 4096)")
      ("max-pending-rtr", po::value(&lim.max_pending_rtr), "RTRs and UD address resolutions parked for ARP, per session (default 16)")
      ("max-pending-rtr-total", po::value(&lim.max_pending_rtr_total), "RTRs and UD address resolutions parked for ARP, in all (default 256)")
      ("max-pending-rtr-per-uid", po::value(&lim.max_pending_rtr_per_uid),
       "RTRs and UD address resolutions parked for ARP, per uid over its sessions (default 64)")
      ("no-rx-interrupts", po::bool_switch(&no_rx_intr),
       "poll on the tick even where the PMD has RX interrupts (net_tap, net_af_xdp, NICs)")
      ("idle-spin-us", po::value(&idle_cfg.spin_us), "keep polling at least this long after the last work, then sleep (default 5)")
      ("idle-spin-max-us", po::value(&idle_cfg.spin_max_us),
       "poll on for up to twice the recent gap between bursts of work, at most this long; traffic sparser than this "
       "(its last gap past four times this too) sleeps after --idle-spin-us (default 200)")
      ("poll-tick-us", po::value(&idle_cfg.tick_us),
       "sleep between polls while warm; bounds RX latency on PMDs without interrupts (default 20)")
      ("idle-warm-ms", po::value(&idle_cfg.warm_ms), "after this long without work, sleeps double (default 10)")
      ("idle-max-us", po::value(&idle_cfg.max_sleep_us), "longest idle sleep in us; 0 = always busy-poll (default 20000)")
      ("busy-poll", po::bool_switch(&busy_poll), "never sleep: poll all the time (for dedicated, pinned cores)")
      ("duration", po::value(&duration), "stop after this many seconds (0 = run until stopped)")
      ("log-level", po::value(&log_level), "debug, info, warn or error (default info)")
      ("log-format", po::value(&log_format), "text (logfmt: ts=... level=... msg=\"...\" key=value) or json (one object a line, "
                                            "for journald and log shippers); default text");
  if (extra.desc) opts.add(*extra.desc);
  po::variables_map vm;
  for (int i = 1; i < argc; ++i)
    if (has_placeholder(argv[i])) {
      text = "argument " + std::to_string(i) + " holds a %name% token, which is not allowed in options";
      return ParseResult::kError;
    }
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("config")) {
      // A regular file of bounded size: not a device (/dev/zero never ends),
      // not a directory (which reads as empty and hides the mistake).
      const std::string path = vm["config"].as<std::string>();
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) {
        text = "cannot read config file '" + path + "': " + std::strerror(errno);
        return ParseResult::kError;
      }
      if (!S_ISREG(st.st_mode)) {
        text = "config file '" + path + "' is not a regular file";
        return ParseResult::kError;
      }
      if (st.st_size > kMaxConfigBytes) {
        text = "config file '" + path + "' is over " + std::to_string(kMaxConfigBytes) + " bytes";
        return ParseResult::kError;
      }
      std::ifstream f(path);
      if (!f) {
        text = "cannot read config file '" + path + "'";
        return ParseResult::kError;
      }
      std::string body;  // read in chunks, up to one byte past the limit
      char chunk[4096];
      while (f.read(chunk, sizeof chunk) || f.gcount() > 0) {
        body.append(chunk, static_cast<std::size_t>(f.gcount()));
        if (body.size() > static_cast<std::size_t>(kMaxConfigBytes)) {  // it grew since the stat
          text = "config file '" + path + "' is over " + std::to_string(kMaxConfigBytes) + " bytes";
          return ParseResult::kError;
        }
      }
      if (has_placeholder(body)) {
        text = "config file '" + path + "' holds a %name% token, which is not allowed in options";
        return ParseResult::kError;
      }
      std::istringstream in(body);
      po::store(po::parse_config_file(in, opts), vm);
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    text = std::string(e.what()) + " (see --help)";
    return ParseResult::kError;
  }
  if (vm.count("help")) {
    std::ostringstream h;
    h << opts;
    text = h.str();
    return ParseResult::kHelp;
  }
  auto bad = [&text](const std::string& why) {
    text = why;
    return ParseResult::kError;
  };
  if (!log_level.empty()) {
    const char* names[] = {"debug", "info", "warn", "error"};
    out.log_level = -1;
    for (int i = 0; i < 4; ++i)
      if (log_level == names[i]) out.log_level = i;
    if (out.log_level < 0) return bad("--log-level must be debug, info, warn or error");
  }
  if (!log_format.empty()) {
    if (log_format != "text" && log_format != "json") return bad("--log-format must be text or json");
    out.log_json = log_format == "json";
  }
  if (port_names.empty()) return bad("--port is required (the ethdev to use)");
  if (ip_texts.size() != port_names.size())
    return bad("give one --ip per --port (" + std::to_string(port_names.size()) + " ports, " +
               std::to_string(ip_texts.size()) + " addresses)");
  std::vector<wire::IpAddr> ips(ip_texts.size());
  std::vector<unsigned> prefixes(ip_texts.size(), 0);
  for (std::size_t i = 0; i < ip_texts.size(); ++i) {
    std::string addr = ip_texts[i];
    const auto slash = addr.find('/');
    if (slash != std::string::npos) {
      const std::string len = addr.substr(slash + 1);
      addr.resize(slash);
      char* end = nullptr;
      const unsigned long v = std::strtoul(len.c_str(), &end, 10);
      if (len.empty() || len.size() > 3 || len.find_first_not_of("0123456789") != std::string::npos || *end != '\0' ||
          v == 0 || v > 128)
        return bad("--ip: the prefix length after '/' must be 1..32 (IPv4) or 1..128 (IPv6), got '" + ip_texts[i] + "'");
      prefixes[i] = static_cast<unsigned>(v);
    }
    if (!wire::IpAddr::parse(addr, ips[i])) return bad("--ip must be an IPv4 or IPv6 address, got '" + ip_texts[i] + "'");
    if (ips[i].is_v4_mapped() && prefixes[i] > 32) return bad("--ip: an IPv4 prefix length is 1..32, got '" + ip_texts[i] + "'");
  }
  if (no_host_netdev) host_netdev.clear();
  if (vm.count("host-netdev") && no_host_netdev) return bad("give --host-netdev or --no-host-netdev, not both");
  if (vm.count("host-netdev") && host_netdev != "auto" &&
      (host_netdev.empty() || host_netdev.size() > 15 || host_netdev.find_first_of("/ \t:") != std::string::npos))
    return bad("--host-netdev must be a netdev name of 1..15 bytes without '/', ':' or spaces, or auto");
  if (shards < 1 || shards > 64) return bad("--shards must be 1..64");
  const std::size_t npipes = port_names.size() * shards;
  std::vector<unsigned> lcores;
  if (!lcores_text.empty()) {
    std::stringstream ls(lcores_text);
    std::string t;
    while (std::getline(ls, t, ',')) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(t.c_str(), &end, 10);
      if (t.empty() || *end != '\0' || v >= RTE_MAX_LCORE) return bad("--lcores must be a comma-separated list of lcore numbers");
      lcores.push_back(static_cast<unsigned>(v));
    }
  } else {
    for (std::size_t i = 0; i < npipes; ++i) lcores.push_back(lcore + static_cast<unsigned>(i));
  }
  if (lcores.size() != npipes)
    return bad("need " + std::to_string(npipes) + " lcores (ports x shards), --lcores gives " + std::to_string(lcores.size()));
  if (!app_socket.empty() && npipes != 1) return bad("--app-socket needs a single pipeline for now (one port, --shards 1)");
  if (dscp > 63) return bad("--dscp must be 0..63");
  if (mtu != 0 && (mtu < 576 || mtu > 9600)) return bad("--link-mtu must be 576..9600");
  if (vm.count("vlan") && (vlan < 1 || vlan > 4094)) return bad("--vlan must be 1..4094");
  if (pcp > 7) return bad("--pcp must be 0..7");
  if (ecn > 3) return bad("--ecn must be 0..3");
  if (cnp_interval_us > 1'000'000) return bad("--cnp-interval-us must be 0..1000000");
  if (cnp_dscp > 63) return bad("--cnp-dscp must be 0..63");
  if (cc::find(cc) == nullptr) {
    std::string names;
    for (const cc::Entry& e : cc::registry()) names += (names.empty() ? "" : ", ") + std::string(e.name);
    return bad("--cc must be one of " + names);
  }
  if (line_rate_mbps > 10'000'000) return bad("--line-rate-mbps must be 0..10000000");
  if (!std::isfinite(duration) || duration < 0 || duration > 1e7) return bad("--duration must be 0..10000000 seconds");
  if (mem_mb < 64 || mem_mb > (1u << 20)) return bad("--mem-mb must be 64..1048576");
  if (lcore >= RTE_MAX_LCORE) return bad("--lcore must be below " + std::to_string(RTE_MAX_LCORE));
  // The socket's mode is octal, as chmod(1) reads it: 0660 or 660. Only
  // permission bits; other users are never given write access by default.
  unsigned app_socket_mode = 0;
  {
    const std::string& t = app_socket_mode_text;
    char* end = nullptr;
    const unsigned long v = std::strtoul(t.c_str(), &end, 8);
    if (t.empty() || *end != '\0' || t.find_first_not_of("01234567") != std::string::npos || v > 0777)
      return bad("--app-socket-mode must be octal permission bits, 0000..0777 (e.g. 0660), got '" + t + "'");
    app_socket_mode = static_cast<unsigned>(v);
  }
  gid_t app_socket_gid = static_cast<gid_t>(-1);
  if (!app_socket_group.empty()) {
    const group* g = ::getgrnam(app_socket_group.c_str());
    if (!g) return bad("--app-socket-group: no group named '" + app_socket_group + "'");
    app_socket_gid = g->gr_gid;
  }
  if (idle_cfg.spin_us > 1'000'000 || idle_cfg.spin_max_us > 1'000'000 || idle_cfg.tick_us < 1 ||
      idle_cfg.tick_us > 1'000'000 || idle_cfg.warm_ms > 60'000 || idle_cfg.max_sleep_us > 1'000'000)
    return bad("--idle-spin-us 0..1000000, --idle-spin-max-us 0..1000000, --poll-tick-us 1..1000000, --idle-warm-ms "
               "0..60000, --idle-max-us 0..1000000");
  if (busy_poll) idle_cfg.max_sleep_us = 0;
  for (const auto& [name, v, hi] : {std::tuple{"--max-sessions", lim.max_sessions, 65536u},
                                    {"--max-sessions-per-uid", lim.max_sessions_per_uid, 65536u},
                                    {"--max-unhelloed", lim.max_unhelloed, 65536u},
                                    {"--max-unhelloed-per-uid", lim.max_unhelloed_per_uid, 65536u},
                                    {"--hello-timeout-ms", lim.hello_timeout_ms, 600000u},
                                    {"--max-qps", lim.max_qps, 65536u},
                                    {"--max-qps-per-uid", lim.max_qps_per_uid, 65536u},
                                    {"--max-mcast-per-uid", lim.max_mcast_per_uid, 1024u},
                                    {"--max-flows-per-uid", lim.max_flows_per_uid, 256u},
                                    {"--max-cqs", lim.max_cqs, 65536u},
                                    {"--max-mrs", lim.max_mrs, 1u << 20},
                                    {"--max-pending-rtr", lim.max_pending_rtr, 65536u},
                                    {"--max-pending-rtr-total", lim.max_pending_rtr_total, 1u << 20},
                                    {"--max-pending-rtr-per-uid", lim.max_pending_rtr_per_uid, 1u << 20}})
    if (v < 1 || v > hi) return bad(std::string(name) + " must be 1.." + std::to_string(hi));
  if (max_mr_mb < 1 || max_mr_mb > (1ull << 30)) return bad("--max-mr-mb must be 1..1073741824");
  if (!metrics.empty()) {
    boost::asio::ip::tcp::endpoint ep;
    std::string why;
    if (!MetricsServer::parse(metrics, ep, why)) return bad("--metrics: " + why);
  }
  if (metrics_qps > 10000) return bad("--metrics-qps must be 0..10000");
  lim.max_mr_bytes = max_mr_mb << 20;
  pipeline::FaultConfig frx, ftx;
  std::string err;
  if (!pipeline::FaultConfig::parse(fault_rx, frx, err)) return bad("--fault-rx: " + err);
  if (!pipeline::FaultConfig::parse(fault_tx, ftx, err)) return bad("--fault-tx: " + err);
  for (const auto& t : tx_weights) {
    const auto eq = t.find('=');
    const std::string who = eq == std::string::npos ? "" : t.substr(0, eq);
    std::uint32_t w = 0;
    const std::string wt = eq == std::string::npos ? "" : t.substr(eq + 1);
    const auto [wend, wec] = std::from_chars(wt.data(), wt.data() + wt.size(), w);
    if (who.empty() || wt.empty() || wec != std::errc{} || wend != wt.data() + wt.size() || w < 1 ||
        w > transport::Engine::kMaxWeight)
      return bad("--tx-weight must be UID=W, USER=W or default=W with W 1..1000, got '" + t + "'");
    std::uint32_t uid = 0;
    const auto [uend, uec] = std::from_chars(who.data(), who.data() + who.size(), uid);
    if (who == "default") {
      lim.tx_weight_default = w;
    } else if (uec == std::errc{} && uend == who.data() + who.size()) {
      lim.tx_weights[uid] = w;
    } else if (const passwd* pw = ::getpwnam(who.c_str())) {
      lim.tx_weights[pw->pw_uid] = w;
    } else {
      return bad("--tx-weight: no user named '" + who + "'");
    }
  }
  std::vector<std::pair<wire::IpAddr, wire::MacAddr>> statics;
  for (const auto& n : neighbors) {
    const auto eq = n.find('=');
    wire::IpAddr nip;
    wire::MacAddr nmac;
    if (eq == std::string::npos || !wire::IpAddr::parse(n.substr(0, eq), nip) || !parse_mac(n.substr(eq + 1), nmac))
      return bad("--neighbor must be IP=MAC, got '" + n + "'");
    statics.emplace_back(nip, nmac);
  }
  out.ports = port_names;
  out.ips = ips;
  out.prefixes = prefixes;
  out.host_netdev = host_netdev;
  out.shards = shards;
  out.lcores = lcores;
  out.app_socket = app_socket;
  out.app_socket_mode = app_socket_mode;
  out.app_socket_gid = app_socket_gid;
  out.vdevs = vdevs;
  out.no_huge = no_huge;
  out.mem_mb = mem_mb;
  out.file_prefix = file_prefix;
  out.eal_extra = eal_extra;
  out.neighbors = statics;
  out.vlan = vlan;
  out.pcp = pcp;
  out.dscp = dscp;
  out.ecn = ecn;
  out.cnp_interval_us = cnp_interval_us;
  out.cnp_dscp = cnp_dscp;
  out.cc = cc;
  out.line_rate_mbps = line_rate_mbps;
  out.capture = capture_path;
  out.ctl_socket = ctl_path;
  out.metrics = metrics;
  out.check = check;
  out.check_root = check_root;
  out.metrics_qps = metrics_qps;
  out.fault_rx = frx;
  out.fault_tx = ftx;
  out.tx_copy = tx_copy;
  out.mtu = mtu;
  out.rx_interrupts = !no_rx_intr;
  out.idle = idle_cfg;
  out.duration = duration;
  out.limits = lim;
  out.args.assign(argv + 1, argv + argc);
  if (extra.check) {
    std::string why = extra.check(npipes);
    if (!why.empty()) return bad(why);
  }
  return ParseResult::kOk;
}

bool is_pci(const std::string& port) {
  static const std::regex k("^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]$");
  return std::regex_match(port, k);
}

std::string vdev_arg(const NodeOptions& o, const std::string& port, const std::string& key) {
  for (const std::string& v : o.vdevs) {
    if (v.compare(0, port.size(), port) != 0 || (v.size() > port.size() && v[port.size()] != ',')) continue;
    std::istringstream is(v.substr(port.size()));
    for (std::string kv; std::getline(is, kv, ',');)
      if (kv.rfind(key + "=", 0) == 0) return kv.substr(key.size() + 1);
  }
  return "";
}

}  // namespace uroce::control
