// Kernel TCP with the same message sizes as uroce-perf: what a user without
// RDMA would use. A ping-pong (half round trip) and a stream (goodput).
//
//   tcp_bench server [--port P]                       serves clients one after another
//   tcp_bench client HOST [--port P] --mode pingpong|stream --size N [--iters N] [--json]
//
// The client sends a 16-byte header (mode, size, iterations); the server
// answers every message of a ping-pong, and acknowledges the end of a stream
// with one byte, so the client's clock covers delivery.
#include <arpa/inet.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Hdr {
  std::uint32_t mode;  // 1 ping-pong, 2 stream
  std::uint32_t size;
  std::uint64_t iters;
};

bool full(int fd, void* p, std::size_t n, bool rd) {
  auto* b = static_cast<std::uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = rd ? ::read(fd, b, n) : ::write(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

void nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int serve(std::uint16_t port) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 4) != 0) {
    std::perror("tcp_bench: bind/listen");
    return 2;
  }
  for (;;) {
    const int fd = ::accept(ls, nullptr, nullptr);
    if (fd < 0) continue;
    nodelay(fd);
    Hdr h{};
    if (full(fd, &h, sizeof h, true) && h.size > 0 && h.size <= (64u << 20)) {
      std::vector<std::uint8_t> buf(h.size);
      if (h.mode == 1) {
        for (std::uint64_t i = 0; i < h.iters; ++i)
          if (!full(fd, buf.data(), h.size, true) || !full(fd, buf.data(), h.size, false)) break;
      } else {
        for (std::uint64_t i = 0; i < h.iters; ++i)
          if (!full(fd, buf.data(), h.size, true)) break;
        std::uint8_t ack = 1;
        full(fd, &ack, 1, false);
      }
    }
    ::close(fd);
  }
}

int client(const char* host, std::uint16_t port, const std::string& mode, std::uint32_t size, std::uint64_t iters,
           bool json) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host, std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    std::fprintf(stderr, "tcp_bench: cannot resolve %s\n", host);
    return 2;
  }
  int fd = -1;
  for (int tries = 0; tries < 50; ++tries) {  // the server may still be starting
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
    ::close(fd);
    fd = -1;
    ::usleep(100000);
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    std::fprintf(stderr, "tcp_bench: cannot connect to %s:%u\n", host, port);
    return 2;
  }
  nodelay(fd);
  const bool pp = mode == "pingpong";
  Hdr h{pp ? 1u : 2u, size, iters};
  std::vector<std::uint8_t> buf(size, 0x5a);
  if (!full(fd, &h, sizeof h, false)) return 2;
  using clk = std::chrono::steady_clock;
  if (pp) {
    std::vector<double> half;  // microseconds
    half.reserve(iters);
    for (std::uint64_t i = 0; i < iters; ++i) {
      const auto t0 = clk::now();
      if (!full(fd, buf.data(), size, false) || !full(fd, buf.data(), size, true)) return 1;
      half.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count() / 2);
    }
    std::sort(half.begin(), half.end());
    double sum = 0;
    for (double v : half) sum += v;
    const double avg = sum / static_cast<double>(half.size());
    const double med = half[half.size() / 2], p99 = half[half.size() * 99 / 100];
    if (json)
      std::printf("{\"mode\": \"pingpong\", \"size\": %u, \"iters\": %lu, \"t_min\": %.2f, \"t_typical\": %.2f, "
                  "\"t_avg\": %.2f, \"p99\": %.2f}\n",
                  size, static_cast<unsigned long>(iters), half.front(), med, avg, p99);
    else
      std::printf("tcp ping-pong %u B x %lu: half-RTT min %.2f typical %.2f avg %.2f p99 %.2f us\n", size,
                  static_cast<unsigned long>(iters), half.front(), med, avg, p99);
  } else {
    const auto t0 = clk::now();
    for (std::uint64_t i = 0; i < iters; ++i)
      if (!full(fd, buf.data(), size, false)) return 1;
    std::uint8_t ack = 0;
    if (!full(fd, &ack, 1, true)) return 1;
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    const double mbps = static_cast<double>(size) * static_cast<double>(iters) / s / 1e6;
    if (json)
      std::printf("{\"mode\": \"stream\", \"size\": %u, \"iters\": %lu, \"MBps\": %.2f, \"msg_rate\": %.0f}\n", size,
                  static_cast<unsigned long>(iters), mbps, static_cast<double>(iters) / s);
    else
      std::printf("tcp stream %u B x %lu: %.2f MB/s, %.0f msg/s\n", size, static_cast<unsigned long>(iters), mbps,
                  static_cast<double>(iters) / s);
  }
  ::close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint16_t port = 18600;
  std::string mode = "pingpong";
  std::uint32_t size = 64;
  std::uint64_t iters = 1000;
  bool json = false;
  static const option kLong[] = {{"port", required_argument, nullptr, 'p'}, {"mode", required_argument, nullptr, 'm'},
                                 {"size", required_argument, nullptr, 's'}, {"iters", required_argument, nullptr, 'n'},
                                 {"json", no_argument, nullptr, 'j'},       {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "p:m:s:n:j", kLong, nullptr)) != -1) {
    switch (c) {
      case 'p': port = static_cast<std::uint16_t>(std::atoi(optarg)); break;
      case 'm': mode = optarg; break;
      case 's': size = static_cast<std::uint32_t>(std::strtoul(optarg, nullptr, 0)); break;
      case 'n': iters = std::strtoull(optarg, nullptr, 0); break;
      case 'j': json = true; break;
      default: return 2;
    }
  }
  if (optind < argc && std::string(argv[optind]) == "server") return serve(port);
  if (optind + 1 < argc && std::string(argv[optind]) == "client" && size > 0 &&
      (mode == "pingpong" || mode == "stream"))
    return client(argv[optind + 1], port, mode, size, iters, json);
  std::fprintf(stderr,
               "usage: tcp_bench server [--port P]\n"
               "       tcp_bench client HOST [--port P] --mode pingpong|stream --size N [--iters N] [--json]\n");
  return 2;
}
