#include "stack/wire/addr.h"

#include <arpa/inet.h>

namespace uroce::wire {

std::string IpAddr::to_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (is_v4_mapped()) {
    inet_ntop(AF_INET, v4(), buf, sizeof(buf));
  } else {
    inet_ntop(AF_INET6, b.data(), buf, sizeof(buf));
  }
  return buf;
}

bool IpAddr::parse(const std::string& text, IpAddr& out) {
  std::uint8_t v4buf[4];
  if (inet_pton(AF_INET, text.c_str(), v4buf) == 1) {
    out = from_v4_bytes(v4buf);
    return true;
  }
  IpAddr r;
  if (inet_pton(AF_INET6, text.c_str(), r.b.data()) == 1) {
    out = r;
    return true;
  }
  return false;
}

}  // namespace uroce::wire
