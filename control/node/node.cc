#include "control/node/node.h"

#include <execinfo.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include <rte_launch.h>
#include <rte_log.h>
#include <rte_lcore.h>

#include "control/node/accept_guard.h"
#include "control/node/sessions.h"
#include "control/node/log.h"
#include "control/node/metrics.h"
#include "control/node/metrics_server.h"
#include "control/node/preflight.h"
#include "control/node/privileges.h"
#include "control/node/sigbus_guard.h"
#include "control/node/systemd.h"
#include "drivers/dpdk/dpdk_port.h"
#include "drivers/host/host_tap.h"
#include "drivers/pcap/pcap_io.h"
#include "stack/pipeline/dataplane.h"
#include "stack/pipeline/shard.h"
#include "stack/pipeline/neigh.h"
#include "stack/abi/qp_attr.h"
#include "stack/abi/spin.h"
#include "stack/transport/engine.h"

namespace asio = boost::asio;

namespace uroce::control {

namespace {
int g_log_level = 1;  // the node's --log-level (one node per process)
/// The longest control line taken; a longer one is refused and its
/// connection closed, so a client cannot make the daemon buffer without end.
constexpr std::size_t kMaxControlLine = 4096;
/// Control connections served at once, and how long one may stay silent.
constexpr std::size_t kMaxControlConns = 64, kMaxControlConnsPerUid = 8;
constexpr std::chrono::seconds kControlIdle{5};
/// Control requests a uid other than root and the daemon's own may make,
/// a second and at once: each costs the daemon's loop (a status, about
/// 0.2 ms here), so one uid asking back to back would take that time from
/// every tenant's traffic. A request past them waits for its turn (it is
/// not refused), counted.
constexpr double kControlRequestsPerUid = 10;
}  // namespace

std::uint64_t now_ns() { return abi::monotonic_ns(); }  // the clock the waiting policy reads (abi/spin.h)

namespace {
/// Runs the control plane's ready handlers (accepts, session requests, CM
/// events, uroce-ctl) for at most this long at a time, so a flood of
/// connections or requests waits for the next slice (about every ms while
/// the pipeline is busy) instead of stalling every tenant's traffic.
constexpr std::uint64_t kControlSliceNs = 200'000;
std::size_t serve_control(boost::asio::io_context& io) {
  const std::uint64_t until = now_ns() + kControlSliceNs;
  std::size_t n = 0;
  while (io.poll_one() != 0) {
    ++n;
    if (now_ns() >= until) break;
  }
  return n;
}
}  // namespace

namespace {
volatile sig_atomic_t* g_stop_flag = nullptr;
const char* g_host_name = "uroced";

void on_stop_signal(int) {
  if (g_stop_flag) *g_stop_flag = 1;
}

/// SIGHUP (systemctl reload): the main loop reloads at its next pass.
volatile sig_atomic_t g_reload = 0;
void on_reload_signal(int) { g_reload = 1; }

/// A crash leaves a backtrace on stderr (async-signal-safe calls only), so a
/// rare failure in CI can be read from the log.
void on_fatal_signal(int sig) {
  static const char kMsg[] = ": fatal signal, backtrace:\n";
  (void)!::write(2, g_host_name, std::strlen(g_host_name));
  (void)!::write(2, kMsg, sizeof kMsg - 1);
  void* frames[48];
  backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void host_crash_signals(const char* name) {
  g_host_name = name;
  ::signal(SIGSEGV, on_fatal_signal);
  ::signal(SIGBUS, on_fatal_signal);
  ::signal(SIGABRT, on_fatal_signal);
}

void host_stop_signals(volatile sig_atomic_t* stop) {
  g_stop_flag = stop;
  ::signal(SIGTERM, on_stop_signal);
  ::signal(SIGINT, on_stop_signal);
  ::signal(SIGHUP, on_reload_signal);
  ::signal(SIGPIPE, SIG_IGN);
}
}  // namespace

int host_main(const char* name, int argc, char** argv, const ExtraOptions& extra,
              const std::function<StageSpec()>& stage) {
  static volatile sig_atomic_t stop = 0;
  host_crash_signals(name);
  NodeOptions o;
  std::string text;
  switch (parse_options(argc, argv, o, text, extra)) {
    case ParseResult::kHelp:
      std::printf("%s\n", text.c_str());
      return 0;
    case ParseResult::kError:
      std::fprintf(stderr, "%s: %s\n", name, text.c_str());
      return 2;
    case ParseResult::kOk:
      break;
  }
  if (o.check) return preflight(o, o.check_root, std::cout) == 0 ? 0 : 1;  // the host, not started
  std::string err;
  auto node = Node::start(o, /*embedded=*/false, err, stage ? stage() : StageSpec{});
  if (!node) {
    std::fprintf(stderr, "%s: %s\n", name, err.c_str());
    return 2;
  }
  host_stop_signals(&stop);
  const int rc = node->run(stop);
  node.reset();
  return rc;
}

/// One poll-mode pipeline: an engine with its dataplane, on one lcore, over
/// one port (or one shard of a port).
struct Node::Pipeline {
  dpdk::Port* port = nullptr;
  std::string port_name;
  std::uint16_t shard = 0;
  std::uint16_t shards = 1;
  unsigned lcore = 0;
  std::unique_ptr<transport::Engine> eng;
  std::unique_ptr<pipeline::Neighbors> neigh;
  std::unique_ptr<pipeline::Dataplane> dp;
  std::unique_ptr<pcapio::Writer> capture;
  const std::atomic<bool>* stop = nullptr;  // worker lcores: the node's stop flag
  /// Passes of its loop so far (written by the pipeline's own thread only):
  /// the systemd watchdog is fed while every pipeline's count moves.
  std::atomic<std::uint64_t> passes{0};
  void passed() { passes.store(passes.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
};

namespace {

/// The loop of a pipeline on a worker lcore. (A sharded port's shard 0,
/// which also dispatches, may run here too when it is not the first port.)
int run_pipeline(Node::Pipeline& p) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // short idle sleeps really are short
  while (!p.stop->load(std::memory_order_relaxed)) {
    const std::uint64_t now = now_ns();
    std::size_t work = 0;
    if (p.shards > 1 && p.shard == 0) work += p.port->dispatch(pipeline::frame_owner);
    work += p.dp->iterate(now);
    p.passed();
    p.dp->idle(work);
  }
  return 0;
}

void capture_cb(void* ctx, wire::ConstBytes frame, bool /*tx*/, std::uint64_t /*now*/) {
  auto* w = static_cast<pcapio::Writer*>(ctx);
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  w->write(frame, ts.tv_sec, ts.tv_nsec / 1000);
}

std::size_t stage_cb(void* ctx, std::uint64_t now) { return static_cast<Stage*>(ctx)->step(now); }
std::size_t sessions_cb(void* ctx, std::uint64_t) { return static_cast<SessionServer*>(ctx)->step(); }

/// With --log-format json, DPDK's own lines (the EAL's, the drivers') are
/// the node's JSON lines too: DPDK writes to a stream whose lines end in
/// log(), with source=dpdk, at the level DPDK gave the message. Once a
/// process, before the EAL starts.
void route_dpdk_log() {
  static bool done = false;
  if (done) return;
  done = true;
  cookie_io_functions_t io{};
  io.write = [](void*, const char* buf, size_t n) -> ssize_t {
    thread_local std::string pending;
    pending.append(buf, n);
    for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
      if (nl == 0) continue;
      const int l = rte_log_cur_msg_loglevel();
      log(l <= static_cast<int>(RTE_LOG_ERR) ? 3 : l == static_cast<int>(RTE_LOG_WARNING) ? 2
          : l == static_cast<int>(RTE_LOG_DEBUG)                                        ? 0
                                                                                          : 1,
          pending.substr(0, nl), "source=dpdk");
    }
    return static_cast<ssize_t>(n);
  };
  if (FILE* f = fopencookie(nullptr, "w", io)) {
    std::setvbuf(f, nullptr, _IONBF, 0);
    rte_openlog_stream(f);
  }
}

void learn_cb(void*, const wire::IpAddr& ip, const wire::MacAddr& mac) {
  char m[24];
  std::snprintf(m, sizeof m, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
  // A peer decides how often this happens (ARP, ND, any source address):
  // a few lines a second at most, each pipeline's thread its own limit.
  thread_local LogLimit limit(5, 20);
  std::uint64_t held = 0;
  if (!limit.allow(now_ns(), &held)) return;
  log(1, "neighbour learned",
      "ip=" + ip.to_string() + " mac=" + m + (held ? " suppressed=" + std::to_string(held) : std::string()));
}

}  // namespace

namespace {
/// A QP's congestion control as the status shows it (uroce-ctl watch and
/// telemetry read it).
nlohmann::ordered_json cc_json(const transport::CcReport& r) {
  return {{"algorithm", std::string(r.algorithm)},
          {"pace_bps", r.pace_bps},
          {"window", r.window},
          {"rate_bps", r.state.rate_bps},
          {"target_bps", r.state.target_bps},
          {"alpha", r.state.alpha},
          {"cwnd", r.state.window},
          {"rtt_samples", r.rtt_samples},
          {"rtt_min_ns", r.rtt_min_ns},
          {"rtt_mean_ns", r.rtt_mean_ns},
          {"rtt_p99_ns", r.rtt_p99_ns}};
}
}  // namespace

std::string Node::status_json() const {
  return status().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::unique_ptr<MetricsServer> Node::open_metrics(const std::string& addr, std::string& err) {
  // Prometheus: each scrape renders the status, on this lcore's io_context.
  boost::asio::ip::tcp::endpoint ep;
  std::string why;
  if (!MetricsServer::parse(addr, ep, why)) {
    err = "--metrics: " + why;
    return nullptr;
  }
  try {
    return std::make_unique<MetricsServer>(
        io_, ep, [this] { return render_metrics(status(), MetricsOptions{opts_.metrics_qps}); });
  } catch (const std::exception& e) {
    err = "--metrics " + addr + ": " + e.what();
    return nullptr;
  }
}

nlohmann::ordered_json Node::reload() {
  using json = nlohmann::ordered_json;
  auto refuse = [](const std::string& why) { return json{{"ok", false}, {"error", why}}; };
  if (embedded_) return refuse("an embedded node's options are its application's: nothing to reload");
  NodeOptions n;
  std::string text;
  std::vector<const char*> argv = {"uroced"};
  for (const auto& a : opts_.args) argv.push_back(a.c_str());
  if (parse_options(static_cast<int>(argv.size()), argv.data(), n, text) != ParseResult::kOk)
    return refuse("the configuration does not parse: " + text);
  const NodeOptions& o = opts_;
  // What a running node cannot take without restarting: named, and the
  // whole reload refused.
  std::vector<std::string> fixed;
  auto same = [&fixed](bool eq, const char* name) {
    if (!eq) fixed.emplace_back(name);
  };
  same(n.ports == o.ports && n.vdevs == o.vdevs, "port/vdev");
  same(n.ips == o.ips && n.prefixes == o.prefixes, "ip");
  same(n.host_netdev == o.host_netdev, "host-netdev");
  same(n.shards == o.shards, "shards");
  same(n.lcores == o.lcores, "lcore");
  same(n.app_socket == o.app_socket && n.app_socket_mode == o.app_socket_mode && n.app_socket_gid == o.app_socket_gid,
       "app-socket");
  same(n.no_huge == o.no_huge && n.mem_mb == o.mem_mb && n.file_prefix == o.file_prefix && n.eal_extra == o.eal_extra,
       "EAL (no-huge, mem-mb, file-prefix, eal)");
  same(n.neighbors == o.neighbors, "neighbor");
  same(n.vlan == o.vlan && n.pcp == o.pcp, "vlan/pcp");
  same(n.dscp == o.dscp && n.ecn == o.ecn, "dscp/ecn");
  same(n.cnp_interval_us == o.cnp_interval_us && n.cnp_dscp == o.cnp_dscp, "cnp-interval-us/cnp-dscp");
  same(n.line_rate_mbps == o.line_rate_mbps, "line-rate-mbps");
  same(n.capture == o.capture, "capture");
  same(n.ctl_socket == o.ctl_socket, "ctl-socket");
  same(n.tx_copy == o.tx_copy && n.mtu == o.mtu && n.rx_interrupts == o.rx_interrupts && n.idle == o.idle,
       "the port's I/O (tx-copy, link-mtu, rx-interrupts, idle)");
  same(n.duration == o.duration, "duration");
  same(n.limits.odp == o.limits.odp, "odp");
  // The live ones that pipelines own: taken on the main lcore, so only
  // with one pipeline (as the control socket's fault and cc commands).
  const bool cc_changed = n.cc != o.cc;
  const bool faults_changed =
      n.fault_rx.to_string() != o.fault_rx.to_string() || n.fault_tx.to_string() != o.fault_tx.to_string();
  if ((cc_changed || faults_changed) && pipes_.size() != 1)
    fixed.emplace_back(cc_changed ? "cc (live with one pipeline only)" : "fault-rx/fault-tx (live with one pipeline only)");
  if (!fixed.empty()) {
    std::string names;
    for (const auto& f : fixed) names += (names.empty() ? "" : ", ") + f;
    json r = refuse("cannot change live (restart uroced for these): " + names);
    r["not_live"] = fixed;
    return r;
  }
  // A new metrics endpoint is bound before anything changes: a port in use
  // refuses the reload.
  std::unique_ptr<MetricsServer> metrics;
  const bool metrics_changed = n.metrics != o.metrics;
  if (metrics_changed && !n.metrics.empty()) {
    boost::asio::ip::tcp::endpoint ep;
    std::string why;
    if (!MetricsServer::parse(n.metrics, ep, why)) return refuse("--metrics: " + why);
    metrics_.reset();  // the old endpoint's port may be the new one's
    metrics = open_metrics(n.metrics, why);
    if (!metrics) return refuse(why + " (the endpoint is now off)");
  }
  json changed = json::array();
  if (cc_changed) {
    pipes_[0]->eng->set_default_cc(n.cc);  // parse_options checked the name
    changed.push_back("cc");
  }
  if (faults_changed) {
    pipes_[0]->dp->rx_faults().configure(n.fault_rx);
    pipes_[0]->dp->tx_faults().configure(n.fault_tx);
    changed.push_back("fault");
  }
  if (!(n.limits == o.limits)) {
    if (sessions_) sessions_->set_limits(n.limits);
    changed.push_back("limits");
  }
  if (n.log_level != o.log_level || n.log_json != o.log_json) {
    g_log_level = n.log_level;
    set_log(n.log_level, n.log_json ? LogFormat::kJson : LogFormat::kText);
    changed.push_back("log");
  }
  if (metrics_changed) {
    metrics_ = std::move(metrics);
    changed.push_back("metrics");
  }
  if (n.metrics_qps != o.metrics_qps) changed.push_back("metrics-qps");
  const std::vector<std::string> args = opts_.args;
  opts_ = n;
  opts_.args = args;
  log(1, "reloaded", "changed=" + log_value(changed.dump()));
  return json{{"ok", true}, {"changed", changed}};
}

nlohmann::ordered_json Node::status() const {
  // Counters are read while other lcores update them: each is an aligned
  // 64-bit load, so a value may be a moment old but is never torn.
  using json = nlohmann::ordered_json;
  json o;
  o["pipelines"] = pipes_.size();
  o["stage"] = stage_ ? (stage_->finished() ? "done" : "running") : "none";
  o["sessions"] = sessions_ ? sessions_->sessions() : 0;
  o["session_list"] = sessions_ ? sessions_->describe() : json::array();
  o["cm"] = sessions_ ? sessions_->cm_status() : json::object();
  if (intake_) {
    const pipeline::Intake::Counters& ic = intake_->counters();
    o["intake"] = {{"names", ic.names}, {"foreign", ic.foreign}, {"overflows", ic.overflows}, {"looks", ic.looks},
                   {"scans", ic.scans}};
  }
  if (!pipes_.empty()) {
    const pipeline::IdleConfig& ic = pipes_[0]->dp->idle_config();
    o["wait"] = {{"busy_poll", ic.max_sleep_us == 0},
                 {"spin_us", ic.spin_us},
                 {"spin_max_us", ic.spin_max_us},
                 {"tick_us", ic.tick_us},
                 {"warm_ms", ic.warm_ms},
                 {"max_sleep_us", ic.max_sleep_us},
                 {"doorbells", sessions_ ? sessions_->doorbells() : 0},
                 {"cq_notifies", sessions_ ? sessions_->cq_notifies() : 0},
                 {"late_yields", pipes_[0]->dp->late_yields()},
                 {"gap_us", pipes_[0]->dp->average_gap_ns() / 1000},
                 {"window_us", pipes_[0]->dp->spin_window_ns(now_ns()) / 1000},
                 {"rx_interrupts", pipes_[0]->dp->rx_wakes()},
                 {"rx_wakes", rx_wakes_},
                 {"host_wakes", host_wakes_}};
  }
  if (host_) {
    const host::TapStats& hs = host_->stats();
    o["host_netdev"] = {{"name", host_->name()},
                        {"from_kernel", hs.rx_frames},
                        {"to_kernel", hs.tx_frames},
                        {"to_kernel_dropped", hs.tx_dropped}};
  } else {
    o["host_netdev"] = nullptr;
  }
  o["limits"] = sessions_ ? sessions_->limits_status() : nlohmann::ordered_json::object();
  o["limits"]["control_line_bytes"] = kMaxControlLine;
  o["limits"]["max_control_conns"] = kMaxControlConns;
  o["limits"]["max_control_conns_per_uid"] = kMaxControlConnsPerUid;
  o["limits"]["control_requests_per_uid_per_second"] = kControlRequestsPerUid;
  if (o["limits"].contains("refused")) o["limits"]["refused"]["control_conns"] = ctl_refused_;
  o["limits"]["delayed"] = {{"control_requests", ctl_delayed_}};
  for (std::size_t k = 0; k < pipes_.size(); ++k) {
    const Pipeline& p = *pipes_[k];
    const std::string pre = k == 0 ? "" : "_" + std::to_string(k);
    o["pipeline" + pre] = {{"port", p.port_name}, {"shard", p.shard},
                           {"lcore", p.lcore},    {"ip", p.eng->config().ip.to_string()},
                           {"qps", p.eng->qp_count()},
                           {"quarantined_qpns", p.eng->quarantined_count()}};
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
      e["cc"] = cc_json(p.eng->cc_report(q));
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
  for (std::size_t k = 0; k < ports_.size(); ++k) {
    const auto ps = ports_[k]->stats();
    o["ethdev" + (k ? "_" + std::to_string(k) : std::string())] = {
        {"rx", ps.rx_frames},         {"tx", ps.tx_frames},       {"tx_dropped", ps.tx_dropped},
        {"tx_zero_copy", ps.tx_zero_copy}, {"tx_copied", ps.tx_copied}, {"tx_looped", ps.tx_looped}, {"imissed", ps.hw_imissed},
        {"dispatch_drops", ports_[k]->dispatch_drops()}};
  }
  return o;
}

/// The control socket: one line in ("status", "fault rx SPEC", "fault tx
/// SPEC", "stop"), one line out. Served from the dataplane loop with poll().
class Node::ControlServer {
 public:
  ControlServer(asio::io_context& io, const std::string& path, Node& d) : acceptor_(io), d_(d) {
    ::unlink(path.c_str());
    asio::local::stream_protocol::endpoint ep(path);
    acceptor_.open(ep.protocol());
    acceptor_.bind(ep);
    acceptor_.listen();
    accept();
  }

 private:
  /// Connections being served, in all and per uid (SO_PEERCRED; -1:
  /// unknown), and the request rate of each uid that is bounded.
  struct Open {
    std::size_t total = 0;
    std::map<int, std::size_t> per_uid;
    std::map<int, TokenBucket> rate;
    /// 0 when `uid` may make a request now, else how long until it may.
    std::uint64_t take(int uid, std::uint64_t now) {
      if (uid == 0 || uid == static_cast<int>(::geteuid())) return 0;  // the operator's own
      if (rate.size() >= kMaxControlConns) std::erase_if(rate, [&](const auto& r) { return r.second.full(now); });
      if (rate.size() >= kMaxControlConns && !rate.contains(uid)) return 1'000'000;  // so many uids at once: wait a little
      return rate.try_emplace(uid, kControlRequestsPerUid, kControlRequestsPerUid).first->second.take(now);
    }
  };
  struct Conn : std::enable_shared_from_this<Conn> {
    Conn(asio::local::stream_protocol::socket s, Node& d, std::shared_ptr<Open> open, int uid)
        : sock(std::move(s)), in(kMaxControlLine), d(d), deadline(sock.get_executor()), open(std::move(open)),
          uid(uid) {
      ++this->open->total;
      ++this->open->per_uid[uid];
    }
    ~Conn() {
      --open->total;
      if (--open->per_uid[uid] == 0) open->per_uid.erase(uid);
    }
    asio::local::stream_protocol::socket sock;
    asio::streambuf in;  // bounded: async_read_until fails once it holds kMaxControlLine bytes without a newline
    std::string out;
    Node& d;
    asio::steady_timer deadline;  // a client that says nothing is closed after kControlIdle
    asio::steady_timer turn{sock.get_executor()};  // a request past its uid's rate waits on this
    std::shared_ptr<Open> open;  // shared: a Conn may outlive the server in the io_context
    int uid;
    bool waited = false;  // its request was counted as delayed
    void start() {
      auto self = shared_from_this();
      deadline.expires_after(kControlIdle);
      deadline.async_wait([self](boost::system::error_code ec) {
        boost::system::error_code ignored;
        if (ec) return;
        self->sock.close(ignored);
        self->turn.cancel();
      });
      asio::async_read_until(sock, in, '\n', [self](boost::system::error_code ec, std::size_t) {
        // The deadline stays armed through the reply's write: a client that
        // never reads it is closed too.
        if (ec == asio::error::not_found) {  // no newline within the limit: refuse, answer once, close
          self->out = error("control line longer than " + std::to_string(kMaxControlLine) + " bytes") + "\n";
          asio::async_write(self->sock, asio::buffer(self->out), [self](boost::system::error_code, std::size_t) {
            boost::system::error_code ignored;
            self->sock.close(ignored);
          });
          return;
        }
        if (ec) {  // the client hung up (or worse): the connection is let go now, not at its deadline
          self->deadline.cancel();
          return;
        }
        std::istream is(&self->in);
        std::string line;
        std::getline(is, line);
        self->serve(std::move(line));
      });
    }
    /// Answers `line` now, or when its uid may make another request.
    void serve(std::string line) {
      if (!sock.is_open()) return;  // closed at its deadline while it waited
      if (const std::uint64_t wait = open->take(uid, now_ns()); wait != 0) {
        if (!waited) ++d.ctl_delayed_;
        waited = true;
        turn.expires_after(std::chrono::nanoseconds(wait));
        turn.async_wait([self = shared_from_this(), line = std::move(line)](boost::system::error_code ec) mutable {
          if (!ec) self->serve(std::move(line));
        });
        return;
      }
      out = handle(line) + "\n";
      asio::async_write(sock, asio::buffer(out),
                        [self = shared_from_this()](boost::system::error_code, std::size_t) { self->deadline.cancel(); });
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
      if (cmd == "reload") return d.reload().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      if (cmd == "stop") {
        if (d.embedded_) return error("an embedded node stops when its application closes the device");
        d.stop_requested_ = true;
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
        if (d.pipes_.size() != 1)
          return error("live fault changes need a single pipeline; use --fault-rx/--fault-tx at start");
        (dir == "rx" ? d.pipes_[0]->dp->rx_faults() : d.pipes_[0]->dp->tx_faults()).configure(c);
        log(1, "fault injection changed", "dir=" + dir + " config=" + log_value(c.to_string()));
        return ok();
      }
      if (cmd == "cc") {
        // cc QPN NAME: one QP's congestion control, live. Like fault, only
        // with one pipeline: its QPs belong to this lcore.
        std::string qpn_text, name;
        ls >> qpn_text >> name;
        char* end = nullptr;
        const unsigned long qpn = std::strtoul(qpn_text.c_str(), &end, 0);
        if (qpn_text.empty() || *end != '\0' || name.empty()) return error("usage: cc QPN none|dcqcn|swift");
        if (d.pipes_.size() != 1) return error("live congestion-control changes need a single pipeline; use --cc at start");
        transport::Engine& eng = *d.pipes_[0]->eng;
        transport::Qp* qp = qpn <= 0xffffff ? eng.find_qp(static_cast<std::uint32_t>(qpn)) : nullptr;
        if (qp == nullptr) return error("no such QP");
        if (cc::find(name) == nullptr) return error("no congestion control named '" + name.substr(0, 32) + "'");
        const int rc = eng.set_cc(qp, name);
        // The engine's one refusal of a known name: an algorithm that needs ACKs, on UD.
        if (rc == EOPNOTSUPP) return error(cc::ud_refusal(name));
        if (rc != 0) return error(std::strerror(rc));
        log(1, "congestion control changed", "qpn=" + std::to_string(qpn) + " cc=" + name);
        // The QP's algorithm as the engine now has it: the caller's proof.
        return nlohmann::ordered_json{{"ok", true}, {"qpn", qpn}, {"cc", std::string(eng.cc_report(*qp).algorithm)}}.dump();
      }
      // The command is echoed back, cut short: escaped by the JSON library
      // (quotes, backslashes, control bytes, invalid UTF-8 replaced).
      return error("unknown command '" + cmd.substr(0, 64) + "' (status, reload, fault, cc, stop)");
    }
  };
  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, asio::local::stream_protocol::socket s) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors or worse: shed, pause, accept again (no spin).
      if (guard_.retry_on_failure(ec, acceptor_.native_handle(), pause_, [this] { accept(); })) return;
      // A flood of clients: this one is closed at once, past the bound in
      // all or its uid's own (so one uid's flood cannot lock the others out).
      ucred cred{};
      socklen_t len = sizeof cred;
      const int uid = ::getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0
                          ? static_cast<int>(cred.uid)
                          : -1;
      const auto mine = open_->per_uid.find(uid);
      if (open_->total >= kMaxControlConns ||
          (mine != open_->per_uid.end() && mine->second >= kMaxControlConnsPerUid)) {
        ++d_.ctl_refused_;
        boost::system::error_code ignored;
        s.close(ignored);
      } else {
        std::make_shared<Conn>(std::move(s), d_, open_, uid)->start();
      }
      accept();
    });
  }
  asio::local::stream_protocol::acceptor acceptor_;
  Node& d_;
  AcceptGuard guard_;
  asio::steady_timer pause_{acceptor_.get_executor()};
  std::shared_ptr<Open> open_ = std::make_shared<Open>();
};

/// Memory for the asynchronous waits MainWait starts on every sleep. Asio
/// allocates each wait's state through its handler's allocator, and its
/// default one recycles only inside io_context::run on the same thread;
/// these waits start outside it, so each sleep would cost a heap allocation.
/// A few fixed blocks serve every wait instead (a moved timer wait and its
/// successor are alive at once); more at once falls back to the heap. One
/// set, in static storage: a wait cancelled when MainWait goes is freed
/// later, when the io_context runs or is destroyed, so the blocks must
/// outlive any MainWait (and their destructor is trivial, so nothing goes
/// before the last node does). Only the main lcore's Node::run uses them.
namespace {
class WaitSlots {
 public:
  void* allocate(std::size_t n) {
    for (auto& b : blocks_)
      if (!b.used && n <= sizeof b.mem) {
        b.used = true;
        return b.mem;
      }
    return ::operator new(n);
  }
  void deallocate(void* p) {
    for (auto& b : blocks_)
      if (p == b.mem) {
        b.used = false;
        return;
      }
    ::operator delete(p);
  }

 private:
  struct Block {
    alignas(std::max_align_t) unsigned char mem[256];
    bool used = false;
  };
  Block blocks_[4];
};

template <typename T>
struct WaitAllocator {
  using value_type = T;
  WaitSlots* slots;
  explicit WaitAllocator(WaitSlots& s) noexcept : slots(&s) {}
  template <typename U>
  WaitAllocator(const WaitAllocator<U>& o) noexcept : slots(o.slots) {}  // NOLINT: rebinding, as allocators do
  T* allocate(std::size_t n) { return static_cast<T*>(slots->allocate(sizeof(T) * n)); }
  void deallocate(T* p, std::size_t) noexcept { slots->deallocate(p); }
  template <typename U>
  bool operator==(const WaitAllocator<U>& o) const noexcept { return slots == o.slots; }
  template <typename U>
  bool operator!=(const WaitAllocator<U>& o) const noexcept { return slots != o.slots; }
};

/// A wait's handler that asio allocates for from `slots`.
template <typename F>
struct SlotHandler {
  using allocator_type = WaitAllocator<F>;
  WaitSlots* slots;
  F f;
  allocator_type get_allocator() const noexcept { return allocator_type(*slots); }
  void operator()(boost::system::error_code ec) { f(ec); }
};
template <typename F>
SlotHandler<F> in_slots(WaitSlots& s, F f) {
  return {&s, std::move(f)};
}
WaitSlots g_wait_slots;
}  // namespace

/// How the main lcore blocks when its pipeline is idle: in the io_context,
/// which watches the control socket, every session's socket and doorbell,
/// and a timer for the next poll tick (a timerfd, so the tick is exact to
/// the microsecond). Whatever becomes ready first wakes the loop.
class Node::MainWait {
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
      timer_.async_wait(in_slots(g_wait_slots, [this](boost::system::error_code ec) {
        if (!ec) pending_ = false;
      }));
    }
    io_.run_one();
    serve_control(io_);
  }
  /// Also wake when `fd`, the port's RX interrupt, is readable; each such
  /// wake-up is counted in `*wakes`.
  void watch_rx(int fd, std::uint64_t* wakes) {
    rx_.emplace(io_, ::dup(fd));
    rx_wakes_ = wakes;
  }
  /// Also wake when `fd` (the host netdev) is readable.
  void watch_host(int fd, std::uint64_t* wakes) {
    host_.emplace(io_, ::dup(fd));
    host_wakes_ = wakes;
  }
  /// Before the loop's last look at the port and the host netdev: from
  /// here a frame from either ends the coming sleep (asio's epoll is
  /// edge-triggered, so the wait must be registered before that look, not
  /// after it).
  void arm() {
    if (host_ && !host_pending_) {
      host_pending_ = true;
      host_->async_wait(asio::posix::descriptor_base::wait_read, in_slots(g_wait_slots, [this](boost::system::error_code ec) {
        if (ec == asio::error::operation_aborted) return;
        host_pending_ = false;
        if (!ec) ++*host_wakes_;
      }));
    }
    if (!rx_ || rx_pending_) return;
    rx_pending_ = true;
    auto woke = [this](boost::system::error_code ec) {
      if (ec == asio::error::operation_aborted) return;  // the waiter is going away
      rx_pending_ = false;
      if (!ec) ++*rx_wakes_;
    };
    rx_->async_wait(asio::posix::descriptor_base::wait_read, in_slots(g_wait_slots, woke));
  }

 private:
  asio::io_context& io_;
  asio::steady_timer timer_;
  bool pending_ = false;
  std::optional<asio::posix::stream_descriptor> rx_;
  bool rx_pending_ = false;
  std::uint64_t* rx_wakes_ = nullptr;
  std::optional<asio::posix::stream_descriptor> host_;
  bool host_pending_ = false;
  std::uint64_t* host_wakes_ = nullptr;
};

Node::Node() = default;

/// The host netdev (drivers/host) of pipeline 0, as the options ask.
bool Node::open_host_netdev(Node& n, const NodeOptions& o, bool embedded, std::string& err) {
  // "auto": a daemon that serves applications gets one, named as its device.
  const std::string name = host_netdev_name(o, embedded, n.pipes_.size());
  if (name.empty()) return true;
  if (n.pipes_.size() != 1) {
    err = "--host-netdev needs a single pipeline (one port, --shards 1)";
    return false;
  }
  Pipeline& p = *n.pipes_[0];
  host::TapOptions t;
  t.name = name;
  t.mac = p.port->mac();
  t.ip = o.ips[0];
  t.prefix = o.prefixes.empty() ? 0 : o.prefixes[0];
  t.mtu = p.port->link().mtu;
  n.host_ = host::HostTap::open(t, err);
  if (!n.host_) {
    err = "host netdev: " + err + " (--no-host-netdev runs without one)";
    return false;
  }
  p.neigh->answer = false;  // the host's stack answers ARP, ND and ICMP for the address
  p.dp->set_host(n.host_.get());
  log(1, "host netdev up", "name=" + n.host_->name() + " ip=" + t.ip.to_string() +
                               (t.prefix ? "/" + std::to_string(t.prefix) : std::string()));
  return true;
}

std::unique_ptr<Node> Node::start(const NodeOptions& o, bool embedded, std::string& err, const StageSpec& stage) {
  g_log_level = o.log_level;
  set_log(o.log_level, o.log_json ? LogFormat::kJson : LogFormat::kText);
  std::unique_ptr<Node> n(new Node());
  n->embedded_ = embedded;
  n->opts_ = o;
  // EAL from the configuration.
  std::string lcore_list;
  for (unsigned l : o.lcores) lcore_list += (lcore_list.empty() ? "" : ",") + std::to_string(l);
  std::vector<std::string> eal = {"-l", lcore_list, "--main-lcore", std::to_string(o.lcores[0]),
                                  "--log-level=lib.eal:warning"};
  if (o.no_huge) {
    eal.push_back("--no-huge");
    eal.push_back("-m");
    eal.push_back(std::to_string(o.mem_mb));
  }
  if (!o.file_prefix.empty()) eal.push_back("--file-prefix=" + o.file_prefix);
  if (embedded) eal.push_back("--no-telemetry");  // no socket, and no line on the application's stderr
  // Vdev ports need no PCI scan (and a scan may grab devices it should not).
  bool all_vdev = true;
  for (const auto& pn : o.ports) all_vdev = all_vdev && pn.rfind("net_", 0) == 0;
  if (all_vdev && o.eal_extra.find("-a ") == std::string::npos) eal.push_back("--no-pci");
  for (const auto& v : o.vdevs) {
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
    std::istringstream es(o.eal_extra);
    std::string a;
    while (es >> a) eal.push_back(a);
  }
  if (!is_root()) {
    // Unprivileged (the units' User=uroce): the ports' capabilities named
    // here, not as a driver's failure to probe; hugepages from memfd (a
    // hugetlbfs mount's files are root's) and no shared files (--no-huge
    // keeps its own in $XDG_RUNTIME_DIR).
    for (const PrivilegeNeed& nd : privileges(o, host_netdev_name(o, embedded, o.ports.size() * o.shards)))
      if (!nd.missing.empty()) {
        err = nd.what + " needs " + nd.needs + "; this process (uid " + std::to_string(::geteuid()) +
              ", capabilities: " + held_capabilities() + ") lacks " + nd.missing +
              ": run it as root, or grant them (the units' AmbientCapabilities=; docs/deploy.md)";
        return nullptr;
      }
    if (!o.no_huge && o.eal_extra.find("--in-memory") == std::string::npos) eal.push_back("--in-memory");
    log(1, "unprivileged", "uid=" + std::to_string(::geteuid()) + " capabilities=" + log_value(held_capabilities()));
  }
  if (o.log_json) route_dpdk_log();
  if (!dpdk::eal_init(eal, err)) return nullptr;

  const std::uint64_t seed = now_ns();
  for (std::size_t pi = 0; pi < o.ports.size(); ++pi) {
    dpdk::PortOptions popt;
    popt.name = o.ports[pi];
    popt.zero_copy = !o.tx_copy;
    popt.rx_interrupts = o.rx_interrupts;
    popt.mtu = o.mtu;
    popt.shards = static_cast<std::uint16_t>(o.shards);
    auto port = dpdk::Port::open(popt, err);
    if (!port) {
      err = "port " + o.ports[pi] + ": " + err;
      return nullptr;
    }
    for (unsigned sh = 0; sh < o.shards; ++sh) {
      auto p = std::make_unique<Pipeline>();
      p->port = port.get();
      p->port_name = o.ports[pi];
      p->shard = static_cast<std::uint16_t>(sh);
      p->shards = static_cast<std::uint16_t>(o.shards);
      p->lcore = o.lcores[n->pipes_.size()];
      p->stop = &n->workers_stop_;
      transport::EngineConfig ec;
      ec.mac = port->mac();
      ec.ip = o.ips[pi];
      ec.dscp = static_cast<std::uint8_t>(o.dscp);
      ec.ecn = static_cast<std::uint8_t>(o.ecn);
      ec.cnp_interval_ns = std::uint64_t{o.cnp_interval_us} * 1000;
      ec.cnp_dscp = static_cast<std::uint8_t>(o.cnp_dscp);
      ec.cc = o.cc;
      {
        const std::uint64_t link_mbps = port->link().speed_mbps;
        ec.line_rate_bps = (o.line_rate_mbps ? o.line_rate_mbps : link_mbps ? link_mbps : 10'000) * 1'000'000;
      }
      ec.vlan_tci = static_cast<std::uint16_t>(o.vlan ? (o.pcp << 13) | o.vlan : 0);
      ec.seed = seed + n->pipes_.size();
      ec.ipv4_checksum_offload = port->ipv4_checksum_offload();
      ec.ud_mtu = transport::mtu_bytes(abi::roce_active_mtu(port->link().mtu));
      ec.qpns = {sh, o.shards};
      p->eng = std::make_unique<transport::Engine>(ec);
      p->neigh = std::make_unique<pipeline::Neighbors>(p->eng->neighbors(), ec.mac, ec.ip, ec.vlan_tci);
      p->neigh->answer = sh == 0;  // every shard learns; one answers
      p->neigh->on_learn = learn_cb;
      for (const auto& [nip, nmac] : o.neighbors) p->eng->set_neighbor(nip, nmac);
      pipeline::PortIo& pio =
          o.shards > 1 ? port->shard(static_cast<std::uint16_t>(sh)) : static_cast<pipeline::PortIo&>(*port);
      p->dp = std::make_unique<pipeline::Dataplane>(*p->eng, pio, *p->neigh, ec.seed);
      // The engine's one neighbour wait asks through this pipeline's port.
      p->eng->set_resolver([](void* ctx, const wire::IpAddr& ip) { static_cast<pipeline::Dataplane*>(ctx)->resolve(ip); },
                           p->dp.get());
      p->dp->rx_faults().configure(o.fault_rx);
      p->dp->tx_faults().configure(o.fault_tx);
      p->dp->set_idle(o.idle);
      // The main lcore's sleeps end when a frame comes if the port has an
      // RX interrupt; worker shards read rings, and keep the poll tick.
      // (A sharded port's shard 0 also sends the workers' frames, which raise
      // no interrupt: it keeps the tick.)
      p->dp->set_rx_wakes(o.shards == 1 && pi == 0 && port->rx_interrupt_fd() >= 0);
      if (!o.capture.empty()) {
        // One file per pipeline: the first is FILE, the others FILE.N.
        const std::string path = n->pipes_.empty() ? o.capture : o.capture + "." + std::to_string(n->pipes_.size());
        p->capture = std::make_unique<pcapio::Writer>();
        if (!p->capture->open(path)) {
          err = "--capture: " + p->capture->error();
          return nullptr;
        }
        p->dp->set_capture(capture_cb, p->capture.get());
      }
      char macs[24];
      std::snprintf(macs, sizeof macs, "%02x:%02x:%02x:%02x:%02x:%02x", ec.mac[0], ec.mac[1], ec.mac[2], ec.mac[3],
                    ec.mac[4], ec.mac[5]);
      log(1, embedded ? "uroce embedded node started" : std::string(g_host_name) + " started",
          "port=" + o.ports[pi] + " shard=" + std::to_string(sh) + "/" + std::to_string(o.shards) +
              " lcore=" + std::to_string(p->lcore) + " ip=" + ec.ip.to_string() + " mac=" + macs + " " +
              port->describe() + " fault_rx=\"" + o.fault_rx.to_string() + "\" fault_tx=\"" + o.fault_tx.to_string() +
              "\"");
      n->pipes_.push_back(std::move(p));
    }
    n->ports_.push_back(std::move(port));
  }
  if (!open_host_netdev(*n, o, embedded, err)) return nullptr;
  if (stage.make) {
    if (stage.pipeline >= n->pipes_.size()) {
      err = "the stage's pipeline " + std::to_string(stage.pipeline) + " does not exist (the node has " +
            std::to_string(n->pipes_.size()) + ")";
      return nullptr;
    }
    if (!o.app_socket.empty() && stage.pipeline == 0) {
      err = "pipeline 0 serves the application socket (--app-socket): it cannot run a stage too";
      return nullptr;
    }
    Pipeline& sp = *n->pipes_[stage.pipeline];
    n->stage_ = stage.make(*sp.eng, *sp.dp);
    sp.dp->set_app(stage_cb, n->stage_.get());
  }
  if (!o.app_socket.empty() && !embedded) {
    // Applications' memory is mapped here: a fault in it must cost only the
    // application (sigbus_guard.h). Room for every MR the limits allow.
    const std::size_t ranges = std::min<std::size_t>(std::size_t{o.limits.max_sessions} * o.limits.max_mrs, 1u << 20);
    if (!sigbus_guard::install(ranges)) {
      err = "cannot install the SIGBUS guard for applications' memory";
      return nullptr;
    }
  }
  if (!o.app_socket.empty()) {
    n->intake_ = std::make_unique<pipeline::Intake>(*n->pipes_[0]->eng);
    n->pipes_[0]->dp->set_intake(n->intake_.get());
    try {
      n->sessions_ = std::make_unique<SessionServer>(
          n->io_, o.app_socket, o.app_socket_mode, *n->pipes_[0]->eng, *n->intake_, o.limits,
          [](void* ctx) { return static_cast<pipeline::Dataplane*>(ctx)->link(); }, n->pipes_[0]->dp.get());
    } catch (const std::exception& e) {
      err = "--app-socket " + o.app_socket + ": " + e.what();
      return nullptr;
    }
    n->pipes_[0]->dp->set_app(sessions_cb, n->sessions_.get());
    if (o.app_socket_gid != static_cast<gid_t>(-1) &&
        ::chown(o.app_socket.c_str(), static_cast<uid_t>(-1), o.app_socket_gid) != 0) {
      err = "--app-socket-group: cannot give " + o.app_socket + " to the group: " + std::strerror(errno);
      return nullptr;
    }
  }
  if (!o.ctl_socket.empty()) {
    try {
      n->ctl_ = std::make_unique<ControlServer>(n->io_, o.ctl_socket, *n);
    } catch (const std::exception& e) {
      err = "--ctl-socket " + o.ctl_socket + ": " + e.what();
      return nullptr;
    }
  }
  if (!o.metrics.empty()) {
    n->metrics_ = n->open_metrics(o.metrics, err);
    if (!n->metrics_) return nullptr;
    log(1, "metrics", "url=http://" + o.metrics + "/metrics");
  }
  // Pipelines after the first run on their own lcores; the main lcore (the
  // daemon's, or the embedding application's thread) runs the first, the
  // control socket and the lifecycle.
  for (std::size_t k = 1; k < n->pipes_.size(); ++k) {
    Pipeline* p = n->pipes_[k].get();
    const int lrc =
        rte_eal_remote_launch([](void* arg) { return run_pipeline(*static_cast<Pipeline*>(arg)); }, p, p->lcore);
    if (lrc != 0) {
      err = "cannot launch a pipeline on lcore " + std::to_string(p->lcore);
      return nullptr;
    }
    n->workers_launched_ = true;
  }
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // short idle sleeps really are short (default slack is 50 us)
  n->started_ = true;
  return n;
}

Node::~Node() {
  workers_stop_ = true;
  if (workers_launched_) rte_eal_mp_wait_lcore();
  if (started_) log(1, embedded_ ? "uroce embedded node stopped" : std::string(g_host_name) + " stopped", "status=" + status_json());
  for (auto& p : pipes_)
    if (p->capture) p->capture->close();
  ctl_.reset();
  metrics_.reset();
  stage_.reset();
  sessions_.reset();
  if (!pipes_.empty()) pipes_[0]->dp->set_intake(nullptr);
  intake_.reset();
  pipes_.clear();
  ports_.clear();
  // The EAL stays up until the process exits (dpdk_port.h says why).
}

std::size_t Node::one_pass(std::uint64_t now) {
  Pipeline& p = *pipes_[0];
  std::size_t work = 0;
  if (p.shards > 1) work += p.port->dispatch(pipeline::frame_owner);
  return work + p.dp->iterate(now);
}

int Node::run(const volatile sig_atomic_t& stop) {
  Pipeline& main_pipe = *pipes_[0];
  // The loop's naps on a contended core (abi/spin.h) and its sleeps end on
  // time, not up to 50 us late.
  (void)::prctl(PR_SET_TIMERSLACK, 1000UL);
  const std::uint64_t start = now_ns();
  std::uint64_t last_ctl = 0, stop_at = 0;
  int rc = 0;
  MainWait waiter(io_);
  // systemd (Type=notify): ready now that the ports are started and the
  // sockets listen; the watchdog is fed while every pipeline turns.
  SystemdNotify sd;
  sd.ready(std::to_string(pipes_.size()) + " pipeline(s) up" +
           (opts_.app_socket.empty() ? std::string() : "; applications on " + opts_.app_socket));
  std::vector<std::uint64_t> passes(pipes_.size());
  dpdk::Port* rx_port = main_pipe.dp->rx_wakes() ? main_pipe.port : nullptr;
  if (rx_port) waiter.watch_rx(rx_port->rx_interrupt_fd(), &rx_wakes_);
  if (host_) waiter.watch_host(host_->fd(), &host_wakes_);
  for (;;) {
    std::uint64_t now = now_ns();
    std::size_t work = one_pass(now);
    main_pipe.passed();
    if (now - last_ctl > 1'000'000) {  // while busy, the control plane about every ms
      serve_control(io_);
      last_ctl = now;
    }
    if (sd.watchdog().enabled()) {
      for (std::size_t k = 0; k < pipes_.size(); ++k) passes[k] = pipes_[k]->passes.load(std::memory_order_relaxed);
      sd.tick(now, passes);
    }
    if (g_reload) {
      // SIGHUP: systemd hears RELOADING=1, then READY=1 whatever came of it
      // (a refused reload leaves the node as it was, and says why).
      g_reload = 0;
      sd.reloading();
      const auto r = reload();
      if (!r.value("ok", false)) log(2, "reload refused", "why=" + log_value(r.value("error", std::string())));
      sd.ready(r.value("ok", false) ? "reloaded" : "reload refused: " + r.value("error", std::string()));
    }
    if (opts_.duration > 0 && now - start > static_cast<std::uint64_t>(opts_.duration * 1e9)) stop_requested_ = true;
    const bool stopping = stop || stop_requested_;
    if (stopping && stop_at == 0) {
      // Graceful stop: QPs to ERR, completions delivered, then exit.
      log(1, "stopping: flushing QPs");
      sd.stopping();
      stop_at = now;
      if (stage_) stage_->request_shutdown();
    }
    if (stage_ && stage_->finished()) {
      rc = stage_->exit_code();
      std::printf("%s\n", stage_->summary().c_str());
      std::fflush(stdout);
      break;
    }
    if (stop_at && (!stage_ || now - stop_at > 2'000'000'000ull)) break;
    const std::uint64_t sleep_ns = main_pipe.dp->idle_sleep_ns(work, now);
    if (sleep_ns == 0) {
      // Polling on (the spin window, or --busy-poll): an empty pass gives
      // the core to whatever else is runnable on it, such as the
      // application this daemon's work is for (abi/spin.h).
      if (work == 0) main_pipe.dp->yield_core();
      continue;
    }
    // Going to block. Tell the applications first, then look at every ring
    // once more: a post published before they saw the flag is found here,
    // and one after it rings the doorbell (uroce_abi.h, the session page).
    if (intake_) intake_->set_sleeping(true);
    if (rx_port) rx_port->rx_interrupt_arm();
    // A frame after this arm wakes the sleep; one before it is found by the
    // pass below (and the host netdev's by the read after it).
    waiter.arm();
    now = now_ns();
    if (one_pass(now) == 0 && main_pipe.dp->poll_host(now) == 0 && !stop && !stop_requested_) {
      waiter.sleep(sleep_ns);
      last_ctl = now_ns();
    } else {
      main_pipe.dp->idle_sleep_ns(1, now);  // that pass found work: busy again
    }
    if (rx_port) rx_port->rx_interrupt_disarm();
    if (intake_) intake_->set_sleeping(false);
  }
  return rc;
}

std::size_t Node::progress() {
  if (turning_.test_and_set(std::memory_order_acquire)) return 0;
  const std::uint64_t now = now_ns();
  std::size_t work = one_pass(now);
  // Work restarts the idle clock, so the next wait spins before it sleeps.
  if (work) (void)pipes_[0]->dp->idle_sleep_ns(work, now);
  if (now - last_serve_ > 1'000'000) {  // sockets (session requests, CM events, uroce-ctl) about every ms
    serve_control(io_);
    last_serve_ = now;
  }
  turning_.clear(std::memory_order_release);
  return work;
}

int Node::wait_readable(int fd, int timeout_ms) {
  const std::uint64_t start = now_ns();
  const std::uint64_t deadline =
      timeout_ms < 0 ? UINT64_MAX : start + static_cast<std::uint64_t>(timeout_ms) * 1'000'000ull;
  // The awaited descriptor, and the port's RX interrupt where it has one
  // (a frame then ends a sleep; without one the poll tick bounds it).
  dpdk::Port* port = pipes_[0]->port;
  const int rx_fd = pipes_[0]->dp->rx_wakes() ? port->rx_interrupt_fd() : -1;
  // The host netdev's descriptor is level-triggered here: always watched.
  pollfd p[3] = {{fd, POLLIN, 0}, {host_ ? host_->fd() : -1, POLLIN, 0}, {rx_fd, POLLIN, 0}};
  const nfds_t nfds = fd >= 0 ? 1 : 0;
  bool armed = false;
  const auto disarm = [&] {
    if (armed && !turning_.test_and_set(std::memory_order_acquire)) {
      port->rx_interrupt_disarm();
      armed = false;
      turning_.clear(std::memory_order_release);
    }
  };
  for (bool once = false;; once = true) {
    if (interrupted_.load(std::memory_order_relaxed)) {
      disarm();
      return 0;
    }
    std::uint64_t now = now_ns();
    std::uint64_t sleep_ns = 1'000'000;  // another thread turns the loop: look again within a millisecond
    bool idle_pass = false;
    if (!turning_.test_and_set(std::memory_order_acquire)) {
      if (armed) port->rx_interrupt_disarm();
      armed = false;
      // A reply to the application's own request, or a CM event, needs the
      // sockets served: every pass while waiting.
      serve_control(io_);
      last_serve_ = now;
      if (rx_fd >= 0) {  // armed before the pass: a frame after it raises the interrupt
        port->rx_interrupt_arm();
        armed = true;
      }
      const std::size_t work = one_pass(now);
      sleep_ns = pipes_[0]->dp->idle_sleep_ns(work, now);
      idle_pass = work == 0;
      turning_.clear(std::memory_order_release);
    }
    if (nfds) {
      const int r = ::poll(p, nfds, 0);
      if (r > 0) {
        disarm();
        return 1;
      }
      if (r < 0 && errno != EINTR) return -1;
    }
    now = now_ns();
    if (now >= deadline || (fd < 0 && once)) {
      disarm();
      return 0;
    }
    if (sleep_ns == 0) {
      // Polling on: a runnable process on this core first (abi/spin.h).
      if (idle_pass) pipes_[0]->dp->yield_core();
      continue;
    }
    sleep_ns = std::min(sleep_ns, deadline - now);
    const timespec ts{static_cast<time_t>(sleep_ns / 1'000'000'000ull), static_cast<long>(sleep_ns % 1'000'000'000ull)};
    // p[1] (the host netdev) is ignored when its fd is -1; p[2] counts only when armed.
    const int r = ::ppoll(fd >= 0 ? p : p + 1, nfds + 1 + (armed ? 1 : 0), &ts, nullptr);
    if (r > 0 && nfds && (p[0].revents & POLLIN)) {
      disarm();
      return 1;
    }
    if (r > 0 && armed) ++rx_wakes_;
    if (r < 0 && errno != EINTR) return -1;
  }
}

}  // namespace uroce::control
