// One poll-mode pipeline: a flat loop of stages over one port and one
// transport engine, as DPDK's l3fwd and TAS do:
//
//   rx burst -> dispatch (ARP/ND/ICMP here, RoCE to the engine's completer
//   and responder, the rest dropped and counted) -> app hook (control work)
//   -> intake (applications' posts, intake.h) -> engine.poll (requester,
//   timers) -> tx flush -> adaptive idle
//
// One engine poll a pass: everything that posts runs before it.
//
// With a host port (set_host: the kernel's TAP netdev that carries the
// RoCE address), the host answers ARP, ND and ICMP instead: every frame
// that is not RoCE goes to it (neighbours are still learned from ARP/ND),
// and what the host sends goes out on the wire.
//
// RX and TX faults, when configured, wrap the first and last stages.
#pragma once

#include <cstdint>

#include "stack/abi/spin.h"
#include "stack/pipeline/fault.h"
#include "stack/pipeline/intake.h"
#include "stack/pipeline/neigh.h"
#include "stack/pipeline/port_io.h"
#include "stack/transport/engine.h"

namespace uroce::pipeline {

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
  X(idle_sleeps, "times the loop slept while idle")                  \
  X(rx_to_host, "frames that are not RoCE handed to the host netdev") \
  X(tx_from_host, "frames from the host netdev sent on the wire")     \
  X(host_drops, "frames the host netdev or the wire refused")

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
inline constexpr const char* kDpCounterHelp[] = {
#define UROCE_X(n, h) h,
    UROCE_DP_COUNTERS(UROCE_X)
#undef UROCE_X
};

/// How the loop waits when there is nothing to do. It polls on after the
/// last work for a window learnt from the gaps between bursts of work
/// (abi::AdaptiveSpin: twice the recent gap, at least spin_us, at most
/// spin_max_us; the loop yields its core between empty passes). Then it
/// sleeps tick_us at a time, polling between sleeps: on a PMD
/// without RX interrupts (memif, af_packet) the tick bounds how late a frame
/// is seen. After warm_ms without work the sleeps double, up to
/// max_sleep_us, so an idle daemon costs almost nothing. Any work resets
/// this. max_sleep_us 0 means busy-poll, never sleeping. A loop whose port
/// wakes it when a frame comes (an RX interrupt, set_rx_wakes) needs no
/// tick: after the spin it sleeps max_sleep_us at once.
struct IdleConfig {
  std::uint32_t spin_us = 5;
  std::uint32_t spin_max_us = 200;  // abi::AdaptiveSpin::kDefaultCapNs
  std::uint32_t tick_us = 20;
  std::uint32_t warm_ms = 10;
  std::uint32_t max_sleep_us = 20000;  // 2000 cost an idle daemon about 2% of a core here (wake-ups are dear in a VM)
  friend bool operator==(const IdleConfig&, const IdleConfig&) = default;
};

class Dataplane {
 public:
  using Capture = void (*)(void* ctx, wire::ConstBytes frame, bool tx, std::uint64_t now);
  using AppHook = std::size_t (*)(void* ctx, std::uint64_t now);  // returns work done

  Dataplane(transport::Engine& eng, PortIo& port, Neighbors& neigh, std::uint64_t seed = 1);

  /// One pass of the loop; returns the work done (frames in + frames out + app work).
  std::size_t iterate(std::uint64_t now);
  /// The idle policy: how long to sleep now (ns), given the work of the
  /// last iteration and the time; 0 means poll again at once. Counts the
  /// sleeps it asks for.
  std::uint64_t idle_sleep_ns(std::size_t work, std::uint64_t now);
  /// Sleeps (nanosleep) as the idle policy says: for loops that have nothing
  /// else to wait on (worker lcores).
  void idle(std::size_t work);

  void set_capture(Capture fn, void* ctx) {
    capture_ = fn;
    capture_ctx_ = ctx;
  }
  void set_app(AppHook fn, void* ctx) {
    app_ = fn;
    app_ctx_ = ctx;
  }
  /// The intake of applications' posts (the pipeline that serves sessions).
  void set_intake(Intake* in) { intake_ = in; }
  /// Between empty passes inside the polling window: gives the core away
  /// once (abi::AdaptiveSpin::yield_core).
  void yield_core() { spin_.yield_core(); }
  /// Yields in the polling window that came back late (a contended core).
  [[nodiscard]] std::uint64_t late_yields() const { return spin_.late_yields(); }
  /// The polling window's inputs and outcome now (abi::AdaptiveSpin).
  [[nodiscard]] std::uint64_t average_gap_ns() const { return spin_.average_gap_ns(); }
  /// At `now_ns` (while the loop naps after a late yield, the cap).
  [[nodiscard]] std::uint64_t spin_window_ns(std::uint64_t now_ns) const {
    return spin_.window_ns(std::uint64_t{idle_cfg_.spin_us} * 1000, now_ns);
  }
  void set_idle(const IdleConfig& c) {
    idle_cfg_ = c;
    spin_.set_cap(std::uint64_t{c.spin_max_us} * 1000);
  }
  /// The host's netdev (the exception path), or nullptr for none. With one,
  /// the Neighbors given must not answer (the host does).
  void set_host(PortIo* host) { host_ = host; }
  /// Reads the host netdev now (iterate() reads it at most every poll tick):
  /// for a loop's last look before it sleeps. Returns the frames sent on.
  std::size_t poll_host(std::uint64_t now) { return host_ ? from_host(now) : 0; }
  /// The loop's sleeps end when a frame arrives (the port's RX interrupt is
  /// among what it blocks on), so the idle policy skips the poll tick.
  void set_rx_wakes(bool on) { rx_wakes_ = on; }
  [[nodiscard]] bool rx_wakes() const { return rx_wakes_; }
  [[nodiscard]] const IdleConfig& idle_config() const { return idle_cfg_; }
  /// Sends an ARP request or IPv6 NS for `ip`.
  void resolve(const wire::IpAddr& ip);
  /// The port's link (PortIo::link).
  [[nodiscard]] LinkInfo link() const { return port_.link(); }

  FaultInjector& rx_faults() { return rx_fault_; }
  FaultInjector& tx_faults() { return tx_fault_; }
  [[nodiscard]] std::uint64_t counter(DpCounter c) const { return ctr_[static_cast<std::size_t>(c)]; }

 private:
  void dispatch(wire::ConstBytes frame, std::uint64_t now);
  void send_raw(wire::ConstBytes frame, std::uint64_t now);
  void to_host(wire::ConstBytes frame);
  std::size_t from_host(std::uint64_t now);
  void inc(DpCounter c, std::uint64_t n = 1) { ctr_[static_cast<std::size_t>(c)] += n; }

  transport::Engine& eng_;
  PortIo& port_;
  Neighbors& neigh_;
  FaultInjector rx_fault_;
  FaultInjector tx_fault_;
  Capture capture_ = nullptr;
  void* capture_ctx_ = nullptr;
  PortIo* host_ = nullptr;
  std::uint64_t host_polled_ = 0;  // when the host port was last read
  AppHook app_ = nullptr;
  void* app_ctx_ = nullptr;
  Intake* intake_ = nullptr;
  IdleConfig idle_cfg_{};
  std::uint64_t idle_since_ = 0;  // ns; 0 = busy
  abi::AdaptiveSpin spin_;
  std::uint64_t sleep_ns_ = 0;    // the last sleep asked for, once past warm_ms
  bool rx_wakes_ = false;
  std::uint64_t ctr_[static_cast<std::size_t>(DpCounter::kCount)] = {};
  std::uint8_t reply_[2048];
  std::uint8_t flat_[9216];
};

}  // namespace uroce::pipeline
