#include "tools/traffic/exchange.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace uroce::traffic {

namespace {
template <typename T>
void put(std::uint8_t*& p, T v) {
  wire::be<T> b;
  b.set(v);
  std::memcpy(p, b.b, sizeof(T));
  p += sizeof(T);
}
template <typename T>
T get(const std::uint8_t*& p) {
  wire::be<T> b;
  std::memcpy(b.b, p, sizeof(T));
  p += sizeof(T);
  return b.get();
}
}  // namespace

void encode(const PeerInfo& i, std::uint8_t out[kExchangeBytes]) {
  std::memset(out, 0, kExchangeBytes);
  std::uint8_t* p = out;
  put<std::uint32_t>(p, kExchangeMagic);
  put<std::uint16_t>(p, kExchangeVersion);
  put<std::uint16_t>(p, 0);
  put<std::uint32_t>(p, i.qpn);
  put<std::uint32_t>(p, i.psn);
  std::memcpy(p, i.gid.b.data(), 16);
  p += 16;
  put<std::uint32_t>(p, i.rkey);
  put<std::uint64_t>(p, i.va);
  put<std::uint64_t>(p, i.len);
  put<std::uint32_t>(p, i.mtu);
}

bool decode(const std::uint8_t in[kExchangeBytes], PeerInfo& i, std::string& err) {
  const std::uint8_t* p = in;
  if (get<std::uint32_t>(p) != kExchangeMagic) {
    err = "peer exchange: bad magic (not a uroce peer?)";
    return false;
  }
  const std::uint16_t v = get<std::uint16_t>(p);
  if (v != kExchangeVersion) {
    err = "peer exchange: version " + std::to_string(v) + ", we speak " + std::to_string(kExchangeVersion);
    return false;
  }
  p += 2;
  i.qpn = get<std::uint32_t>(p);
  i.psn = get<std::uint32_t>(p);
  std::memcpy(i.gid.b.data(), p, 16);
  p += 16;
  i.rkey = get<std::uint32_t>(p);
  i.va = get<std::uint64_t>(p);
  i.len = get<std::uint64_t>(p);
  i.mtu = get<std::uint32_t>(p);
  if (i.qpn > 0xffffff || i.psn > 0xffffff) {
    err = "peer exchange: QPN or PSN over 24 bits";
    return false;
  }
  return true;
}

static bool wait_fd(int fd, short ev, std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return false;
  pollfd pfd{fd, ev, 0};
  return ::poll(&pfd, 1, static_cast<int>(left.count())) == 1;
}

bool send_all(int fd, const void* buf, std::size_t n, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const auto* p = static_cast<const std::uint8_t*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return false;
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool recv_all(int fd, void* buf, std::size_t n, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto* p = static_cast<std::uint8_t*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

}  // namespace uroce::traffic
