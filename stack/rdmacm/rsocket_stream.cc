// rsockets in uroce's librdmacm.so.1: librdmacm's socket-like API (rsocket,
// rconnect, raccept, rsend, rrecv, rpoll, riomap, riowrite, ...) over this
// library's rdma_cm calls and uroce's verbs, so rdmacm-utils' rstream,
// riostream and rcopy, and programs under librspreload, run unmodified.
//
// The wire is rsockets' own protocol, version 1, as rdma-core's librdmacm
// speaks it, so a uroce rsocket talks to one on rxe or a NIC:
//   - one RC QP per stream socket; its CM REQ and REP carry the connection
//     data (ConnData: credits, where to write receive space, the first
//     receive space);
//   - data goes as RDMA WRITE WITH IMMEDIATE into the peer's receive buffer;
//     the immediate's top 3 bits name the message (data, receive space,
//     iomap entry, control) and the rest its length or argument;
//   - a receiver gives back half its buffer at a time by writing an SGE into
//     the sender's target list, and its receive credits in the immediate;
//   - riomap'd buffers are announced by writing an Iomap entry into the
//     peer's iomap table; riowrite writes into them directly.
// SOCK_DGRAM rsockets (rsockets' UD protocol) are rsocket_dgram.cc's; the
// calls here hand them over.
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

#include "stack/rdmacm/rsocket_qp.h"

#include "stack/rdmacm/rsocket_stream.h"

namespace uroce::rsockets {

namespace {


std::mutex g_mu;
std::map<int, Rs*>& g_rs = *new std::map<int, Rs*>;  // by number; never destroyed (see rdmacm.cc)

}  // namespace

Rs* lookup(int s) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_rs.find(s);
  return it == g_rs.end() ? nullptr : it->second;
}

namespace {

void set_nonblock(int fd) { (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

namespace {

void* page_alloc(std::size_t len) {
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, (len + 4095) & ~std::size_t{4095}) != 0) return nullptr;
  std::memset(p, 0, len);
  return p;
}

}  // namespace

/// A new socket on its own event channel (a listener's connection: the
/// channel its id moves to).
Rs* make_rs(const Rs* parent) {
  auto* rs = new Rs;
  if (parent) {
    rs->sbuf_size = parent->sbuf_size;
    rs->rbuf_size = parent->rbuf_size;
    rs->sq_inline = parent->sq_inline;
    rs->sq_size = parent->sq_size;
    rs->rq_size = parent->rq_size;
    rs->target_iomap_size = parent->target_iomap_size;
    rs->fs_flags = parent->fs_flags;
    rs->tcp_nodelay = parent->tcp_nodelay;
  }
  rs->ch = rdma_create_event_channel();
  if (!rs->ch) {
    delete rs;
    return nullptr;
  }
  set_nonblock(rs->ch->fd);
  rs->index = rs->ch->fd;
  return rs;
}

namespace {

}  // namespace

void insert(Rs* rs) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_rs[rs->index] = rs;
}

namespace {

}  // namespace

void free_rs(Rs* rs) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_rs.find(rs->index);
    if (it != g_rs.end() && it->second == rs) g_rs.erase(it);
  }
  for (Rs* c : rs->accepted) free_rs(c);
  if (rs->id && rs->id->qp) rdma_destroy_qp(rs->id);
  for (auto* maps : {&rs->remote_maps, &rs->local_maps})
    for (MapMr& m : *maps)
      if (m.mr) ibv_dereg_mr(m.mr);
  for (ibv_mr* mr : {rs->smr, rs->rmr, rs->target_mr})
    if (mr) ibv_dereg_mr(mr);
  if (rs->cq) ibv_destroy_cq(rs->cq);
  if (rs->cc) ibv_destroy_comp_channel(rs->cc);
  if (rs->pd) ibv_dealloc_pd(rs->pd);
  if (rs->id) rdma_destroy_id(rs->id);
  if (rs->ch) rdma_destroy_event_channel(rs->ch);
  std::free(rs->sbuf);
  std::free(rs->rbuf);
  std::free(rs->target);
  delete rs;
}

namespace {

// ------------------------------------------------------------ the QP
int post_recv(Rs* rs) {
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvWr;  // no SGE: data arrives by RDMA WRITE
  const int rc = ibv_post_recv(rs->id->qp, &wr, &bad);
  return rc ? fail(rc) : 0;
}

/// An RDMA WRITE WITH IMMEDIATE carrying message `m` (a zero-length one
/// when sgl is null), or a plain RDMA WRITE (riowrite: no message).
int post_write(Rs* rs, ibv_sge* sgl, int nsge, std::uint32_t m, int flags, std::uint64_t addr, std::uint32_t rkey,
               bool with_imm = true) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = m;
  wr.sg_list = sgl;
  wr.num_sge = nsge;
  wr.opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = flags;
  wr.imm_data = htobe32(m);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  const int rc = ibv_post_send(rs->id->qp, &wr, &bad);
  return rc ? fail(rc) : 0;
}

int create_ep(Rs* rs) {
  ibv_context* verbs = rs->id->verbs;
  if (!verbs) return fail(ENODEV);
  ibv_device_attr da{};
  const int max = ibv_query_device(verbs, &da) == 0 ? std::min<int>(da.max_qp_wr, kQpMax) : kQpMax;
  rs->sq_size = static_cast<std::uint16_t>(std::clamp<int>(rs->sq_size, kQpMin, max));
  rs->rq_size = static_cast<std::uint16_t>(std::clamp<int>(rs->rq_size, kQpMin, max));
  Endpoint ep;
  const int rc = make_endpoint(rs->id, rs, IBV_QPT_RC, rs->sq_size, rs->rq_size, 2, 1, rs->sq_inline, ep);
  rs->pd = ep.pd;
  rs->cc = ep.cc;
  rs->cq = ep.cq;
  if (rc != 0) return -1;

  // The send buffer, and room for control messages that cannot go inline.
  const std::size_t sbuf_total = rs->sbuf_size + (rs->sq_inline < sizeof(Sge) ? sizeof(Sge) * kCtrlSlots : 0);
  const std::size_t target_len = sizeof(Sge) * kSglSize + sizeof(Iomap) * rs->target_iomap_size;
  rs->sbuf = static_cast<std::uint8_t*>(page_alloc(sbuf_total));
  rs->target = static_cast<std::uint8_t*>(page_alloc(target_len));
  rs->rbuf = static_cast<std::uint8_t*>(page_alloc(rs->rbuf_size));
  if (!rs->sbuf || !rs->target || !rs->rbuf) return fail(ENOMEM);
  constexpr int kLocal = IBV_ACCESS_LOCAL_WRITE, kRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (!(rs->smr = ibv_reg_mr(rs->pd, rs->sbuf, sbuf_total, kLocal))) return -1;
  if (!(rs->target_mr = ibv_reg_mr(rs->pd, rs->target, target_len, kRemote))) return -1;
  if (!(rs->rmr = ibv_reg_mr(rs->pd, rs->rbuf, rs->rbuf_size, kRemote))) return -1;
  rs->target_sgl = reinterpret_cast<volatile Sge*>(rs->target);
  if (rs->target_iomap_size) rs->target_iomap = reinterpret_cast<Iomap*>(rs->target + sizeof(Sge) * kSglSize);

  rs->ssgl[0].addr = rs->ssgl[1].addr = reinterpret_cast<std::uintptr_t>(rs->sbuf);
  rs->ssgl[0].lkey = rs->ssgl[1].lkey = rs->smr->lkey;
  rs->sbuf_bytes_avail = static_cast<int>(rs->sbuf_size);
  // The first half of the receive buffer goes in the connection data; the
  // second is given back as the first half is drained.
  rs->rbuf_free_offset = static_cast<int>(rs->rbuf_size >> 1);
  rs->rbuf_bytes_avail = static_cast<int>(rs->rbuf_size >> 1);
  rs->sqe_avail = rs->sq_size - static_cast<int>(rs->ctrl_max_seqno);
  rs->rseq_comp = rs->rq_size >> 1;
  rs->rmsg.assign(rs->rq_size + 1u, {0, 0});
  for (int i = 0; i < rs->rq_size; ++i)
    if (post_recv(rs) != 0) return -1;
  return 0;
}

void format_conn_data(const Rs* rs, ConnData& c) {
  std::memset(&c, 0, sizeof c);
  c.version = 1;
  c.flags = kConnFlagIomap | (host_is_net() ? kConnFlagNet : 0);
  c.credits = htobe16(rs->rq_size);
  c.target_iomap_size = static_cast<std::uint8_t>(scale_of(rs->target_iomap_size));
  c.target_sgl.addr = htobe64(reinterpret_cast<std::uintptr_t>(rs->target));
  c.target_sgl.length = htobe32(kSglSize);
  c.target_sgl.key = htobe32(rs->target_mr->rkey);
  c.data_buf.addr = htobe64(reinterpret_cast<std::uintptr_t>(rs->rbuf));
  c.data_buf.length = htobe32(rs->rbuf_size >> 1);
  c.data_buf.key = htobe32(rs->rmr->rkey);
}

void save_conn_data(Rs* rs, const ConnData& c) {
  rs->remote_sgl.addr = be64toh(c.target_sgl.addr);
  rs->remote_sgl.length = be32toh(c.target_sgl.length);
  rs->remote_sgl.key = be32toh(c.target_sgl.key);
  rs->remote_sge = 1;
  rs->swap = host_is_net() != ((c.flags & kConnFlagNet) != 0);
  if (c.flags & kConnFlagIomap) {
    rs->remote_iomap.addr = rs->remote_sgl.addr + sizeof(Sge) * rs->remote_sgl.length;
    rs->remote_iomap.length = static_cast<std::uint32_t>(value_of(c.target_iomap_size));
    rs->remote_iomap.key = rs->remote_sgl.key;
  }
  rs->target_sgl[0].addr = be64toh(c.data_buf.addr);
  rs->target_sgl[0].length = be32toh(c.data_buf.length);
  rs->target_sgl[0].key = be32toh(c.data_buf.key);
  rs->sseq_comp = be16toh(c.credits);
}

// ------------------------------------------------------------ progress
bool have_rdata(const Rs* rs) { return rs->rmsg_head != rs->rmsg_tail; }
bool can_send(const Rs* rs) {
  return rs->sqe_avail > 0 && rs->sbuf_bytes_avail >= static_cast<int>(kSndLowat) && rs->sseq_no != rs->sseq_comp &&
         rs->target_sgl[rs->target_sge].length != 0;
}
bool conn_can_send(const Rs* rs) { return can_send(rs) || !(rs->state & kWritable); }
bool conn_have_rdata(const Rs* rs) { return have_rdata(rs) || !(rs->state & kReadable); }
}  // namespace

bool conn_all_sends_done(const Rs* rs) {
  return static_cast<int>(rs->ctrl_max_seqno - rs->ctrl_seqno) + rs->sqe_avail == rs->sq_size ||
         !(rs->state & kConnected);
}

namespace {

/// Gives the peer receive credits, and the drained half of the receive
/// buffer when there is one.
void send_credits(Rs* rs) {
  ++rs->ctrl_seqno;
  rs->rseq_comp = static_cast<std::uint16_t>(rs->rseq_no + (rs->rq_size >> 1));
  const std::uint32_t m = msg_set(kOpSgl, static_cast<std::uint16_t>(rs->rseq_no + rs->rq_size));
  if (rs->rbuf_bytes_avail < static_cast<int>(rs->rbuf_size >> 1)) {
    (void)post_write(rs, nullptr, 0, m, 0, 0, 0);
    return;
  }
  Sge sge{reinterpret_cast<std::uintptr_t>(rs->rbuf + rs->rbuf_free_offset), rs->rmr->rkey, rs->rbuf_size >> 1};
  if (rs->swap) sge = {bswap_64(sge.addr), bswap_32(sge.key), bswap_32(sge.length)};
  ibv_sge s{};
  int flags = IBV_SEND_INLINE;
  s.length = sizeof sge;
  if (rs->sq_inline < sizeof sge) {
    auto* slot = rs->sbuf + rs->sbuf_size + sizeof(Sge) * (rs->ctrl_seqno & (kCtrlSlots - 1));
    std::memcpy(slot, &sge, sizeof sge);
    s.addr = reinterpret_cast<std::uintptr_t>(slot);
    s.lkey = rs->smr->lkey;
    flags = 0;
  } else {
    s.addr = reinterpret_cast<std::uintptr_t>(&sge);
  }
  (void)post_write(rs, &s, 1, m, flags, rs->remote_sgl.addr + rs->remote_sge * sizeof(Sge), rs->remote_sgl.key);
  rs->rbuf_bytes_avail -= static_cast<int>(rs->rbuf_size >> 1);
  rs->rbuf_free_offset += static_cast<int>(rs->rbuf_size >> 1);
  if (rs->rbuf_free_offset >= static_cast<int>(rs->rbuf_size)) rs->rbuf_free_offset = 0;
  if (++rs->remote_sge == static_cast<int>(rs->remote_sgl.length)) rs->remote_sge = 0;
}

void update_credits(Rs* rs) {
  const bool due = rs->rbuf_bytes_avail >= static_cast<int>(rs->rbuf_size >> 1) ||
                   static_cast<std::int16_t>(rs->rseq_no - rs->rseq_comp) >= 0;
  if (due && ctrl_avail(rs) && (rs->state & kConnected)) send_credits(rs);
}

/// Takes what the CQ holds; false when the receive queue could not be
/// refilled (the socket is then in error).
bool poll_cq(Rs* rs) {
  ibv_wc wc[16];
  int n, received = 0;
  while ((n = ibv_poll_cq(rs->cq, 16, wc)) > 0) {
    for (int i = 0; i < n; ++i) {
      const ibv_wc& w = wc[i];
      if (w.wr_id & kRecvWr) {
        if (w.status != IBV_WC_SUCCESS) continue;  // flushed
        ++received;
        const std::uint32_t m = (w.wc_flags & IBV_WC_WITH_IMM) ? be32toh(w.imm_data) : 0;
        switch (msg_op(m)) {
          case kOpSgl:
            rs->sseq_comp = static_cast<std::uint16_t>(msg_data(m));
            break;
          case kOpIomapSgl:  // the peer's iomap table changed: read at riowrite
          case kOpWrite:
            break;
          case kOpCtrl:
            if (msg_data(m) == kCtrlDisconnect) {
              rs->state = kDisconnected;
            } else if (msg_data(m) == kCtrlShutdown) {
              if (rs->state & kWritable) rs->state &= ~kReadable;
              else rs->state = kDisconnected;
            }
            break;
          default:
            rs->rmsg[rs->rmsg_tail] = {msg_op(m), msg_data(m)};
            if (++rs->rmsg_tail == rs->rq_size + 1) rs->rmsg_tail = 0;
            break;
        }
      } else {
        const std::uint32_t m = static_cast<std::uint32_t>(w.wr_id);
        switch (msg_op(m)) {
          case kOpSgl:
            ++rs->ctrl_max_seqno;
            break;
          case kOpCtrl:
            ++rs->ctrl_max_seqno;
            if (msg_data(m) == kCtrlDisconnect) rs->state = kDisconnected;
            break;
          case kOpIomapSgl:
            ++rs->sqe_avail;
            rs->sbuf_bytes_avail += sizeof(Iomap);
            break;
          default:
            ++rs->sqe_avail;
            rs->sbuf_bytes_avail += static_cast<int>(msg_data(m));
            break;
        }
        if (w.status != IBV_WC_SUCCESS && (rs->state & kConnected)) {
          rs->state = kError;
          rs->err = EIO;
        }
      }
    }
  }
  if (rs->state & kConnected) {
    while (received-- > 0) {
      if (post_recv(rs) != 0) {
        rs->state = kError;
        rs->err = errno;
        return false;
      }
    }
  }
  return true;
}

void connect_failed(Rs* rs, int err) {
  rs->state = kConnectError;
  rs->err = err;
}

/// Takes the channel's CM events: the steps of a connection being made,
/// and a disconnection.
void cm_events(Rs* rs) {
  rdma_cm_event* e = nullptr;
  while (rdma_get_cm_event(rs->ch, &e) == 0) {
    const rdma_cm_event_type type = e->event;
    const int status = e->status;
    ConnData peer{};
    const bool have_peer = e->param.conn.private_data && e->param.conn.private_data_len >= sizeof peer;
    if (have_peer) std::memcpy(&peer, e->param.conn.private_data, sizeof peer);
    (void)rdma_ack_cm_event(e);
    switch (type) {
      case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (rs->state != kResolvingAddr) break;
        if (rdma_resolve_route(rs->id, 2000) != 0) connect_failed(rs, errno);
        else rs->state = kResolvingRoute;
        break;
      case RDMA_CM_EVENT_ROUTE_RESOLVED: {
        if (rs->state != kResolvingRoute) break;
        if (create_ep(rs) != 0) {
          connect_failed(rs, errno);
          break;
        }
        ConnData mine;
        format_conn_data(rs, mine);
        rdma_conn_param p{};
        p.private_data = &mine;
        p.private_data_len = sizeof mine;
        p.flow_control = 1;
        p.retry_count = 7;
        p.rnr_retry_count = 7;
        if (rdma_connect(rs->id, &p) != 0) connect_failed(rs, errno);
        else rs->state = kConnecting;
        break;
      }
      case RDMA_CM_EVENT_ESTABLISHED:
        if (rs->state == kConnecting) {
          if (!have_peer || peer.version != 1) {
            connect_failed(rs, EOPNOTSUPP);
            break;
          }
          save_conn_data(rs, peer);
          rs->state = kConnectRdwr;
        } else if (rs->state == kAccepting) {
          rs->state = kConnectRdwr;
        }
        break;
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_CONNECT_ERROR:
        if (rs->state & kOpening) connect_failed(rs, status == -ETIMEDOUT ? ETIMEDOUT : EHOSTUNREACH);
        break;
      case RDMA_CM_EVENT_REJECTED:
        if (rs->state & kOpening) connect_failed(rs, ECONNREFUSED);
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
        // What was received stays readable; nothing more can be sent.
        if (rs->state & kConnected) rs->state = kDisconnected;
        else if (rs->state & kOpening) connect_failed(rs, ECONNRESET);
        break;
      default:
        break;
    }
  }
}

/// One pass: credits, completions, CM events.
bool progress(Rs* rs) {
  bool ok = true;
  // An accepted connection's CQ waits for ESTABLISHED: its receives are
  // refilled only once connected.
  const bool live = rs->cq && (rs->state & (kConnected | kDisconnected | kError));
  if (live) {
    update_credits(rs);
    ok = poll_cq(rs);
    update_credits(rs);
  }
  cm_events(rs);
  if (rs->cq && (rs->state & kConnected)) {
    ok = poll_cq(rs) && ok;  // what came before a disconnection
    update_credits(rs);
  }
  return ok;
}

}  // namespace

/// Makes progress until `test` holds: 0; -1 with EWOULDBLOCK when
/// non-blocking, or with errno when the socket failed. Waits in poll() with
/// the socket's lock released.
int wait_until(Rs* rs, std::unique_lock<std::mutex>& lock, bool nonblock, bool (*test)(const Rs*)) {
  for (;;) {
    const bool ok = progress(rs);
    if (test(rs)) return 0;
    if (!ok) return -1;
    if (nonblock) return fail(EWOULDBLOCK);
    if (rs->cq && arm(rs->cq, rs->cq_armed)) continue;  // what completed before the arming
    pollfd p[2] = {{rs->ch->fd, POLLIN, 0}, {rs->cc ? rs->cc->fd : -1, POLLIN, 0}};
    lock.unlock();
    (void)::poll(p, 2, -1);
    lock.lock();
    if (rs->cc && (p[1].revents & POLLIN)) take_events(rs->cc, rs->cq, rs->cq_armed);
  }
}

namespace {

bool nonblocking(const Rs* rs, int flags) { return (rs->fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }

bool connected_or_failed(const Rs* rs) { return !(rs->state & kOpening); }

}  // namespace

/// Drives a connection being made (rconnect's, or an accepted one's):
/// 0 once connected; -1 with EINPROGRESS while it is on its way
/// (non-blocking), or the reason it failed.
int drive_connect(Rs* rs, std::unique_lock<std::mutex>& lock, bool nonblock) {
  if (rs->state & kOpening) {
    if (wait_until(rs, lock, nonblock, connected_or_failed) != 0 && errno == EWOULDBLOCK) return fail(EINPROGRESS);
  }
  if (rs->state & kConnected) return 0;
  if (rs->state == kConnectError) return fail(rs->err ? rs->err : ECONNREFUSED);
  if (rs->state & (kDisconnected | kError)) return fail(ENOTCONN);
  return fail(EINVAL);
}

namespace {

}  // namespace

/// Takes a listener's connection requests: each becomes a socket,
/// accepted, queued for raccept.
void accept_requests(Rs* l) {
  rdma_cm_event* e = nullptr;
  while (rdma_get_cm_event(l->ch, &e) == 0) {
    if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      (void)rdma_ack_cm_event(e);
      continue;
    }
    rdma_cm_id* cid = e->id;
    ConnData req{};
    const bool ok = e->param.conn.private_data && e->param.conn.private_data_len >= sizeof req;
    if (ok) std::memcpy(&req, e->param.conn.private_data, sizeof req);
    rdma_conn_param p = e->param.conn;
    (void)rdma_ack_cm_event(e);
    Rs* c = ok && req.version == 1 ? make_rs(l) : nullptr;
    if (!c || rdma_migrate_id(cid, c->ch) != 0) {
      (void)rdma_reject(cid, nullptr, 0);
      (void)rdma_destroy_id(cid);
      if (c) free_rs(c);
      continue;
    }
    c->id = cid;
    cid->context = c;
    ConnData mine;
    if (create_ep(c) != 0) {
      (void)rdma_reject(cid, nullptr, 0);
      free_rs(c);
      continue;
    }
    save_conn_data(c, req);
    format_conn_data(c, mine);
    p.private_data = &mine;
    p.private_data_len = sizeof mine;
    p.qp_num = 0;
    p.srq = 0;
    if (rdma_accept(cid, &p) != 0) {
      free_rs(c);
      continue;
    }
    c->state = kAccepting;
    insert(c);
    l->accepted.push_back(c);
  }
}

namespace {

// ------------------------------------------------------------ data
/// Stages `len` bytes of `buf` (inline, or copied into the send buffer)
/// and posts them with `post`.
template <class Post>
int stage_send(Rs* rs, const void* buf, std::uint32_t len, Post post) {
  const auto sbuf = reinterpret_cast<std::uintptr_t>(rs->sbuf);
  const std::uint32_t left = static_cast<std::uint32_t>(sbuf + rs->sbuf_size - rs->ssgl[0].addr);
  if (len <= rs->sq_inline) {
    ibv_sge s{reinterpret_cast<std::uintptr_t>(buf), len, 0};
    return post(&s, 1, IBV_SEND_INLINE);
  }
  if (len <= left) {
    std::memcpy(reinterpret_cast<void*>(rs->ssgl[0].addr), buf, len);
    rs->ssgl[0].length = len;
    const int rc = post(rs->ssgl, 1, 0);
    rs->ssgl[0].addr = len < left ? rs->ssgl[0].addr + len : sbuf;
    return rc;
  }
  rs->ssgl[0].length = left;
  std::memcpy(reinterpret_cast<void*>(rs->ssgl[0].addr), buf, left);
  rs->ssgl[1].length = len - left;
  std::memcpy(rs->sbuf, static_cast<const std::uint8_t*>(buf) + left, len - left);
  const int rc = post(rs->ssgl, 2, 0);
  rs->ssgl[0].addr = sbuf + rs->ssgl[1].length;
  return rc;
}

/// Data: written into the peer's current receive space; the target entry
/// moves on before the post, as the peer may rewrite it once it has the data.
int write_data(Rs* rs, const void* buf, std::uint32_t len) {
  return stage_send(rs, buf, len, [&](ibv_sge* sgl, int n, int flags) {
    ++rs->sseq_no;
    --rs->sqe_avail;
    rs->sbuf_bytes_avail -= static_cast<int>(len);
    volatile Sge& t = rs->target_sgl[rs->target_sge];
    const std::uint64_t addr = t.addr;
    const std::uint32_t key = t.key;
    t.addr = addr + len;
    t.length = t.length - len;
    if (t.length == 0 && ++rs->target_sge == kSglSize) rs->target_sge = 0;
    return post_write(rs, sgl, n, msg_set(kOpData, len), flags, addr, key);
  });
}

/// Waits for room to send a message: the peer's credits and receive space,
/// a send queue entry, our send buffer.
int wait_room(Rs* rs, std::unique_lock<std::mutex>& lock, int flags) {
  if (can_send(rs)) return 0;
  if (wait_until(rs, lock, nonblocking(rs, flags), conn_can_send) != 0) return -1;
  return rs->state & kWritable ? 0 : fail(ECONNRESET);
}

}  // namespace

/// Announces riomap'd buffers to the peer (its iomap table, at their index).
int send_iomaps(Rs* rs, std::unique_lock<std::mutex>& lock, int flags) {
  for (std::size_t i = 0; i < rs->remote_maps.size(); ++i) {
    MapMr& m = rs->remote_maps[i];
    if (!m.queued) continue;
    if (wait_room(rs, lock, flags) != 0) return -1;
    Iomap iom{m.offset, {reinterpret_cast<std::uintptr_t>(m.mr->addr), m.mr->rkey, static_cast<std::uint32_t>(m.mr->length)}};
    if (rs->swap)
      iom = {bswap_64(iom.offset), {bswap_64(iom.sge.addr), bswap_32(iom.sge.key), bswap_32(iom.sge.length)}};
    const int rc = stage_send(rs, &iom, sizeof iom, [&](ibv_sge* sgl, int n, int fl) {
      ++rs->sseq_no;
      --rs->sqe_avail;
      rs->sbuf_bytes_avail -= sizeof(Iomap);
      return post_write(rs, sgl, n, msg_set(kOpIomapSgl, static_cast<std::uint32_t>(i)), fl,
                        rs->remote_iomap.addr + i * sizeof(Iomap), rs->remote_iomap.key);
    });
    m.queued = false;
    if (rc != 0) return -1;
  }
  rs->iomap_pending = false;
  return 0;
}

namespace {

}  // namespace

/// The entry point of every data call on a stream: finishes a connection
/// being made first.
int ready(Rs* rs, std::unique_lock<std::mutex>& lock, int flags) {
  if (!(rs->state & kOpening)) return 0;
  if (drive_connect(rs, lock, nonblocking(rs, flags)) == 0) return 0;
  if (errno == EINPROGRESS) errno = EAGAIN;
  return -1;
}

namespace {

/// Waits for room to send (wait_room), then sizes the next message of a send with `left` bytes to go: the first
/// kOlapStart, doubling to kMaxTransfer, within the send buffer's room.
int next_message(Rs* rs, std::unique_lock<std::mutex>& lock, int flags, std::size_t left, std::uint32_t& olen,
                 std::uint32_t& x) {
  if (wait_room(rs, lock, flags) != 0) return -1;
  if (olen < left) {
    x = olen;
    if (olen < kMaxTransfer) olen <<= 1;
  } else {
    x = static_cast<std::uint32_t>(left);
  }
  x = std::min<std::uint32_t>(x, static_cast<std::uint32_t>(rs->sbuf_bytes_avail));
  return 0;
}

}  // namespace

ssize_t do_send(Rs* rs, std::unique_lock<std::mutex>& lock, const void* buf, std::size_t len, int flags) {
  if (ready(rs, lock, flags) != 0) return -1;
  if (!(rs->state & kWritable)) return fail(rs->state & (kConnected | kDisconnected | kError) ? ECONNRESET : ENOTCONN);
  if (rs->iomap_pending && send_iomaps(rs, lock, flags) != 0) return -1;
  auto* p = static_cast<const std::uint8_t*>(buf);
  std::size_t left = len;
  std::uint32_t olen = kOlapStart;
  int rc = 0;
  while (left) {
    std::uint32_t x;
    if ((rc = next_message(rs, lock, flags, left, olen, x)) != 0) break;
    x = std::min<std::uint32_t>(x, static_cast<std::uint32_t>(rs->target_sgl[rs->target_sge].length));
    rc = write_data(rs, p, x);
    if (rc != 0) break;
    p += x;
    left -= x;
  }
  return rc != 0 && left == len ? -1 : static_cast<ssize_t>(len - left);
}

namespace {

/// Copies n bytes of the receive buffer from `off` (wrapping): the offset after.
int copy_out(const Rs* rs, int off, std::uint8_t* out, std::uint32_t n) {
  while (n) {
    const std::uint32_t chunk = std::min<std::uint32_t>(n, rs->rbuf_size - static_cast<std::uint32_t>(off));
    std::memcpy(out, rs->rbuf + off, chunk);
    out += chunk;
    n -= chunk;
    off += static_cast<int>(chunk);
    if (off == static_cast<int>(rs->rbuf_size)) off = 0;
  }
  return off;
}

/// MSG_PEEK: what rrecv would copy, the receive state untouched.
std::size_t peek(const Rs* rs, std::uint8_t* out, std::size_t len) {
  std::size_t left = len;
  int head = rs->rmsg_head, off = rs->rbuf_offset;
  while (left && head != rs->rmsg_tail) {
    const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::size_t>(left, rs->rmsg[head].second));
    if (n == rs->rmsg[head].second && ++head == rs->rq_size + 1) head = 0;
    off = copy_out(rs, off, out, n);
    out += n;
    left -= n;
  }
  return len - left;
}

}  // namespace

ssize_t do_recv(Rs* rs, std::unique_lock<std::mutex>& lock, void* buf, std::size_t len, int flags) {
  if (ready(rs, lock, flags) != 0) return -1;
  if (!(rs->state & (kConnected | kDisconnected | kError))) return fail(ENOTCONN);
  auto* out = static_cast<std::uint8_t*>(buf);
  std::size_t left = len;
  int rc = 0;
  do {
    if (!have_rdata(rs)) {
      rc = wait_until(rs, lock, nonblocking(rs, flags), conn_have_rdata);
      if (rc != 0) break;
    }
    if (flags & MSG_PEEK) {
      left -= peek(rs, out, left);
      break;
    }
    while (left && have_rdata(rs)) {
      auto& m = rs->rmsg[rs->rmsg_head];
      std::uint32_t n;
      if (left < m.second) {
        n = static_cast<std::uint32_t>(left);
        m.second -= n;
      } else {
        n = m.second;
        ++rs->rseq_no;
        if (++rs->rmsg_head == rs->rq_size + 1) rs->rmsg_head = 0;
      }
      rs->rbuf_offset = copy_out(rs, rs->rbuf_offset, out, n);
      out += n;
      left -= n;
      rs->rbuf_bytes_avail += static_cast<int>(n);
    }
  } while (left && (flags & MSG_WAITALL) && (rs->state & kReadable));
  update_credits(rs);
  return rc != 0 && left == len ? -1 : static_cast<ssize_t>(len - left);
}

namespace {

}  // namespace

/// What poll would say of an rsocket, without waiting.
short poll_rs(Rs* rs, short events) {
  std::unique_lock<std::mutex> lock(rs->mu);
  if (rs->state == kListening) {
    accept_requests(rs);
    return (events & POLLIN) && !rs->accepted.empty() ? POLLIN : 0;
  }
  if (rs->state & kOpening) {
    (void)drive_connect(rs, lock, true);  // then as the state it reached
    if (rs->state & kOpening) return 0;
  }
  if ((rs->state & kConnected) || rs->state == kDisconnected || (rs->state & kError)) {
    (void)progress(rs);
    short r = 0;
    if ((events & POLLIN) && conn_have_rdata(rs)) r |= POLLIN;
    if ((events & POLLOUT) && can_send(rs)) r |= POLLOUT;
    // A peer's close is a hang-up once what it sent has been read: before
    // that, POLLIN alone, as a TCP socket holding data and the peer's FIN
    // says (rstream -T a stops at a POLLHUP that comes with its last data).
    if (rs->state == kDisconnected && !have_rdata(rs)) r |= POLLHUP;
    else if (!(rs->state & (kConnected | kDisconnected))) r |= POLLERR;
    return r;
  }
  if (rs->state == kConnectError) return static_cast<short>((events & (POLLIN | POLLOUT)) | POLLERR);
  return 0;
}

namespace {

}  // namespace

/// Before rpoll sleeps: arms an rsocket's CQ and adds what wakes it.
void arm_rs(Rs* rs, std::vector<pollfd>& w) {
  std::lock_guard<std::mutex> lock(rs->mu);
  w.push_back({rs->ch->fd, POLLIN, 0});
  if (rs->cq && (rs->state & kConnected)) {
    (void)arm(rs->cq, rs->cq_armed);
    w.push_back({rs->cc->fd, POLLIN, 0});
  }
}

namespace {

}  // namespace

int send_ctrl(Rs* rs, std::uint32_t ctrl) {
  ++rs->ctrl_seqno;
  return post_write(rs, nullptr, 0, msg_set(kOpCtrl, ctrl), 0, 0, 0);
}

ssize_t do_iowrite(Rs* rs, std::unique_lock<std::mutex>& lock, const void* buf, std::size_t count, off_t offset, int flags) {
if (ready(rs, lock, flags) != 0) return static_cast<size_t>(-1);
if (rs->iomap_pending && send_iomaps(rs, lock, flags) != 0) return static_cast<size_t>(-1);
auto* p = static_cast<const std::uint8_t*>(buf);
std::size_t left = count;
std::uint32_t olen = kOlapStart;
std::uint64_t off = static_cast<std::uint64_t>(offset);
int rc = 0;
const Iomap* iom = nullptr;
while (left) {
  if (!iom || off >= iom->offset + iom->sge.length) {
    iom = nullptr;
    for (int i = 0; i < rs->target_iomap_size && rs->target_iomap; ++i) {
      const Iomap& t = rs->target_iomap[i];
      if (t.sge.length && off >= t.offset && off < t.offset + t.sge.length) {
        iom = &t;
        break;
      }
    }
    if (!iom) {
      if (left == count) rc = fail(EINVAL);  // nothing of the peer's is mapped there
      break;
    }
  }
  std::uint32_t x;
  if ((rc = next_message(rs, lock, flags, left, olen, x)) != 0) break;
  x = static_cast<std::uint32_t>(std::min<std::uint64_t>(x, iom->offset + iom->sge.length - off));
  const std::uint64_t addr = iom->sge.addr + off - iom->offset;
  const std::uint32_t key = iom->sge.key;
  rc = stage_send(rs, p, x, [&](ibv_sge* sgl, int n, int fl) {
    --rs->sqe_avail;
    rs->sbuf_bytes_avail -= static_cast<int>(x);
    return post_write(rs, sgl, n, msg_set(kOpWrite, x), fl, addr, key, false);
  });
  if (rc != 0) break;
  p += x;
  off += x;
  left -= x;
}
  return rc != 0 && left == count ? -1 : static_cast<ssize_t>(count - left);
}

}  // namespace uroce::rsockets
