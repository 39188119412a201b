// rsockets in uroce's librdmacm.so.1: librdmacm's socket-like API (rsocket,
// rconnect, raccept, rsend, rrecv, rpoll, riomap, riowrite, ...), so
// rdmacm-utils' rstream, riostream and rcopy, and programs under
// librspreload, run unmodified. These are the public calls: a stream
// socket's protocol is rsocket_stream.cc's (rsockets' RC protocol, as
// rdma-core speaks it), a datagram socket's rsocket_dgram.cc's.
//
// An rsocket's number is the descriptor of its own CM event channel, as in
// librdmacm. Every descriptor underneath (the channel, the completion
// channel) stays non-blocking; a call that blocks waits in poll() on them
// with the socket's lock released.
#include <arpa/inet.h>
#include <byteswap.h>
#include <endian.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "stack/abi/spin.h"
#include "stack/rdmacm/rsocket_dgram.h"
#include "stack/rdmacm/rsocket_qp.h"

#include "stack/rdmacm/rsocket_stream.h"

using namespace uroce::rsockets;

namespace {

template <class Op>
ssize_t over_iov(int s, const iovec* iov, int iovcnt, int flags, Op op) {
  return keeping_errno([&]() -> ssize_t {
    Rs* rs = lookup(s);
    if (!rs) return fail(EBADF);
    if (!iov || iovcnt < 0) return fail(EINVAL);
    std::unique_lock<std::mutex> lock(rs->mu);
    ssize_t total = 0;
    for (int i = 0; i < iovcnt; ++i) {
      if (!iov[i].iov_len) continue;
      const ssize_t n = op(rs, lock, iov[i].iov_base, iov[i].iov_len, flags);
      if (n < 0) return total ? total : -1;
      total += n;
      if (static_cast<std::size_t>(n) < iov[i].iov_len) break;
    }
    return total;
  });
}

/// A call that succeeds leaves errno as its caller had it: the library's
/// own looks at empty non-blocking channels (EAGAIN) must not show through
/// (rstream reads errno after rrecv returns 0 for a closed connection).
template <class F>
auto keeping_errno(F f) {
  const int saved = errno;
  const auto r = f();
  using R = decltype(r);
  const bool failed = std::is_signed_v<R> ? r < 0 : r == static_cast<R>(-1);
  if (!failed) errno = saved;
  return r;
}

socklen_t copy_addr(sockaddr* dst, socklen_t* len, const sockaddr* src) {
  const socklen_t size = src->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(dst, src, std::min(*len, size));
  *len = size;
  return size;
}

int set_int(void* optval, socklen_t* optlen, int v) {
  if (!optval || !optlen || *optlen < static_cast<socklen_t>(sizeof(int))) return fail(EINVAL);
  std::memcpy(optval, &v, sizeof v);
  *optlen = sizeof v;
  return 0;
}

/// A datagram from an iovec: gathered into one message (at most 2048
/// bytes, as rsockets' datagrams are), and scattered on the way in.
ssize_t dgram_sendv(int s, const iovec* iov, int n, int flags, const sockaddr* to, socklen_t tolen) {
  std::uint8_t msg[kSndLowat];
  std::size_t len = 0;
  for (int i = 0; i < n; ++i) {
    if (iov[i].iov_len > sizeof msg - len) return fail(EMSGSIZE);
    std::memcpy(msg + len, iov[i].iov_base, iov[i].iov_len);
    len += iov[i].iov_len;
  }
  return dgram_sendto(s, msg, len, flags, to, tolen);
}
ssize_t dgram_recvv(int s, const iovec* iov, int n, int flags, sockaddr* from, socklen_t* fromlen) {
  std::uint8_t msg[kSndLowat];
  const ssize_t got = dgram_recvfrom(s, msg, sizeof msg, flags, from, fromlen);
  std::size_t off = 0;
  for (int i = 0; got > 0 && i < n && off < static_cast<std::size_t>(got); ++i) {
    const std::size_t c = std::min(iov[i].iov_len, static_cast<std::size_t>(got) - off);
    std::memcpy(iov[i].iov_base, msg + off, c);
    off += c;
  }
  return got < 0 ? got : static_cast<ssize_t>(off);
}

}  // namespace

extern "C" {

int rsocket(int domain, int type, int protocol) {
  const int socket_type = type & ~(SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (domain != AF_INET && domain != AF_INET6) return fail(EOPNOTSUPP);  // AF_IB is not built
  if (socket_type == SOCK_DGRAM && (!protocol || protocol == IPPROTO_UDP)) return dgram_socket(domain, type);
  if (socket_type != SOCK_STREAM || (protocol && protocol != IPPROTO_TCP)) return fail(EOPNOTSUPP);
  Rs* rs = make_rs(nullptr);
  if (!rs) return -1;
  rs->fs_flags = (type & SOCK_NONBLOCK) ? O_NONBLOCK : 0;
  if (rdma_create_id(rs->ch, &rs->id, rs, RDMA_PS_TCP) != 0) {
    const int e = errno;
    free_rs(rs);
    return fail(e);
  }
  rs->id->route.addr.src_addr.sa_family = static_cast<sa_family_t>(domain);
  insert(rs);
  return rs->index;
}

int rbind(int s, const sockaddr* addr, socklen_t len) {
  if (is_dgram(s)) return dgram_bind(s, addr, len);
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  std::lock_guard<std::mutex> lock(rs->mu);
  if (rdma_bind_addr(rs->id, const_cast<sockaddr*>(addr)) != 0) return -1;
  rs->state = kBound;
  return 0;
}

int rlisten(int s, int backlog) {
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  std::lock_guard<std::mutex> lock(rs->mu);
  if (rs->state == kListening) return 0;
  if (rdma_listen(rs->id, backlog) != 0) return -1;
  rs->state = kListening;
  return 0;
}

int raccept(int s, sockaddr* addr, socklen_t* addrlen) {
  return keeping_errno([&]() -> int {
    Rs* rs = lookup(s);
    if (!rs) return fail(EBADF);
    std::unique_lock<std::mutex> lock(rs->mu);
    if (rs->state != kListening) return fail(EINVAL);
    for (;;) {
      accept_requests(rs);
      if (!rs->accepted.empty()) break;
      if (rs->fs_flags & O_NONBLOCK) return fail(EAGAIN);
      pollfd p{rs->ch->fd, POLLIN, 0};
      lock.unlock();
      (void)::poll(&p, 1, -1);
      lock.lock();
    }
    Rs* c = rs->accepted.front();
    rs->accepted.pop_front();
    lock.unlock();
    if (addr && addrlen) (void)rgetpeername(c->index, addr, addrlen);
    return c->index;
  });
}

int rconnect(int s, const sockaddr* addr, socklen_t addrlen) {
  if (is_dgram(s)) return dgram_connect(s, addr, addrlen);
  return keeping_errno([&]() -> int {
    Rs* rs = lookup(s);
    if (!rs) return fail(EBADF);
    std::unique_lock<std::mutex> lock(rs->mu);
    if (rs->state == kInit || rs->state == kBound) {
      if (!addr || addrlen < sizeof(sockaddr_in)) return fail(EINVAL);
      if (rdma_resolve_addr(rs->id, nullptr, const_cast<sockaddr*>(addr), 2000) != 0) return -1;
      rs->state = kResolvingAddr;
    } else if (!(rs->state & kOpening)) {
      return fail(rs->state & kConnected ? EISCONN : EINVAL);
    }
    return drive_connect(rs, lock, rs->fs_flags & O_NONBLOCK);
  });
}

int rshutdown(int s, int how) {
  if (is_dgram(s)) return 0;  // a datagram socket has no connection to close
  return keeping_errno([&]() -> int {
    Rs* rs = lookup(s);
    if (!rs) return fail(EBADF);
    std::unique_lock<std::mutex> lock(rs->mu);
    if (!(rs->state & kConnected)) return 0;
    std::uint32_t ctrl;
    if (how == SHUT_RDWR) {
      ctrl = kCtrlDisconnect;
      rs->state &= ~(kReadable | kWritable);
    } else if (how == SHUT_WR) {
      rs->state &= ~kWritable;
      ctrl = (rs->state & kReadable) ? kCtrlShutdown : kCtrlDisconnect;
    } else {
      rs->state &= ~kReadable;
      if (rs->state & kWritable) return 0;
      ctrl = kCtrlDisconnect;
    }
    if (!ctrl_avail(rs) && wait_until(rs, lock, false, conn_can_send_ctrl) != 0) return -1;
    int rc = 0;
    if ((rs->state & kConnected) && ctrl_avail(rs)) rc = send_ctrl(rs, ctrl);
    if (rs->state & kConnected) (void)wait_until(rs, lock, false, conn_all_sends_done);
    return rc;
  });
}

int rclose(int s) {
  if (is_dgram(s)) return dgram_close(s);
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  if (rs->state & kConnected) (void)rshutdown(s, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(rs->mu);
    if (rs->id && rs->id->qp && (rs->state & (kConnected | kDisconnected | kError))) (void)rdma_disconnect(rs->id);
  }
  free_rs(rs);
  return 0;
}

ssize_t rsend(int s, const void* buf, size_t len, int flags) {
  if (is_dgram(s)) return dgram_sendto(s, buf, len, flags, nullptr, 0);
  return keeping_errno([&]() -> ssize_t {
    Rs* rs = lookup(s);
    if (!rs) return fail(EBADF);
    std::unique_lock<std::mutex> lock(rs->mu);
    return do_send(rs, lock, buf, len, flags);
  });
}
ssize_t rrecv(int s, void* buf, size_t len, int flags) {
  if (is_dgram(s)) return dgram_recvfrom(s, buf, len, flags, nullptr, nullptr);
  return keeping_errno([&]() -> ssize_t {
    Rs* rs = lookup(s);
    if (!rs) return fail(EBADF);
    std::unique_lock<std::mutex> lock(rs->mu);
    return do_recv(rs, lock, buf, len, flags);
  });
}
ssize_t rsendto(int s, const void* buf, size_t len, int flags, const sockaddr* to, socklen_t tolen) {
  if (is_dgram(s)) return dgram_sendto(s, buf, len, flags, to, tolen);
  if (to || tolen) return fail(EISCONN);  // a stream is connected
  return rsend(s, buf, len, flags);
}
ssize_t rrecvfrom(int s, void* buf, size_t len, int flags, sockaddr* src, socklen_t* srclen) {
  if (is_dgram(s)) return dgram_recvfrom(s, buf, len, flags, src, srclen);
  const ssize_t n = rrecv(s, buf, len, flags);
  if (n >= 0 && src && srclen) (void)rgetpeername(s, src, srclen);
  return n;
}
ssize_t rread(int s, void* buf, size_t count) { return rrecv(s, buf, count, 0); }
ssize_t rwrite(int s, const void* buf, size_t count) { return rsend(s, buf, count, 0); }
ssize_t rreadv(int s, const iovec* iov, int iovcnt) {
  if (is_dgram(s)) return iov && iovcnt >= 0 ? dgram_recvv(s, iov, iovcnt, 0, nullptr, nullptr) : fail(EINVAL);
  return over_iov(s, iov, iovcnt, 0, [](Rs* rs, std::unique_lock<std::mutex>& l, void* b, size_t n, int f) {
    return do_recv(rs, l, b, n, f);
  });
}
ssize_t rwritev(int s, const iovec* iov, int iovcnt) {
  if (is_dgram(s)) return iov && iovcnt >= 0 ? dgram_sendv(s, iov, iovcnt, 0, nullptr, 0) : fail(EINVAL);
  return over_iov(s, iov, iovcnt, 0, [](Rs* rs, std::unique_lock<std::mutex>& l, void* b, size_t n, int f) {
    return do_send(rs, l, b, n, f);
  });
}
ssize_t rrecvmsg(int s, msghdr* msg, int flags) {
  if (!msg) return fail(EINVAL);
  if (msg->msg_control && msg->msg_controllen) return fail(EOPNOTSUPP);
  if (is_dgram(s))
    return dgram_recvv(s, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags, static_cast<sockaddr*>(msg->msg_name),
                       msg->msg_name ? &msg->msg_namelen : nullptr);
  return over_iov(s, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                  [](Rs* rs, std::unique_lock<std::mutex>& l, void* b, size_t n, int f) { return do_recv(rs, l, b, n, f); });
}
ssize_t rsendmsg(int s, const msghdr* msg, int flags) {
  if (!msg) return fail(EINVAL);
  if (msg->msg_control && msg->msg_controllen) return fail(EOPNOTSUPP);
  if (is_dgram(s))
    return dgram_sendv(s, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                       static_cast<const sockaddr*>(msg->msg_name), msg->msg_namelen);
  return over_iov(s, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                  [](Rs* rs, std::unique_lock<std::mutex>& l, void* b, size_t n, int f) { return do_send(rs, l, b, n, f); });
}

int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  return keeping_errno([&]() -> int {
    if (!fds && nfds) return fail(EFAULT);
    // In ns: a deadline in whole ms would end a 1 ms wait anywhere from
    // 0 to 1 ms after it began (udpong's echo mode resends after such a
    // wait, and a late echo then stalls it for good); poll(2) waits at
    // least the timeout.
    const std::uint64_t deadline = timeout > 0 ? uroce::abi::monotonic_ns() + std::uint64_t(timeout) * 1'000'000 : 0;
    std::vector<Rs*> rss(nfds);      // stream rsockets
    std::vector<char> dgram(nfds);  // datagram rsockets
    for (nfds_t i = 0; i < nfds; ++i) {
      rss[i] = fds[i].fd >= 0 ? lookup(fds[i].fd) : nullptr;
      dgram[i] = fds[i].fd >= 0 && !rss[i] && is_dgram(fds[i].fd);
    }
    // look(i): what rsocket i says without waiting.
    auto look = [&](nfds_t i) -> short {
      return rss[i] ? poll_rs(rss[i], fds[i].events) : dgram_poll(fds[i].fd, fds[i].events);
    };
    for (;;) {
      // Every descriptor, without waiting: the rsockets by their state, the
      // rest by poll(2).
      std::vector<pollfd> plain;
      std::vector<nfds_t> where;
      int ready_n = 0;
      for (nfds_t i = 0; i < nfds; ++i) {
        fds[i].revents = 0;
        if (rss[i] || dgram[i]) {
          fds[i].revents = look(i);
          if (fds[i].revents) ++ready_n;
        } else {
          plain.push_back(fds[i]);
          where.push_back(i);
        }
      }
      if (!plain.empty()) {
        const int n = ::poll(plain.data(), plain.size(), 0);
        if (n < 0) return -1;
        for (std::size_t k = 0; k < plain.size(); ++k) {
          fds[where[k]].revents = plain[k].revents;
          if (plain[k].revents) ++ready_n;
        }
      }
      if (ready_n || timeout == 0) return ready_n;
      int left = -1;
      if (timeout > 0) {
        const std::uint64_t now = uroce::abi::monotonic_ns();
        if (now >= deadline) return 0;
        left = static_cast<int>((deadline - now + 999'999) / 1'000'000);  // rounded up
      }
      // Sleep on what wakes each: the plain descriptors; a stream rsocket's
      // CM channel and (connected) its armed completion channel; a datagram
      // rsocket's UDP socket and armed completion channels. Then look again.
      std::vector<pollfd> w = plain;
      std::vector<std::pair<Rs*, std::size_t>> cqs;
      for (nfds_t i = 0; i < nfds; ++i) {
        if (dgram[i]) dgram_arm(fds[i].fd, w);
        if (!rss[i]) continue;
        const std::size_t before = w.size();
        arm_rs(rss[i], w);
        if (w.size() - before == 2) cqs.push_back({rss[i], w.size() - 1});
      }
      // Armed after a look: what completed in between is seen first.
      bool now_ready = false;
      for (nfds_t i = 0; i < nfds && !now_ready; ++i)
        if ((rss[i] || dgram[i]) && look(i)) now_ready = true;
      if (now_ready) continue;
      if (::poll(w.data(), w.size(), left) < 0 && errno != EINTR) return -1;
      for (auto& [rs, k] : cqs) {
        if (!(w[k].revents & POLLIN)) continue;
        std::lock_guard<std::mutex> lock(rs->mu);
        if (rs->cc) take_events(rs->cc, rs->cq, rs->cq_armed);
      }
    }
  });
}

int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (readfds && FD_ISSET(fd, readfds)) ev |= POLLIN;
    if (writefds && FD_ISSET(fd, writefds)) ev |= POLLOUT;
    if (ev || (exceptfds && FD_ISSET(fd, exceptfds))) p.push_back({fd, ev, 0});
  }
  const int ms = timeout ? static_cast<int>(timeout->tv_sec * 1000 + timeout->tv_usec / 1000) : -1;
  const int rc = rpoll(p.data(), p.size(), ms);
  if (rc < 0) return rc;
  if (readfds) FD_ZERO(readfds);
  if (writefds) FD_ZERO(writefds);
  if (exceptfds) FD_ZERO(exceptfds);
  int n = 0;
  for (const pollfd& x : p) {
    if (readfds && (x.revents & (POLLIN | POLLHUP | POLLERR))) FD_SET(x.fd, readfds), ++n;
    if (writefds && (x.revents & (POLLOUT | POLLERR))) FD_SET(x.fd, writefds), ++n;
    if (exceptfds && (x.revents & POLLERR)) FD_SET(x.fd, exceptfds), ++n;
  }
  return n;
}

int rgetpeername(int s, sockaddr* addr, socklen_t* addrlen) {
  if (is_dgram(s)) return dgram_getpeername(s, addr, addrlen);
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  if (!addr || !addrlen) return fail(EINVAL);
  if (!(rs->state & (kConnected | kDisconnected | kOpening))) return fail(ENOTCONN);
  copy_addr(addr, addrlen, &rs->id->route.addr.dst_addr);
  return 0;
}

int rgetsockname(int s, sockaddr* addr, socklen_t* addrlen) {
  if (is_dgram(s)) return dgram_getsockname(s, addr, addrlen);
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  if (!addr || !addrlen) return fail(EINVAL);
  copy_addr(addr, addrlen, &rs->id->route.addr.src_addr);
  return 0;
}

int rsetsockopt(int s, int level, int optname, const void* optval, socklen_t optlen) {
  if (is_dgram(s)) return dgram_setsockopt(s, level, optname, optval, optlen);
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  if (!optval || optlen < static_cast<socklen_t>(sizeof(int))) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(rs->mu);
  int v;
  std::memcpy(&v, optval, sizeof v);
  const bool before_qp = !rs->cq;
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR:
          (void)rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, const_cast<void*>(optval), optlen);
          rs->so_reuseaddr = v;
          return 0;
        case SO_RCVBUF:
          if (before_qp) rs->rbuf_size = std::max<std::uint32_t>(static_cast<std::uint32_t>(v) << 1, kSndLowat << 1);
          return 0;
        case SO_SNDBUF:
          if (before_qp) rs->sbuf_size = std::max<std::uint32_t>(static_cast<std::uint32_t>(v) << 1, kSndLowat << 1);
          return 0;
        case SO_LINGER:
          if (optlen < static_cast<socklen_t>(sizeof(linger))) return fail(EINVAL);
          rs->so_linger_off = !static_cast<const linger*>(optval)->l_onoff;
          return 0;
        case SO_KEEPALIVE:
          rs->so_keepalive = v;  // the peer's keepalives are taken; uroce's CM watches the connection
          return 0;
        case SO_OOBINLINE:
          rs->so_oobinline = v;
          return 0;
      }
      break;
    case IPPROTO_IP:
      if (optname == IP_TOS)
        return rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, const_cast<void*>(optval), optlen);
      break;
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_NODELAY:  // every rsend posts at once
          rs->tcp_nodelay = v;
          return 0;
        case TCP_MAXSEG:
          return 0;
        case TCP_KEEPIDLE:
          rs->tcp_keepidle = v;
          return 0;
        case TCP_KEEPINTVL:
          rs->tcp_keepintvl = v;
          return 0;
        case TCP_KEEPCNT:
          rs->tcp_keepcnt = v;
          return 0;
      }
      break;
    case SOL_RDMA:
      if (!before_qp && optname != RDMA_ROUTE) return fail(EINVAL);
      switch (optname) {
        case RDMA_SQSIZE:
          rs->sq_size = static_cast<std::uint16_t>(std::min(std::max(v, 0), 0xFFFF));
          return 0;
        case RDMA_RQSIZE:
          rs->rq_size = static_cast<std::uint16_t>(std::min(std::max(v, 0), 0xFFFF));
          return 0;
        case RDMA_INLINE:
          rs->sq_inline = static_cast<std::uint32_t>(std::min(std::max(v, 0), 0xFFFF));
          return 0;
        case RDMA_IOMAPSIZE:
          rs->target_iomap_size = static_cast<std::uint16_t>(value_of(scale_of(std::min(std::max(v, 0), 0xFFFF))));
          return 0;
        case RDMA_ROUTE:  // a path record: uroce's CM resolves the route itself
          return 0;
      }
      break;
  }
  return fail(ENOPROTOOPT);
}

int rgetsockopt(int s, int level, int optname, void* optval, socklen_t* optlen) {
  if (is_dgram(s)) return dgram_getsockopt(s, level, optname, optval, optlen);
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  std::lock_guard<std::mutex> lock(rs->mu);
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR: return set_int(optval, optlen, rs->so_reuseaddr);
        case SO_KEEPALIVE: return set_int(optval, optlen, rs->so_keepalive);
        case SO_OOBINLINE: return set_int(optval, optlen, rs->so_oobinline);
        case SO_RCVBUF: return set_int(optval, optlen, static_cast<int>(rs->rbuf_size));
        case SO_SNDBUF: return set_int(optval, optlen, static_cast<int>(rs->sbuf_size));
        case SO_ERROR: {
          const int e = rs->err;
          rs->err = 0;
          return set_int(optval, optlen, e);
        }
        case SO_LINGER: {
          if (!optval || !optlen || *optlen < static_cast<socklen_t>(sizeof(linger))) return fail(EINVAL);
          linger l{!rs->so_linger_off, 0};
          std::memcpy(optval, &l, sizeof l);
          *optlen = sizeof l;
          return 0;
        }
      }
      break;
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_NODELAY: return set_int(optval, optlen, rs->tcp_nodelay);
        case TCP_MAXSEG: return set_int(optval, optlen, static_cast<int>(kSndLowat));
        case TCP_KEEPIDLE: return set_int(optval, optlen, rs->tcp_keepidle);
        case TCP_KEEPINTVL: return set_int(optval, optlen, rs->tcp_keepintvl);
        case TCP_KEEPCNT: return set_int(optval, optlen, rs->tcp_keepcnt);
      }
      break;
    case SOL_RDMA:
      switch (optname) {
        case RDMA_SQSIZE: return set_int(optval, optlen, rs->sq_size);
        case RDMA_RQSIZE: return set_int(optval, optlen, rs->rq_size);
        case RDMA_INLINE: return set_int(optval, optlen, static_cast<int>(rs->sq_inline));
        case RDMA_IOMAPSIZE: return set_int(optval, optlen, rs->target_iomap_size);
      }
      break;
  }
  return fail(ENOPROTOOPT);
}

int rfcntl(int s, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  const int arg = cmd == F_SETFL ? va_arg(ap, int) : 0;
  va_end(ap);
  if (is_dgram(s)) return dgram_fcntl(s, cmd, arg);
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  std::lock_guard<std::mutex> lock(rs->mu);
  switch (cmd) {
    case F_GETFL: return rs->fs_flags;
    case F_SETFL: rs->fs_flags = arg & O_NONBLOCK; return 0;  // every wait underneath polls: only the flag changes
    default: return fail(ENOTSUP);
  }
}

off_t riomap(int s, void* buf, size_t len, int prot, int, off_t offset) {
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  std::lock_guard<std::mutex> lock(rs->mu);
  if (!rs->pd || (prot & ~(PROT_WRITE | PROT_NONE))) return fail(EINVAL);
  MapMr* m = nullptr;
  if (prot & PROT_WRITE) {
    if (rs->remote_maps.empty()) rs->remote_maps.resize(rs->remote_iomap.length);
    for (MapMr& x : rs->remote_maps)
      if (!x.mr) {
        m = &x;
        break;
      }
    if (!m) return fail(ENOMEM);  // the peer's iomap table is full
  } else {
    rs->local_maps.emplace_back();
    m = &rs->local_maps.back();
  }
  const int access = IBV_ACCESS_LOCAL_WRITE | ((prot & PROT_WRITE) ? IBV_ACCESS_REMOTE_WRITE : 0);
  if (!(m->mr = ibv_reg_mr(rs->pd, buf, len, access))) {
    if (!(prot & PROT_WRITE)) rs->local_maps.pop_back();
    return -1;
  }
  m->offset = static_cast<std::uint64_t>(offset == -1 ? static_cast<off_t>(reinterpret_cast<std::uintptr_t>(buf)) : offset);
  if (prot & PROT_WRITE) {
    m->queued = true;
    rs->iomap_pending = true;
  }
  return static_cast<off_t>(m->offset);
}

int riounmap(int s, void* buf, size_t len) {
  Rs* rs = lookup(s);
  if (!rs) return fail(EBADF);
  std::lock_guard<std::mutex> lock(rs->mu);
  for (auto* maps : {&rs->remote_maps, &rs->local_maps})
    for (MapMr& m : *maps)
      if (m.mr && m.mr->addr == buf && m.mr->length == len) {
        ibv_dereg_mr(m.mr);
        m = MapMr{};
        return 0;
      }
  return fail(EINVAL);
}

size_t riowrite(int s, const void* buf, size_t count, off_t offset, int flags) {
  return keeping_errno([&]() -> size_t {
    Rs* rs = lookup(s);
    if (!rs) return static_cast<size_t>(fail(EBADF));
    std::unique_lock<std::mutex> lock(rs->mu);
    const ssize_t n = do_iowrite(rs, lock, buf, count, offset, flags);
    return n < 0 ? static_cast<size_t>(-1) : static_cast<size_t>(n);
  });
}

}  // extern "C"
