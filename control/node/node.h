// A node: one RoCE endpoint with everything it runs. The EAL and its ports,
// one pipeline (engine, neighbours, dataplane) per port and shard, the
// application socket where liburoce sessions attach, the control socket,
// captures, and the main loop's waiting.
//
// Two hosts run a node. uroced runs one as a daemon (run(): it serves every
// application on the host). An application in embedded mode runs one inside
// its own process (liburoce's embedded plugin): its own post, poll and wait
// calls drive progress() and wait_readable(), so the engine, the pipeline
// and the port cost it no process hop. Both go through the same session
// protocol and the same shared rings; only who turns the loop differs.
//
// Everything here runs on one thread (the main lcore), apart from the
// pipelines of other shards or ports, each on its own lcore.
#pragma once

#include <signal.h>

#include <utility>  // boost 1.74's asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "control/node/log.h"
#include "control/node/options.h"

namespace uroce::dpdk {
class Port;
}
namespace uroce::host {
class HostTap;
}
namespace uroce::pcapio {
class Writer;
}
namespace uroce::pipeline {
class Dataplane;
class Neighbors;
}
namespace uroce::transport {
class Engine;
}

namespace uroce::control {

class MetricsServer;

class SessionServer;

/// A host program's own stage on one pipeline, run in that pipeline's loop
/// on its lcore, on the engine directly (uroce-traffic's verified traffic
/// generator). The main lcore asks it to stop and reads whether it has
/// finished; the node's run() ends when it has, with its exit code.
class Stage {
 public:
  virtual ~Stage() = default;
  /// One turn of the stage; returns the work done (0: idle).
  virtual std::size_t step(std::uint64_t now) = 0;
  /// Graceful stop, from any thread: the stage winds down in step().
  virtual void request_shutdown() = 0;
  /// From any thread; once true, exit_code() and summary() are final.
  [[nodiscard]] virtual bool finished() const = 0;
  [[nodiscard]] virtual int exit_code() const = 0;
  [[nodiscard]] virtual std::string summary() const = 0;
};


std::uint64_t now_ns();

/// A stage for Node::start: made from pipeline `pipeline`'s engine and
/// dataplane before any worker lcore starts.
struct StageSpec {
  using Factory = std::function<std::unique_ptr<Stage>(transport::Engine&, pipeline::Dataplane&)>;
  unsigned pipeline = 0;
  Factory make;  // empty: no stage
};

/// The whole of a program that hosts a node as a daemon does (uroced,
/// uroce-traffic): a crash (SIGSEGV, SIGBUS, SIGABRT) leaves "NAME: fatal
/// signal" and a backtrace on stderr; the options (the node's and `extra`),
/// Node::start with the stage `stage()` gives once the options are parsed
/// (none if empty; NAME names the process in its "started" and "stopped"
/// log lines), then SIGTERM and SIGINT stop the loop gracefully and SIGPIPE
/// is ignored. Returns the exit code:
/// 0 for --help, 2 for bad options or a failed start, else Node::run's.
int host_main(const char* name, int argc, char** argv, const ExtraOptions& extra = {},
              const std::function<StageSpec()>& stage = {});

class Node {
 public:
  /// Brings up the EAL, the ports, the pipelines and the sockets the options
  /// name. `embedded`: inside an application (a "stop" on the control socket
  /// is refused: the node stops when the application closes the device).
  /// nullptr and why on failure; the EAL cannot be started again in the
  /// same process after that. `stage`: a host program's own stage (refused
  /// on pipeline 0 when it serves the application socket).
  static std::unique_ptr<Node> start(const NodeOptions& o, bool embedded, std::string& err,
                                     const StageSpec& stage = {});
  /// Stops the worker lcores, closes captures, frees everything and cleans
  /// up the EAL.
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// The daemon's loop: spins, then blocks in the io_context on doorbells,
  /// sockets and the poll tick, until `stop` is set (a signal), a stop
  /// command comes, --duration runs out or the attached stage finishes.
  /// Returns the exit code.
  int run(const volatile sig_atomic_t& stop);


  /// Embedded mode, manual progress: one pass of the main pipeline, and the
  /// control plane's sockets about every millisecond. Returns the work done.
  /// A call while another thread is in progress() or wait_readable() does
  /// nothing (that thread is already turning the loop).
  std::size_t progress();
  /// Embedded mode: turns the loop until `fd` is readable (1), `timeout_ms`
  /// passes (0; -1 waits without end) or poll fails (-1, errno). Idle
  /// passes sleep as the daemon's do (spin, then the poll tick, bounded by
  /// the engine's next timer), in ppoll on `fd`, so the fd ends a sleep.
  /// `fd` < 0: one wait of at most one sleep.
  int wait_readable(int fd, int timeout_ms);
  /// Makes every wait_readable, now and later, return 0 at once (the node
  /// is about to be destroyed; callers must leave it).
  void interrupt_waits() { interrupted_ = true; }

  [[nodiscard]] nlohmann::ordered_json status() const;
  [[nodiscard]] std::string status_json() const;
  /// Live reconfiguration (SIGHUP, `systemctl reload`, the control
  /// socket's "reload"): parses the command line again, and so re-reads its
  /// --config file, and applies what may change without touching a QP: the
  /// congestion control of new QPs (--cc), fault injection, the session
  /// limits, logging and the metrics endpoint. Any other option that
  /// changed refuses the whole reload, each one named, and nothing is
  /// applied. {"ok":true,"changed":[...]}, or {"ok":false,"error":...}.
  nlohmann::ordered_json reload();

  struct Pipeline;

 private:
  Node();
  std::size_t one_pass(std::uint64_t now);
  /// The Prometheus endpoint at "ADDR:PORT" (--metrics), on this node's
  /// io_context; null and why when it cannot listen there.
  std::unique_ptr<MetricsServer> open_metrics(const std::string& addr, std::string& err);

  class ControlServer;
  class MainWait;
  static bool open_host_netdev(Node& n, const NodeOptions& o, bool embedded, std::string& err);

  bool embedded_ = false;
  NodeOptions opts_;
  boost::asio::io_context io_;
  // Keeps io_ from running out of work: an io_context polled with nothing
  // outstanding stops, and a stopped one returns at once from every later
  // run_one, which turned a node without sockets into a spinning one.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> io_work_{io_.get_executor()};
  std::vector<std::unique_ptr<dpdk::Port>> ports_;
  std::vector<std::unique_ptr<Pipeline>> pipes_;
  std::unique_ptr<host::HostTap> host_;  // the host netdev of pipeline 0, if any
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<pipeline::Intake> intake_;  // pipeline 0's: the sessions' posts (before sessions_, which registers in it)
  std::unique_ptr<SessionServer> sessions_;
  std::unique_ptr<ControlServer> ctl_;
  std::uint64_t ctl_refused_ = 0;  // control connections closed at once (too many, in all or from one uid)
  std::uint64_t ctl_delayed_ = 0;  // control requests that waited for their uid's rate
  std::unique_ptr<MetricsServer> metrics_;  // --metrics
  bool workers_launched_ = false;
  std::atomic<bool> workers_stop_{false};
  std::atomic<bool> stop_requested_{false};
  std::atomic_flag turning_ = ATOMIC_FLAG_INIT;  // a thread is in progress() or wait_readable()
  std::atomic<bool> interrupted_{false};
  bool started_ = false;  // start() finished: the stop is worth a log line
  std::uint64_t rx_wakes_ = 0;  // sleeps a frame ended (the port's RX interrupt)
  std::uint64_t host_wakes_ = 0;  // sleeps the host netdev ended (a frame from the kernel)
  std::uint64_t last_serve_ = 0;
};

}  // namespace uroce::control
