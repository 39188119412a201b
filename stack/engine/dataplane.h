// One poll-mode pipeline: a flat loop of stages over one port and one
// transport engine, as DPDK's l3fwd and TAS do:
//
//   rx burst -> dispatch (ARP/ND/ICMP here, RoCE to the engine, the rest
//   dropped and counted) -> engine.poll (completer/responder/requester,
//   timers) -> app hook -> tx flush -> adaptive idle
//
// RX and TX faults, when configured, wrap the first and last stages.
#pragma once

#include <cstdint>

#include "stack/engine/fault.h"
#include "stack/engine/neigh.h"
#include "stack/engine/port_io.h"
#include "stack/transport/engine.h"

namespace uroce::engine {

#define UROCE_DP_COUNTERS(X)                                     \
  X(rx_bursts, "non-empty receive bursts")                       \
  X(rx_frames, "frames received from the port")                  \
  X(rx_roce, "RoCEv2 frames handed to the transport")            \
  X(rx_arp_nd, "ARP and IPv6 ND frames handled")                 \
  X(rx_icmp_echo, "ICMP echo requests answered")                 \
  X(rx_other, "frames that are neither, dropped")                \
  X(rx_own, "our own frames looped back by the driver, dropped") \
  X(tx_frames, "frames queued on the port")                      \
  X(tx_replies, "ARP/ND/ICMP replies sent")                      \
  X(neigh_requests, "ARP requests and neighbour solicitations sent") \
  X(idle_sleeps, "times the loop slept while idle")

enum class DpCounter : std::uint8_t {
#define UROCE_X(n, h) n,
  UROCE_DP_COUNTERS(UROCE_X)
#undef UROCE_X
      kCount
};
inline constexpr const char* kDpCounterNames[] = {
#define UROCE_X(n, h) #n,
    UROCE_DP_COUNTERS(UROCE_X)
#undef UROCE_X
};

struct IdleConfig {
  /// After spin_us of continuous idleness, sleeps start at min_sleep_us and
  /// double up to max_sleep_us. Any work resets this. max_sleep_us 0 means
  /// always busy-poll.
  std::uint32_t spin_us = 100;
  std::uint32_t min_sleep_us = 1;
  std::uint32_t max_sleep_us = 200;
};

class Dataplane {
 public:
  using Capture = void (*)(void* ctx, wire::ConstBytes frame, bool tx, std::uint64_t now);
  using AppHook = std::size_t (*)(void* ctx, std::uint64_t now);  // returns work done

  Dataplane(transport::Engine& eng, PortIo& port, Neighbors& neigh, std::uint64_t seed = 1);

  /// One pass of the loop; returns the work done (frames in + frames out + app work).
  std::size_t iterate(std::uint64_t now);
  /// Sleeps as the idle policy says, given the work of the last iteration.
  void idle(std::size_t work);

  void set_capture(Capture fn, void* ctx) {
    capture_ = fn;
    capture_ctx_ = ctx;
  }
  void set_app(AppHook fn, void* ctx) {
    app_ = fn;
    app_ctx_ = ctx;
  }
  void set_idle(const IdleConfig& c) { idle_cfg_ = c; }
  /// Sends an ARP request or IPv6 NS for `ip`.
  void resolve(const wire::IpAddr& ip);

  FaultInjector& rx_faults() { return rx_fault_; }
  FaultInjector& tx_faults() { return tx_fault_; }
  [[nodiscard]] std::uint64_t counter(DpCounter c) const { return ctr_[static_cast<std::size_t>(c)]; }

 private:
  void dispatch(wire::ConstBytes frame, std::uint64_t now);
  void send_raw(wire::ConstBytes frame, std::uint64_t now);
  void inc(DpCounter c, std::uint64_t n = 1) { ctr_[static_cast<std::size_t>(c)] += n; }

  transport::Engine& eng_;
  PortIo& port_;
  Neighbors& neigh_;
  FaultInjector rx_fault_;
  FaultInjector tx_fault_;
  Capture capture_ = nullptr;
  void* capture_ctx_ = nullptr;
  AppHook app_ = nullptr;
  void* app_ctx_ = nullptr;
  IdleConfig idle_cfg_{};
  std::uint64_t idle_since_ = 0;  // ns; 0 = busy
  std::uint32_t sleep_us_ = 0;
  std::uint64_t ctr_[static_cast<std::size_t>(DpCounter::kCount)] = {};
  std::uint8_t reply_[2048];
  std::uint8_t flat_[9216];
};

}  // namespace uroce::engine
