// Neighbour resolution and the non-RoCE frames a host must answer: ARP
// (RFC 826) requests and replies, ICMP echo to our IPv4 address, and IPv6
// Neighbor Solicitation/Advertisement (RFC 4861). What it learns goes into
// the engine's one neighbour table (transport::NeighborTable), which it
// does not own.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "stack/transport/neighbor_table.h"
#include "stack/wire/addr.h"
#include "stack/wire/be.h"
#include "stack/wire/headers.h"

namespace uroce::pipeline {

class Neighbors {
 public:
  Neighbors(transport::NeighborTable& table, const wire::MacAddr& mac, const wire::IpAddr& ip,
            std::uint16_t vlan_tci = 0)
      : mac_(mac), ip_(ip), vlan_tci_(vlan_tci), table_(table) {}

  enum class Verdict : std::uint8_t {
    kNotMine,  // not ARP/ICMP/ND for us: the caller decides
    kHandled,  // consumed (learned, or ignored on purpose)
    kReply,    // consumed, and `reply` holds a frame to send
  };
  /// Looks at a received frame. Fills `reply` (reply_len bytes) for kReply.
  Verdict handle(wire::ConstBytes frame, wire::Bytes reply, std::size_t& reply_len);

  /// Builds a broadcast ARP request, or an IPv6 Neighbor Solicitation, for `ip`.
  std::size_t build_request(const wire::IpAddr& ip, wire::Bytes out) const;

  /// Called when an entry is learned or changes (for the log; the table is the engine's).
  void (*on_learn)(void* ctx, const wire::IpAddr& ip, const wire::MacAddr& mac) = nullptr;
  void* on_learn_ctx = nullptr;
  /// Whether to answer ARP/NS/echo. When a port is sharded over several
  /// pipelines, each learns from every ARP/ND frame but only one answers.
  bool answer = true;

  [[nodiscard]] const wire::IpAddr& ip() const { return ip_; }
  [[nodiscard]] const wire::MacAddr& mac() const { return mac_; }

 private:
  void learn(const wire::IpAddr& ip, const wire::MacAddr& mac);
  Verdict arp(wire::ConstBytes f, std::size_t l3, wire::Bytes reply, std::size_t& len);
  Verdict icmp4(wire::ConstBytes f, std::size_t l3, wire::Bytes reply, std::size_t& len);
  Verdict icmp6(wire::ConstBytes f, std::size_t l3, wire::Bytes reply, std::size_t& len);

  std::size_t put_eth(wire::Bytes out, const wire::MacAddr& dst, std::uint16_t type) const;
  std::size_t build_nd(wire::Bytes out, const wire::MacAddr& dmac, const wire::IpAddr& dst, std::uint8_t type,
                       std::uint8_t flags, const wire::IpAddr& target, std::uint8_t lladdr_option) const;
  wire::MacAddr mac_;
  wire::IpAddr ip_;
  std::uint16_t vlan_tci_;
  transport::NeighborTable& table_;
};

/// RFC 1071 one's-complement sum, continued from `sum`, unfolded.
std::uint32_t csum_add(std::uint32_t sum, const std::uint8_t* p, std::size_t n);
std::uint16_t csum_fold(std::uint32_t sum);

}  // namespace uroce::pipeline
