// librdmacm.so.1 for uroce: a drop-in for rdma-core's library, so that
// rdma_cm programs (rping, ucmatose, perftest -R, your own) run on uroce
// unmodified, beside uroce's libibverbs.so.1 (stack/ibverbs), whose
// contexts and QPs the CM ids use. Built against Debian's rdma-core 44
// headers; exports every public symbol of Debian's librdmacm.so.1 with its
// version node (librdmacm.map).
//
// The handshake is the daemon's CM agent (stack/cm), reached through
// liburoce's uroce_cm_* calls on the context behind each device. An event
// channel's descriptor is an epoll set of every device's CM descriptor
// (uroce_cm_fd, which the daemon rings when it queues an event) and of an
// eventfd for events this library makes itself (address and route
// resolution) or took from a device for another channel: it is readable
// exactly when rdma_get_cm_event has something, and the daemon drives it.
//
// UD ids (RDMA_PS_UDP) resolve their peer's QP by SIDR, through the same
// agent. What uroce cannot do fails cleanly with EOPNOTSUPP:
// ECE, AF_IB addresses and RDMA_PS_IPOIB. rsockets live in rsocket.cc.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "stack/verbs/uroce_verbs.h"

// uroce's libibverbs.so.1 (UROCE_PRIVATE_1): liburoce's objects behind its own.
extern "C" uroce_context* uroce_ibv_context(ibv_context* c);
extern "C" uroce_qp* uroce_ibv_qp(ibv_qp* q);
extern "C" ibv_qp* uroce_ibv_qp_by_num(ibv_context* c, uint32_t qp_num);

namespace {

// The most private data a REQ or REP carries for an rdma_cm peer (after the
// CM's own header), as uroce_cm_param takes it.
constexpr std::uint8_t kPrivateMax = sizeof(uroce_cm_event::private_data);

int fail(int err) {
  errno = err;
  return -1;
}
template <class T>
T* fail_null(int err) {
  errno = err;
  return nullptr;
}

/// One uroce device, opened for the process's life (as librdmacm keeps its
/// devices open): rdma_get_devices lists these contexts.
struct Dev {
  ibv_context* verbs = nullptr;
  uroce_context* u = nullptr;
  ibv_pd* pd = nullptr;  // for resolving addresses, and for rdma_create_qp without a PD
  ibv_gid gid{};         // the port's address as a RoCE v2 GID
  int cm_fd = -1;
  int max_rd_atom = 16;
};

struct Channel;

/// An event and the private data it points at.
struct Event {
  rdma_cm_event e{};
  std::uint8_t priv[kPrivateMax] = {};
};

/// An rdma_cm_id (first, so the pointer handed out is this one).
struct Id {
  rdma_cm_id id{};
  Channel* chan = nullptr;
  bool sync = false;  // made without a channel: the calls wait for their own events
  Dev* dev = nullptr;
  std::uint32_t conn = 0;  // the agent's connection
  bool has_conn = false, established = false, disconnected = false;
  bool listening = false;
  bool any_port = false;
  int ack_timeout = -1;  // RDMA_OPTION_ID_ACK_TIMEOUT, 0..31; -1: the agent's (connect) or the request's (accept)  // bound to port 0: the port was picked here, and listen may pick another if it is taken
  std::uint16_t listen_port = 0;
  std::vector<Dev*> listen_devs;
  ibv_sa_path_rec path{};
  bool own_cqs = false;  // rdma_create_qp made the CQs and channels
  // rdma_create_ep on a passive id: the QP each rdma_get_request makes.
  bool ep_qp = false;
  ibv_qp_init_attr ep_attr{};
  ibv_pd* ep_pd = nullptr;
  Event* sync_event = nullptr;  // a sync id's last event (id->event), freed by the next
  // An id without a QP of rdma_cm's (the application made its QP itself and
  // names it by rdma_conn_param's qp_num): the application brings the QP
  // up, with what rdma_init_qp_attr reports from the request's or the
  // reply's event (`attrs`); the active side ends with rdma_establish.
  bool app_qp = false;
  bool have_attrs = false;
  uroce_cm_event attrs{};
};

struct Channel {
  rdma_event_channel ch{};  // fd: the epoll set
  int efd = -1;             // readable while `queue` holds events
  bool own = false;         // a sync id's private channel
  bool destroyed = false;   // kept, never freed: a thread may still wait on it
  std::deque<Event*> queue;
};

// The library's state is never destroyed: an application may call exit()
// from one thread while another is still in rdma_destroy_id (rping's CM
// thread does, on ADDR_ERROR or REJECTED), and static destructors running
// under it would free what it is using. The process's end frees it.
std::mutex g_mu;
bool g_init = false;
int g_init_err = 0;
std::vector<Dev*>& g_devs = *new std::vector<Dev*>;
std::vector<Channel*>& g_chans = *new std::vector<Channel*>;
std::map<std::pair<Dev*, std::uint32_t>, Id*>& g_conns = *new std::map<std::pair<Dev*, std::uint32_t>, Id*>;
/// Listens by device and port (| 1 << 16 in RDMA_PS_UDP's port space).
std::map<std::pair<Dev*, std::uint32_t>, Id*>& g_listens = *new std::map<std::pair<Dev*, std::uint32_t>, Id*>;
std::uint32_t listen_key(std::uint16_t port, bool ud) { return port | (ud ? 1u << 16 : 0u); }
bool is_ud(const rdma_cm_id* id) { return id->ps == RDMA_PS_UDP; }

Id* as_id(rdma_cm_id* id) { return reinterpret_cast<Id*>(id); }

// ------------------------------------------------------------ addresses

bool is_v4_mapped(const ibv_gid& g) {
  static const std::uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, 12) == 0;
}

/// The GID of an IPv4 or IPv6 socket address (false for any other family).
bool gid_of(const sockaddr* a, ibv_gid& g) {
  g = ibv_gid{};
  if (a->sa_family == AF_INET) {
    g.raw[10] = g.raw[11] = 0xff;
    std::memcpy(g.raw + 12, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, 4);
    return true;
  }
  if (a->sa_family == AF_INET6) {
    std::memcpy(g.raw, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16);
    return true;
  }
  return false;
}

/// The socket address of a GID and a port (network order).
void sockaddr_of(const ibv_gid& g, std::uint16_t port_be, sockaddr_storage& out) {
  out = sockaddr_storage{};
  if (is_v4_mapped(g)) {
    auto* s = reinterpret_cast<sockaddr_in*>(&out);
    s->sin_family = AF_INET;
    std::memcpy(&s->sin_addr, g.raw + 12, 4);
    s->sin_port = port_be;
  } else {
    auto* s = reinterpret_cast<sockaddr_in6*>(&out);
    s->sin6_family = AF_INET6;
    std::memcpy(&s->sin6_addr, g.raw, 16);
    s->sin6_port = port_be;
  }
}

std::uint16_t port_of(const sockaddr* a) {  // network order
  if (a->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(a)->sin_port;
  if (a->sa_family == AF_INET6) return reinterpret_cast<const sockaddr_in6*>(a)->sin6_port;
  return 0;
}

void set_port(sockaddr* a, std::uint16_t port_be) {
  if (a->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(a)->sin_port = port_be;
  if (a->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(a)->sin6_port = port_be;
}

std::size_t addr_len(const sockaddr* a) {
  return a->sa_family == AF_INET ? sizeof(sockaddr_in) : a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : 0;
}

bool is_any(const sockaddr* a) {
  ibv_gid g;
  if (!gid_of(a, g)) return false;
  if (a->sa_family == AF_INET) return std::all_of(g.raw + 12, g.raw + 16, [](std::uint8_t b) { return b == 0; });
  return std::all_of(g.raw, g.raw + 16, [](std::uint8_t b) { return b == 0; });
}

/// 127.0.0.0/8 or ::1. The kernel's rdma_cm (rxe, Linux 6.1) resolves such
/// a destination to the first active device, and binds such a source to no
/// device at all (the bind succeeds and id->verbs stays NULL), as it does
/// the any address: libfabric's verbs provider counts on that to list the
/// devices' own addresses for a listener.
bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

Dev* dev_with_ip(const sockaddr* a) {
  ibv_gid g;
  if (!gid_of(a, g)) return nullptr;
  for (Dev* d : g_devs)
    if (std::memcmp(d->gid.raw, g.raw, 16) == 0) return d;
  return nullptr;
}

/// The device to reach `dst` from: the one that has that address
/// (loopback), else the one sharing the longest prefix with it (a /24 for
/// IPv4 beats a /16), else the first.
Dev* dev_for(const sockaddr* dst) {
  ibv_gid g;
  if (g_devs.empty() || !gid_of(dst, g)) return nullptr;
  Dev* best = g_devs.front();
  int best_bits = -1;
  for (Dev* d : g_devs) {
    if (is_v4_mapped(d->gid) != is_v4_mapped(g)) continue;
    int bits = 0;
    for (int i = 0; i < 16 && bits == i * 8; ++i) {
      const std::uint8_t x = d->gid.raw[i] ^ g.raw[i];
      bits += x ? __builtin_clz(x) - 24 : 8;
    }
    if (bits > best_bits) best = d, best_bits = bits;
  }
  return best;
}

void attach(Id* id, Dev* d) {
  id->dev = d;
  id->id.verbs = d->verbs;
  // As librdmacm does: an id bound to a device carries the device's PD, and
  // programs use it (UCX's rdmacm component creates its QPs on id->pd).
  if (!id->id.pd) id->id.pd = d->pd;
  id->id.port_num = 1;
  id->id.route.addr.addr.ibaddr.sgid = d->gid;
  id->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
}

// ------------------------------------------------------------ devices and channels

/// fork: the devices' contexts are the parent's sessions (a request and its
/// reply on one socket), so a child that spoke on them would interleave
/// with the parent (rdma-core's suite forks its rdma_cm players after the
/// parent has used rdma_cm). The child forgets them, unclosed (a close would
/// speak on the parent's session), and opens its own on its next call; the
/// lock is held across the fork so that the child's copy is consistent.
void fork_prepare() { g_mu.lock(); }
void fork_parent() { g_mu.unlock(); }
void fork_child() {
  g_devs.clear();
  g_conns.clear();
  g_listens.clear();
  g_init = false;
  g_init_err = 0;
  g_mu.unlock();
}

int init_locked() {
  if (g_init) return g_init_err;
  g_init = true;
  static const bool fork_handlers = pthread_atfork(fork_prepare, fork_parent, fork_child) == 0;
  (void)fork_handlers;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; ++i) {
    ibv_context* c = ibv_open_device(list[i]);
    if (!c) continue;
    auto* d = new Dev;
    d->verbs = c;
    d->u = uroce_ibv_context(c);
    ibv_device_attr da{};
    if (ibv_query_device(c, &da) == 0 && da.max_qp_rd_atom > 0) d->max_rd_atom = da.max_qp_rd_atom;
    d->cm_fd = d->u ? uroce_cm_fd(d->u) : -1;
    d->pd = ibv_alloc_pd(c);
    if (!d->u || d->cm_fd < 0 || !d->pd || ibv_query_gid(c, 1, 0, &d->gid) != 0) {
      if (d->pd) ibv_dealloc_pd(d->pd);
      ibv_close_device(c);
      delete d;
      continue;
    }
    g_devs.push_back(d);
  }
  if (list) ibv_free_device_list(list);
  if (g_devs.empty()) g_init_err = ENODEV;
  return g_init_err;
}

Channel* new_channel_locked(bool own) {
  auto* ch = new Channel;
  ch->own = own;
  ch->ch.fd = ::epoll_create1(EPOLL_CLOEXEC);
  ch->efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  bool ok = ch->ch.fd >= 0 && ch->efd >= 0;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ok = ok && ::epoll_ctl(ch->ch.fd, EPOLL_CTL_ADD, ch->efd, &ev) == 0;
  for (Dev* d : g_devs) ok = ok && ::epoll_ctl(ch->ch.fd, EPOLL_CTL_ADD, d->cm_fd, &ev) == 0;
  if (!ok) {
    const int e = errno;
    if (ch->ch.fd >= 0) ::close(ch->ch.fd);
    if (ch->efd >= 0) ::close(ch->efd);
    delete ch;
    errno = e ? e : EMFILE;
    return nullptr;
  }
  g_chans.push_back(ch);
  return ch;
}

/// A destroyed channel's descriptors close, and its events go; the struct
/// stays (a few bytes), because a thread may still be inside
/// rdma_get_cm_event on it, as rping's CM thread is when rping destroys the
/// channel at exit: that thread then waits for good, as it would on
/// rdma-core's kernel channel, instead of touching freed memory.
void free_channel_locked(Channel* ch) {
  for (Event* e : ch->queue) delete e;
  ch->queue.clear();
  ::close(ch->ch.fd);
  ::close(ch->efd);
  ch->ch.fd = ch->efd = -1;
  ch->destroyed = true;
  g_chans.erase(std::remove(g_chans.begin(), g_chans.end(), ch), g_chans.end());
}

void enqueue(Channel* ch, Event* e) {
  ch->queue.push_back(e);
  const std::uint64_t one = 1;
  (void)!::write(ch->efd, &one, sizeof one);
}

Event* make_event(Id* id, rdma_cm_event_type type, int status) {
  auto* e = new Event;
  e->e.id = &id->id;
  e->e.event = type;
  e->e.status = status;
  return e;
}

/// An agent event for device `d`, to the channel of the id it names.
void route_locked(Dev* d, const uroce_cm_event& ev) {
  Id* id = nullptr;
  Id* listener = nullptr;
  if (ev.event == UROCE_CM_EVENT_CONNECT_REQUEST) {
    const auto it = g_listens.find({d, listen_key(ev.local_port, ev.ud != 0)});
    if (it == g_listens.end()) {  // nobody listens any more
      (void)uroce_cm_reject(d->u, ev.id, nullptr, 0);
      return;
    }
    listener = it->second;
    id = new Id;
    id->chan = listener->chan;
    id->id.channel = &listener->chan->ch;
    id->id.context = listener->id.context;
    id->id.ps = listener->id.ps;
    id->id.qp_type = listener->id.qp_type;
    attach(id, d);
    id->conn = ev.id;
    id->has_conn = true;
    sockaddr_of(d->gid, htons(ev.local_port), id->id.route.addr.src_storage);
    sockaddr_of(ev.peer_gid, htons(ev.peer_port), id->id.route.addr.dst_storage);
    id->id.route.addr.addr.ibaddr.dgid = ev.peer_gid;
    g_conns[{d, ev.id}] = id;
  } else {
    const auto it = g_conns.find({d, ev.id});
    if (it == g_conns.end()) return;  // its id is gone
    id = it->second;
  }
  int status = 0;
  switch (ev.event) {
    case UROCE_CM_EVENT_CONNECT_REQUEST:
    case UROCE_CM_EVENT_CONNECT_RESPONSE:
      id->attrs = ev;
      id->have_attrs = true;
      break;
    case UROCE_CM_EVENT_ESTABLISHED:
      id->established = true;
      if (port_of(&id->id.route.addr.src_addr) == 0) set_port(&id->id.route.addr.src_addr, htons(ev.local_port));
      break;
    case UROCE_CM_EVENT_DISCONNECTED:
      id->disconnected = true;
      break;
    case UROCE_CM_EVENT_REJECTED:
      status = ev.status;  // the IBTA reject reason, as librdmacm reports it
      break;
    case UROCE_CM_EVENT_UNREACHABLE:
      // A SIDR answer that is not a QP says why (as rdma_cm: the SIDR
      // status); no answer at all is a timeout.
      status = ev.ud && ev.status != 4 ? ev.status : -ETIMEDOUT;
      break;
    default:
      break;
  }
  Event* e = make_event(id, static_cast<rdma_cm_event_type>(ev.event), status);
  e->e.listen_id = listener ? &listener->id : nullptr;
  rdma_conn_param& p = e->e.param.conn;
  p.private_data_len = ev.private_data_len;
  std::memcpy(e->priv, ev.private_data, ev.private_data_len);
  p.private_data = ev.private_data_len ? e->priv : nullptr;
  p.responder_resources = ev.responder_resources;
  p.initiator_depth = ev.initiator_depth;
  p.flow_control = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  p.qp_num = ev.peer_qp_num;
  if (ev.ud && (ev.event == UROCE_CM_EVENT_ESTABLISHED || ev.event == UROCE_CM_EVENT_CONNECT_REQUEST)) {
    // A SIDR answer: the QP to send to, its Q_Key, and how to reach it. A
    // SIDR request: how to reach the asker (qperf's UD server makes its
    // address handle from it), and the Q_Key of rdma_cm's UD QPs.
    rdma_ud_param& u = e->e.param.ud;
    u = rdma_ud_param{};
    u.private_data_len = ev.private_data_len;
    u.private_data = ev.private_data_len ? e->priv : nullptr;
    u.qp_num = ev.peer_qp_num;
    u.qkey = ev.event == UROCE_CM_EVENT_ESTABLISHED ? ev.qkey : RDMA_UDP_QKEY;
    u.ah_attr.is_global = 1;
    u.ah_attr.grh.dgid = ev.peer_gid;
    u.ah_attr.grh.sgid_index = 0;
    u.ah_attr.grh.hop_limit = 64;
    u.ah_attr.port_num = 1;
    if (ev.event == UROCE_CM_EVENT_ESTABLISHED) g_conns.erase({d, ev.id});  // nothing more comes for it
  }
  enqueue(id->chan, e);
}

/// Takes every event the devices hold and hands each to its channel.
void pump_locked() {
  for (Dev* d : g_devs) {
    uroce_cm_event ev;
    while (uroce_cm_get_event(d->u, 0, &ev) == 0) route_locked(d, ev);
  }
}

/// Waits for the next event of `ch`: 0 and *out, or -1 with errno.
int next_event(Channel* ch, bool block, Event** out) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (ch->destroyed) break;
      pump_locked();
      if (!ch->queue.empty()) {
        *out = ch->queue.front();
        ch->queue.pop_front();
        if (ch->queue.empty()) {
          std::uint64_t v;
          (void)!::read(ch->efd, &v, sizeof v);
        }
        return 0;
      }
    }
    if (!block) return fail(EAGAIN);
    epoll_event evs[8];
    const int n = ::epoll_wait(ch->ch.fd, evs, 8, -1);
    if (n < 0 && errno != EINTR) {
      // Destroyed meanwhile (its descriptor closed, maybe even reused): the
      // loop looks again and waits for good; any other error is the caller's.
      const int e = errno;
      std::lock_guard<std::mutex> lock(g_mu);
      if (!ch->destroyed) return fail(e);
    }
  }
  if (!block) return fail(EBADF);
  for (;;) ::pause();  // the channel is gone: nothing will ever come
}

void free_sync_event(Id* id) {
  delete id->sync_event;
  id->sync_event = nullptr;
  id->id.event = nullptr;
}

/// A sync id: waits for the event its last call makes; kept in id->event.
int sync_wait(Id* id, rdma_cm_event_type want) {
  free_sync_event(id);
  Event* e = nullptr;
  if (next_event(id->chan, true, &e) != 0) return -1;
  id->sync_event = e;
  id->id.event = &e->e;
  if (e->e.event != want) return fail(e->e.status < 0 ? -e->e.status : e->e.status ? ECONNREFUSED : EPROTO);
  return 0;
}

/// A destroyed channel (its descriptor closed) counts as blocking: a thread
/// that comes back to it after another destroyed it (rping's CM thread,
/// racing its main thread's teardown) waits for good, as one already
/// waiting does, instead of failing with EBADF and taking the process down.
bool nonblocking(const Channel* ch) { return ch->ch.fd >= 0 && (::fcntl(ch->ch.fd, F_GETFL) & O_NONBLOCK) != 0; }

int cm_error(int rc) { return fail(rc > 0 ? rc : EIO); }

uroce_cm_param cm_param(const Id* id, const rdma_conn_param* c) {
  uroce_cm_param p{};
  p.mtu = id->path.mtu ? static_cast<ibv_mtu>(id->path.mtu) : static_cast<ibv_mtu>(0);
  if (!c) {
    if (id->ack_timeout >= 0) {
      p.flags |= UROCE_CM_ACK_TIMEOUT;
      p.ack_timeout = static_cast<std::uint8_t>(id->ack_timeout);
    }
    return p;
  }
  p.private_data = c->private_data;
  p.private_data_len = c->private_data_len;
  const int max = id->dev ? id->dev->max_rd_atom : 16;
  p.responder_resources = static_cast<std::uint8_t>(std::min<int>(c->responder_resources, max));
  p.initiator_depth = static_cast<std::uint8_t>(std::min<int>(c->initiator_depth, max));
  p.retry_count = std::min<std::uint8_t>(c->retry_count, 7);
  p.rnr_retry_count = std::min<std::uint8_t>(c->rnr_retry_count, 7);
  if (id->ack_timeout >= 0) {
    p.flags |= UROCE_CM_ACK_TIMEOUT;
    p.ack_timeout = static_cast<std::uint8_t>(id->ack_timeout);
  }
  return p;
}

int unlisten_locked(Id* id) {
  for (Dev* d : id->listen_devs) {
    (void)(is_ud(&id->id) ? uroce_cm_unlisten_ud(d->u, id->listen_port) : uroce_cm_unlisten(d->u, id->listen_port));
    g_listens.erase({d, listen_key(id->listen_port, is_ud(&id->id))});
  }
  id->listen_devs.clear();
  id->listening = false;
  return 0;
}

/// INIT, as librdmacm leaves a QP it made (receives can be posted before
/// the connection); the agent takes it on to RTR and RTS.
int qp_to_init(ibv_qp* qp, ibv_qp_type type) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (type == IBV_QPT_UD) {
    a.qkey = RDMA_UDP_QKEY;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  return ibv_modify_qp(qp, &a, mask);
}

void destroy_own_cqs(Id* id) {
  if (!id->own_cqs) return;
  if (id->id.send_cq) ibv_destroy_cq(id->id.send_cq);
  if (id->id.recv_cq && id->id.recv_cq != id->id.send_cq) ibv_destroy_cq(id->id.recv_cq);
  if (id->id.send_cq_channel) ibv_destroy_comp_channel(id->id.send_cq_channel);
  if (id->id.recv_cq_channel && id->id.recv_cq_channel != id->id.send_cq_channel)
    ibv_destroy_comp_channel(id->id.recv_cq_channel);
  id->id.send_cq = id->id.recv_cq = nullptr;
  id->id.send_cq_channel = id->id.recv_cq_channel = nullptr;
  id->own_cqs = false;
}

/// Makes the CQs (each with a completion channel) a QP without them needs,
/// as librdmacm does.
int make_cqs(Id* id, ibv_qp_init_attr_ex& a) {
  if (a.send_cq && a.recv_cq) return 0;
  if (a.send_cq || a.recv_cq) return fail(EINVAL);
  id->own_cqs = true;
  id->id.send_cq_channel = ibv_create_comp_channel(id->id.verbs);
  id->id.recv_cq_channel = ibv_create_comp_channel(id->id.verbs);
  if (id->id.send_cq_channel && id->id.recv_cq_channel) {
    id->id.send_cq = ibv_create_cq(id->id.verbs, std::max<int>(1, a.cap.max_send_wr), id, id->id.send_cq_channel, 0);
    id->id.recv_cq = ibv_create_cq(id->id.verbs, std::max<int>(1, a.cap.max_recv_wr), id, id->id.recv_cq_channel, 0);
  }
  if (!id->id.send_cq || !id->id.recv_cq) {
    const int e = errno;
    destroy_own_cqs(id);
    return fail(e ? e : ENOMEM);
  }
  a.send_cq = id->id.send_cq;
  a.recv_cq = id->id.recv_cq;
  return 0;
}

int create_qp(Id* id, ibv_qp_init_attr_ex& a) {
  if (!id->id.verbs) return fail(EINVAL);  // no device yet: bind or resolve first
  if (!(a.comp_mask & IBV_QP_INIT_ATTR_PD) || !a.pd) {
    a.pd = id->dev->pd;
    a.comp_mask |= IBV_QP_INIT_ATTR_PD;
  }
  if (a.pd->context != id->id.verbs) return fail(EINVAL);
  if (make_cqs(id, a) != 0) return -1;
  ibv_qp* qp = ibv_create_qp_ex(id->id.verbs, &a);
  if (!qp) {
    const int e = errno;
    destroy_own_cqs(id);
    return fail(e ? e : ENOMEM);
  }
  int rc = qp_to_init(qp, a.qp_type);
  if (rc == 0 && a.qp_type == IBV_QPT_UD) {
    // A UD QP needs no peer: on to RTS at once, as librdmacm does.
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTR;
    rc = ibv_modify_qp(qp, &r, IBV_QP_STATE);
    if (rc == 0) {
      r.qp_state = IBV_QPS_RTS;
      r.sq_psn = 0;
      rc = ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_SQ_PSN);
    }
  }
  if (rc) {
    ibv_destroy_qp(qp);
    destroy_own_cqs(id);
    return fail(rc);
  }
  id->id.qp = qp;
  id->id.pd = a.pd;
  return 0;
}

void fill_path(Id* id) {
  ibv_sa_path_rec& p = id->path;
  p = ibv_sa_path_rec{};
  p.sgid = id->id.route.addr.addr.ibaddr.sgid;
  p.dgid = id->id.route.addr.addr.ibaddr.dgid;
  p.pkey = htobe16(0xffff);
  p.hop_limit = 64;
  p.reversible = 1;
  p.numb_path = 1;
  p.mtu_selector = 2;  // exactly
  ibv_port_attr pa{};
  p.mtu = ibv_query_port(id->id.verbs, 1, &pa) == 0 ? pa.active_mtu : IBV_MTU_1024;
  p.rate_selector = 2;
  p.rate = 2;  // the SA's code for 2.5 Gb/s; nothing here paces by it
  p.packet_life_time_selector = 2;
  p.packet_life_time = 14;
  id->id.route.path_rec = &id->path;
  id->id.route.num_paths = 1;
}

/// A port from the range Linux gives out by default (32768..60999).
std::uint16_t ephemeral_port() {
  static thread_local std::mt19937 rng(std::random_device{}());
  return static_cast<std::uint16_t>(32768 + rng() % 28232);
}

}  // namespace

extern "C" {

// ------------------------------------------------------------ channels

rdma_event_channel* rdma_create_event_channel(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (const int err = init_locked()) return fail_null<rdma_event_channel>(err);
  Channel* ch = new_channel_locked(false);
  return ch ? &ch->ch : nullptr;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (!channel) return;
  std::lock_guard<std::mutex> lock(g_mu);
  free_channel_locked(reinterpret_cast<Channel*>(channel));
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return fail(EINVAL);
  auto* ch = reinterpret_cast<Channel*>(channel);
  Event* e = nullptr;
  if (next_event(ch, !nonblocking(ch), &e) != 0) return -1;
  *event = &e->e;
  return 0;
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail(EINVAL);
  delete reinterpret_cast<Event*>(event);
  return 0;
}

const char* rdma_event_str(rdma_cm_event_type event) {
  static const char* const names[] = {
      "RDMA_CM_EVENT_ADDR_RESOLVED",    "RDMA_CM_EVENT_ADDR_ERROR",       "RDMA_CM_EVENT_ROUTE_RESOLVED",
      "RDMA_CM_EVENT_ROUTE_ERROR",      "RDMA_CM_EVENT_CONNECT_REQUEST",  "RDMA_CM_EVENT_CONNECT_RESPONSE",
      "RDMA_CM_EVENT_CONNECT_ERROR",    "RDMA_CM_EVENT_UNREACHABLE",      "RDMA_CM_EVENT_REJECTED",
      "RDMA_CM_EVENT_ESTABLISHED",      "RDMA_CM_EVENT_DISCONNECTED",     "RDMA_CM_EVENT_DEVICE_REMOVAL",
      "RDMA_CM_EVENT_MULTICAST_JOIN",   "RDMA_CM_EVENT_MULTICAST_ERROR",  "RDMA_CM_EVENT_ADDR_CHANGE",
      "RDMA_CM_EVENT_TIMEWAIT_EXIT"};
  const auto i = static_cast<unsigned>(event);
  return i < sizeof names / sizeof names[0] ? names[i] : "UNKNOWN EVENT";
}

// ------------------------------------------------------------ ids

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps) {
  if (!out) return fail(EINVAL);
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_IB && ps != RDMA_PS_UDP) return fail(EOPNOTSUPP);  // IPoIB's is not ours
  std::lock_guard<std::mutex> lock(g_mu);
  if (const int err = init_locked()) return fail(err);
  auto* id = new Id;
  if (channel) {
    id->chan = reinterpret_cast<Channel*>(channel);
  } else {
    id->sync = true;
    id->chan = new_channel_locked(true);
    if (!id->chan) {
      const int e = errno;
      delete id;
      return fail(e);
    }
  }
  id->id.channel = &id->chan->ch;
  id->id.context = context;
  id->id.ps = ps;
  id->id.qp_type = ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
  *out = &id->id;
  return 0;
}

int rdma_destroy_id(rdma_cm_id* cm_id) {
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  std::lock_guard<std::mutex> lock(g_mu);
  if (id->listening) unlisten_locked(id);
  if (id->has_conn && !id->disconnected) {
    // Closing a connected id closes the connection (the peer gets a DREQ),
    // or refuses a request never answered.
    if (id->established) (void)uroce_cm_disconnect(id->dev->u, id->conn);
    else if (!id->id.qp) (void)uroce_cm_reject(id->dev->u, id->conn, nullptr, 0);
  }
  for (auto it = g_conns.begin(); it != g_conns.end();)
    it = it->second == id ? g_conns.erase(it) : std::next(it);
  // Events not yet taken that name this id go with it; a request to a
  // listener that is going away is refused, and its id freed.
  for (Channel* ch : g_chans) {
    for (auto it = ch->queue.begin(); it != ch->queue.end();) {
      Event* e = *it;
      if (e->e.id == cm_id) {
        delete e;
        it = ch->queue.erase(it);
      } else if (e->e.listen_id == cm_id) {
        Id* child = as_id(e->e.id);
        (void)uroce_cm_reject(child->dev->u, child->conn, nullptr, 0);
        g_conns.erase({child->dev, child->conn});
        delete child;
        delete e;
        it = ch->queue.erase(it);
      } else {
        ++it;
      }
    }
  }
  free_sync_event(id);
  if (id->sync) free_channel_locked(id->chan);
  delete id;
  return 0;
}

int rdma_migrate_id(rdma_cm_id* cm_id, rdma_event_channel* channel) {
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  std::lock_guard<std::mutex> lock(g_mu);
  Channel* to = channel ? reinterpret_cast<Channel*>(channel) : new_channel_locked(true);
  if (!to) return -1;
  // Its events not yet taken move along.
  Channel* from = id->chan;
  for (auto it = from->queue.begin(); it != from->queue.end();) {
    if ((*it)->e.id == cm_id) {
      enqueue(to, *it);
      it = from->queue.erase(it);
    } else {
      ++it;
    }
  }
  if (id->sync) free_channel_locked(from);
  id->chan = to;
  id->sync = channel == nullptr;
  id->id.channel = &to->ch;
  return 0;
}

int rdma_bind_addr(rdma_cm_id* cm_id, sockaddr* addr) {
  if (!cm_id || !addr) return fail(EINVAL);
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return fail(EAFNOSUPPORT);
  Id* id = as_id(cm_id);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!is_any(addr) && !is_loopback(addr)) {
    Dev* d = dev_with_ip(addr);
    if (!d) return fail(ENODEV);  // no uroce device has that address
    attach(id, d);
  }
  std::memcpy(&id->id.route.addr.src_storage, addr, addr_len(addr));
  // Port 0: an ephemeral port now, as the kernel gives one at bind, so that
  // rdma_get_src_port() names the port before rdma_listen (qperf sends it
  // to its client in between).
  id->any_port = port_of(addr) == 0;
  if (id->any_port) set_port(&id->id.route.addr.src_addr, htons(ephemeral_port()));
  return 0;
}

int rdma_resolve_addr(rdma_cm_id* cm_id, sockaddr* src, sockaddr* dst, int timeout_ms) {
  (void)timeout_ms;  // the daemon gives up on ARP/ND after 3 s
  if (!cm_id || !dst) return fail(EINVAL);
  if (dst->sa_family != AF_INET && dst->sa_family != AF_INET6) return fail(EAFNOSUPPORT);
  Id* id = as_id(cm_id);
  Dev* d = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (src && src->sa_family != AF_UNSPEC && !is_any(src) && !is_loopback(src)) {
      d = dev_with_ip(src);
      if (!d) return fail(ENODEV);
    }
    if (!d) d = id->dev ? id->dev : dev_for(dst);
    if (!d) return fail(ENODEV);
    attach(id, d);
    const std::uint16_t port = port_of(&id->id.route.addr.src_addr);
    sockaddr_of(d->gid, port, id->id.route.addr.src_storage);
    std::memcpy(&id->id.route.addr.dst_storage, dst, addr_len(dst));
    gid_of(dst, id->id.route.addr.addr.ibaddr.dgid);
    if (is_loopback(dst)) id->id.route.addr.addr.ibaddr.dgid = d->gid;  // this device itself
  }
  // The peer's MAC, as the kernel resolves it here: an address handle to
  // it (the daemon's ARP/ND), made and dropped.
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.grh.dgid = id->id.route.addr.addr.ibaddr.dgid;
  ah.grh.hop_limit = 64;
  ah.port_num = 1;
  ibv_ah* h = ibv_create_ah(d->pd, &ah);
  const int err = h ? 0 : (errno ? errno : EHOSTUNREACH);
  if (h) ibv_destroy_ah(h);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    enqueue(id->chan, make_event(id, err ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED, -err));
  }
  return id->sync ? sync_wait(id, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}

int rdma_resolve_route(rdma_cm_id* cm_id, int timeout_ms) {
  (void)timeout_ms;
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!id->dev) return fail(EINVAL);  // resolve the address first
    fill_path(id);
    enqueue(id->chan, make_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
  }
  return id->sync ? sync_wait(id, RDMA_CM_EVENT_ROUTE_RESOLVED) : 0;
}

int rdma_listen(rdma_cm_id* cm_id, int backlog) {
  (void)backlog;
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  std::lock_guard<std::mutex> lock(g_mu);
  if (id->listening) return 0;
  sockaddr* src = &id->id.route.addr.src_addr;
  if (src->sa_family == AF_UNSPEC) src->sa_family = AF_INET;  // never bound: any address
  std::vector<Dev*> devs = id->dev ? std::vector<Dev*>{id->dev} : g_devs;
  std::uint16_t port = ntohs(port_of(src));
  for (int attempt = 0; attempt < 64; ++attempt) {
    // A port picked at bind is tried first; if it is taken, another.
    const std::uint16_t p = port && (!id->any_port || attempt == 0) ? port : ephemeral_port();
    int rc = 0;
    std::vector<Dev*> done;
    for (Dev* d : devs) {
      rc = is_ud(&id->id) ? uroce_cm_listen_ud(d->u, p) : uroce_cm_listen(d->u, p);
      if (rc) break;
      done.push_back(d);
    }
    if (rc == 0) {
      id->listening = true;
      id->listen_port = p;
      id->listen_devs = devs;
      for (Dev* d : devs) g_listens[{d, listen_key(p, is_ud(&id->id))}] = id;
      set_port(src, htons(p));
      return 0;
    }
    for (Dev* d : done) (void)(is_ud(&id->id) ? uroce_cm_unlisten_ud(d->u, p) : uroce_cm_unlisten(d->u, p));
    if ((port && !id->any_port) || rc != EADDRINUSE) return cm_error(rc);
  }
  return fail(EADDRINUSE);
}

/// The QP a connect or accept is for: the id's own (rdma_create_qp), or
/// the application's, named by conn_param's qp_num (then *app is set).
ibv_qp* conn_qp(Id* id, const rdma_conn_param* c, bool& app) {
  app = false;
  if (id->id.qp) return id->id.qp;
  if (!c || !id->id.verbs) return nullptr;
  app = true;
  return uroce_ibv_qp_by_num(id->id.verbs, c->qp_num);
}

int rdma_connect(rdma_cm_id* cm_id, rdma_conn_param* conn_param) {
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  bool app = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!id->dev) return fail(EINVAL);  // resolve first
    ibv_qp* qp = conn_qp(id, conn_param, app);
    if (!qp) return fail(EINVAL);  // rdma_create_qp first, or name a QP of this device in qp_num
    if (conn_param && conn_param->private_data_len > kPrivateMax) return fail(EINVAL);
    uroce_cm_param p = cm_param(id, conn_param);
    if (app) p.flags |= UROCE_CM_APP_QP;
    std::uint32_t conn = 0;
    const int rc = uroce_cm_connect(uroce_ibv_qp(qp), &id->id.route.addr.addr.ibaddr.dgid,
                                    ntohs(port_of(&id->id.route.addr.dst_addr)), &p, &conn);
    if (rc) return cm_error(rc);
    id->conn = conn;
    id->has_conn = true;
    id->app_qp = app;
    id->have_attrs = false;
    id->established = id->disconnected = false;
    g_conns[{id->dev, conn}] = id;
  }
  // Without a QP of its own the id's answer is the REP: the application
  // brings its QP up and says rdma_establish.
  return id->sync ? sync_wait(id, app ? RDMA_CM_EVENT_CONNECT_RESPONSE : RDMA_CM_EVENT_ESTABLISHED) : 0;
}

int rdma_accept(rdma_cm_id* cm_id, rdma_conn_param* conn_param) {
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (id->listening || !id->has_conn) return fail(EINVAL);
    bool app = false;
    ibv_qp* qp = conn_qp(id, conn_param, app);
    if (!qp) return fail(EINVAL);
    if (conn_param && conn_param->private_data_len > kPrivateMax) return fail(EINVAL);
    uroce_cm_param p = cm_param(id, conn_param);
    if (app) p.flags |= UROCE_CM_APP_QP;
    if (const int rc = uroce_cm_accept(uroce_ibv_qp(qp), id->conn, &p)) return cm_error(rc);
    id->app_qp = app;
    if (is_ud(&id->id)) {
      // A SIDR answer ends the exchange: no event follows.
      g_conns.erase({id->dev, id->conn});
      id->has_conn = false;
      return 0;
    }
  }
  return id->sync ? sync_wait(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

int rdma_reject(rdma_cm_id* cm_id, const void* private_data, uint8_t private_data_len) {
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!id->has_conn) return fail(EINVAL);
  if (const int rc = uroce_cm_reject(id->dev->u, id->conn, private_data, private_data_len)) return cm_error(rc);
  g_conns.erase({id->dev, id->conn});
  id->has_conn = false;
  return 0;
}

int rdma_disconnect(rdma_cm_id* cm_id) {
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!id->has_conn) return fail(EINVAL);
  const int rc = uroce_cm_disconnect(id->dev->u, id->conn);
  // EINVAL: the agent has no such connection any more, as the peer's DREQ
  // ended it (its DISCONNECTED event may not have reached this id yet):
  // nothing more to do, and not an error, as the kernel's rdma_cm does not
  // report a DREQ it could not send.
  if (rc && rc != EINVAL && !id->disconnected) return cm_error(rc);
  return 0;
}

int rdma_establish(rdma_cm_id* cm_id) {
  if (!cm_id) return fail(EINVAL);
  Id* id = as_id(cm_id);
  std::lock_guard<std::mutex> lock(g_mu);
  // With a QP of rdma_cm's the agent sent the RTU itself once it was at RTS.
  if (!id->app_qp) return 0;
  if (!id->has_conn) return fail(EINVAL);
  if (const int rc = uroce_cm_establish(id->dev->u, id->conn)) return cm_error(rc);
  id->established = true;
  return 0;
}

int rdma_notify(rdma_cm_id* cm_id, ibv_event_type event) {
  (void)event;
  return cm_id ? 0 : fail(EINVAL);
}

int rdma_init_qp_attr(rdma_cm_id* cm_id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!cm_id || !qp_attr || !qp_attr_mask) return fail(EINVAL);
  const ibv_qp_state want = qp_attr->qp_state;
  if (want == IBV_QPS_INIT && is_ud(cm_id)) {
    *qp_attr = ibv_qp_attr{};
    qp_attr->qp_state = IBV_QPS_INIT;
    qp_attr->port_num = 1;
    qp_attr->qkey = RDMA_UDP_QKEY;
    *qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    return 0;
  }
  if (want == IBV_QPS_INIT) {
    *qp_attr = ibv_qp_attr{};
    qp_attr->qp_state = IBV_QPS_INIT;
    qp_attr->port_num = 1;
    qp_attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    *qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    return 0;
  }
  if (want != IBV_QPS_RTR && want != IBV_QPS_RTS) return fail(EINVAL);
  if (!cm_id->qp) {
    // The application's own QP: what the request's or the reply's event
    // says it is to be brought up with.
    std::lock_guard<std::mutex> lock(g_mu);
    const Id* id = as_id(cm_id);
    if (!id->have_attrs) return fail(EINVAL);  // no request or reply yet
    const uroce_cm_event& e = id->attrs;
    *qp_attr = ibv_qp_attr{};
    qp_attr->qp_state = want;
    if (want == IBV_QPS_RTR) {
      qp_attr->path_mtu = e.mtu;
      qp_attr->dest_qp_num = e.peer_qp_num;
      qp_attr->rq_psn = e.rq_psn;
      qp_attr->max_dest_rd_atomic = e.max_dest_rd_atomic;
      qp_attr->min_rnr_timer = 12;
      qp_attr->ah_attr.is_global = 1;
      qp_attr->ah_attr.grh.dgid = e.peer_gid;
      qp_attr->ah_attr.grh.sgid_index = 0;
      qp_attr->ah_attr.grh.hop_limit = 64;
      qp_attr->ah_attr.port_num = 1;
      *qp_attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    } else {
      qp_attr->timeout = id->ack_timeout >= 0 ? static_cast<std::uint8_t>(id->ack_timeout) : e.timeout;
      qp_attr->retry_cnt = e.retry_count;
      qp_attr->rnr_retry = e.rnr_retry_count;
      qp_attr->sq_psn = e.sq_psn;
      qp_attr->max_rd_atomic = e.max_rd_atomic;
      *qp_attr_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                      IBV_QP_MAX_QP_RD_ATOMIC;
    }
    return 0;
  }
  // The agent takes the QP rdma_create_qp made to RTR and RTS: what it set
  // is what to report.
  ibv_qp_init_attr init{};
  if (const int rc = ibv_query_qp(cm_id->qp, qp_attr, ~0, &init)) return fail(rc);
  qp_attr->qp_state = want;
  *qp_attr_mask = want == IBV_QPS_RTR ? IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER
                                      : IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  return 0;
}

int rdma_set_option(rdma_cm_id* cm_id, int level, int optname, void* optval, size_t optlen) {
  if (!cm_id || !optval) return fail(EINVAL);
  if (level != RDMA_OPTION_ID) return fail(EOPNOTSUPP);
  switch (optname) {
    case RDMA_OPTION_ID_REUSEADDR:
    case RDMA_OPTION_ID_AFONLY:
      // Ports are the agent's, per daemon, free again as soon as the listen
      // ends; and an id's family is what it was bound or resolved with.
      return optlen == sizeof(int) ? 0 : fail(EINVAL);
    case RDMA_OPTION_ID_ACK_TIMEOUT: {
      // The QP's local ACK timeout (4.096 us * 2^n), for the connection
      // this id makes or accepts from now on (and rdma_init_qp_attr's RTS).
      if (optlen != sizeof(std::uint8_t)) return fail(EINVAL);
      const std::uint8_t t = *static_cast<std::uint8_t*>(optval);
      if (t > 31) return fail(EINVAL);
      std::lock_guard<std::mutex> lock(g_mu);
      as_id(cm_id)->ack_timeout = t;
      return 0;
    }
    case RDMA_OPTION_ID_TOS:
      // The CM does not carry a traffic class yet: only the default.
      if (optlen != sizeof(std::uint8_t)) return fail(EINVAL);
      return *static_cast<std::uint8_t*>(optval) == 0 ? 0 : fail(EOPNOTSUPP);
    default:
      return fail(EOPNOTSUPP);
  }
}

uint16_t rdma_get_src_port(rdma_cm_id* cm_id) { return cm_id ? port_of(&cm_id->route.addr.src_addr) : 0; }
uint16_t rdma_get_dst_port(rdma_cm_id* cm_id) { return cm_id ? port_of(&cm_id->route.addr.dst_addr) : 0; }

ibv_context** rdma_get_devices(int* num_devices) {
  std::lock_guard<std::mutex> lock(g_mu);
  (void)init_locked();
  auto** list = static_cast<ibv_context**>(std::calloc(g_devs.size() + 1, sizeof(ibv_context*)));
  if (!list) return fail_null<ibv_context*>(ENOMEM);
  for (std::size_t i = 0; i < g_devs.size(); ++i) list[i] = g_devs[i]->verbs;
  if (num_devices) *num_devices = static_cast<int>(g_devs.size());
  return list;
}

void rdma_free_devices(ibv_context** list) { std::free(list); }

// ------------------------------------------------------------ QPs and SRQs

int rdma_create_qp(rdma_cm_id* cm_id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!cm_id || !qp_init_attr) return fail(EINVAL);
  ibv_qp_init_attr_ex a{};
  std::memcpy(&a, qp_init_attr, sizeof *qp_init_attr);  // ibv_qp_init_attr is its prefix
  a.comp_mask = pd ? IBV_QP_INIT_ATTR_PD : 0;
  a.pd = pd;
  if (create_qp(as_id(cm_id), a) != 0) return -1;
  qp_init_attr->send_cq = a.send_cq;
  qp_init_attr->recv_cq = a.recv_cq;
  qp_init_attr->cap = a.cap;
  return 0;
}

int rdma_create_qp_ex(rdma_cm_id* cm_id, ibv_qp_init_attr_ex* qp_init_attr) {
  if (!cm_id || !qp_init_attr) return fail(EINVAL);
  return create_qp(as_id(cm_id), *qp_init_attr);
}

void rdma_destroy_qp(rdma_cm_id* cm_id) {
  if (!cm_id || !cm_id->qp) return;
  ibv_destroy_qp(cm_id->qp);
  cm_id->qp = nullptr;
  destroy_own_cqs(as_id(cm_id));
}

int rdma_create_srq(rdma_cm_id* cm_id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!cm_id || !attr || !cm_id->verbs) return fail(EINVAL);
  ibv_srq* srq = ibv_create_srq(pd ? pd : as_id(cm_id)->dev->pd, attr);
  if (!srq) return -1;
  cm_id->srq = srq;
  return 0;
}

int rdma_create_srq_ex(rdma_cm_id* cm_id, ibv_srq_init_attr_ex* attr) {
  if (!cm_id || !attr) return fail(EINVAL);
  if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC) return fail(EOPNOTSUPP);
  ibv_srq_init_attr base{};
  base.srq_context = attr->srq_context;
  base.attr = attr->attr;
  return rdma_create_srq(cm_id, (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? attr->pd : nullptr, &base);
}

void rdma_destroy_srq(rdma_cm_id* cm_id) {
  if (!cm_id || !cm_id->srq) return;
  ibv_destroy_srq(cm_id->srq);
  cm_id->srq = nullptr;
}

// ------------------------------------------------------------ the synchronous calls

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** out) {
  if (!listen || !out) return fail(EINVAL);
  Id* l = as_id(listen);
  if (!l->sync || !l->listening) return fail(EINVAL);
  for (;;) {
    Event* e = nullptr;
    if (next_event(l->chan, true, &e) != 0) return -1;
    if (e->e.event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      delete e;  // nothing else is meant for a listener
      continue;
    }
    rdma_cm_id* cid = e->e.id;
    Id* child = as_id(cid);
    if (rdma_migrate_id(cid, nullptr) != 0) {
      delete e;
      return -1;
    }
    child->sync_event = e;
    cid->event = &e->e;
    if (l->ep_qp) {
      ibv_qp_init_attr a = l->ep_attr;
      if (rdma_create_qp(cid, l->ep_pd, &a) != 0) {
        const int err = errno;
        (void)rdma_reject(cid, nullptr, 0);
        (void)rdma_destroy_id(cid);
        return fail(err);
      }
    }
    *out = cid;
    return 0;
  }
}

int rdma_create_ep(rdma_cm_id** out, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!out || !res) return fail(EINVAL);
  rdma_cm_id* cid = nullptr;
  if (rdma_create_id(nullptr, &cid, nullptr, static_cast<rdma_port_space>(res->ai_port_space)) != 0) return -1;
  Id* id = as_id(cid);
  int rc;
  // The QP is of the type the address info names (librdmacm sets it in the
  // caller's attributes: rdmacm-utils' rdma_client leaves it 0).
  if (qp_init_attr) qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
  if (res->ai_flags & RAI_PASSIVE) {
    rc = res->ai_src_addr ? rdma_bind_addr(cid, res->ai_src_addr) : 0;
    if (rc == 0 && qp_init_attr) {
      id->ep_qp = true;
      id->ep_attr = *qp_init_attr;
      id->ep_pd = pd;
    }
  } else {
    rc = rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (rc == 0) rc = rdma_resolve_route(cid, 2000);
    if (rc == 0 && qp_init_attr) rc = rdma_create_qp(cid, pd, qp_init_attr);
  }
  if (rc != 0) {
    const int err = errno;
    rdma_destroy_id(cid);
    return fail(err);
  }
  *out = cid;
  return 0;
}

void rdma_destroy_ep(rdma_cm_id* cm_id) {
  if (!cm_id) return;
  rdma_destroy_qp(cm_id);
  rdma_destroy_srq(cm_id);
  rdma_destroy_id(cm_id);
}

// ------------------------------------------------------------ addresses

namespace {
/// The QP type an rdma_addrinfo names: the hints' (an XRC program asks for
/// IBV_QPT_XRC_SEND), else the port space's (UD for RDMA_PS_UDP, else RC).
int qp_type_for(const rdma_addrinfo* hints, int port_space) {
  if (hints && hints->ai_qp_type) return hints->ai_qp_type;
  return port_space == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
}
}  // namespace

int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
  if (!res) return fail(EINVAL);
  const int flags = hints ? hints->ai_flags : 0;
  if (hints && (hints->ai_family == AF_IB || (hints->ai_port_space && hints->ai_port_space != RDMA_PS_TCP &&
                                              hints->ai_port_space != RDMA_PS_IB &&
                                              hints->ai_port_space != RDMA_PS_UDP)))
    return fail(EOPNOTSUPP);
  if (!node && !service) {
    // No name: the addresses the hints carry, as they are (libfabric's verbs
    // provider asks so, with a source and a destination it already has).
    const bool src = hints && hints->ai_src_addr && hints->ai_src_len;
    const bool dst = hints && hints->ai_dst_addr && hints->ai_dst_len;
    if (!src && !dst) return fail(EINVAL);
    auto* r = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
    if (!r) return fail(ENOMEM);
    r->ai_flags = flags;
    r->ai_family = (dst ? hints->ai_dst_addr : hints->ai_src_addr)->sa_family;
    r->ai_port_space = hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
    r->ai_qp_type = qp_type_for(hints, r->ai_port_space);
    const auto copy = [](const sockaddr* a, socklen_t len, sockaddr*& to, socklen_t& to_len) {
      to = static_cast<sockaddr*>(std::malloc(len));
      if (!to) return false;
      std::memcpy(to, a, len);
      to_len = len;
      return true;
    };
    if ((src && !copy(hints->ai_src_addr, hints->ai_src_len, r->ai_src_addr, r->ai_src_len)) ||
        (dst && !copy(hints->ai_dst_addr, hints->ai_dst_len, r->ai_dst_addr, r->ai_dst_len))) {
      rdma_freeaddrinfo(r);
      return fail(ENOMEM);
    }
    *res = r;
    return 0;
  }
  addrinfo h{};
  h.ai_family = hints && (flags & RAI_FAMILY) ? hints->ai_family : AF_UNSPEC;
  h.ai_socktype = SOCK_STREAM;
  h.ai_flags = ((flags & RAI_PASSIVE) ? AI_PASSIVE : 0) | ((flags & RAI_NUMERICHOST) ? AI_NUMERICHOST : 0);
  addrinfo* ai = nullptr;
  if (const int rc = ::getaddrinfo(node, service, &h, &ai)) return rc;
  // An IPv4 address first: that is what a uroce port usually has.
  addrinfo* pick = ai;
  for (addrinfo* p = ai; p; p = p->ai_next)
    if (p->ai_family == AF_INET) {
      pick = p;
      break;
    }
  auto* r = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  auto* addr = static_cast<sockaddr*>(std::malloc(pick->ai_addrlen));
  if (!r || !addr) {
    std::free(r);
    std::free(addr);
    ::freeaddrinfo(ai);
    return fail(ENOMEM);
  }
  std::memcpy(addr, pick->ai_addr, pick->ai_addrlen);
  r->ai_flags = flags;
  r->ai_family = pick->ai_family;
  r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
  r->ai_qp_type = qp_type_for(hints, r->ai_port_space);
  if (flags & RAI_PASSIVE) {
    r->ai_src_addr = addr;
    r->ai_src_len = pick->ai_addrlen;
  } else {
    r->ai_dst_addr = addr;
    r->ai_dst_len = pick->ai_addrlen;
    if (hints && hints->ai_src_addr && hints->ai_src_len) {
      r->ai_src_addr = static_cast<sockaddr*>(std::malloc(hints->ai_src_len));
      if (r->ai_src_addr) {
        std::memcpy(r->ai_src_addr, hints->ai_src_addr, hints->ai_src_len);
        r->ai_src_len = hints->ai_src_len;
      }
    }
  }
  ::freeaddrinfo(ai);
  *res = r;
  return 0;
}

void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_route);
    std::free(res->ai_connect);
    std::free(res);
    res = next;
  }
}

// ------------------------------------------------------------ refused

// Multicast on RoCE: no subnet manager to ask, so a join attaches the id's
// UD QP (if it has one yet) to the group's GID and reports
// MULTICAST_JOIN at once with what a sender needs: the group's address,
// QPN 0xFFFFFF, and the UDP port space's Q_Key.
static bool group_gid(const sockaddr* addr, ibv_gid& gid) {
  if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) return false;
  gid_of(addr, gid);
  const bool v4 = addr->sa_family == AF_INET;
  return v4 ? (gid.raw[12] & 0xf0) == 0xe0 : gid.raw[0] == 0xff;
}
int rdma_join_multicast_ex(rdma_cm_id* cm_id, rdma_cm_join_mc_attr_ex* attr, void* context) {
  if (!cm_id || !attr || !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS)) return fail(EINVAL);
  if ((attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) &&
      attr->join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER && attr->join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
    return fail(EINVAL);
  const bool send_only = (attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) &&
                         attr->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
  ibv_gid mgid{};
  if (!group_gid(attr->addr, mgid)) return fail(EINVAL);  // not a multicast address
  Id* id = as_id(cm_id);
  if (!id->dev) return fail(ENODEV);  // bound or resolved to a device first
  if (cm_id->qp && !send_only && ibv_attach_mcast(cm_id->qp, &mgid, 0) != 0) return -1;
  Event* e = make_event(id, RDMA_CM_EVENT_MULTICAST_JOIN, 0);
  rdma_ud_param& u = e->e.param.ud;
  u.private_data = context;
  u.ah_attr.is_global = 1;
  u.ah_attr.grh.dgid = mgid;
  u.ah_attr.grh.hop_limit = 1;
  u.ah_attr.port_num = 1;
  u.qp_num = 0xFFFFFF;
  u.qkey = RDMA_UDP_QKEY;
  std::lock_guard<std::mutex> lock(g_mu);
  enqueue(id->chan, e);
  return 0;
}
int rdma_join_multicast(rdma_cm_id* cm_id, sockaddr* addr, void* context) {
  rdma_cm_join_mc_attr_ex a{};
  a.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
  a.addr = addr;
  return rdma_join_multicast_ex(cm_id, &a, context);
}
int rdma_leave_multicast(rdma_cm_id* cm_id, sockaddr* addr) {
  ibv_gid mgid{};
  if (!cm_id || !group_gid(addr, mgid)) return fail(EINVAL);
  if (cm_id->qp && ibv_detach_mcast(cm_id->qp, &mgid, 0) != 0) return fail(EADDRNOTAVAIL);  // not joined
  return 0;
}
int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) { return fail(EOPNOTSUPP); }
int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) { return fail(EOPNOTSUPP); }
int rdma_reject_ece(rdma_cm_id*, const void*, uint8_t) { return fail(EOPNOTSUPP); }

}  // extern "C"
