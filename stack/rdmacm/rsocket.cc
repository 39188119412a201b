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

#include "stack/rdmacm/rsocket_dgram.h"
#include "stack/rdmacm/rsocket_qp.h"

namespace {

using namespace uroce::rsockets;

// ------------------------------------------------------------ the wire
// The immediate: bits 31..29 the message, 28..0 its argument.
enum : std::uint32_t { kOpData = 0, kOpWrite = 2, kOpSgl = 4, kOpIomapSgl = 6, kOpCtrl = 7 };
enum : std::uint32_t { kCtrlDisconnect = 0, kCtrlKeepalive = 1, kCtrlShutdown = 2 };
constexpr std::uint32_t msg_set(std::uint32_t op, std::uint32_t data) { return op << 29 | data; }
constexpr std::uint32_t msg_op(std::uint32_t m) { return m >> 29; }
constexpr std::uint32_t msg_data(std::uint32_t m) { return m & 0x1FFFFFFFu; }

constexpr std::uint64_t kRecvWr = 1ull << 63;  // a receive's wr_id; a send's is its message
constexpr std::uint32_t kSndLowat = 2048;      // the least send space worth a message
constexpr std::uint32_t kMaxTransfer = 65536;  // one message's most
constexpr std::uint32_t kOlapStart = 2048;     // the first message of a send; doubles up to kMaxTransfer
constexpr std::uint16_t kQpMin = 16, kQpMax = 0xFFFE;
constexpr std::uint32_t kCtrlSlots = 4;  // control messages in flight (power of 2)
constexpr int kSglSize = 2;              // receive-space entries in the target list
constexpr std::uint8_t kConnFlagNet = 1, kConnFlagIomap = 2;

/// Remote memory, in the sender's byte order (the peer swaps when the
/// connection data's NET flags differ).
struct Sge {
  std::uint64_t addr;
  std::uint32_t key;
  std::uint32_t length;
};
struct Iomap {
  std::uint64_t offset;
  Sge sge;
};
/// The CM private data of the REQ and the REP; its SGEs are big-endian.
struct ConnData {
  std::uint8_t version;
  std::uint8_t flags;
  std::uint16_t credits;  // big-endian: the sender's receive queue
  std::uint8_t reserved[3];
  std::uint8_t target_iomap_size;  // scaled (scale_of)
  Sge target_sgl;                  // where the peer writes receive space
  Sge data_buf;                    // the first receive space
};
static_assert(sizeof(Sge) == 16 && sizeof(Iomap) == 24 && sizeof(ConnData) == 40, "rsockets' wire layout");

constexpr bool host_is_net() { return __BYTE_ORDER == __BIG_ENDIAN; }
/// An 8-bit size field: values to 128 as they are, larger ones as 128 | v >> 8.
int scale_of(int v) { return v <= 128 ? v : 128 | (v >> 8); }
int value_of(int s) { return s <= 128 ? s : (s & ~128) << 8; }

// ------------------------------------------------------------ a socket
// States as rsockets orders them: passive, connecting, connected, closed.
enum : int {
  kInit = 0,
  kBound = 0x1,
  kListening = 0x2,
  kOpening = 0x4,
  kResolvingAddr = kOpening | 0x10,
  kResolvingRoute = kOpening | 0x20,
  kConnecting = kOpening | 0x40,
  kAccepting = kOpening | 0x80,
  kConnected = 0x100,
  kWritable = 0x200,
  kReadable = 0x400,
  kConnectRdwr = kConnected | kReadable | kWritable,
  kConnectError = 0x800,
  kDisconnected = 0x1000,
  kError = 0x2000,
};

struct MapMr {
  std::uint64_t offset = 0;
  ibv_mr* mr = nullptr;
  bool queued = false;  // announced to the peer at the next send
};

struct Rs {
  int index = -1;
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  std::mutex mu;
  int state = kInit;
  int err = 0;
  int fs_flags = 0;  // O_NONBLOCK
  bool swap = false;
  // Options (SOL_SOCKET, IPPROTO_TCP, SOL_RDMA), before the QP.
  std::uint32_t sbuf_size = 1 << 17, rbuf_size = 1 << 17;
  std::uint16_t sq_size = 384, rq_size = 384;
  std::uint32_t sq_inline = 64;
  std::uint16_t target_iomap_size = 0;
  int so_reuseaddr = 0, so_keepalive = 0, so_oobinline = 0, so_linger_off = 0;
  int tcp_nodelay = 0, tcp_keepidle = 7200, tcp_keepintvl = 75, tcp_keepcnt = 9;
  // A listener's connections, accepted and waiting for raccept.
  std::deque<Rs*> accepted;
  // The connection.
  ibv_pd* pd = nullptr;
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  bool cq_armed = false;
  std::uint32_t ctrl_seqno = 0, ctrl_max_seqno = kCtrlSlots;
  std::uint16_t sseq_no = 0, sseq_comp = 0, rseq_no = 0, rseq_comp = 0;
  int remote_sge = 0;
  Sge remote_sgl{}, remote_iomap{};
  std::uint8_t* target = nullptr;  // target list, then iomap table: the peer writes them
  ibv_mr* target_mr = nullptr;
  int target_sge = 0;
  volatile Sge* target_sgl = nullptr;
  Iomap* target_iomap = nullptr;
  std::uint8_t* rbuf = nullptr;
  ibv_mr* rmr = nullptr;
  int rbuf_bytes_avail = 0, rbuf_free_offset = 0, rbuf_offset = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> rmsg;  // (op, length) of data received
  int rmsg_head = 0, rmsg_tail = 0;
  std::uint8_t* sbuf = nullptr;
  ibv_mr* smr = nullptr;
  int sbuf_bytes_avail = 0;
  ibv_sge ssgl[2]{};
  int sqe_avail = 0;
  std::vector<MapMr> remote_maps;  // riomap(PROT_WRITE): the peer's iomap table's entries
  std::vector<MapMr> local_maps;   // riomap without PROT_WRITE
  bool iomap_pending = false;
};

int fail(int err) {
  errno = err;
  return -1;
}

std::mutex g_mu;
std::map<int, Rs*>& g_rs = *new std::map<int, Rs*>;  // by number; never destroyed (see rdmacm.cc)

Rs* lookup(int s) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_rs.find(s);
  return it == g_rs.end() ? nullptr : it->second;
}

void set_nonblock(int fd) { (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::uint64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000 + static_cast<std::uint64_t>(ts.tv_nsec) / 1'000'000;
}

void* page_alloc(std::size_t len) {
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, (len + 4095) & ~std::size_t{4095}) != 0) return nullptr;
  std::memset(p, 0, len);
  return p;
}

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

void insert(Rs* rs) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_rs[rs->index] = rs;
}

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
bool ctrl_avail(const Rs* rs) { return rs->ctrl_seqno != rs->ctrl_max_seqno; }
bool have_rdata(const Rs* rs) { return rs->rmsg_head != rs->rmsg_tail; }
bool can_send(const Rs* rs) {
  return rs->sqe_avail > 0 && rs->sbuf_bytes_avail >= static_cast<int>(kSndLowat) && rs->sseq_no != rs->sseq_comp &&
         rs->target_sgl[rs->target_sge].length != 0;
}
bool conn_can_send(const Rs* rs) { return can_send(rs) || !(rs->state & kWritable); }
bool conn_can_send_ctrl(const Rs* rs) { return ctrl_avail(rs) || !(rs->state & kConnected); }
bool conn_have_rdata(const Rs* rs) { return have_rdata(rs) || !(rs->state & kReadable); }
bool conn_all_sends_done(const Rs* rs) {
  return static_cast<int>(rs->ctrl_max_seqno - rs->ctrl_seqno) + rs->sqe_avail == rs->sq_size ||
         !(rs->state & kConnected);
}

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

bool nonblocking(const Rs* rs, int flags) { return (rs->fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }

bool connected_or_failed(const Rs* rs) { return !(rs->state & kOpening); }

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

/// The entry point of every data call on a stream: finishes a connection
/// being made first.
int ready(Rs* rs, std::unique_lock<std::mutex>& lock, int flags) {
  if (!(rs->state & kOpening)) return 0;
  if (drive_connect(rs, lock, nonblocking(rs, flags)) == 0) return 0;
  if (errno == EINPROGRESS) errno = EAGAIN;
  return -1;
}

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

/// Before rpoll sleeps: arms an rsocket's CQ and adds what wakes it.
void arm_rs(Rs* rs, std::vector<pollfd>& w) {
  std::lock_guard<std::mutex> lock(rs->mu);
  w.push_back({rs->ch->fd, POLLIN, 0});
  if (rs->cq && (rs->state & kConnected)) {
    (void)arm(rs->cq, rs->cq_armed);
    w.push_back({rs->cc->fd, POLLIN, 0});
  }
}

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
    if ((rs->state & kConnected) && ctrl_avail(rs)) {
      ++rs->ctrl_seqno;
      rc = post_write(rs, nullptr, 0, msg_set(kOpCtrl, ctrl), 0, 0, 0);
    }
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
    const std::uint64_t deadline = timeout > 0 ? now_ms() + static_cast<std::uint64_t>(timeout) : 0;
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
        const std::uint64_t now = now_ms();
        if (now >= deadline) return 0;
        left = static_cast<int>(deadline - now);
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
    return rc != 0 && left == count ? static_cast<size_t>(-1) : count - left;
  });
}

}  // extern "C"
