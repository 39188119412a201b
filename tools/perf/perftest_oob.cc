#include "tools/perf/perftest_oob.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "stack/verbs/uroce_verbs.h"

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace uroce::perf {

std::array<char, kKeyMsgGid> format_keys(const Dest& d) {
  std::array<char, kKeyMsgGid> m{};
  int n = std::snprintf(m.data(), m.size(), "%04x:%04x:%06x:%06x:%08x:%016llx:", d.lid & 0xffff, d.out_reads & 0xffff,
                        d.qpn & 0xffffff, d.psn & 0xffffff, d.rkey, static_cast<unsigned long long>(d.vaddr));
  for (std::uint8_t b : d.gid) n += std::snprintf(m.data() + n, m.size() - static_cast<std::size_t>(n), "%02x:", b);
  std::snprintf(m.data() + n, m.size() - static_cast<std::size_t>(n), "%08x:", d.srqn);
  return m;
}

bool parse_keys(const char* msg, std::size_t len, Dest& out) {
  if (len != kKeyMsgGid || msg[kKeyMsgGid - 1] != '\0' || std::strlen(msg) != kKeyMsgGid - 1) return false;
  // Fixed widths: check each field's width and separator, then read it.
  static constexpr int kWidth[] = {4, 4, 6, 6, 8, 16, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 8};
  unsigned long long v[23];
  std::size_t at = 0;
  for (int i = 0; i < 23; ++i) {
    char field[17] = {};
    for (int k = 0; k < kWidth[i]; ++k) {
      const char c = msg[at + static_cast<std::size_t>(k)];
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
      field[k] = c;
    }
    at += static_cast<std::size_t>(kWidth[i]);
    if (msg[at++] != ':') return false;
    v[i] = std::strtoull(field, nullptr, 16);
  }
  out.lid = static_cast<std::uint32_t>(v[0]);
  out.out_reads = static_cast<std::uint32_t>(v[1]);
  out.qpn = static_cast<std::uint32_t>(v[2]);
  out.psn = static_cast<std::uint32_t>(v[3]);
  out.rkey = static_cast<std::uint32_t>(v[4]);
  out.vaddr = v[5];
  for (int i = 0; i < 16; ++i) out.gid[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v[6 + i]);
  out.srqn = static_cast<std::uint32_t>(v[22]);
  return true;
}

PerftestOob::~PerftestOob() {
  if (fd_ >= 0) ::close(fd_);
}

bool PerftestOob::fail(std::string why) {
  error_ = std::move(why);
  return false;
}

bool PerftestOob::accept(std::uint16_t port, int timeout_ms) {
  server_ = true;
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0) {
    ::close(ls);
    return fail("cannot listen on TCP port " + std::to_string(port) + ": " + std::strerror(errno));
  }
  if (uroce_wait_fd(ls, timeout_ms) != 1) {
    ::close(ls);
    return fail("no client connected within " + std::to_string(timeout_ms / 1000) + " s");
  }
  fd_ = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  ::close(ls);  // one client, as perftest
  if (fd_ < 0) return fail(std::string("accept: ") + std::strerror(errno));
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return true;
}

bool PerftestOob::connect(const std::string& host, std::uint16_t port, int timeout_ms) {
  server_ = false;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    return fail("cannot resolve " + host);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd_, res->ai_addr, res->ai_addrlen) == 0) break;
    ::close(fd_);
    fd_ = -1;
    if (std::chrono::steady_clock::now() >= end) {
      ::freeaddrinfo(res);
      return fail("cannot connect to " + host + ":" + std::to_string(port) + " (is the server running?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(res);
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return true;
}

bool PerftestOob::write_all(const void* p, std::size_t n) {
  // One write per message: real perftest reads each message with one read().
  const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
  if (w != static_cast<ssize_t>(n)) return fail("the peer closed the exchange (write)");
  bytes_out += n;
  return true;
}

bool PerftestOob::read_all(void* p, std::size_t n) {
  auto* b = static_cast<std::uint8_t*>(p);
  std::size_t got = 0;
  while (got < n) {
    // uroce_wait_fd: an embedded node keeps answering its peer meanwhile.
    if (uroce_wait_fd(fd_, timeout_ms_) != 1) return fail("the peer went quiet in the exchange");
    const ssize_t r = ::read(fd_, b + got, n - got);
    if (r <= 0) return fail("the peer closed the exchange (read)");
    got += static_cast<std::size_t>(r);
  }
  bytes_in += n;
  return true;
}

bool PerftestOob::xchg(const void* out, void* in, std::size_t n) {
  if (fd_ < 0) return fail("not connected");
  if (server_) return read_all(in, n) && write_all(out, n);
  return write_all(out, n) && read_all(in, n);
}

bool PerftestOob::exchange_versions(std::string& peer) {
  char mine[kVersionMsg] = {}, theirs[kVersionMsg] = {};
  std::strncpy(mine, kPerftestVersion, sizeof mine);
  if (!xchg(mine, theirs, sizeof mine)) return false;
  theirs[kVersionMsg - 1] = '\0';
  peer = theirs;
  if (std::atof(theirs) < kMinPeerVersion)
    return fail("the peer speaks perftest version '" + peer + "'; 5.70 or newer is needed");
  return true;
}

bool PerftestOob::sys_data(std::uint32_t& cycle_buffer, std::uint32_t& cache_line) {
  for (std::uint32_t* v : {&cycle_buffer, &cache_line}) {
    const std::uint32_t out = htonl(*v);
    std::uint32_t in = 0;
    if (!xchg(&out, &in, 4)) return false;
    *v = std::max(*v, ntohl(in));
  }
  return true;
}

bool PerftestOob::mtu(int& mtu) {
  char out[2] = {static_cast<char>('0' + mtu), '\0'}, in[2] = {};
  if (!xchg(out, in, 2)) return false;
  const int rem = in[0] - '0';
  if (in[1] != '\0' || rem < 1 || rem > 5) return fail("the peer's MTU is not an ibv_mtu digit");
  mtu = std::min(mtu, rem);
  return true;
}

bool PerftestOob::hand_shake(const Dest& mine, Dest& theirs) {
  const auto out = format_keys(mine);
  char in[kKeyMsgGid];
  if (!xchg(out.data(), in, sizeof in)) return false;
  if (!parse_keys(in, sizeof in, theirs)) return fail("the peer's key message is not perftest's 108-byte GID form");
  return true;
}

bool PerftestOob::bw_report(const BwReport& mine, BwReport& theirs) {
  auto item = [&](std::uint64_t out, std::uint64_t& in) {
    const std::uint64_t be = __builtin_bswap64(out);
    std::uint64_t got = 0;
    if (!xchg(&be, &got, 8)) return false;
    in = __builtin_bswap64(got);
    return true;
  };
  std::uint64_t peak = 0, avg = 0, rate = 0;
  if (!item(mine.size, theirs.size) || !item(mine.iters, theirs.iters) ||
      !item(std::bit_cast<std::uint64_t>(mine.bw_peak), peak) || !item(std::bit_cast<std::uint64_t>(mine.bw_avg), avg) ||
      !item(std::bit_cast<std::uint64_t>(mine.msg_rate), rate))
    return false;
  theirs.bw_peak = std::bit_cast<double>(peak);
  theirs.bw_avg = std::bit_cast<double>(avg);
  theirs.msg_rate = std::bit_cast<double>(rate);
  return true;
}

bool PerftestOob::close_connection(const Dest& mine) {
  Dest theirs;
  if (!hand_shake(mine, theirs)) return false;
  static const char kDone[] = "done";
  const bool ok = write_all(kDone, sizeof kDone);  // perftest 6.06 writes it and nobody reads it
  // Take the peer's "done" if it sends one (6.24 does not), so closing with
  // unread bytes does not reset the connection under it.
  char sink[8];
  if (uroce_wait_fd(fd_, 200) == 1) (void)!::read(fd_, sink, sizeof sink);
  ::close(fd_);
  fd_ = -1;
  return ok;
}

}  // namespace uroce::perf
