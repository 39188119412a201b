// An ethdev port as a PortIo: any DPDK poll-mode driver, a PCI NIC or a vdev
// (net_ring, net_memif, net_af_packet, net_af_xdp, net_tap, net_pcap).
// This header has no DPDK types; dpdk_port.cc is the only file that includes
// rte_*.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "stack/pipeline/port_io.h"

namespace uroce::dpdk {

/// Initialises the EAL with `args` (as on a DPDK command line, without argv[0]).
///
/// There is no cleanup: the EAL's memory stays mapped until the process
/// exits. DPDK 22.11's interrupt thread runs on through rte_eal_cleanup
/// (nothing stops or joins it) and rebuilds its epoll set from every
/// registered interrupt source whenever one comes or goes, cleanup's own
/// unregistrations included. Sources a driver freed without unregistering
/// (memif's) stay in that list, so a rebuild during or after the heap's
/// unmapping reads unmapped memory: the crash at shutdown in
/// eal-intr-thread (rte_intr_fd_get). A 100 ms sleep before
/// rte_eal_cleanup only made it rarer; how rare depends on timing alone
/// (tools/restart_stress.sh: the old order without the sleep, 0 crashes in
/// 105 cycles; ports stopped on the interrupt thread with rte_eal_cleanup
/// right after, 3 in 20, every one in that thread). With the memory mapped the
/// thread reads only stale memory, and the exit ends it. Cleanup would
/// otherwise unlink the multi-process socket (the next start with the same
/// --file-prefix replaces it) and unmap what the kernel reclaims at exit;
/// an embedded node's application keeps the EAL's memory until it exits
/// (DPDK cannot start twice in a process either way). Ports are stopped on
/// the interrupt thread itself (Port::~Port).
bool eal_init(const std::vector<std::string>& args, std::string& err);

struct PortOptions {
  std::string name;  // ethdev name: a vdev given with --vdev, or a PCI address
  /// Pipelines sharing the port, one per lcore. Shard 0 is the I/O lcore:
  /// its dispatcher reads the RX queue and hands frames to each shard's ring
  /// by destination QP, and sends what the other shards put on the TX funnel.
  std::uint16_t shards = 1;
  std::uint16_t rx_desc = 1024;
  std::uint16_t tx_desc = 1024;
  std::uint32_t mbufs = 8191;
  std::uint16_t data_room = 9216;  // one segment per frame up to a 9K MTU
  /// Send payloads from registered memory as external buffers when the port
  /// takes multi-segment frames and IOVA is VA; otherwise copy.
  bool zero_copy = true;
  std::uint32_t zero_copy_min = 256;  // below this a copy is cheaper than a chain
  /// Ask for an RX queue interrupt where the PMD has one (net_tap,
  /// net_af_xdp, NICs; not memif or af_packet in DPDK 22.11), so an idle
  /// loop can block until a frame comes instead of waking on a poll tick.
  bool rx_interrupts = true;
  /// The Ethernet MTU to set (rte_eth_dev_set_mtu); 0 leaves the driver's.
  std::uint32_t mtu = 0;
};

struct PortStats {
  std::uint64_t rx_frames = 0, tx_frames = 0, tx_dropped = 0, rx_linearized = 0, tx_zero_copy = 0, tx_copied = 0;
  std::uint64_t tx_looped = 0;  // frames to the port's own MAC, looped back to its RX
  std::uint64_t hw_ipackets = 0, hw_opackets = 0, hw_imissed = 0, hw_ierrors = 0, hw_oerrors = 0;
};

class Port : public pipeline::PortIo {
 public:
  /// Configures and starts the port; on failure returns nullptr and sets err.
  static std::unique_ptr<Port> open(const PortOptions& o, std::string& err);
  ~Port() override;

  std::uint16_t rx_burst(pipeline::RxFrame* out, std::uint16_t max) override;
  void rx_done() override;
  bool tx(const transport::TxFrame& f) override;
  bool tx_raw(wire::ConstBytes frame) override;
  void tx_push() override;
  [[nodiscard]] std::uint32_t tx_room() const override;
  [[nodiscard]] wire::MacAddr mac() const override { return mac_; }
  [[nodiscard]] pipeline::LinkInfo link() const override;

  [[nodiscard]] PortStats stats() const;
  /// Whether the port computes IPv4 header checksums on transmit.
  [[nodiscard]] bool ipv4_checksum_offload() const;
  /// Driver name and the offloads in use, for the log.
  [[nodiscard]] std::string describe() const;

  /// The RX queue's interrupt descriptor (readable when a frame is waiting
  /// while armed), or -1 when the port has none. The port owns it.
  [[nodiscard]] int rx_interrupt_fd() const;
  /// Before blocking on rx_interrupt_fd(): arm it (then poll once more, as a
  /// frame that came before the arm raises nothing). After waking: disarm.
  void rx_interrupt_arm();
  void rx_interrupt_disarm();

  /// With shards > 1: the PortIo of shard i (its own TX queue; RX from its ring).
  pipeline::PortIo& shard(std::uint16_t i);
  /// With shards > 1, run by shard 0's lcore: one RX burst from the device,
  /// each frame handed to the ring of `owner(frame)`; owner -1 means "every
  /// shard" (ARP/ND, so each learns neighbours). Returns frames moved.
  using Owner = int (*)(wire::ConstBytes frame, std::uint16_t shards);
  std::uint16_t dispatch(Owner owner);
  [[nodiscard]] std::uint64_t dispatch_drops() const;

 private:
  Port() = default;
  struct Impl;
  struct Queue;
  std::unique_ptr<Impl> impl_;
  wire::MacAddr mac_{};
};

}  // namespace uroce::dpdk
