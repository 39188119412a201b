// uroce_exchange_tcp: the out-of-band connection parameters exchange.
// Wire format: struct Msg below (48 bytes, big-endian).
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "stack/verbs/uroce_verbs.h"
#include "stack/wire/be.h"

namespace uroce::verbs_detail {
int set_error(int err, std::string why);  // liburoce_session.cc
}

namespace {

using Clock = std::chrono::steady_clock;
namespace wire = uroce::wire;
using uroce::verbs_detail::set_error;

constexpr std::uint32_t kMagic = 0x55524f42;  // "UROB"
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kMsgLen = 48;

struct Msg {
  wire::be32 magic, version, qp_num, psn, rkey;
  wire::be64 addr;
  std::uint8_t gid[16];
  std::uint8_t reserved[4];
};
static_assert(sizeof(Msg) == kMsgLen);

void encode(const uroce_conn_info& c, std::uint8_t* m) {
  Msg w{};
  w.magic.set(kMagic);
  w.version.set(kVersion);
  w.qp_num.set(c.qp_num);
  w.psn.set(c.psn);
  w.rkey.set(c.rkey);
  w.addr.set(c.addr);
  std::memcpy(w.gid, c.gid.raw, 16);
  std::memcpy(m, &w, kMsgLen);
}

bool decode(const std::uint8_t* m, uroce_conn_info& c) {
  Msg w;
  std::memcpy(&w, m, kMsgLen);
  if (w.magic.get() != kMagic || w.version.get() != kVersion) return false;
  c.qp_num = w.qp_num.get();
  c.psn = w.psn.get();
  c.rkey = w.rkey.get();
  c.addr = w.addr.get();
  std::memcpy(c.gid.raw, w.gid, 16);
  return true;
}

int ms_left(Clock::time_point deadline) {
  const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return d > 0 ? static_cast<int>(d) : 0;
}

/// Waits for `events` on fd until the deadline: 0, ETIMEDOUT or errno.
int wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    // Reads wait in liburoce, which turns an embedded node meanwhile.
    const int n = events == POLLIN ? uroce_wait_fd(fd, ms_left(deadline)) : ::poll(&p, 1, ms_left(deadline));
    if (n > 0) return 0;
    if (n == 0) return ETIMEDOUT;
    if (errno != EINTR) return errno;
  }
}

/// Sends ours and reads theirs on a connected socket.
int swap(int fd, const uroce_conn_info& mine, uroce_conn_info& theirs, Clock::time_point deadline) {
  std::uint8_t out[kMsgLen], in[kMsgLen];
  encode(mine, out);
  if (::send(fd, out, kMsgLen, MSG_NOSIGNAL) != static_cast<ssize_t>(kMsgLen)) return errno ? errno : EIO;
  std::size_t got = 0;
  while (got < kMsgLen) {
    if (int rc = wait_fd(fd, POLLIN, deadline)) return rc;
    const ssize_t n = ::recv(fd, in + got, kMsgLen - got, 0);
    if (n == 0) return ECONNRESET;
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    got += static_cast<std::size_t>(n);
  }
  return decode(in, theirs) ? 0 : EPROTO;
}

}  // namespace

extern "C" int uroce_exchange_tcp(const char* host, uint16_t port, int timeout_ms, const uroce_conn_info* mine,
                                  uroce_conn_info* theirs) {
  if (!mine || !theirs || timeout_ms < 0) return set_error(EINVAL, "exchange_tcp: bad arguments");
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::string service = std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = host ? 0 : AI_PASSIVE;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host, service.c_str(), &hints, &res) != 0 || !res) return set_error(EHOSTUNREACH, "exchange_tcp: cannot resolve " + std::string(host ? host : "the listening address"));
  int rc = ETIMEDOUT;
  if (!host) {  // listen and accept one peer
    const int ls = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (ls < 0) rc = errno;
    else if (::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
             ::bind(ls, res->ai_addr, res->ai_addrlen) != 0 || ::listen(ls, 1) != 0)
      rc = errno;
    else if ((rc = wait_fd(ls, POLLIN, deadline)) == 0) {
      const int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
      rc = fd < 0 ? errno : swap(fd, *mine, *theirs, deadline);
      if (fd >= 0) ::close(fd);
    }
    if (ls >= 0) ::close(ls);
  } else {  // connect, retrying while the peer is not listening yet
    while (ms_left(deadline) > 0) {
      const int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        rc = errno;
        break;
      }
      if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        rc = swap(fd, *mine, *theirs, deadline);
        ::close(fd);
        break;
      }
      ::close(fd);
      ::usleep(20000);
    }
  }
  ::freeaddrinfo(res);
  if (rc == 0) return 0;
  const char* what = rc == ETIMEDOUT ? "no peer within the timeout"
                     : rc == EPROTO  ? "the peer does not speak the uroce exchange"
                                     : std::strerror(rc);
  return set_error(rc, std::string("exchange_tcp: ") + what);
}
