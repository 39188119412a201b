// Which QP numbers an engine owns: the one place the formula lives. Several
// engines (one per lcore) share a port by owning disjoint numbers: engine
// `shard` of `shards` owns kFirstQpn + shard + k * shards (k = 0, 1, ...),
// so a frame's owner follows from its DestQP alone (pipeline/shard.h).
#pragma once

#include <cstdint>

namespace uroce::transport {

inline constexpr std::uint32_t kFirstQpn = 0x11;  // QP0/QP1 are special in IBTA

struct QpnSpace {
  std::uint32_t shard = 0;   // this engine's
  std::uint32_t shards = 1;  // engines sharing the port

  /// The shard that owns `qpn` among `shards`.
  static std::uint32_t owner(std::uint32_t qpn, std::uint32_t shards) { return (qpn - kFirstQpn) % shards; }
  /// This engine's index-th number.
  [[nodiscard]] std::uint32_t qpn(std::uint32_t index) const { return kFirstQpn + shard + index * shards; }
  /// The index of `qpn` among this engine's numbers; false if it is not one.
  [[nodiscard]] bool index(std::uint32_t qpn, std::uint32_t& i) const {
    if (qpn < kFirstQpn + shard) return false;
    const std::uint32_t d = qpn - kFirstQpn - shard;
    if (d % shards != 0) return false;
    i = d / shards;
    return true;
  }
};

}  // namespace uroce::transport
