// Datagram rsockets: rsockets' UD protocol, as rdma-core's librdmacm speaks
// it, so rdmacm-utils' udpong runs and talks to rdma-core's. A socket is a
// kernel UDP socket (its number) at the device's address, which the host
// netdev gives the kernel (uroced --host-netdev), and a UD QP for each
// local address it sends from:
//   - a datagram for a peer whose QP is not known yet goes by UDP, behind
//     a DsUdpHeader naming the sender's QP; the receiver answers by UDP
//     (op CTRL) with its own QP, and each side makes an address handle;
//   - the receiver hands a UDP datagram's payload to its own QP (a UD SEND
//     to itself, behind a DsHeader with the sender's address), so the
//     application reads every datagram from one queue;
//   - later datagrams go QP to QP: a DsHeader, then the payload, in a
//     2048-byte message, with Q_Key RDMA_UDP_QKEY.
// rdma-core serves the UDP side in a thread of its own; here it is served
// whenever the socket is used (a send, a receive, a poll), and a call that
// blocks also waits on the UDP socket.
#include "stack/rdmacm/rsocket_dgram.h"

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "stack/rdmacm/rsocket_qp.h"

namespace uroce::rsockets {
namespace {

constexpr std::uint32_t kUdpTag = 0x55555555;
constexpr std::uint8_t kUdpV4Len = 16, kUdpV6Len = 28;  // DsUdpHeader's length by IP version
constexpr std::uint8_t kHdrV4Len = 8, kHdrV6Len = 24;   // DsHeader's
constexpr std::uint8_t kOpData = 0, kOpCtrl = 7;
constexpr std::uint32_t kMsgSize = 2048;  // one datagram's message, header included
constexpr std::uint32_t kGrh = 40;
constexpr std::uint64_t kRecvWr = 1ull << 63;

/// Before a UDP datagram's payload: who sent it, and from which QP.
struct DsUdpHeader {
  std::uint32_t tag;  // big-endian kUdpTag
  std::uint8_t version;
  std::uint8_t op;
  std::uint8_t length;  // of this header: kUdpV4Len or kUdpV6Len
  std::uint8_t reserved;
  std::uint32_t qpn;  // big-endian; the low 24 bits
  std::uint8_t addr[16];
};
/// Before a UD message's payload: the sender's address and port.
struct DsHeader {
  std::uint8_t version;
  std::uint8_t length;  // kHdrV4Len or kHdrV6Len
  std::uint16_t port;   // big-endian
  std::uint8_t addr[20];  // IPv4: 4 bytes; IPv6: flow info (4), then 16
};
static_assert(sizeof(DsUdpHeader) == kUdpV6Len && sizeof(DsHeader) == kHdrV6Len, "rsockets' datagram headers");

int fail(int err) {
  errno = err;
  return -1;
}

socklen_t addr_len(const sockaddr* a) { return a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in); }

bool same_addr(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    auto* x = reinterpret_cast<const sockaddr_in*>(a);
    auto* y = reinterpret_cast<const sockaddr_in*>(b);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  auto* x = reinterpret_cast<const sockaddr_in6*>(a);
  auto* y = reinterpret_cast<const sockaddr_in6*>(b);
  return x->sin6_port == y->sin6_port && std::memcmp(&x->sin6_addr, &y->sin6_addr, 16) == 0;
}

bool any_or_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const std::uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr);
    return ip == INADDR_ANY || ip == INADDR_LOOPBACK;
  }
  const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
  return IN6_IS_ADDR_UNSPECIFIED(&ip) || IN6_IS_ADDR_LOOPBACK(&ip);
}

/// The RoCE v2 GID of an address (IPv4: mapped into IPv6).
ibv_gid gid_of(const sockaddr* a) {
  ibv_gid g{};
  if (a->sa_family == AF_INET) {
    g.raw[10] = g.raw[11] = 0xff;
    std::memcpy(&g.raw[12], &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, 4);
  } else {
    std::memcpy(g.raw, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16);
  }
  return g;
}

DsHeader header_of(const sockaddr* a) {
  DsHeader h{};
  if (a->sa_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(a);
    h.version = 4;
    h.length = kHdrV4Len;
    h.port = s->sin_port;
    std::memcpy(h.addr, &s->sin_addr, 4);
  } else {
    auto* s = reinterpret_cast<const sockaddr_in6*>(a);
    h.version = 6;
    h.length = kHdrV6Len;
    h.port = s->sin6_port;
    std::memcpy(h.addr, &s->sin6_flowinfo, 4);
    std::memcpy(h.addr + 4, &s->sin6_addr, 16);
  }
  return h;
}

sockaddr_storage addr_of(const DsHeader& h) {
  sockaddr_storage ss{};
  if (h.version == 4) {
    auto* s = reinterpret_cast<sockaddr_in*>(&ss);
    s->sin_family = AF_INET;
    s->sin_port = h.port;
    std::memcpy(&s->sin_addr, h.addr, 4);
  } else {
    auto* s = reinterpret_cast<sockaddr_in6*>(&ss);
    s->sin6_family = AF_INET6;
    s->sin6_port = h.port;
    std::memcpy(&s->sin6_flowinfo, h.addr, 4);
    std::memcpy(&s->sin6_addr, h.addr + 4, 16);
  }
  return ss;
}

/// A UD QP and its buffers, for one local address.
struct DsQp {
  rdma_cm_id* id = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  bool armed = false;
  ibv_mr* smr = nullptr;
  ibv_mr* rmr = nullptr;
  std::uint8_t* rbuf = nullptr;  // rq_size messages, then the GRHs' landing place
  ibv_ah* self = nullptr;        // its own address: UDP payloads handed to it
  sockaddr_storage local{};
  DsHeader hdr{};
};

/// A peer: its address, the local QP that talks to it, and (once known)
/// its QP and an address handle.
struct Dest {
  sockaddr_storage addr{};
  DsQp* qp = nullptr;
  ibv_ah* ah = nullptr;
  std::uint32_t qpn = 0;
};

struct Ds {
  int udp = -1;  // the socket's number
  std::mutex mu;
  bool ready = false;
  int fs_flags = 0;
  std::uint32_t sbuf_size = 1 << 17, rbuf_size = 1 << 17;
  std::uint16_t sq_size = 384, rq_size = 384;
  std::uint32_t sq_inline = 64;
  std::uint8_t* sbuf = nullptr;
  std::vector<std::uint32_t> free_slots;  // offsets into sbuf
  int rqe_avail = 0;
  std::vector<std::unique_ptr<DsQp>> qps;
  std::vector<std::unique_ptr<Dest>> dests;
  Dest* conn = nullptr;
  struct Rmsg {
    DsQp* qp;
    std::uint32_t offset, length;
  };
  std::vector<Rmsg> dmsg;
  int head = 0, tail = 0;
};

std::mutex g_mu;
std::map<int, Ds*>& g_ds = *new std::map<int, Ds*>;

Ds* lookup(int s) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_ds.find(s);
  return it == g_ds.end() ? nullptr : it->second;
}

/// The buffers, at the first bind, connect or send: rsockets sizes the
/// queues by the buffers, one 2048-byte message a work request.
int init_ep(Ds* ds) {
  if (ds->ready) return 0;
  ds->rq_size = static_cast<std::uint16_t>(std::clamp<std::uint32_t>(ds->rbuf_size / kMsgSize, 1, ds->rq_size));
  ds->sq_size = static_cast<std::uint16_t>(std::clamp<std::uint32_t>(ds->sbuf_size / kMsgSize, 1, ds->sq_size));
  ds->sbuf = static_cast<std::uint8_t*>(std::calloc(ds->sq_size, kMsgSize));
  if (!ds->sbuf) return fail(ENOMEM);
  for (std::uint32_t i = 0; i < ds->sq_size; ++i) ds->free_slots.push_back(i * kMsgSize);
  ds->dmsg.assign(ds->rq_size + 1u, {});
  ds->rqe_avail = ds->rq_size;
  ds->ready = true;
  return 0;
}

int post_recv(Ds* ds, DsQp* qp, std::uint32_t offset) {
  ibv_sge sge[2] = {{reinterpret_cast<std::uintptr_t>(qp->rbuf + ds->rq_size * kMsgSize), kGrh, qp->rmr->lkey},
                    {reinterpret_cast<std::uintptr_t>(qp->rbuf + offset), kMsgSize, qp->rmr->lkey}};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvWr | offset;
  wr.sg_list = sge;
  wr.num_sge = 2;
  const int rc = ibv_post_recv(qp->id->qp, &wr, &bad);
  return rc ? fail(rc) : 0;
}

ibv_ah* make_ah(DsQp* qp, const sockaddr* to) {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.grh.dgid = gid_of(to);
  a.grh.sgid_index = 0;
  a.grh.hop_limit = 64;
  a.port_num = qp->id->port_num ? qp->id->port_num : 1;
  return ibv_create_ah(qp->pd, &a);
}

void free_qp(DsQp* qp) {
  if (qp->id && qp->id->qp) rdma_destroy_qp(qp->id);
  if (qp->self) ibv_destroy_ah(qp->self);
  for (ibv_mr* mr : {qp->smr, qp->rmr})
    if (mr) ibv_dereg_mr(mr);
  if (qp->cq) ibv_destroy_cq(qp->cq);
  if (qp->cc) ibv_destroy_comp_channel(qp->cc);
  if (qp->pd) ibv_dealloc_pd(qp->pd);
  if (qp->id) rdma_destroy_id(qp->id);
  std::free(qp->rbuf);
}

/// The QP for local address `src`, made the first time.
DsQp* get_qp(Ds* ds, const sockaddr* src) {
  for (auto& q : ds->qps)
    if (same_addr(reinterpret_cast<const sockaddr*>(&q->local), src)) return q.get();
  auto qp = std::make_unique<DsQp>();
  std::memcpy(&qp->local, src, addr_len(src));
  qp->hdr = header_of(src);
  bool ok = rdma_create_id(nullptr, &qp->id, qp.get(), RDMA_PS_UDP) == 0 &&
            rdma_bind_addr(qp->id, const_cast<sockaddr*>(src)) == 0;
  Endpoint ep;
  ok = ok && make_endpoint(qp->id, qp.get(), IBV_QPT_UD, ds->sq_size, ds->rq_size, 1, 2, ds->sq_inline, ep) == 0;
  qp->pd = ep.pd;
  qp->cc = ep.cc;
  qp->cq = ep.cq;
  constexpr int kLocal = IBV_ACCESS_LOCAL_WRITE;
  ok = ok && (qp->rbuf = static_cast<std::uint8_t*>(std::calloc(1, ds->rq_size * kMsgSize + kGrh)));
  ok = ok && (qp->rmr = ibv_reg_mr(qp->pd, qp->rbuf, ds->rq_size * kMsgSize + kGrh, kLocal));
  ok = ok && (qp->smr = ibv_reg_mr(qp->pd, ds->sbuf, ds->sq_size * kMsgSize, kLocal));
  ok = ok && (qp->self = make_ah(qp.get(), src));
  for (std::uint32_t i = 0; ok && i < ds->rq_size; ++i) ok = post_recv(ds, qp.get(), i * kMsgSize) == 0;
  if (!ok) {
    const int e = errno ? errno : ENOMEM;
    free_qp(qp.get());
    errno = e;
    return nullptr;
  }
  ds->qps.push_back(std::move(qp));
  return ds->qps.back().get();
}

/// The local address that talks to `to`: the socket's, or, bound to any,
/// the one the kernel's route picks (with the socket's port).
int src_for(Ds* ds, const sockaddr* to, sockaddr_storage& src) {
  socklen_t len = sizeof src;
  if (::getsockname(ds->udp, reinterpret_cast<sockaddr*>(&src), &len) != 0) return -1;
  if (!any_or_loopback(reinterpret_cast<sockaddr*>(&src))) return 0;
  const std::uint16_t port = reinterpret_cast<sockaddr_in*>(&src)->sin_port;  // the same place in sockaddr_in6
  const int s = ::socket(to->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  len = sizeof src;
  const int rc = ::connect(s, to, addr_len(to)) == 0 ? ::getsockname(s, reinterpret_cast<sockaddr*>(&src), &len) : -1;
  const int e = errno;
  ::close(s);
  reinterpret_cast<sockaddr_in*>(&src)->sin_port = port;
  errno = e;
  return rc;
}

Dest* get_dest(Ds* ds, const sockaddr* to) {
  for (auto& d : ds->dests)
    if (same_addr(reinterpret_cast<const sockaddr*>(&d->addr), to)) return d.get();
  sockaddr_storage src{};
  if (src_for(ds, to, src) != 0) return nullptr;
  DsQp* qp = get_qp(ds, reinterpret_cast<sockaddr*>(&src));
  if (!qp) return nullptr;
  auto d = std::make_unique<Dest>();
  std::memcpy(&d->addr, to, addr_len(to));
  d->qp = qp;
  ds->dests.push_back(std::move(d));
  return ds->dests.back().get();
}

/// A datagram by UDP: to a peer whose QP is not known yet (op DATA), or the
/// answer that names ours (op CTRL).
ssize_t send_udp(Ds* ds, Dest* d, const void* buf, std::size_t len, int flags, std::uint8_t op) {
  DsUdpHeader h{};
  h.tag = htobe32(kUdpTag);
  h.version = d->qp->hdr.version;
  h.op = op;
  h.length = h.version == 4 ? kUdpV4Len : kUdpV6Len;
  h.qpn = htobe32(d->qp->id->qp->qp_num & 0xFFFFFF);
  std::memcpy(h.addr, d->qp->hdr.addr + (h.version == 4 ? 0 : 4), h.version == 4 ? 4 : 16);
  iovec iov[2] = {{&h, h.length}, {const_cast<void*>(buf), len}};
  msghdr m{};
  m.msg_name = &d->addr;
  m.msg_namelen = addr_len(reinterpret_cast<sockaddr*>(&d->addr));
  m.msg_iov = iov;
  m.msg_iovlen = len ? 2 : 1;
  const ssize_t n = ::sendmsg(ds->udp, &m, flags & MSG_DONTWAIT);
  return n > 0 ? n - h.length : n;
}

/// A UD SEND of `hdr` and `len` bytes of `buf` from a free slot.
int post_ud(Ds* ds, DsQp* qp, ibv_ah* ah, std::uint32_t qpn, const DsHeader& hdr, const void* buf, std::size_t len) {
  const std::uint32_t slot = ds->free_slots.back();
  ds->free_slots.pop_back();
  std::uint8_t* msg = ds->sbuf + slot;
  std::memcpy(msg, &hdr, hdr.length);
  std::memcpy(msg + hdr.length, buf, len);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(msg), static_cast<std::uint32_t>(hdr.length + len), qp->smr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = sge.length <= ds->sq_inline ? IBV_SEND_INLINE : 0;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = qpn;
  wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  const int rc = ibv_post_send(qp->id->qp, &wr, &bad);
  if (rc) {
    ds->free_slots.push_back(slot);
    return fail(rc);
  }
  return 0;
}

bool valid_recv(const DsQp* qp, std::uint32_t offset, std::uint32_t byte_len) {
  const auto* h = reinterpret_cast<const DsHeader*>(qp->rbuf + offset);
  return byte_len >= kGrh + kHdrV4Len && byte_len - kGrh >= h->length &&
         ((h->version == 4 && h->length == kHdrV4Len) || (h->version == 6 && h->length == kHdrV6Len));
}

/// Completions: received messages queued for the application (one it has
/// no room for, or a malformed one, is dropped and its buffer reposted);
/// sent ones free their slot.
void poll_cqs(Ds* ds) {
  ibv_wc wc[16];
  for (auto& q : ds->qps) {
    int n;
    while ((n = ibv_poll_cq(q->cq, 16, wc)) > 0) {
      for (int i = 0; i < n; ++i) {
        if (!(wc[i].wr_id & kRecvWr)) {
          ds->free_slots.push_back(static_cast<std::uint32_t>(wc[i].wr_id));
          continue;
        }
        const auto offset = static_cast<std::uint32_t>(wc[i].wr_id);
        if (wc[i].status == IBV_WC_WR_FLUSH_ERR) continue;
        if (ds->rqe_avail && wc[i].status == IBV_WC_SUCCESS && valid_recv(q.get(), offset, wc[i].byte_len)) {
          --ds->rqe_avail;
          ds->dmsg[ds->tail] = {q.get(), offset, wc[i].byte_len - kGrh};
          if (++ds->tail == ds->rq_size + 1) ds->tail = 0;
        } else {
          (void)post_recv(ds, q.get(), offset);
        }
      }
    }
  }
}

/// The UDP side: datagrams of peers that do not know our QP yet. Each is
/// answered with it (CTRL), gives an address handle for the peer's QP, and
/// its payload goes to our own QP, so it is read in order with the rest.
void serve_udp(Ds* ds) {
  alignas(8) std::uint8_t buf[kMsgSize];
  for (;;) {
    sockaddr_storage from{};
    socklen_t flen = sizeof from;
    const ssize_t n = ::recvfrom(ds->udp, buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &flen);
    if (n < 0) return;
    DsUdpHeader h{};
    if (n < kUdpV4Len) continue;
    std::memcpy(&h, buf, std::min<std::size_t>(sizeof h, static_cast<std::size_t>(n)));
    const bool v4 = h.version == 4 && from.ss_family == AF_INET && h.length == kUdpV4Len;
    const bool v6 = h.version == 6 && from.ss_family == AF_INET6 && h.length == kUdpV6Len;
    if (be32toh(h.tag) != kUdpTag || !(v4 || v6) || n < h.length) continue;  // not rsockets': dropped
    const std::uint32_t qpn = be32toh(h.qpn) & 0xFFFFFF;
    const auto* peer = reinterpret_cast<const sockaddr*>(&from);
    Dest* d = get_dest(ds, peer);
    if (!d) continue;
    if (h.op == kOpData) (void)send_udp(ds, d, nullptr, 0, MSG_DONTWAIT, kOpCtrl);
    if (!d->ah || d->qpn != qpn) {
      if (d->ah) ibv_destroy_ah(d->ah);
      d->ah = make_ah(d->qp, peer);
      d->qpn = qpn;
    }
    if (h.op != kOpData) continue;
    const std::size_t len = static_cast<std::size_t>(n) - h.length;
    const DsHeader src = header_of(peer);
    if (ds->free_slots.empty()) poll_cqs(ds);
    if (ds->free_slots.empty() || len + src.length > kMsgSize) continue;  // no room: dropped, as UDP drops
    (void)post_ud(ds, d->qp, d->qp->self, d->qp->id->qp->qp_num, src, buf + h.length, len);
  }
}

bool have_rdata(const Ds* ds) { return ds->head != ds->tail; }
bool can_send(const Ds* ds) { return !ds->free_slots.empty(); }

/// Serves the socket until `test` holds: 0; -1 with EWOULDBLOCK when
/// non-blocking. Waits in poll() on the UDP socket and the QPs' completion
/// channels, the socket's lock released.
int wait_until(Ds* ds, std::unique_lock<std::mutex>& lock, bool nonblock, bool (*test)(const Ds*)) {
  for (;;) {
    serve_udp(ds);
    poll_cqs(ds);
    if (test(ds)) return 0;
    if (nonblock) return fail(EWOULDBLOCK);
    bool armed_now = false;
    for (auto& q : ds->qps) armed_now = arm(q->cq, q->armed) || armed_now;
    if (armed_now) continue;  // what completed before the arming
    std::vector<pollfd> p{{ds->udp, POLLIN, 0}};
    for (auto& q : ds->qps) p.push_back({q->cc->fd, POLLIN, 0});
    lock.unlock();
    (void)::poll(p.data(), p.size(), -1);
    lock.lock();
    for (std::size_t i = 1; i < p.size() && i - 1 < ds->qps.size(); ++i)
      if (p[i].revents & POLLIN) take_events(ds->qps[i - 1]->cc, ds->qps[i - 1]->cq, ds->qps[i - 1]->armed);
  }
}

bool nonblocking(const Ds* ds, int flags) { return (ds->fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }

}  // namespace

int dgram_socket(int domain, int type) {
  auto* ds = new Ds;
  ds->fs_flags = (type & SOCK_NONBLOCK) ? O_NONBLOCK : 0;
  ds->udp = ::socket(domain, SOCK_DGRAM | (type & SOCK_CLOEXEC), 0);
  if (ds->udp < 0) {
    delete ds;
    return -1;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_ds[ds->udp] = ds;
  return ds->udp;
}

bool is_dgram(int s) { return lookup(s) != nullptr; }

int dgram_bind(int s, const sockaddr* addr, socklen_t len) {
  Ds* ds = lookup(s);
  if (!ds) return fail(EBADF);
  std::lock_guard<std::mutex> lock(ds->mu);
  if (init_ep(ds) != 0) return -1;
  return ::bind(ds->udp, addr, len);
}

int dgram_connect(int s, const sockaddr* addr, socklen_t len) {
  Ds* ds = lookup(s);
  if (!ds) return fail(EBADF);
  std::lock_guard<std::mutex> lock(ds->mu);
  if (init_ep(ds) != 0 || ::connect(ds->udp, addr, len) != 0) return -1;
  ds->conn = get_dest(ds, addr);
  return ds->conn ? 0 : -1;
}

ssize_t dgram_sendto(int s, const void* buf, size_t len, int flags, const sockaddr* to, socklen_t) {
  Ds* ds = lookup(s);
  if (!ds) return fail(EBADF);
  std::unique_lock<std::mutex> lock(ds->mu);
  if (init_ep(ds) != 0) return -1;
  Dest* d = ds->conn;
  if (to && (!d || !same_addr(to, reinterpret_cast<const sockaddr*>(&d->addr)))) d = get_dest(ds, to);
  if (!d) return to ? -1 : fail(EDESTADDRREQ);
  if (len + d->qp->hdr.length > kMsgSize) return fail(EMSGSIZE);
  if (!d->ah) serve_udp(ds);  // the peer's answer may name its QP by now
  if (!d->ah) return send_udp(ds, d, buf, len, flags, kOpData);
  if (!can_send(ds) && wait_until(ds, lock, nonblocking(ds, flags), can_send) != 0) return -1;
  if (post_ud(ds, d->qp, d->ah, d->qpn, d->qp->hdr, buf, len) != 0) return -1;
  return static_cast<ssize_t>(len);
}

ssize_t dgram_recvfrom(int s, void* buf, size_t len, int flags, sockaddr* from, socklen_t* fromlen) {
  Ds* ds = lookup(s);
  if (!ds) return fail(EBADF);
  std::unique_lock<std::mutex> lock(ds->mu);
  if (init_ep(ds) != 0) return -1;
  if (!have_rdata(ds) && wait_until(ds, lock, nonblocking(ds, flags), have_rdata) != 0) return -1;
  const Ds::Rmsg m = ds->dmsg[ds->head];
  const auto* h = reinterpret_cast<const DsHeader*>(m.qp->rbuf + m.offset);
  const std::size_t n = std::min<std::size_t>(len, m.length - h->length);
  std::memcpy(buf, m.qp->rbuf + m.offset + h->length, n);
  if (from && fromlen) {
    const sockaddr_storage a = addr_of(*h);
    const socklen_t alen = addr_len(reinterpret_cast<const sockaddr*>(&a));
    std::memcpy(from, &a, std::min(*fromlen, alen));
    *fromlen = alen;
  }
  if (!(flags & MSG_PEEK)) {
    (void)post_recv(ds, m.qp, m.offset);
    if (++ds->head == ds->rq_size + 1) ds->head = 0;
    ++ds->rqe_avail;
  }
  return static_cast<ssize_t>(n);
}

int dgram_close(int s) {
  Ds* ds = lookup(s);
  if (!ds) return fail(EBADF);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_ds.erase(s);
  }
  for (auto& d : ds->dests)
    if (d->ah) ibv_destroy_ah(d->ah);
  for (auto& q : ds->qps) free_qp(q.get());
  std::free(ds->sbuf);
  ::close(ds->udp);
  delete ds;
  return 0;
}

int dgram_getsockname(int s, sockaddr* addr, socklen_t* len) {
  Ds* ds = lookup(s);
  return ds ? ::getsockname(ds->udp, addr, len) : fail(EBADF);
}
int dgram_getpeername(int s, sockaddr* addr, socklen_t* len) {
  Ds* ds = lookup(s);
  return ds ? ::getpeername(ds->udp, addr, len) : fail(EBADF);
}

int dgram_setsockopt(int s, int level, int name, const void* val, socklen_t len) {
  Ds* ds = lookup(s);
  if (!ds) return fail(EBADF);
  std::lock_guard<std::mutex> lock(ds->mu);
  int v = 0;
  if (val && len >= static_cast<socklen_t>(sizeof v)) std::memcpy(&v, val, sizeof v);
  if (level == SOL_RDMA) {
    if (ds->ready) return fail(EINVAL);  // before the first bind, connect or send
    switch (name) {
      case RDMA_SQSIZE: ds->sq_size = static_cast<std::uint16_t>(std::clamp(v, 1, 0xFFFF)); return 0;
      case RDMA_RQSIZE: ds->rq_size = static_cast<std::uint16_t>(std::clamp(v, 1, 0xFFFF)); return 0;
      case RDMA_INLINE: ds->sq_inline = static_cast<std::uint32_t>(std::clamp(v, 0, 0xFFFF)); return 0;
      default: return fail(ENOPROTOOPT);
    }
  }
  // The rest is the UDP socket's; the buffer sizes also size the queues.
  if (::setsockopt(ds->udp, level, name, val, len) != 0) return -1;
  if (level == SOL_SOCKET && !ds->ready && (name == SO_RCVBUF || name == SO_SNDBUF)) {
    const std::uint32_t b = std::max<std::uint32_t>(static_cast<std::uint32_t>(std::max(v, 0)) << 1, kMsgSize);
    (name == SO_RCVBUF ? ds->rbuf_size : ds->sbuf_size) = b;
  }
  return 0;
}

int dgram_getsockopt(int s, int level, int name, void* val, socklen_t* len) {
  Ds* ds = lookup(s);
  if (!ds) return fail(EBADF);
  if (level == SOL_RDMA) {
    if (!val || !len || *len < static_cast<socklen_t>(sizeof(int))) return fail(EINVAL);
    int v;
    switch (name) {
      case RDMA_SQSIZE: v = ds->sq_size; break;
      case RDMA_RQSIZE: v = ds->rq_size; break;
      case RDMA_INLINE: v = static_cast<int>(ds->sq_inline); break;
      default: return fail(ENOPROTOOPT);
    }
    std::memcpy(val, &v, sizeof v);
    *len = sizeof v;
    return 0;
  }
  return ::getsockopt(ds->udp, level, name, val, len);
}

int dgram_fcntl(int s, int cmd, int arg) {
  Ds* ds = lookup(s);
  if (!ds) return fail(EBADF);
  std::lock_guard<std::mutex> lock(ds->mu);
  switch (cmd) {
    case F_GETFL: return ds->fs_flags;
    case F_SETFL: ds->fs_flags = arg & O_NONBLOCK; return 0;  // the UDP socket is always read without waiting
    default: return fail(ENOTSUP);
  }
}

short dgram_poll(int s, short events) {
  Ds* ds = lookup(s);
  if (!ds) return POLLNVAL;
  std::lock_guard<std::mutex> lock(ds->mu);
  if (!ds->ready) return static_cast<short>(events & POLLOUT);
  serve_udp(ds);
  poll_cqs(ds);
  for (auto& q : ds->qps) take_events(q->cc, q->cq, q->armed);  // a wake-up's events
  short r = 0;
  if ((events & POLLIN) && have_rdata(ds)) r |= POLLIN;
  if ((events & POLLOUT) && can_send(ds)) r |= POLLOUT;
  return r;
}

void dgram_arm(int s, std::vector<pollfd>& wake) {
  Ds* ds = lookup(s);
  if (!ds) return;
  std::lock_guard<std::mutex> lock(ds->mu);
  wake.push_back({ds->udp, POLLIN, 0});
  for (auto& q : ds->qps) {
    (void)arm(q->cq, q->armed);
    wake.push_back({q->cc->fd, POLLIN, 0});
  }
}

}  // namespace uroce::rsockets
