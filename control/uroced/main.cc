// uroced: the uroce dataplane daemon. One port, one poll-mode pipeline.
//
//   uroced --port net_memif0 --vdev net_memif0,role=server,socket=/tmp/m.sock
//          --ip 10.0.0.1 --no-huge [--config FILE] [--app server|client ...]
//
// Every option can also come from a config file (key = value, same names).

#include <execinfo.h>
#include <grp.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <utility>  // boost 1.74's asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <rte_launch.h>
#include <rte_lcore.h>

#include "control/uroced/app.h"
#include "control/uroced/sessions.h"
#include "drivers/dpdk/dpdk_port.h"
#include "drivers/pcap/pcap_io.h"
#include "stack/pipeline/dataplane.h"
#include "stack/pipeline/neigh.h"
#include "stack/transport/engine.h"

namespace po = boost::program_options;
namespace asio = boost::asio;
using namespace uroce;

namespace {

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

int g_log_level = 1;  // 0 debug, 1 info, 2 warn, 3 error

/// Structured log line: ts=... level=... msg="..." key=value...
void log(int level, const std::string& msg, const std::string& kv = "") {
  if (level < g_log_level) return;
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char tbuf[32];
  tm t;
  gmtime_r(&ts.tv_sec, &t);
  strftime(tbuf, sizeof tbuf, "%Y-%m-%dT%H:%M:%S", &t);
  std::fprintf(stderr, "ts=%s.%06ldZ level=%s msg=\"%s\"%s%s\n", tbuf, ts.tv_nsec / 1000, kNames[level], msg.c_str(),
               kv.empty() ? "" : " ", kv.c_str());
}

bool parse_mac(const std::string& s, wire::MacAddr& m) {
  unsigned v[6];
  if (std::sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) return false;
  for (int i = 0; i < 6; ++i) {
    if (v[i] > 255) return false;
    m[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v[i]);
  }
  return true;
}

/// One poll-mode pipeline: an engine with its dataplane, on one lcore, over
/// one port (or one shard of a port).
struct Pipeline {
  dpdk::Port* port = nullptr;
  std::string port_name;
  std::uint16_t shard = 0;
  std::uint16_t shards = 1;
  unsigned lcore = 0;
  std::unique_ptr<transport::Engine> eng;
  std::unique_ptr<pipeline::Neighbors> neigh;
  std::unique_ptr<pipeline::Dataplane> dp;
  std::unique_ptr<pcapio::Writer> capture;
};

struct Daemon {
  std::vector<std::unique_ptr<dpdk::Port>> ports;
  std::vector<std::unique_ptr<Pipeline>> pipes;
  std::unique_ptr<control::TrafficApp> app;
  std::unique_ptr<control::SessionServer> sessions;

  std::string status_json() const;
  [[nodiscard]] nlohmann::ordered_json status() const;
};

std::atomic<bool> g_workers_stop{false};

/// The longest control line taken; a longer one is refused and its
/// connection closed, so a client cannot make the daemon buffer without end.
constexpr std::size_t kMaxControlLine = 4096;
constexpr long kMaxConfigBytes = 1 << 20;  // a config file larger than this is refused

/// Which shard owns a frame: RoCE by destination QP (an engine owns every
/// `shards`-th QPN, see EngineConfig::qpn_stride), ARP and ICMPv6 (ND) to
/// every shard so each learns neighbours, everything else to shard 0.
int frame_owner(wire::ConstBytes f, std::uint16_t shards) {
  wire::Packet pkt;
  wire::ParseOptions o;
  o.verify_icrc = false;  // the owner checks it
  const auto st = wire::parse_frame(f, o, pkt);
  if (st.ok()) return static_cast<int>((pkt.destqp - transport::kFirstQpn) % shards);
  if (st.roce) return 0;
  std::size_t off = 12;
  std::uint16_t type = f.size() >= 14 ? static_cast<std::uint16_t>((f[12] << 8) | f[13]) : 0;
  if (type == wire::kEtherTypeVlan && f.size() >= 18) {
    type = static_cast<std::uint16_t>((f[16] << 8) | f[17]);
    off = 16;
  }
  if (type == wire::kEtherTypeArp) return -1;
  if (type == wire::kEtherTypeIpv6 && f.size() >= off + 2 + 40 && f[off + 2 + 6] == 58) return -1;
  return 0;
}

/// The loop of a pipeline on a worker lcore. (A sharded port's shard 0,
/// which also dispatches, may run here too when it is not the first port.)
int run_pipeline(Pipeline& p) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // short idle sleeps really are short
  while (!g_workers_stop.load(std::memory_order_relaxed)) {
    const std::uint64_t now = now_ns();
    std::size_t work = 0;
    if (p.shards > 1 && p.shard == 0) work += p.port->dispatch(frame_owner);
    work += p.dp->iterate(now);
    p.dp->idle(work);
  }
  return 0;
}

std::string Daemon::status_json() const {
  return status().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::ordered_json Daemon::status() const {
  // Counters are read while other lcores update them: each is an aligned
  // 64-bit load, so a value may be a moment old but is never torn.
  using json = nlohmann::ordered_json;
  json o;
  o["pipelines"] = pipes.size();
  o["app"] = app ? (app->finished() ? "done" : "running") : "none";
  o["sessions"] = sessions ? sessions->sessions() : 0;
  o["session_list"] = sessions ? sessions->describe() : json::array();
  o["cm"] = sessions ? sessions->cm_status() : json::object();
  if (!pipes.empty()) {
    const pipeline::IdleConfig& ic = pipes[0]->dp->idle_config();
    o["wait"] = {{"busy_poll", ic.max_sleep_us == 0}, {"spin_us", ic.spin_us},       {"tick_us", ic.tick_us},
                 {"warm_ms", ic.warm_ms},             {"max_sleep_us", ic.max_sleep_us},
                 {"doorbells", sessions ? sessions->doorbells() : 0}};
  }
  o["limits"] = {{"control_line_bytes", kMaxControlLine}};
  for (std::size_t k = 0; k < pipes.size(); ++k) {
    const Pipeline& p = *pipes[k];
    const std::string pre = k == 0 ? "" : "_" + std::to_string(k);
    o["pipeline" + pre] = {{"port", p.port_name}, {"shard", p.shard},
                           {"lcore", p.lcore},    {"ip", p.eng->config().ip.to_string()},
                           {"qps", p.eng->qp_count()}};
    json port = json::object(), dp = json::object(), totals = json::object();
    const auto& pc = p.eng->counters();
    for (std::size_t i = 0; i < transport::kPortCounterNames.size(); ++i) port[transport::kPortCounterNames[i]] = pc.v[i];
    for (std::size_t i = 0; i < static_cast<std::size_t>(pipeline::DpCounter::kCount); ++i)
      dp[pipeline::kDpCounterNames[i]] = p.dp->counter(static_cast<pipeline::DpCounter>(i));
    for (std::size_t i = 0; i < transport::kQpCounterNames.size(); ++i)
      totals[transport::kQpCounterNames[i]] = p.eng->qp_counter_total(static_cast<transport::QpCounter>(i));
    o["port" + pre] = port;
    o["dataplane" + pre] = dp;
    o["qp_totals" + pre] = totals;
    json qps = json::array();
    p.eng->for_each_qp([&](const transport::Qp& q) {
      json e = {{"qpn", q.qpn},
                {"type", q.type == IBV_QPT_RC ? "RC" : q.type == IBV_QPT_UC ? "UC" : "UD"},
                {"state", transport::to_string(q.state)},
                {"dest_qpn", q.dest_qp_num},
                {"peer", q.remote_ip.to_string()},
                {"sq_depth", q.sq.size()}};
      for (std::size_t i = 0; i < transport::kQpCounterNames.size(); ++i) e[transport::kQpCounterNames[i]] = q.ctr.v[i];
      qps.push_back(e);
    });
    o["qp_list" + pre] = qps;
    auto fault = [&](const char* n, const pipeline::FaultInjector& f) {
      const auto& st = f.stats();
      o[std::string("fault_") + n + pre] = {{"config", f.config().to_string()}, {"seen", st.seen},
                                            {"dropped", st.dropped},           {"duplicated", st.duplicated},
                                            {"reordered", st.reordered},       {"delayed", st.delayed},
                                            {"corrupted", st.corrupted},       {"ecn_marked", st.ecn_marked},
                                            {"rule_hits", st.rule_hits}};
    };
    fault("rx", p.dp->rx_faults());
    fault("tx", p.dp->tx_faults());
  }
  for (std::size_t k = 0; k < ports.size(); ++k) {
    const auto ps = ports[k]->stats();
    o["ethdev" + (k ? "_" + std::to_string(k) : std::string())] = {
        {"rx", ps.rx_frames},         {"tx", ps.tx_frames},       {"tx_dropped", ps.tx_dropped},
        {"tx_zero_copy", ps.tx_zero_copy}, {"tx_copied", ps.tx_copied}, {"imissed", ps.hw_imissed},
        {"dispatch_drops", ports[k]->dispatch_drops()}};
  }
  return o;
}

/// The control socket: one line in ("status", "fault rx SPEC", "fault tx
/// SPEC", "stop"), one line out. Served from the dataplane loop with poll().
class ControlServer {
 public:
  ControlServer(asio::io_context& io, const std::string& path, Daemon& d) : acceptor_(io), d_(d) {
    ::unlink(path.c_str());
    asio::local::stream_protocol::endpoint ep(path);
    acceptor_.open(ep.protocol());
    acceptor_.bind(ep);
    acceptor_.listen();
    accept();
  }

 private:
  struct Conn : std::enable_shared_from_this<Conn> {
    explicit Conn(asio::local::stream_protocol::socket s, Daemon& d) : sock(std::move(s)), in(kMaxControlLine), d(d) {}
    asio::local::stream_protocol::socket sock;
    asio::streambuf in;  // bounded: async_read_until fails once it holds kMaxControlLine bytes without a newline
    std::string out;
    Daemon& d;
    void start() {
      auto self = shared_from_this();
      asio::async_read_until(sock, in, '\n', [self](boost::system::error_code ec, std::size_t) {
        if (ec == asio::error::not_found) {  // no newline within the limit: refuse, answer once, close
          self->out = error("control line longer than " + std::to_string(kMaxControlLine) + " bytes") + "\n";
          asio::async_write(self->sock, asio::buffer(self->out), [self](boost::system::error_code, std::size_t) {
            boost::system::error_code ignored;
            self->sock.close(ignored);
          });
          return;
        }
        if (ec) return;
        std::istream is(&self->in);
        std::string line;
        std::getline(is, line);
        self->out = self->handle(line) + "\n";
        asio::async_write(self->sock, asio::buffer(self->out), [self](boost::system::error_code, std::size_t) {});
      });
    }
    static std::string error(const std::string& why) {
      return nlohmann::ordered_json{{"ok", false}, {"error", why}}.dump(-1, ' ', false,
                                                                          nlohmann::json::error_handler_t::replace);
    }
    static std::string ok() { return nlohmann::ordered_json{{"ok", true}}.dump(); }
    std::string handle(const std::string& line) {
      std::istringstream ls(line);
      std::string cmd;
      ls >> cmd;
      if (cmd == "status") return d.status_json();
      if (cmd == "stop") {
        g_stop = 1;
        return ok();
      }
      if (cmd == "fault") {
        std::string dir, spec, err;
        ls >> dir >> spec;
        pipeline::FaultConfig c;
        if (spec == "off") spec.clear();
        if ((dir != "rx" && dir != "tx") || !pipeline::FaultConfig::parse(spec, c, err))
          return error(err.empty() ? std::string("usage: fault rx|tx SPEC|off") : err);
        // The injector's config is read by the pipeline's own lcore, so live
        // changes are taken only by a daemon with one pipeline, which this
        // control lcore runs.
        if (d.pipes.size() != 1)
          return error("live fault changes need a single pipeline; use --fault-rx/--fault-tx at start");
        (dir == "rx" ? d.pipes[0]->dp->rx_faults() : d.pipes[0]->dp->tx_faults()).configure(c);
        log(1, "fault injection changed", "dir=" + dir + " config=\"" + c.to_string() + "\"");
        return ok();
      }
      // The command is echoed back, cut short: escaped by the JSON library
      // (quotes, backslashes, control bytes, invalid UTF-8 replaced).
      return error("unknown command '" + cmd.substr(0, 64) + "' (status, fault, stop)");
    }
  };
  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, asio::local::stream_protocol::socket s) {
      if (!ec) std::make_shared<Conn>(std::move(s), d_)->start();
      accept();
    });
  }
  asio::local::stream_protocol::acceptor acceptor_;
  Daemon& d_;
};

/// How the main lcore blocks when its pipeline is idle: in the io_context,
/// which watches the control socket, every session's socket and doorbell,
/// and a timer for the next poll tick (a timerfd, so the tick is exact to
/// the microsecond). Whatever becomes ready first wakes the loop.
class MainWait {
 public:
  explicit MainWait(asio::io_context& io) : io_(io), timer_(io) {}
  /// Blocks for at most `ns`, or until a socket or doorbell is ready.
  void sleep(std::uint64_t ns) {
    const auto want = asio::steady_timer::clock_type::now() + std::chrono::nanoseconds(ns);
    // A wait still pending from an earlier sleep that ended early is kept
    // when it ends no later than this one; otherwise it is moved (its
    // handler then runs once as aborted, a harmless extra wake-up).
    if (!pending_ || timer_.expiry() > want) {
      timer_.expires_at(want);
      pending_ = true;
      timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) pending_ = false;
      });
    }
    io_.run_one();
    io_.poll();
  }

 private:
  asio::io_context& io_;
  asio::steady_timer timer_;
  bool pending_ = false;
};

void capture_cb(void* ctx, wire::ConstBytes frame, bool /*tx*/, std::uint64_t /*now*/) {
  auto* w = static_cast<pcapio::Writer*>(ctx);
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  w->write(frame, ts.tv_sec, ts.tv_nsec / 1000);
}

std::size_t app_cb(void* ctx, std::uint64_t now) { return static_cast<control::TrafficApp*>(ctx)->step(now); }
std::size_t sessions_cb(void* ctx, std::uint64_t) { return static_cast<control::SessionServer*>(ctx)->step(); }

void learn_cb(void*, const wire::IpAddr& ip, const wire::MacAddr& mac) {
  char m[24];
  std::snprintf(m, sizeof m, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
  log(1, "neighbour learned", "ip=" + ip.to_string() + " mac=" + m);
}

}  // namespace

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

int main(int argc, char** argv) {
  ::signal(SIGSEGV, on_fatal_signal);
  ::signal(SIGBUS, on_fatal_signal);
  ::signal(SIGABRT, on_fatal_signal);
  std::vector<std::string> port_names, ip_texts;
  std::string lcores_text, app_socket;
  std::string app_socket_mode_text = "0660", app_socket_group;
  unsigned shards = 1, app_pipe_idx = 0;
  std::string config, capture_path, ctl_path, fault_rx, fault_tx, app_role, app_peer, app_ops,
      eal_extra, file_prefix, log_level;
  std::vector<std::string> vdevs, neighbors;
  bool no_huge = false, app_forever = false, tx_copy = false;
  pipeline::IdleConfig idle_cfg;
  bool busy_poll = false;
  unsigned mem_mb = 512, vlan = 0, pcp = 0, dscp = 0, ecn = 2, mtu = 1024, app_port = 18515, app_depth = 32,
           timeout = 14, retry_cnt = 7, lcore = 0;
  std::uint64_t app_messages = 1000;
  std::uint32_t app_size = 4096;
  double duration = 0;

  po::options_description opts("uroced options");
  opts.add_options()("help,h", "show this help")("config,c", po::value(&config), "config file (key = value)")
      ("port", po::value(&port_names)->composing(), "ethdev to use, e.g. net_memif0, net_af_packet0 or a PCI address (repeatable)")
      ("shards", po::value(&shards), "pipelines per port, one lcore each; QPs sharded by QPN (default 1)")
      ("lcores", po::value(&lcores_text), "lcores for the pipelines, e.g. 0,1 (default: --lcore and the next ones)")
      ("app-pipeline", po::value(&app_pipe_idx), "which pipeline runs the built-in app (default 0)")
      ("app-socket", po::value(&app_socket), "Unix socket where applications (liburoce) attach")
      ("app-socket-mode", po::value(&app_socket_mode_text), "permissions of the application socket, octal (default 0660)")
      ("app-socket-group", po::value(&app_socket_group), "group that owns the application socket (default: the daemon's)")
      ("vdev", po::value(&vdevs)->composing(), "create a DPDK vdev (repeatable), e.g. net_af_packet0,iface=veth0")
      ("no-huge", po::bool_switch(&no_huge), "run without hugepages")
      ("mem-mb", po::value(&mem_mb), "EAL memory in MB (default 512)")
      ("lcore", po::value(&lcore), "the first lcore to run on (default 0)")
      ("file-prefix", po::value(&file_prefix), "EAL file prefix (needed for several daemons on one host)")
      ("eal", po::value(&eal_extra), "extra EAL arguments, space separated")
      ("ip", po::value(&ip_texts)->composing(), "the RoCE address (GID), IPv4 or IPv6: one per --port, in order")
      ("neighbor", po::value(&neighbors)->composing(), "static neighbour IP=MAC (repeatable)")
      ("vlan", po::value(&vlan), "802.1Q VLAN ID for all traffic, 1..4094 (default: untagged)")
      ("pcp", po::value(&pcp), "802.1Q priority with --vlan, 0..7 (default 0)")
      ("dscp", po::value(&dscp), "DSCP for RoCE traffic, 0..63 (default 0)")
      ("ecn", po::value(&ecn), "ECN bits on data, 0..3 (default 2 = ECT(0))")
      ("capture", po::value(&capture_path), "write all RoCE traffic, both directions, to this pcap file")
      ("ctl-socket", po::value(&ctl_path), "Unix socket for status and control (status, fault, stop)")
      ("fault-rx", po::value(&fault_rx), "RX fault injection, e.g. drop=0.01,dup=0.01,reorder=0.02")
      ("fault-tx", po::value(&fault_tx), "TX fault injection, same syntax")
      ("tx-copy", po::bool_switch(&tx_copy), "always copy payloads into mbufs (no external-buffer zero-copy)")
      ("idle-spin-us", po::value(&idle_cfg.spin_us), "keep polling this long after the last work, then sleep (default 5)")
      ("poll-tick-us", po::value(&idle_cfg.tick_us),
       "sleep between polls while warm; bounds RX latency on PMDs without interrupts (default 20)")
      ("idle-warm-ms", po::value(&idle_cfg.warm_ms), "after this long without work, sleeps double (default 10)")
      ("idle-max-us", po::value(&idle_cfg.max_sleep_us), "longest idle sleep in us; 0 = always busy-poll (default 2000)")
      ("busy-poll", po::bool_switch(&busy_poll), "never sleep: poll all the time (for dedicated, pinned cores)")
      ("duration", po::value(&duration), "stop after this many seconds (0 = run until stopped)")
      ("log-level", po::value(&log_level), "debug, info, warn or error (default info)")
      ("app", po::value(&app_role), "built-in RC traffic: server or client")
      ("app-peer", po::value(&app_peer), "client: host of the server's TCP exchange")
      ("app-port", po::value(&app_port), "TCP port of the exchange (default 18515)")
      ("app-messages", po::value(&app_messages), "messages to run (default 1000)")
      ("app-size", po::value(&app_size), "message size in bytes, >= 8 (default 4096)")
      ("app-ops", po::value(&app_ops), "operations: send,write,read,atomic (default all)")
      ("app-depth", po::value(&app_depth), "messages in flight (default 32)")
      ("app-forever", po::bool_switch(&app_forever), "server: keep serving clients")
      ("mtu", po::value(&mtu), "path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)")
      ("timeout", po::value(&timeout), "QP timeout exponent 0..31: 4.096 us * 2^timeout (default 14)")
      ("retry-cnt", po::value(&retry_cnt), "QP retry count 0..7 (default 7)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("config")) {
      // A regular file of bounded size: not a device (/dev/zero never ends),
      // not a directory (which reads as empty and hides the mistake).
      const std::string path = vm["config"].as<std::string>();
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) {
        std::fprintf(stderr, "uroced: cannot read config file '%s': %s\n", path.c_str(), std::strerror(errno));
        return 2;
      }
      if (!S_ISREG(st.st_mode)) {
        std::fprintf(stderr, "uroced: config file '%s' is not a regular file\n", path.c_str());
        return 2;
      }
      if (st.st_size > kMaxConfigBytes) {
        std::fprintf(stderr, "uroced: config file '%s' is over %ld bytes\n", path.c_str(), kMaxConfigBytes);
        return 2;
      }
      std::ifstream f(path);
      if (!f) {
        std::fprintf(stderr, "uroced: cannot read config file '%s'\n", path.c_str());
        return 2;
      }
      po::store(po::parse_config_file(f, opts), vm);
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "uroced: %s (see --help)\n", e.what());
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  auto bad = [](const std::string& why) {
    std::fprintf(stderr, "uroced: %s\n", why.c_str());
    return 2;
  };
  if (!log_level.empty()) {
    const char* names[] = {"debug", "info", "warn", "error"};
    g_log_level = -1;
    for (int i = 0; i < 4; ++i)
      if (log_level == names[i]) g_log_level = i;
    if (g_log_level < 0) return bad("--log-level must be debug, info, warn or error");
  }
  if (port_names.empty()) return bad("--port is required (the ethdev to use)");
  if (ip_texts.size() != port_names.size())
    return bad("give one --ip per --port (" + std::to_string(port_names.size()) + " ports, " +
               std::to_string(ip_texts.size()) + " addresses)");
  std::vector<wire::IpAddr> ips(ip_texts.size());
  for (std::size_t i = 0; i < ip_texts.size(); ++i)
    if (!wire::IpAddr::parse(ip_texts[i], ips[i])) return bad("--ip must be an IPv4 or IPv6 address, got '" + ip_texts[i] + "'");
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
  if (!app_socket.empty() && !app_role.empty()) return bad("--app-socket and the built-in --app are exclusive");
  if (app_pipe_idx >= npipes) return bad("--app-pipeline must be below the number of pipelines (" + std::to_string(npipes) + ")");
  if (dscp > 63) return bad("--dscp must be 0..63");
  if (vm.count("vlan") && (vlan < 1 || vlan > 4094)) return bad("--vlan must be 1..4094");
  if (pcp > 7) return bad("--pcp must be 0..7");
  if (ecn > 3) return bad("--ecn must be 0..3");
  if (mtu != 256 && mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096)
    return bad("--mtu must be 256, 512, 1024, 2048 or 4096");
  if (timeout > 31) return bad("--timeout must be 0..31");
  if (!std::isfinite(duration) || duration < 0 || duration > 1e7) return bad("--duration must be 0..10000000 seconds");
  if (mem_mb < 64 || mem_mb > (1u << 20)) return bad("--mem-mb must be 64..1048576");
  if (app_port < 1 || app_port > 65535) return bad("--app-port must be 1..65535");
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
  if (idle_cfg.spin_us > 1'000'000 || idle_cfg.tick_us < 1 || idle_cfg.tick_us > 1'000'000 || idle_cfg.warm_ms > 60'000 ||
      idle_cfg.max_sleep_us > 1'000'000)
    return bad("--idle-spin-us 0..1000000, --poll-tick-us 1..1000000, --idle-warm-ms 0..60000, --idle-max-us 0..1000000");
  if (busy_poll) idle_cfg.max_sleep_us = 0;
  if (retry_cnt > 7) return bad("--retry-cnt must be 0..7");
  pipeline::FaultConfig frx, ftx;
  std::string err;
  if (!pipeline::FaultConfig::parse(fault_rx, frx, err)) return bad("--fault-rx: " + err);
  if (!pipeline::FaultConfig::parse(fault_tx, ftx, err)) return bad("--fault-tx: " + err);
  control::AppOptions ao;
  if (!app_role.empty()) {
    if (app_role == "server") ao.role = control::AppOptions::Role::kServer;
    else if (app_role == "client") ao.role = control::AppOptions::Role::kClient;
    else return bad("--app must be server or client");
    if (ao.role == control::AppOptions::Role::kClient && app_peer.empty()) return bad("--app client needs --app-peer");
    if (app_size < 8 || app_size > (64u << 20)) return bad("--app-size must be 8 bytes .. 64 MiB");
    if (app_depth == 0 || app_depth > 1024) return bad("--app-depth must be 1..1024");
    if (!app_ops.empty() && !control::parse_ops(app_ops, ao.ops, err)) return bad("--app-ops: " + err);
    ao.peer_host = app_peer;
    ao.port = static_cast<std::uint16_t>(app_port);
    ao.messages = app_messages;
    ao.size = app_size;
    ao.depth = app_depth;
    ao.mtu = static_cast<ibv_mtu>(__builtin_ctz(mtu) - 7);
    ao.timeout = static_cast<std::uint8_t>(timeout);
    ao.retry_cnt = static_cast<std::uint8_t>(retry_cnt);
    ao.forever = app_forever;
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

  // EAL from the configuration.
  std::string lcore_list;
  for (unsigned l : lcores) lcore_list += (lcore_list.empty() ? "" : ",") + std::to_string(l);
  std::vector<std::string> eal = {"-l", lcore_list, "--main-lcore", std::to_string(lcores[0]),
                                  "--log-level=lib.eal:warning"};
  if (no_huge) {
    eal.push_back("--no-huge");
    eal.push_back("-m");
    eal.push_back(std::to_string(mem_mb));
  }
  if (!file_prefix.empty()) eal.push_back("--file-prefix=" + file_prefix);
  // Vdev ports need no PCI scan (and a scan may grab devices it should not).
  bool all_vdev = true;
  for (const auto& pn : port_names) all_vdev = all_vdev && pn.rfind("net_", 0) == 0;
  if (all_vdev && eal_extra.find("-a ") == std::string::npos) eal.push_back("--no-pci");
  for (const auto& v : vdevs) {
    eal.push_back("--vdev=" + v);
    // DPDK 22.11's memif chains descriptors for frames larger than its buffer
    // (2048 bytes by default), and under 4 KiB-MTU load that path delivered
    // frames more than once here (a storm of duplicate ACKs and timeouts).
    if (v.rfind("net_memif", 0) == 0 && v.find("bsize=") == std::string::npos)
      log(2, "memif with its default 2048-byte buffers: frames over 2 KiB are chained; for path MTU 2048 or 4096 add "
             "bsize=8192 to the vdev (docs/deploy.md)",
          "vdev=" + v.substr(0, v.find(',')));
  }
  {
    std::istringstream es(eal_extra);
    std::string a;
    while (es >> a) eal.push_back(a);
  }
  if (!dpdk::eal_init(eal, err)) return bad(err);

  Daemon d;
  const std::uint64_t seed = now_ns();
  for (std::size_t pi = 0; pi < port_names.size(); ++pi) {
    dpdk::PortOptions popt;
    popt.name = port_names[pi];
    popt.zero_copy = !tx_copy;
    popt.shards = static_cast<std::uint16_t>(shards);
    auto port = dpdk::Port::open(popt, err);
    if (!port) {
      dpdk::eal_cleanup();
      return bad("port " + port_names[pi] + ": " + err);
    }
    for (unsigned sh = 0; sh < shards; ++sh) {
      auto p = std::make_unique<Pipeline>();
      p->port = port.get();
      p->port_name = port_names[pi];
      p->shard = static_cast<std::uint16_t>(sh);
      p->shards = static_cast<std::uint16_t>(shards);
      p->lcore = lcores[d.pipes.size()];
      transport::EngineConfig ec;
      ec.mac = port->mac();
      ec.ip = ips[pi];
      ec.dscp = static_cast<std::uint8_t>(dscp);
      ec.ecn = static_cast<std::uint8_t>(ecn);
      ec.vlan_tci = static_cast<std::uint16_t>(vlan ? (pcp << 13) | vlan : 0);
      ec.seed = seed + d.pipes.size();
      ec.ipv4_checksum_offload = port->ipv4_checksum_offload();
      ec.qpn_stride = shards;
      ec.qpn_offset = sh;
      p->eng = std::make_unique<transport::Engine>(ec);
      p->neigh = std::make_unique<pipeline::Neighbors>(p->eng->neighbors(), ec.mac, ec.ip, ec.vlan_tci);
      p->neigh->answer = sh == 0;  // every shard learns; one answers
      p->neigh->on_learn = learn_cb;
      for (const auto& [nip, nmac] : statics) p->eng->set_neighbor(nip, nmac);
      pipeline::PortIo& pio =
          shards > 1 ? port->shard(static_cast<std::uint16_t>(sh)) : static_cast<pipeline::PortIo&>(*port);
      p->dp = std::make_unique<pipeline::Dataplane>(*p->eng, pio, *p->neigh, ec.seed);
      p->dp->rx_faults().configure(frx);
      p->dp->tx_faults().configure(ftx);
      p->dp->set_idle(idle_cfg);
      if (!capture_path.empty()) {
        // One file per pipeline: the first is FILE, the others FILE.N.
        const std::string path = d.pipes.empty() ? capture_path : capture_path + "." + std::to_string(d.pipes.size());
        p->capture = std::make_unique<pcapio::Writer>();
        if (!p->capture->open(path)) return bad("--capture: " + p->capture->error());
        p->dp->set_capture(capture_cb, p->capture.get());
      }
      char macs[24];
      std::snprintf(macs, sizeof macs, "%02x:%02x:%02x:%02x:%02x:%02x", ec.mac[0], ec.mac[1], ec.mac[2], ec.mac[3],
                    ec.mac[4], ec.mac[5]);
      log(1, "uroced started",
          "port=" + port_names[pi] + " shard=" + std::to_string(sh) + "/" + std::to_string(shards) +
              " lcore=" + std::to_string(p->lcore) + " ip=" + ec.ip.to_string() + " mac=" + macs + " " +
              port->describe() + " fault_rx=\"" + frx.to_string() + "\" fault_tx=\"" + ftx.to_string() + "\"");
      d.pipes.push_back(std::move(p));
    }
    d.ports.push_back(std::move(port));
  }
  if (ao.role != control::AppOptions::Role::kNone) {
    Pipeline& ap = *d.pipes[app_pipe_idx];
    d.app = std::make_unique<control::TrafficApp>(*ap.eng, *ap.dp, *ap.neigh, ao);
    ap.dp->set_app(app_cb, d.app.get());
  }

  asio::io_context io;
  if (!app_socket.empty()) {
    try {
      d.sessions = std::make_unique<control::SessionServer>(
          io, app_socket, app_socket_mode, *d.pipes[0]->eng, control::SessionLimits{},
          [](void* ctx, const wire::IpAddr& ip) { static_cast<pipeline::Dataplane*>(ctx)->resolve(ip); },
          d.pipes[0]->dp.get());
    } catch (const std::exception& e) {
      return bad("--app-socket " + app_socket + ": " + e.what());
    }
    d.pipes[0]->dp->set_app(sessions_cb, d.sessions.get());
    if (app_socket_gid != static_cast<gid_t>(-1) && ::chown(app_socket.c_str(), static_cast<uid_t>(-1), app_socket_gid) != 0)
      return bad("--app-socket-group: cannot give " + app_socket + " to the group: " + std::strerror(errno));
  }
  std::unique_ptr<ControlServer> ctl;
  if (!ctl_path.empty()) {
    try {
      ctl = std::make_unique<ControlServer>(io, ctl_path, d);
    } catch (const std::exception& e) {
      return bad("--ctl-socket " + ctl_path + ": " + e.what());
    }
  }
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);

  // Pipelines after the first run on their own lcores; the main lcore runs
  // the first, the control socket and the lifecycle.
  for (std::size_t k = 1; k < d.pipes.size(); ++k) {
    Pipeline* p = d.pipes[k].get();
    const int lrc = rte_eal_remote_launch([](void* arg) { return run_pipeline(*static_cast<Pipeline*>(arg)); }, p,
                                          p->lcore);
    if (lrc != 0) return bad("cannot launch a pipeline on lcore " + std::to_string(p->lcore));
  }
  Pipeline& main_pipe = *d.pipes[0];
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // short idle sleeps really are short (default slack is 50 us)
  const std::uint64_t start = now_ns();
  std::uint64_t last_ctl = 0, stop_at = 0;
  int rc = 0;
  MainWait waiter(io);
  auto one_pass = [&](std::uint64_t now) {
    std::size_t work = 0;
    if (main_pipe.shards > 1) work += main_pipe.port->dispatch(frame_owner);
    return work + main_pipe.dp->iterate(now);
  };
  for (;;) {
    std::uint64_t now = now_ns();
    std::size_t work = one_pass(now);
    if (now - last_ctl > 1'000'000) {  // while busy, the control plane about every ms
      io.poll();
      last_ctl = now;
    }
    if (duration > 0 && now - start > static_cast<std::uint64_t>(duration * 1e9)) g_stop = 1;
    if (g_stop && stop_at == 0) {
      // Graceful stop: QPs to ERR, completions delivered, then exit.
      log(1, "stopping: flushing QPs");
      stop_at = now;
      if (d.app) d.app->request_shutdown();
    }
    if (d.app && d.app->finished()) {
      rc = d.app->exit_code();
      std::printf("%s\n", d.app->summary().c_str());
      std::fflush(stdout);
      break;
    }
    if (stop_at && (!d.app || now - stop_at > 2'000'000'000ull)) break;
    const std::uint64_t sleep_ns = main_pipe.dp->idle_sleep_ns(work, now);
    if (sleep_ns == 0) continue;
    // Going to block. Tell the applications first, then look at every ring
    // once more: a post published before they saw the flag is found here,
    // and one after it rings the doorbell (uroce_abi.h, the session page).
    if (d.sessions) d.sessions->set_sleeping(true);
    now = now_ns();
    if (one_pass(now) == 0 && !g_stop) {
      waiter.sleep(sleep_ns);
      last_ctl = now_ns();
    } else {
      main_pipe.dp->idle_sleep_ns(1, now);  // that pass found work: busy again
    }
    if (d.sessions) d.sessions->set_sleeping(false);
  }
  g_workers_stop = true;
  rte_eal_mp_wait_lcore();
  log(1, "uroced stopped", "status=" + d.status_json());
  for (auto& p : d.pipes)
    if (p->capture) p->capture->close();
  d.app.reset();
  d.sessions.reset();
  d.pipes.clear();
  d.ports.clear();
  dpdk::eal_cleanup();
  return rc;
}
