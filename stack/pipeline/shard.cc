#include "stack/pipeline/shard.h"

#include "stack/transport/qpn_space.h"
#include "stack/wire/headers.h"

namespace uroce::pipeline {

namespace {
std::uint16_t be16(wire::ConstBytes f, std::size_t at) { return static_cast<std::uint16_t>((f[at] << 8) | f[at + 1]); }
constexpr std::uint8_t kUdp = 17, kIcmpv6 = 58;
}  // namespace

int frame_owner(wire::ConstBytes f, std::uint16_t shards) {
  if (f.size() < 14) return 0;
  std::size_t l3 = 14;
  std::uint16_t type = be16(f, 12);
  if (type == wire::kEtherTypeVlan && f.size() >= 18) {
    type = be16(f, 16);
    l3 = 18;
  }
  if (type == wire::kEtherTypeArp) return -1;
  std::size_t udp = 0;
  if (type == wire::kEtherTypeIpv4) {
    if (f.size() < l3 + 20 || (f[l3] >> 4) != 4 || f[l3 + 9] != kUdp) return 0;
    udp = l3 + std::size_t{f[l3] & 0x0fu} * 4;
  } else if (type == wire::kEtherTypeIpv6) {
    if (f.size() < l3 + 40) return 0;
    if (f[l3 + 6] == kIcmpv6) return -1;
    if (f[l3 + 6] != kUdp) return 0;
    udp = l3 + 40;
  } else {
    return 0;
  }
  // The BTH's DestQP: bytes 5..7 of the BTH, after the 8-byte UDP header.
  if (f.size() < udp + 8 + 8 || be16(f, udp + 2) != wire::kRoceV2Port) return 0;
  const std::size_t bth = udp + 8;
  const std::uint32_t destqp = (std::uint32_t{f[bth + 5]} << 16) | (std::uint32_t{f[bth + 6]} << 8) | f[bth + 7];
  return static_cast<int>(transport::QpnSpace::owner(destqp, shards));
}

}  // namespace uroce::pipeline
