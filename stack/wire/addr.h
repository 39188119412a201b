// IP addresses as 16-byte GIDs: IPv6 as is, IPv4 as ::ffff:a.b.c.d
// (the IPv4-mapped RoCEv2 GID, IBTA A17.4.5.1).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace uroce::wire {

enum class IpVersion : std::uint8_t { kV4 = 4, kV6 = 6 };

struct IpAddr {
  std::array<std::uint8_t, 16> b{};

  static IpAddr from_v4(std::uint8_t a, std::uint8_t b1, std::uint8_t c, std::uint8_t d) {
    IpAddr r;
    r.b[10] = r.b[11] = 0xff;
    r.b[12] = a;
    r.b[13] = b1;
    r.b[14] = c;
    r.b[15] = d;
    return r;
  }
  static IpAddr from_v4_bytes(const std::uint8_t* p) { return from_v4(p[0], p[1], p[2], p[3]); }
  static IpAddr from_v6_bytes(const std::uint8_t* p) {
    IpAddr r;
    for (int i = 0; i < 16; ++i) r.b[static_cast<std::size_t>(i)] = p[i];
    return r;
  }
  [[nodiscard]] bool is_v4_mapped() const {
    for (int i = 0; i < 10; ++i)
      if (b[static_cast<std::size_t>(i)] != 0) return false;
    return b[10] == 0xff && b[11] == 0xff;
  }
  [[nodiscard]] const std::uint8_t* v4() const { return &b[12]; }
  /// An IPv4 (224/4) or IPv6 (ff00::/8) multicast group.
  [[nodiscard]] bool is_multicast() const { return is_v4_mapped() ? (b[12] & 0xf0) == 0xe0 : b[0] == 0xff; }
  /// The Ethernet address a multicast group's frames go to (RFC 1112:
  /// 01:00:5e and the low 23 bits; RFC 2464: 33:33 and the low 32 bits).
  [[nodiscard]] std::array<std::uint8_t, 6> multicast_mac() const {
    if (is_v4_mapped()) return {0x01, 0x00, 0x5e, static_cast<std::uint8_t>(b[13] & 0x7f), b[14], b[15]};
    return {0x33, 0x33, b[12], b[13], b[14], b[15]};
  }
  friend bool operator==(const IpAddr&, const IpAddr&) = default;
  friend auto operator<=>(const IpAddr&, const IpAddr&) = default;

  /// Dotted quad for IPv4-mapped addresses, RFC 5952 text otherwise.
  [[nodiscard]] std::string to_string() const;
  /// Parses "a.b.c.d" or an IPv6 literal; returns false on bad input.
  static bool parse(const std::string& text, IpAddr& out);
};

}  // namespace uroce::wire
