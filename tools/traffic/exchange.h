// The out-of-band connection exchange between two uroce peers over TCP, as
// perftest does: each side sends what the other needs to connect a QP and
// reach its memory. Fixed-size, big-endian, versioned.
#pragma once

#include <cstdint>
#include <string>

#include "stack/wire/addr.h"
#include "stack/wire/be.h"

namespace uroce::traffic {

struct PeerInfo {
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  wire::IpAddr gid{};
  std::uint32_t rkey = 0;
  std::uint64_t va = 0;
  std::uint64_t len = 0;
  std::uint32_t mtu = 0;
};

/// Wire form: magic "UROC", version, then the fields, 64 bytes in all.
inline constexpr std::uint32_t kExchangeMagic = 0x55524f43;
inline constexpr std::uint16_t kExchangeVersion = 1;
inline constexpr std::size_t kExchangeBytes = 64;

void encode(const PeerInfo& p, std::uint8_t out[kExchangeBytes]);
/// False (with `err`) on a bad magic or version.
bool decode(const std::uint8_t in[kExchangeBytes], PeerInfo& p, std::string& err);

/// Blocking helpers on a connected socket, with a deadline in ms.
bool send_all(int fd, const void* buf, std::size_t n, int timeout_ms);
bool recv_all(int fd, void* buf, std::size_t n, int timeout_ms);

}  // namespace uroce::traffic
