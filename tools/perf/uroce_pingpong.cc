// uroce-pingpong: rdma-core's ibv_rc_pingpong over uroce, with its flags,
// its output and its TCP exchange byte for byte, so either side can be the
// real ibv_rc_pingpong.
//
//   uroce-pingpong [options]        server
//   uroce-pingpong [options] HOST   client
//
// The exchange (rdma-core libibverbs/examples/rc_pingpong.c): the client
// writes a 52-byte "LID:QPN:PSN:GID" string ("%04x:%06x:%06x:" and 32 hex
// digits, NUL included), reads the server's, writes "done\0" and closes;
// the server reads, brings its QP to RTS, answers, and reads the 5-byte
// "done". Then the ping-pong: the client sends first; each side sends one
// message per message received, `iters` each way.
//
// -c checks every received message, every byte of it. Each peer is one of
// two kinds, told apart by its first message and held to it after that:
//  - uroce-pingpong -c sends a numbered pattern: its k-th message must be
//    exactly fill_pattern(k, its role);
//  - a stock ibv_rc_pingpong sends and receives in one buffer, so it echoes
//    what it last received: every message must equal the one we sent last,
//    except a client's first, which is its buffer's fill (rdma-core 44: 0x7b
//    everywhere, and with --chk a 0 at the start of every page). That fill is
//    accepted only there, as our server's first receive.
// The receive buffer is poisoned with kPoison before the first receive and
// again after every checked message, a byte no sender writes, so a receive
// that completes without placing (all of) its data leaves poison and fails.
//
// The end, under loss: each side stops (and ibv_rc_pingpong destroys its QP)
// once it has all its messages. If the ACK of the last SEND is lost, its
// retries meet the QP's number in quarantine, where the daemon ACKs them
// again; and a failed last SEND after every message has arrived is the end,
// with a note: by then the peer has finished.
#include <arpa/inet.h>
#include <getopt.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "stack/verbs/uroce_verbs.h"
#include "tools/perf/wait.h"

namespace {

using clk = std::chrono::steady_clock;
constexpr std::size_t kMsg = sizeof "0000:000000:000000:00000000000000000000000000000000";  // 52
constexpr std::uint64_t kRecvId = 1, kSendId = 2;
// -c poisons the receive buffer with this byte: fill_pattern never writes it
// (its bytes are 0..254), nor does ibv_rc_pingpong (0x7b, and 0 with --chk).
constexpr std::uint8_t kPoison = 0xff;

struct Dest {
  unsigned lid = 0, qpn = 0, psn = 0;
  std::uint8_t gid[16] = {};
};

struct Opts {
  std::string host, device;
  std::uint16_t port = 18515;
  std::uint32_t size = 4096, rx_depth = 500, iters = 1000;
  ibv_mtu mtu = IBV_MTU_1024;
  int gidx = -1;
  bool events = false, check = false;
  long psn = -1;  // --psn: the first send PSN (default: random, as ibv_rc_pingpong)
  int timeout_ms = 30000;
  uroce::tools::WaitMode wait;  // without -e: spin briefly, then block; or busy-poll
};

int fail(const std::string& why) {
  std::fprintf(stderr, "uroce-pingpong: %s\n", why.c_str());
  return 1;
}

std::string to_msg(const Dest& d) {
  char m[kMsg];
  int n = std::snprintf(m, sizeof m, "%04x:%06x:%06x:", d.lid, d.qpn, d.psn);
  for (int i = 0; i < 16; ++i) n += std::snprintf(m + n, sizeof m - static_cast<std::size_t>(n), "%02x", d.gid[i]);
  return std::string(m, kMsg);  // with the NUL, as rc_pingpong writes sizeof msg
}

bool from_msg(const char* m, Dest& d) {
  if (m[kMsg - 1] != '\0' || std::strlen(m) != kMsg - 1) return false;
  char gid[33] = {};
  if (std::sscanf(m, "%x:%x:%x:%32s", &d.lid, &d.qpn, &d.psn, gid) != 4 || std::strlen(gid) != 32) return false;
  for (int i = 0; i < 16; ++i) {
    unsigned v;
    if (std::sscanf(gid + 2 * i, "%2x", &v) != 1) return false;
    d.gid[i] = static_cast<std::uint8_t>(v);
  }
  return true;
}

bool read_n(int fd, void* p, std::size_t n, int timeout_ms) {
  auto* b = static_cast<char*>(p);
  std::size_t got = 0;
  while (got < n) {
    if (uroce_wait_fd(fd, timeout_ms) != 1) return false;  // an embedded node keeps running
    const ssize_t r = ::read(fd, b + got, n - got);
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}

int tcp_client(const Opts& o) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(o.host.c_str(), std::to_string(o.port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  const auto end = clk::now() + std::chrono::milliseconds(o.timeout_ms);
  while (fd < 0 && clk::now() < end) {
    for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        ::close(fd);
        fd = -1;
      }
    }
    if (fd < 0) ::usleep(100000);
  }
  ::freeaddrinfo(res);
  return fd;
}

int tcp_server(const Opts& o) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(o.port);
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0) {
    ::close(ls);
    return -1;
  }
  const int fd = uroce_wait_fd(ls, o.timeout_ms) == 1 ? ::accept(ls, nullptr, nullptr) : -1;
  ::close(ls);
  return fd;
}

/// The numbered pattern uroce-pingpong sends: message k from `role`. Its
/// bytes are 0..254 (mod 255), never kPoison.
void fill_pattern(std::uint8_t* b, std::uint32_t size, std::uint64_t k, int role) {
  for (std::uint32_t i = 0; i < size; ++i)
    b[i] = static_cast<std::uint8_t>((k * 31 + std::uint64_t{i} * 7 + static_cast<unsigned>(role) * 101) % 255);
}

/// A stock ibv_rc_pingpong client's first message: its buffer as allocated,
/// 0x7b everywhere; with --chk it first sets the byte at the start of every
/// page (its page size; 4096 on x86, taken here as ours) to 0.
bool is_stock_fill(const std::uint8_t* b, std::uint32_t size, std::size_t page) {
  const bool chk = b[0] == 0;
  for (std::uint32_t i = 0; i < size; ++i)
    if (b[i] != (chk && i % page == 0 ? 0 : 0x7b)) return false;
  return true;
}

bool connect_qp(uroce_qp* qp, const Opts& o, const Dest& me, const Dest& rem) {
  // As ibv_rc_pingpong: one READ/atomic each way, timeout 14, retries 7.
  uroce_rc_conn k{};
  k.dest_qp_num = rem.qpn;
  std::memcpy(k.dgid.raw, rem.gid, 16);
  k.rq_psn = rem.psn;
  k.sq_psn = me.psn;
  k.path_mtu = o.mtu;
  k.max_rd_atomic = 1;
  return uroce_connect_qp(qp, &k) == 0;  // INIT again (INIT -> INIT), then RTR, RTS
}

std::string gid_text(const std::uint8_t* g) {
  char b[INET6_ADDRSTRLEN];
  ::inet_ntop(AF_INET6, g, b, sizeof b);
  return b;
}

int run(const Opts& o) {
  const bool client = !o.host.empty();
  // The device: a socket path, a name from the list, or the first one.
  uroce_context* ctx = uroce_open_device_by_name(o.device.c_str());
  if (!ctx) return fail(std::string("cannot open the device: ") + uroce_last_error());
  auto* buf = static_cast<std::uint8_t*>(uroce_alloc_buf(ctx, 2 * static_cast<std::size_t>(o.size)));
  std::uint8_t* sbuf = buf;
  std::uint8_t* rbuf = buf + o.size;
  std::memset(sbuf, 0x7b, o.size);  // as ibv_rc_pingpong's buffer (sent as it is without -c)
  std::memset(rbuf, kPoison, o.size);
  uroce_pd* pd = uroce_alloc_pd(ctx);
  uroce_mr* mr = uroce_reg_mr(pd, buf, 2 * static_cast<std::size_t>(o.size), IBV_ACCESS_LOCAL_WRITE);
  const bool channel = o.events || !o.wait.busy;
  uroce_comp_channel* ch = channel ? uroce_create_comp_channel(ctx) : nullptr;
  uroce_cq* cq = uroce_create_cq(ctx, static_cast<int>(o.rx_depth + 1), nullptr, ch, 0);
  uroce_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 1;
  ia.cap.max_recv_wr = o.rx_depth;
  uroce_qp* qp = cq ? uroce_create_qp(pd, &ia) : nullptr;
  if (!mr || !qp || (channel && !ch)) return fail(std::string("cannot set up: ") + uroce_last_error());
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  if (uroce_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
    return fail(std::string("INIT: ") + uroce_last_error());
  ibv_sge rs{reinterpret_cast<std::uint64_t>(rbuf), o.size, uroce_mr_lkey(mr)};
  ibv_recv_wr rw{};
  rw.wr_id = kRecvId;
  rw.sg_list = &rs;
  rw.num_sge = 1;
  auto post_recv = [&](std::uint32_t n) {
    std::uint32_t i = 0;
    for (ibv_recv_wr* bad = nullptr; i < n && uroce_post_recv(qp, &rw, &bad) == 0; ++i) {
    }
    return i;
  };
  std::uint32_t routs = post_recv(o.rx_depth);
  if (o.events) uroce_req_notify_cq(cq, 0);

  Dest me;
  me.qpn = uroce_qp_num(qp);
  srand48(getpid() * time(nullptr));
  me.psn = o.psn >= 0 ? static_cast<unsigned>(o.psn) : static_cast<unsigned>(lrand48()) & 0xffffff;
  if (o.gidx >= 0) {
    ibv_gid g{};
    uroce_query_gid(ctx, 1, 0, &g);
    std::memcpy(me.gid, g.raw, 16);
  }
  std::printf("  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", me.lid, me.qpn, me.psn,
              gid_text(me.gid).c_str());
  std::fflush(stdout);  // scripts read the addresses while the run goes on
  const std::string mine = to_msg(me);
  char msg[kMsg];
  Dest rem;
  if (client) {
    const int fd = tcp_client(o);
    if (fd < 0) return fail("couldn't connect to " + o.host + ":" + std::to_string(o.port));
    if (::write(fd, mine.data(), kMsg) != static_cast<ssize_t>(kMsg) || !read_n(fd, msg, kMsg, o.timeout_ms) ||
        !from_msg(msg, rem))
      return fail("couldn't read/write the remote address");
    static const char kDone[] = "done";
    (void)!::write(fd, kDone, sizeof kDone);
    ::close(fd);
    if (!connect_qp(qp, o, me, rem)) return fail(std::string("couldn't connect to remote QP: ") + uroce_last_error());
  } else {
    const int fd = tcp_server(o);
    if (fd < 0) return fail("no client connected on port " + std::to_string(o.port));
    if (!read_n(fd, msg, kMsg, o.timeout_ms) || !from_msg(msg, rem))
      return fail("couldn't read the remote address");
    if (!connect_qp(qp, o, me, rem)) return fail(std::string("couldn't connect to remote QP: ") + uroce_last_error());
    char done[5];
    if (::write(fd, mine.data(), kMsg) != static_cast<ssize_t>(kMsg) || !read_n(fd, done, sizeof done, o.timeout_ms))
      return fail("couldn't exchange with the client");
    ::close(fd);
  }
  std::printf("  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", rem.lid, rem.qpn, rem.psn,
              gid_text(rem.gid).c_str());
  std::fflush(stdout);

  // The ping-pong.
  const int role = client ? 1 : 2, peer_role = client ? 2 : 1;
  ibv_sge ss{reinterpret_cast<std::uint64_t>(sbuf), o.size, uroce_mr_lkey(mr)};
  ibv_send_wr sw{};
  sw.wr_id = kSendId;
  sw.sg_list = &ss;
  sw.num_sge = 1;
  sw.opcode = IBV_WR_SEND;
  sw.send_flags = IBV_SEND_SIGNALED;
  std::uint64_t scnt = 0, rcnt = 0, bad_msgs = 0;
  std::vector<std::uint8_t> expect(o.size);
  enum class Peer { kUnknown, kPattern, kStock } peer = Peer::kUnknown;  // set by its first good message
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto post_send = [&]() {
    if (o.check) fill_pattern(sbuf, o.size, scnt, role);
    ibv_send_wr* bad = nullptr;
    return uroce_post_send(qp, &sw, &bad) == 0;
  };
  unsigned pending = kRecvId;
  if (client) {
    if (!post_send()) return fail("couldn't post send");
    pending |= kSendId;
  }
  const auto start = clk::now();
  auto last_progress = clk::now();
  while (rcnt < o.iters || scnt < o.iters) {
    if (o.events) {
      uroce_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      pollfd pf{uroce_comp_channel_fd(ch), POLLIN, 0};
      if (::poll(&pf, 1, 0) == 1 && uroce_get_cq_event(ch, &ev_cq, &ev_ctx) == 0) {
        uroce_ack_cq_events(ev_cq, 1);
        uroce_req_notify_cq(cq, 0);
      }
    }
    ibv_wc wc[2];
    const int n = o.events ? uroce_poll_cq(cq, 2, wc) : uroce::tools::poll_wait(cq, 2, wc, o.wait, 100);
    if (n < 0) return fail(std::string("cannot wait for completions: ") + uroce_last_error());
    if (n == 0) {
      if (clk::now() - last_progress > std::chrono::milliseconds(o.timeout_ms))
        return fail("no completion for " + std::to_string(o.timeout_ms / 1000) + " s (peer gone?)");
      continue;
    }
    last_progress = clk::now();
    for (int i = 0; i < n && (rcnt < o.iters || scnt < o.iters); ++i) {  // flushes after the end are not ours
      if (wc[i].status != IBV_WC_SUCCESS) {
        if (wc[i].wr_id == kSendId && wc[i].status == IBV_WC_RETRY_EXC_ERR && rcnt >= o.iters && scnt + 1 >= o.iters) {
          // The last SEND lost its ACK, and its retries met no QP: a peer
          // that has all its messages destroys its QP at once. The client
          // sends first, so the server's last SEND is the run's last
          // message. For the client, the server's last message proves its
          // own last SEND arrived (the server sends only after receiving
          // it): the end of the run. Nothing follows the server's last
          // SEND, so the server has no proof: it fails, says why, and
          // reports its data check for a script that has other evidence
          // (the peer's own report). The QP and PSN are for a script that
          // looks for that PSN's ACK in a capture.
          const std::uint32_t mtu = 128u << o.mtu;
          const std::uint32_t pkts = std::max<std::uint32_t>(1, (o.size + mtu - 1) / mtu);
          char which[96];
          std::snprintf(which, sizeof which, "QPN 0x%06x PSN 0x%06x to QPN 0x%06x", me.qpn,
                        (me.psn + o.iters * pkts - 1) & 0xffffff, rem.qpn);
          if (!client) {
            std::fprintf(stderr,
                         "uroce-pingpong: the last SEND was never acknowledged (%s), and as the server nothing "
                         "from the peer follows it: no proof it arrived (%s)\n",
                         uroce_wc_status_str(wc[i].status), which);
            if (o.check)
              std::printf("%lu messages checked, %lu bad\n", static_cast<unsigned long>(rcnt),
                          static_cast<unsigned long>(bad_msgs));
            std::fflush(stdout);
            return 1;
          }
          std::fprintf(stderr,
                       "uroce-pingpong: the last SEND was never acknowledged (%s) but every message from the peer "
                       "arrived: the peer finished and left (%s)\n",
                       uroce_wc_status_str(wc[i].status), which);
          ++scnt;
          continue;
        }
        return fail(std::string("failed status ") + uroce_wc_status_str(wc[i].status) + " for wr_id " +
                    std::to_string(wc[i].wr_id));
      }
      if (wc[i].wr_id == kSendId) {
        ++scnt;
      } else {
        if (o.check) {
          // The rcnt-th message: the peer's pattern, or a stock peer's echo
          // of what we sent last (or, first of all, its client's fill).
          fill_pattern(expect.data(), o.size, rcnt, peer_role);
          const bool sent = scnt + (pending & kSendId ? 1 : 0) > 0;
          const bool whole = wc[i].byte_len == o.size;
          const bool pattern = whole && peer != Peer::kStock && std::memcmp(rbuf, expect.data(), o.size) == 0;
          const bool stock = whole && peer != Peer::kPattern &&
                             ((sent && std::memcmp(rbuf, sbuf, o.size) == 0) ||
                              (!client && rcnt == 0 && is_stock_fill(rbuf, o.size, page)));
          if (pattern && peer == Peer::kUnknown) peer = Peer::kPattern;
          if (stock && peer == Peer::kUnknown) peer = Peer::kStock;
          if (!pattern && !stock) ++bad_msgs;
          std::memset(rbuf, kPoison, o.size);  // the next message must overwrite all of it
        }
        if (--routs <= 1) {
          routs += post_recv(o.rx_depth - routs);
          if (routs < o.rx_depth) return fail("couldn't post receives");
        }
        ++rcnt;
      }
      pending &= ~static_cast<unsigned>(wc[i].wr_id);
      if (scnt < o.iters && !pending) {
        if (!post_send()) return fail("couldn't post send");
        pending = kRecvId | kSendId;
      }
    }
  }
  const double secs = std::chrono::duration<double>(clk::now() - start).count();
  const long long bytes = static_cast<long long>(o.size) * o.iters * 2;
  std::printf("%lld bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, secs, static_cast<double>(bytes) * 8 / secs / 1e6);
  std::printf("%u iters in %.2f seconds = %.2f usec/iter\n", o.iters, secs, secs * 1e6 / o.iters);
  if (o.check) std::printf("%lu messages checked, %lu bad\n", static_cast<unsigned long>(rcnt), static_cast<unsigned long>(bad_msgs));
  std::fflush(stdout);
  // A retry of the peer's last message meets the QP's number in quarantine.
  uroce_destroy_qp(qp);
  uroce_close_device(ctx);
  return bad_msgs == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  static const option kLong[] = {{"port", required_argument, nullptr, 'p'},    {"ib-dev", required_argument, nullptr, 'd'},
                                 {"ib-port", required_argument, nullptr, 'i'}, {"size", required_argument, nullptr, 's'},
                                 {"mtu", required_argument, nullptr, 'm'},     {"rx-depth", required_argument, nullptr, 'r'},
                                 {"iters", required_argument, nullptr, 'n'},   {"sl", required_argument, nullptr, 'l'},
                                 {"events", no_argument, nullptr, 'e'},        {"gid-idx", required_argument, nullptr, 'g'},
                                 {"chk", no_argument, nullptr, 'c'},           {"busy-poll", no_argument, nullptr, 'B'},
                                 {"spin-us", required_argument, nullptr, 'S'}, {"psn", required_argument, nullptr, 'Q'},
                                 {nullptr, 0, nullptr, 0}};
  int c;
  auto num = [](const char* s, long lo, long hi, long& out) {
    char* e = nullptr;
    out = std::strtol(s, &e, 0);
    return e && *e == '\0' && out >= lo && out <= hi;
  };
  long v = 0;
  while ((c = getopt_long(argc, argv, "p:d:i:s:m:r:n:l:eg:c", kLong, nullptr)) != -1) {
    switch (c) {
      case 'p':
        if (!num(optarg, 1, 65535, v)) return fail("-p: a TCP port");
        o.port = static_cast<std::uint16_t>(v);
        break;
      case 'd': o.device = optarg; break;
      case 'i':
      case 'l': break;  // one port, no SLs on RoCE
      case 's':
        if (!num(optarg, 1, 1 << 24, v)) return fail("-s: 1..16 MiB");
        o.size = static_cast<std::uint32_t>(v);
        break;
      case 'm': {
        if (!num(optarg, 256, 4096, v)) return fail("-m: 256..4096");
        const int m = v == 256 ? 1 : v == 512 ? 2 : v == 1024 ? 3 : v == 2048 ? 4 : v == 4096 ? 5 : -1;
        if (m < 0) return fail("-m: 256, 512, 1024, 2048 or 4096");
        o.mtu = static_cast<ibv_mtu>(m);
        break;
      }
      case 'r':
        if (!num(optarg, 2, 4096, v)) return fail("-r: 2..4096");
        o.rx_depth = static_cast<std::uint32_t>(v);
        break;
      case 'n':
        if (!num(optarg, 1, 100000000, v)) return fail("-n: 1..100000000");
        o.iters = static_cast<std::uint32_t>(v);
        break;
      case 'e': o.events = true; break;
      case 'g':
        if (!num(optarg, 0, 255, v)) return fail("-g: a GID index");
        o.gidx = static_cast<int>(v);
        break;
      case 'c': o.check = true; break;
      case 'B': o.wait.busy = true; break;
      case 'S':
        if (!num(optarg, 0, 1000000, v)) return fail("--spin-us: 0..1000000");
        o.wait.spin_us = static_cast<int>(v);
        break;
      case 'Q':
        if (!num(optarg, 0, 0xffffff, v)) return fail("--psn: 0..0xffffff");
        o.psn = v;
        break;
      default:
        std::fprintf(stderr, "usage: uroce-pingpong [-p port] [-d dev] [-s size] [-m mtu] [-r rx_depth] [-n iters] [-e] "
                             "[-g gid_idx] [-c] [--busy-poll] [--spin-us N] [--psn N] [host]\n");
        return 2;
    }
  }
  if (optind < argc) o.host = argv[optind];
  if (o.gidx < 0) o.gidx = 0;  // RoCE needs a GID; rc_pingpong without -g sends zeros and could not connect
  o.wait.setup();
  return run(o);
}
