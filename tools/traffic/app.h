// uroce-traffic's verified RC traffic: two processes, each hosting a node
// (control/node) with this as its stage on the engine directly, exchange
// connection details over TCP (perftest-style, exchange.h) and run SEND,
// WRITE, READ and ATOMIC traffic. Every payload is checked: SENDs by the
// server, WRITEs by reading them back, READs against a pattern the server
// laid down, atomics by their running value. With no liburoce hop, it shows
// what the engine and the port alone give, next to applications over
// liburoce (uroce-perf in daemon or embedded mode).
//
// It runs as its pipeline's application stage and never blocks the loop for
// long: accept and connect are polled; only the 64-byte exchange itself waits
// (a few ms at most, with a deadline).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "control/node/node.h"
#include "tools/traffic/exchange.h"
#include "stack/pipeline/dataplane.h"
#include "stack/transport/engine.h"

namespace uroce::traffic {

struct AppOptions {
  enum class Role { kNone, kServer, kClient } role = Role::kNone;
  std::uint16_t port = 18515;
  std::string peer_host;  // client: where the server's TCP exchange listens
  std::uint64_t messages = 1000;
  std::uint32_t size = 4096;
  std::vector<ibv_wr_opcode> ops = {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD};
  std::uint32_t depth = 32;
  ibv_mtu mtu = IBV_MTU_1024;
  std::uint8_t timeout = 14;  // 4.096 us * 2^14 = 67 ms
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  bool forever = false;  // server: serve clients one after another
  bool selective_repeat = false;  // IRN-style loss recovery (both ends must say so; every op)
};

/// Parses "send,write,read,atomic" into opcodes; false on an unknown name.
bool parse_ops(const std::string& s, std::vector<ibv_wr_opcode>& out, std::string& err);

class TrafficApp final : public control::Stage {
 public:
  TrafficApp(transport::Engine& eng, pipeline::Dataplane& dp, const AppOptions& o);
  ~TrafficApp() override;

  /// The application stage: returns work done.
  std::size_t step(std::uint64_t now) override;
  /// Graceful stop: the QP goes to ERR, so every outstanding WR is flushed and
  /// its completion delivered before the app reports. Safe to call from any
  /// thread: the app's own lcore acts on it in step().
  void request_shutdown() override { stop_requested_.store(true, std::memory_order_release); }

  /// Readable from any thread.
  [[nodiscard]] bool finished() const override { return done_.load(std::memory_order_acquire); }
  [[nodiscard]] int exit_code() const override { return failed_ ? 1 : 0; }
  [[nodiscard]] std::string summary() const override { return summary_; }

 private:
  enum class State { kListen, kConnecting, kExchange, kResolve, kRun, kFinish, kDone };
  bool open_listener();
  bool exchange();
  bool connect_qp();
  std::size_t run_client(std::uint64_t now);
  std::size_t run_server();
  void post_recvs();
  void fail(const std::string& why);
  void finish();
  static std::uint8_t pattern(std::uint64_t id, std::size_t i) {
    return static_cast<std::uint8_t>((id * 0x9e37) ^ (i * 131) ^ (i >> 7));
  }

  transport::Engine& eng_;
  pipeline::Dataplane& dp_;
  AppOptions o_;
  State state_;
  int listen_fd_ = -1;
  int fd_ = -1;
  std::chrono::steady_clock::time_point deadline_{};
  std::chrono::steady_clock::time_point started_{};
  std::chrono::steady_clock::time_point last_resolve_{};
  // Memory, QP
  std::vector<std::uint8_t> mem_;
  transport::Pd* pd_ = nullptr;
  transport::Cq* cq_ = nullptr;
  transport::Mr* mr_ = nullptr;
  transport::Qp* qp_ = nullptr;
  PeerInfo peer_{};
  std::uint32_t psn_ = 0;
  // Client progress
  struct Slot {
    bool busy = false;
    ibv_wr_opcode op = IBV_WR_SEND;
    std::uint64_t id = 0;
    std::uint64_t expect = 0;  // atomics: the value before
    int pending = 0;           // WRs still to complete (a WRITE is followed by its read-back)
  };
  std::vector<Slot> slots_;
  std::uint64_t next_ = 0, completed_ = 0, bytes_ = 0, sends_ = 0, atomics_ = 0, errors_ = 0;
  // Server progress
  std::uint64_t recv_ok_ = 0, recv_bad_ = 0, next_send_id_ = 0;
  std::uint64_t flushed_ = 0;  // completions with WR_FLUSH_ERR delivered after a stop
  std::uint64_t sends_ok_ = 0;  // SENDs that completed successfully (sends_ counts those posted)
  std::uint64_t clients_ = 0, total_ok_ = 0;  // server: clients served, SENDs verified in all
  bool stopped_ = false;
  void shutdown();
  bool failed_ = false;
  std::string summary_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> done_{false};
};

}  // namespace uroce::traffic
