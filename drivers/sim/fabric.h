// A simulated datacenter fabric for congestion-control research: hosts (one
// uroce Engine each) and switches joined by links of finite rate and
// propagation delay. Every port is output-queued with a byte buffer; a
// switch port marks ECN CE with RED's ramp (Kmin, Kmax, Pmax: DCQCN's
// congestion point), drops at the tail when its buffer is full, or, with
// PFC on, pauses the upstream port feeding an ingress that holds too much.
//
// Deterministic: seeded, on the virtual clock (ns), events in (time,
// sequence) order. A host's engine is given frames as they arrive and is
// polled when it received, when its NIC has room again, or when one of its
// timers (retransmit, RNR, pacer, congestion control) is due; its TX ring
// is small, so a sender waits for its link as it would for a real NIC.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "stack/transport/engine.h"

namespace uroce::sim {

struct LinkSpec {
  std::uint64_t rate_bps = 10'000'000'000;
  std::uint64_t delay_ns = 1'000;  // propagation, each way
};

/// A switch's ports (all alike). Defaults: DCQCN's congestion point
/// settings from the paper (Kmin 5 KB, Kmax 200 KB, Pmax 1%).
struct SwitchSpec {
  std::uint64_t buffer_bytes = 512 * 1024;  // per output port
  bool ecn = true;
  std::uint64_t kmin_bytes = 5'000;
  std::uint64_t kmax_bytes = 200'000;
  double pmax = 0.01;
  /// PFC (802.1Qbb, one class): pause the upstream when the bytes held for
  /// one ingress port reach xoff; resume at xon. The fabric is then
  /// lossless (no tail drop; each ingress holds at most xoff plus what its
  /// link had in flight). Off: tail drop at buffer_bytes. Thresholds: ours,
  /// a static split of a shallow buffer (real switches share it dynamically).
  bool pfc = false;
  std::uint64_t pfc_xoff_bytes = 24 * 1024;
  std::uint64_t pfc_xon_bytes = 12 * 1024;
};

struct PortStats {
  std::uint64_t tx_frames = 0, tx_bytes = 0;
  std::uint64_t dropped = 0, ce_marked = 0, pauses = 0;
  std::uint64_t max_queue_bytes = 0;
};

struct FabricStats {
  std::uint64_t events = 0, frames = 0, dropped = 0, ce_marked = 0, pool_exhausted = 0, unroutable = 0;
};

class Fabric {
 public:
  /// `pool_frames`: frames that can be in queues and on links at once;
  /// `max_frame`: the largest frame (the MTU's payload plus headers).
  explicit Fabric(std::uint64_t seed, std::uint32_t pool_frames = 1u << 15, std::uint32_t max_frame = 4096 + 128);

  int add_switch(const SwitchSpec& s = {});
  /// Attaches an engine to switch `sw` over a link; returns the host id.
  /// The engine's tx_ring should be small (a few frames): it is the NIC's queue.
  int add_host(transport::Engine* e, int sw, const LinkSpec& l = {});
  /// A link between two nodes (switches; add_host links a host).
  void connect(int node_a, int node_b, const LinkSpec& l = {});
  /// Computes the routes (shortest paths by hops; call after the last add).
  void finish();
  /// Random loss on a switch's output port: each frame is dropped with
  /// probability p as it joins the queue (a lossy link, for loss-recovery
  /// experiments; counted as drops).
  void set_loss(int sw, int port, double p) {
    if (sw >= 0 && static_cast<std::size_t>(sw) < nodes_.size() && port >= 0 &&
        static_cast<std::size_t>(port) < nodes_[sw].ports.size())
      nodes_[sw].ports[port].loss = p;
  }

  /// Advances virtual time until `done()` holds or `max_ns` pass.
  bool run_until(const std::function<bool()>& done, std::uint64_t max_ns);
  /// Called every `every_ns` of virtual time while running (0: never).
  void on_sample(std::uint64_t every_ns, std::function<void(std::uint64_t now)> fn) {
    sample_every_ = every_ns;
    sample_ = std::move(fn);
    next_sample_ = now_ + every_ns;
  }

  [[nodiscard]] std::uint64_t now() const { return now_; }
  [[nodiscard]] const FabricStats& stats() const { return stats_; }
  /// The output port of switch `sw` toward host `h` (where an incast queues).
  [[nodiscard]] int port_toward(int sw, int h) const;
  [[nodiscard]] std::uint64_t queue_bytes(int sw, int port) const;
  [[nodiscard]] const PortStats& port_stats(int sw, int port) const;
  /// The host's own NIC port (toward its switch).
  [[nodiscard]] const PortStats& host_port_stats(int h) const;

 private:
  struct Device;
  struct Port {
    int node = -1;       // owner
    int peer = -1;       // the node at the other end
    int peer_port = -1;  // the port there that leads back (for PFC pauses)
    LinkSpec link;
    std::vector<std::uint32_t> q;  // frame slots, FIFO (head at q_head)
    std::size_t q_head = 0;
    std::uint64_t q_bytes = 0;
    bool busy = false;    // serialising a frame
    bool paused = false;  // PFC: the peer asked us to stop
    double loss = 0;      // random loss at enqueue (set_loss)
    PortStats st;
  };
  struct Device {
    bool host = false;
    transport::Engine* eng = nullptr;
    SwitchSpec spec;
    std::vector<Port> ports;
    std::unordered_map<std::uint64_t, int> route;  // switch: destination MAC -> port
    std::vector<std::uint64_t> ingress_bytes;      // switch, PFC: bytes held per ingress port
    std::vector<bool> pause_sent;
    bool dirty = true;  // host: poll its engine at the next step
    std::uint64_t deadline = 0;  // host: its engine's next_deadline() as of the last time it was touched
  };
  enum class Ev : std::uint8_t { kArrive, kTxDone, kPause, kResume };
  struct Event {
    std::uint64_t t, seq;
    Ev kind;
    int node, port;  // kArrive: arriving at node through its port `port`; kTxDone/kPause/kResume: node's port
    std::uint32_t slot;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const { return a.t != b.t ? a.t > b.t : a.seq > b.seq; }
  };
  struct Frame {
    std::uint32_t len = 0;
    int ingress = -1;  // the switch port it came in by, while queued in a switch
  };

  void push(Event e);
  void arrive(int node, int in_port, std::uint32_t slot);
  void enqueue(int node, int port, std::uint32_t slot, int ingress);
  void start_tx(int node, int port);
  void tx_done(int node, int port);
  void poll_host(int h);
  void release_ingress(Device& sw, const Frame& f);
  std::uint32_t alloc(const std::uint8_t* data, std::uint32_t len);
  std::uint8_t* data(std::uint32_t slot) { return &pool_[std::size_t{slot} * max_frame_]; }
  static std::uint64_t mac_key(const std::uint8_t* mac);

  std::vector<Device> nodes_;
  std::vector<int> hosts_;  // host id -> node
  std::unique_ptr<std::uint8_t[]> pool_;
  std::vector<Frame> frames_;
  std::vector<std::uint32_t> free_;
  std::uint32_t max_frame_;
  std::vector<Event> heap_;
  std::mt19937_64 rng_;
  FabricStats stats_;
  std::uint64_t now_ = 1'000'000;
  std::uint64_t seq_ = 0;
  std::uint64_t sample_every_ = 0, next_sample_ = 0;
  std::function<void(std::uint64_t)> sample_;
};

}  // namespace uroce::sim
