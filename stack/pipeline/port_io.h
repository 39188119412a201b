// The small device interface between the dataplane loop and a driver:
// bursts of received frames in, frames out. drivers/dpdk implements it over
// an ethdev port; tests implement it in memory. No DPDK types cross it.
#pragma once

#include <cstdint>

#include "stack/transport/engine.h"
#include "stack/wire/be.h"

namespace uroce::pipeline {

struct RxFrame {
  const std::uint8_t* data = nullptr;
  std::uint32_t len = 0;
};

/// The link as the driver reports it.
struct LinkInfo {
  bool up = true;
  std::uint32_t speed_mbps = 0;  // 0: unknown
  std::uint32_t mtu = 0;         // the Ethernet MTU; 0: unknown
};

class PortIo {
 public:
  virtual ~PortIo() = default;
  /// Receives up to `max` frames; they stay valid until rx_done().
  virtual std::uint16_t rx_burst(RxFrame* out, std::uint16_t max) = 0;
  virtual void rx_done() = 0;
  /// Queues a transport frame (headers + payload by reference + trailer).
  virtual bool tx(const transport::TxFrame& f) = 0;
  /// Queues raw bytes (ARP replies, injected or delayed frames).
  virtual bool tx_raw(wire::ConstBytes frame) = 0;
  /// Sends what is queued.
  virtual void tx_push() = 0;
  /// Frames it can take now without dropping any (the dataplane gives the
  /// engine no more); unbounded where the driver cannot tell.
  [[nodiscard]] virtual std::uint32_t tx_room() const { return UINT32_MAX; }
  [[nodiscard]] virtual wire::MacAddr mac() const = 0;
  /// The link's state and speed (control path: may ask the driver). A port
  /// that cannot tell is up at an unknown speed.
  [[nodiscard]] virtual LinkInfo link() const { return {}; }
};

}  // namespace uroce::pipeline
