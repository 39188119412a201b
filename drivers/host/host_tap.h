// The host's netdev: a kernel TAP device that carries the port's RoCE
// address, the exception path of the node. The kernel answers ARP, ND and
// ICMP for the address and runs every TCP and UDP socket on it; the node's
// dataplane hands it the frames that are not RoCE and sends on the wire what
// it writes (pipeline::Dataplane::set_host). So the RoCE address is a host
// address: a program's TCP side channel and its rdma_resolve_addr use the
// same one, as on rxe, and getifaddrs() lists it.
//
// It is a PortIo over the TAP's file descriptor (non-blocking reads and
// writes, buffers set aside when it opens). No DPDK types; set up with the
// kernel's own ioctls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "stack/pipeline/port_io.h"
#include "stack/wire/addr.h"

namespace uroce::host {

struct TapOptions {
  /// The netdev's name (at most 15 bytes); a name with "%d" lets the
  /// kernel pick the number.
  std::string name;
  wire::MacAddr mac{};  // the port's, so the kernel's frames carry it
  wire::IpAddr ip{};
  unsigned prefix = 0;  // the address's prefix length; 0: a host route (/32, /128)
  std::uint32_t mtu = 0;  // the link's Ethernet MTU; 0 leaves the kernel's 1500
};

struct TapStats {
  std::uint64_t rx_frames = 0;   // read from the kernel
  std::uint64_t tx_frames = 0;   // written to the kernel
  std::uint64_t tx_dropped = 0;  // the kernel's queue was full, or the frame too long
};

class HostTap : public pipeline::PortIo {
 public:
  /// Creates the TAP, gives it the MAC, MTU and address, and brings it up;
  /// on failure returns nullptr and sets err.
  static std::unique_ptr<HostTap> open(const TapOptions& o, std::string& err);
  ~HostTap() override;
  HostTap(const HostTap&) = delete;
  HostTap& operator=(const HostTap&) = delete;

  std::uint16_t rx_burst(pipeline::RxFrame* out, std::uint16_t max) override;
  void rx_done() override {}
  bool tx(const transport::TxFrame& f) override;
  bool tx_raw(wire::ConstBytes frame) override;
  void tx_push() override {}
  [[nodiscard]] wire::MacAddr mac() const override { return mac_; }

  /// The netdev's name as the kernel gave it.
  [[nodiscard]] const std::string& name() const { return name_; }
  /// Readable when the kernel has a frame for the wire.
  [[nodiscard]] int fd() const { return fd_; }
  [[nodiscard]] const TapStats& stats() const { return stats_; }

  static constexpr std::uint16_t kBurst = 8;
  static constexpr std::size_t kFrameMax = 9216 + 18;

 private:
  HostTap() = default;
  int fd_ = -1;
  std::string name_;
  wire::MacAddr mac_{};
  TapStats stats_;
  std::unique_ptr<std::uint8_t[]> rx_buf_;  // kBurst frames of kFrameMax
  std::unique_ptr<std::uint8_t[]> tx_buf_;  // one flattened frame
};

}  // namespace uroce::host
