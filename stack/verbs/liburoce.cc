// liburoce: the application side of the session protocol and the shared
// rings. See uroce_verbs.h for the API and stack/abi for the contract.
// This file: the verbs objects (PDs, memory windows, completion channels,
// CQs, QPs, SRQs, XRC domains, address handles, flow rules, multicast)
// from creation to destruction, and the queries. README.md lists the
// other files.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "stack/abi/qp_attr.h"
#include "stack/abi/session_proto.h"
#include "stack/verbs/liburoce_internal.h"

namespace {
namespace abi = uroce::abi;
using uroce::verbs_detail::call;
using uroce::verbs_detail::set_error;

/// Maps the memfd of a ring the daemon made; false (errno set) on failure.
bool map_fd(int fd, void*& map, std::size_t& len, const char* what) {
  if (fd < 0) return set_error(EPROTO, std::string("no ") + what + " from uroced"), false;
  const off_t end = ::lseek(fd, 0, SEEK_END);
  map = end > 0 ? ::mmap(nullptr, static_cast<std::size_t>(end), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  ::close(fd);
  if (map == MAP_FAILED) return set_error(errno ? errno : EPROTO, std::string("cannot map the ") + what), false;
  len = static_cast<std::size_t>(end);
  return true;
}

}  // namespace

extern "C" {

int uroce_query_gid(uroce_context* ctx, std::uint8_t port_num, int index, ibv_gid* gid) {
  if (!ctx || !gid || port_num != 1 || index < 0 || index >= UROCE_GID_TABLE_LEN)
    return set_error(EINVAL, "port 1, a GID index under the table's length");
  if (index == 0) {
    std::memcpy(gid->raw, ctx->gid, 16);
  } else {
    *gid = ibv_gid{};  // an empty entry, as the kernel reads one
  }
  return 0;
}

uroce_pd* uroce_alloc_pd(uroce_context* ctx) {
  uroce_handle_reply r{};
  if (!ctx || call(ctx, UROCE_MSG_ALLOC_PD, nullptr, 0, -1, &r, sizeof r) != 0) return nullptr;
  return new uroce_pd{ctx, r.handle};
}

int uroce_dealloc_pd(uroce_pd* pd) {
  if (!pd) return set_error(EINVAL, "no PD");
  uroce_destroy_msg d{UROCE_OBJ_PD, pd->handle};
  const int rc = call(pd->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) delete pd;
  return rc;
}

int uroce_destroy_cq(uroce_cq* cq) {
  if (!cq) return set_error(EINVAL, "no CQ");
  uroce_destroy_msg d{UROCE_OBJ_CQ, cq->handle};
  const int rc = call(cq->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) {
    if (cq->channel) std::erase(cq->channel->cqs, cq);
    cq->ctx->cqs.erase(cq->handle);
    ::munmap(cq->map, cq->map_len);
    delete cq;
  }
  return rc;
}

int uroce_query_device(uroce_context* ctx, ibv_device_attr* attr) {
  if (!ctx || !attr) return set_error(EINVAL, "no context or attr");
  uroce_query_msg q{UROCE_OBJ_DEVICE, 0};
  uroce_device_attr r{};
  // A daemon before minor 18 answers 48 bytes (no SRQ bounds: 0).
  const std::size_t rlen = ctx->minor >= 18 ? sizeof r : offsetof(uroce_device_attr, max_srq);
  if (int rc = call(ctx, UROCE_MSG_QUERY, &q, sizeof q, -1, &r, rlen)) return rc;
  ctx->dev_flags = ctx->minor >= 16 ? r.flags : 0;
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "uroce abi %u.%u", UROCE_ABI_MAJOR, UROCE_ABI_MINOR);
  std::uint64_t guid = 0;  // EUI-64 from the MAC, as RoCE devices do
  const std::uint8_t eui[8] = {static_cast<std::uint8_t>(r.mac[0] ^ 2), r.mac[1], r.mac[2], 0xff, 0xfe,
                               r.mac[3], r.mac[4], r.mac[5]};
  std::memcpy(&guid, eui, 8);
  attr->node_guid = attr->sys_image_guid = guid;
  attr->max_mr_size = r.max_mr_size;
  attr->max_qp = static_cast<int>(r.max_qp);
  attr->max_qp_wr = static_cast<int>(r.max_qp_wr);
  attr->max_sge = static_cast<int>(r.max_sge);
  attr->max_cq = static_cast<int>(r.max_cq);
  attr->max_cqe = static_cast<int>(r.max_cqe);
  attr->max_mr = static_cast<int>(r.max_mr);
  attr->max_pd = static_cast<int>(r.max_pd);
  attr->max_qp_rd_atom = attr->max_qp_init_rd_atom = static_cast<int>(r.max_qp_rd_atom);
  attr->max_srq = static_cast<int>(r.max_srq);
  attr->max_srq_wr = static_cast<int>(r.max_srq_wr);
  attr->max_srq_sge = r.max_srq ? UROCE_ABI_MAX_SGE : 0;
  attr->atomic_cap = IBV_ATOMIC_HCA;
  // Memory windows (minor 8) share the MRs' key table and limit.
  attr->device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  attr->max_mw = attr->max_mr;
  if (ctx->minor >= 17) attr->device_cap_flags |= IBV_DEVICE_XRC;  // XRC domains, SRQs and QPs
  attr->phys_port_cnt = 1;
  attr->max_pkeys = 1;
  // MRs and MWs take any byte range: every power-of-two page size from 4 KiB
  // up is one uroce can map (rxe says the same).
  attr->page_size_cap = ~std::uint64_t{0xfff};
  // Multicast (minor 15): a UD QP joins groups; the daemon's default
  // --max-mcast-per-uid (64) bounds a user's attachments.
  if (ctx->minor >= 15) attr->max_mcast_grp = attr->max_mcast_qp_attach = attr->max_total_mcast_qp_attach = 64;
  return 0;
}

int uroce_mcast(uroce_qp* qp, const ibv_gid* gid, int attach) {
  if (!qp || !gid) return set_error(EINVAL, "no QP or GID");
  if (qp->ctx->minor < 15) return set_error(EOPNOTSUPP, "this uroced has no multicast");
  uroce_mcast_msg m{qp->handle, attach ? 1u : 0u, {}};
  std::memcpy(m.gid, gid->raw, 16);
  return call(qp->ctx, UROCE_MSG_MCAST, &m, sizeof m, -1, nullptr, 0);
}

int uroce_query_port(uroce_context* ctx, uint8_t port_num, ibv_port_attr* attr) {
  if (!ctx || !attr) return set_error(EINVAL, "no context or attr");
  if (port_num != 1) return set_error(EINVAL, "uroced serves one port: port_num must be 1");
  // The link as the daemon's driver reports it (minor 7); an older daemon
  // does not say: up, speed unknown.
  uroce_query_msg q{UROCE_OBJ_PORT, 0};
  uroce_port_attr pa{IBV_PORT_ACTIVE, 0, 0};
  if (call(ctx, UROCE_MSG_QUERY, &q, sizeof q, -1, &pa, sizeof pa) != 0) pa = {IBV_PORT_ACTIVE, 0, 0};
  *attr = ibv_port_attr{};
  attr->state = static_cast<ibv_port_state>(pa.state);
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = abi::roce_active_mtu(pa.mtu);  // as Linux sizes a RoCE port's
  attr->gid_tbl_len = UROCE_GID_TABLE_LEN;
  attr->pkey_tbl_len = 1;
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  attr->phys_state = pa.state == IBV_PORT_ACTIVE ? 5 : 3;  // LinkUp, or Disabled
  attr->max_msg_sz = 1u << 31;  // the largest RDMA message (IBTA: 2^31 bytes)
  attr->max_vl_num = 1;         // VL0 only
  // The Ethernet speed as IB widths and lane speeds, as Linux reports a
  // RoCE port's (ib_get_eth_speed): 1X/4X of SDR 2.5, DDR 5, FDR10 10,
  // EDR 25, HDR 50 or NDR 100 Gb/s lanes. Unknown counts as the slowest.
  struct Rate {
    std::uint32_t up_to_mbps;
    std::uint8_t width, speed;
  };
  static constexpr Rate kRates[] = {{2500, 1, 1},   {5000, 1, 2},   {10000, 1, 8},   {20000, 2, 2},
                                    {25000, 1, 32}, {40000, 2, 8},  {50000, 1, 64},  {100000, 2, 32},
                                    {200000, 2, 64}, {400000, 2, 128}};
  attr->active_width = 2;
  attr->active_speed = 128;  // beyond 400 Gb/s: NDR 4X
  for (const Rate& r : kRates)
    if (pa.speed_mbps <= r.up_to_mbps) {
      attr->active_width = r.width;
      attr->active_speed = r.speed;
      break;
    }
  return 0;
}

int uroce_query_qp(uroce_qp* qp, ibv_qp_attr* attr, int attr_mask, uroce_qp_init_attr* init_attr) {
  (void)attr_mask;  // everything is returned, as most providers do
  if (!qp || !attr) return set_error(EINVAL, "no QP or attr");
  uroce_query_msg q{UROCE_OBJ_QP, qp->handle};
  uroce_modify_qp_msg r{};
  if (int rc = call(qp->ctx, UROCE_MSG_QUERY, &q, sizeof q, -1, &r, sizeof r)) return rc;
  int mask = 0;
  *attr = abi::from_msg(r, mask);
  attr->cur_qp_state = attr->qp_state;
  attr->cap.max_send_wr = qp->init.cap.max_send_wr;
  attr->cap.max_recv_wr = qp->init.cap.max_recv_wr;
  attr->cap.max_send_sge = qp->init.cap.max_send_sge;
  attr->cap.max_recv_sge = qp->init.cap.max_recv_sge;
  attr->cap.max_inline_data = qp->init.cap.max_inline_data;
  if (init_attr) *init_attr = qp->init;
  return 0;
}

uroce_mw* uroce_alloc_mw(uroce_pd* pd, ibv_mw_type type) {
  if (!pd) return set_error(EINVAL, "no PD"), nullptr;
  uroce_alloc_mw_msg m{pd->handle, static_cast<std::uint32_t>(type)};
  uroce_alloc_mw_reply r{};
  if (call(pd->ctx, UROCE_MSG_ALLOC_MW, &m, sizeof m, -1, &r, sizeof r) != 0) return nullptr;
  return new uroce_mw{pd, r.handle, r.rkey};
}

int uroce_dealloc_mw(uroce_mw* mw) {
  if (!mw) return set_error(EINVAL, "no memory window");
  uroce_destroy_msg d{UROCE_OBJ_MW, mw->handle};
  const int rc = call(mw->pd->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) delete mw;
  return rc;
}

std::uint32_t uroce_mw_rkey(const uroce_mw* mw) { return mw->rkey; }

uroce_comp_channel* uroce_create_comp_channel(uroce_context* ctx) {
  if (!ctx) return set_error(EINVAL, "no context"), nullptr;
  // A datagram socket pair, not an eventfd: the daemon writes its end
  // with MSG_DONTWAIT, which no flag of ours can turn into a blocking write.
  // Our end stays blocking unless the application makes it non-blocking
  // (as UCX does): then uroce_get_cq_event says EAGAIN instead of waiting,
  // as rdma-core's read() on the channel does.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0)
    return set_error(errno, "cannot create the channel's socket pair"), nullptr;
  (void)::fcntl(sv[1], F_SETFL, ::fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  return new uroce_comp_channel{ctx, sv[0], sv[1], {}};
}

int uroce_destroy_comp_channel(uroce_comp_channel* ch) {
  if (!ch) return set_error(EINVAL, "no channel");
  if (!ch->cqs.empty()) return set_error(EBUSY, "CQs still use this channel");
  ::close(ch->fd);
  ::close(ch->peer);
  delete ch;
  return 0;
}

int uroce_comp_channel_fd(const uroce_comp_channel* ch) { return ch ? ch->fd : -1; }

uroce_cq* uroce_create_cq(uroce_context* ctx, int cqe, void* cq_context, uroce_comp_channel* channel,
                          int comp_vector) {
  // One daemon lcore serves the session: a single vector (num_comp_vectors 1).
  if (comp_vector != 0) return set_error(EINVAL, "comp_vector must be 0 (the device has one vector)"), nullptr;
  if (channel && channel->ctx != ctx) return set_error(EINVAL, "the channel belongs to another context"), nullptr;
  if (!ctx || cqe <= 0) return set_error(EINVAL, "cqe must be positive"), nullptr;
  uroce_create_cq_msg m{static_cast<std::uint32_t>(cqe)};
  uroce_handle_reply r{};
  int fd = -1;
  if (call(ctx, UROCE_MSG_CREATE_CQ, &m, sizeof m, channel ? channel->peer : -1, &r, sizeof r, &fd) != 0) return nullptr;
  void* map = nullptr;
  std::size_t len = 0;
  if (!map_fd(fd, map, len, "CQ ring")) return nullptr;
  auto cq = new uroce_cq{ctx, r.handle, map, len, {}};
  const auto e = uroce::abi::Ring<uroce_cq_entry>::attach(map, cq->map_len, UROCE_RING_CQ, cq->ring);
  if (e != uroce::abi::AttachError::kOk) {
    ::munmap(map, cq->map_len);
    delete cq;
    return set_error(EPROTO, uroce::abi::to_string(e)), nullptr;
  }
  cq->cq_context = cq_context;
  cq->channel = channel;
  if (channel) channel->cqs.push_back(cq);
  ctx->cqs[cq->handle] = cq;
  return cq;
}

int uroce_resize_cq(uroce_cq* cq, int cqe) {
  if (!cq || cqe <= 0) return set_error(EINVAL, "cqe must be positive");
  uroce_resize_cq_msg m{cq->handle, static_cast<std::uint32_t>(cqe)};
  uroce_handle_reply r{};
  int fd = -1;
  if (const int rc = call(cq->ctx, UROCE_MSG_RESIZE_CQ, &m, sizeof m, -1, &r, sizeof r, &fd)) return rc;
  // The daemon now fills the new ring, which holds what the old one had not
  // given out yet; the old one is only unmapped.
  void* map = nullptr;
  std::size_t len = 0;
  if (!map_fd(fd, map, len, "CQ ring")) return errno;
  uroce::abi::Ring<uroce_cq_entry> ring;
  const auto e = uroce::abi::Ring<uroce_cq_entry>::attach(map, len, UROCE_RING_CQ, ring);
  if (e != uroce::abi::AttachError::kOk) {
    ::munmap(map, len);
    return set_error(EPROTO, uroce::abi::to_string(e));
  }
  ::munmap(cq->map, cq->map_len);
  cq->map = map;
  cq->map_len = len;
  cq->ring = ring;
  return 0;
}

int uroce_cq_capacity(const uroce_cq* cq) { return cq ? static_cast<int>(cq->ring.capacity()) : 0; }

uroce_qp* uroce_create_qp(uroce_pd* pd, uroce_qp_init_attr* a) {
  if (!a) return set_error(EINVAL, "no attributes"), nullptr;
  const bool xrc = a->qp_type == IBV_QPT_XRC_SEND || a->qp_type == IBV_QPT_XRC_RECV;
  uroce_context* const ctx = pd ? pd->ctx : a->xrcd ? a->xrcd->ctx : nullptr;
  if (xrc && ctx && ctx->minor < 17) return set_error(EOPNOTSUPP, "this uroced has no XRC (ABI minor < 17)"), nullptr;
  const bool rss = a->rss_log_size != 0;
  if (rss) {
    // Receive-side scaling: a PD and a table of work queues; nothing else.
    if (!pd || a->qp_type != IBV_QPT_RAW_PACKET || a->srq || a->xrcd || !a->rss_wqs || !a->rss_key ||
        a->rss_log_size > UROCE_RSS_MAX_LOG)
      return set_error(EINVAL, "an RSS QP is a raw packet QP with a PD, a key and 2 to 64 work queues"), nullptr;
    for (std::uint32_t i = 0; i < (1u << a->rss_log_size); ++i)
      if (!a->rss_wqs[i]) return set_error(EINVAL, "an RSS table names a work queue in every entry"), nullptr;
    if (ctx->minor < 18) return set_error(EOPNOTSUPP, "this uroced has no RSS (ABI minor < 18)"), nullptr;
  } else if (a->qp_type == IBV_QPT_XRC_RECV) {
    // The target: a domain, and nothing else of its own.
    if (!a->xrcd || a->srq) return set_error(EINVAL, "an XRC target QP needs an XRC domain, and no SRQ"), nullptr;
  } else if (a->qp_type == IBV_QPT_XRC_SEND) {
    if (!pd || !a->send_cq || a->srq || a->xrcd) return set_error(EINVAL, "an XRC send QP needs a PD and a send CQ"), nullptr;
  } else if (!pd || !a->send_cq || !a->recv_cq || a->xrcd) {
    return set_error(EINVAL, "PD and both CQs are required"), nullptr;
  }
  if (a->cap.max_send_sge > UROCE_ABI_MAX_SGE || a->cap.max_recv_sge > UROCE_ABI_MAX_SGE)
    return set_error(EINVAL, "at most 4 SGEs"), nullptr;
  if (a->cap.max_inline_data > UROCE_ABI_MAX_INLINE) return set_error(EINVAL, "max_inline_data is at most 64"), nullptr;
  if (a->qp_type == IBV_QPT_RAW_PACKET && ctx->minor < 16)
    return set_error(EOPNOTSUPP, "this uroced has no raw packet QPs (ABI minor < 16)"), nullptr;
  a->cap.max_inline_data = UROCE_ABI_MAX_INLINE;
  if (xrc) a->cap.max_recv_wr = a->cap.max_recv_sge = 0;  // no receive queue: XRC receives are the SRQs'
  if (a->qp_type == IBV_QPT_XRC_RECV || rss) a->cap = {};
  uroce_create_qp_msg m{pd && a->qp_type != IBV_QPT_XRC_RECV ? pd->handle : 0,
                        a->send_cq && a->qp_type != IBV_QPT_XRC_RECV ? a->send_cq->handle : 0,
                        a->recv_cq && !xrc ? a->recv_cq->handle : 0,
                        static_cast<std::uint32_t>(a->qp_type),
                        a->cap.max_send_wr,
                        a->srq ? 1 : a->cap.max_recv_wr,
                        static_cast<std::uint32_t>(a->sq_sig_all),
                        a->srq ? a->srq->handle : 0,
                        a->qp_type == IBV_QPT_XRC_RECV ? a->xrcd->handle : 0};
  if (rss) {
    m.rss_log_size = a->rss_log_size;
    m.rss_fields = static_cast<std::uint32_t>(a->rss_fields);
    if (m.rss_fields != a->rss_fields) return set_error(EOPNOTSUPP, "RSS hashes IPv4, IPv6, TCP and UDP fields only"), nullptr;
    std::memcpy(m.rss_key, a->rss_key, sizeof m.rss_key);
    for (std::uint32_t i = 0; i < (1u << a->rss_log_size); ++i) m.rss_wq[i] = a->rss_wqs[i]->handle;
  }
  // A daemon before minor 17 reads 32 bytes (it has no XRC, refused above);
  // the RSS fields go only for an RSS QP.
  const std::uint32_t mlen = ctx->minor < 17 ? offsetof(uroce_create_qp_msg, xrcd)
                             : rss           ? sizeof m
                                             : offsetof(uroce_create_qp_msg, rss_log_size);
  uroce_create_qp_reply r{};
  int fd = -1;
  if (call(ctx, UROCE_MSG_CREATE_QP, &m, mlen, -1, &r, sizeof r, &fd) != 0) return nullptr;
  void* map = nullptr;
  std::size_t len = 0;
  if (!map_fd(fd, map, len, "QP rings")) return nullptr;
  auto qp = new uroce_qp{ctx, r.handle, r.qpn, map, len, {}, {}, *a};
  using uroce::abi::AttachError;
  if (uroce::abi::Ring<uroce_send_entry>::attach(map, r.rq_offset, UROCE_RING_SEND, qp->sq) != AttachError::kOk ||
      uroce::abi::Ring<uroce_recv_entry>::attach(static_cast<std::uint8_t*>(map) + r.rq_offset,
                                                 static_cast<std::size_t>(len) - r.rq_offset, UROCE_RING_RECV,
                                                 qp->rq) != AttachError::kOk) {
    ::munmap(map, qp->map_len);
    delete qp;
    return set_error(EPROTO, "bad QP rings from uroced"), nullptr;
  }
  // The queues' real depths, as ibv_create_qp reports them (at least what
  // was asked: a power of two, and 1 for a queue asked with 0): a post past
  // them fails with ENOMEM exactly there.
  if (a->qp_type != IBV_QPT_XRC_RECV && !rss) a->cap.max_send_wr = qp->sq.capacity();
  if (!a->srq && !xrc && !rss) a->cap.max_recv_wr = qp->rq.capacity();
  qp->init.cap = a->cap;
  qp->init.rss_wqs = nullptr;  // the caller's: kept only for this call
  qp->init.rss_key = nullptr;
  ctx->qps[qp->handle] = qp;
  return qp;
}

std::uint32_t uroce_qp_num(const uroce_qp* qp) { return qp->qpn; }

int uroce_create_flow(uroce_qp* qp, std::uint32_t priority, const uroce_flow_key* value, const uroce_flow_key* mask,
                      std::uint32_t* handle) {
  if (!qp || !value || !mask || !handle) return set_error(EINVAL, "no QP, key or handle");
  if (qp->ctx->minor < 16) return set_error(EOPNOTSUPP, "this uroced has no flow rules (ABI minor < 16)");
  uroce_flow_msg m{qp->handle, priority, *value, *mask};
  uroce_handle_reply r{};
  if (const int rc = call(qp->ctx, UROCE_MSG_CREATE_FLOW, &m, sizeof m, -1, &r, sizeof r)) return rc;
  *handle = r.handle;
  return 0;
}

int uroce_destroy_flow(uroce_context* ctx, std::uint32_t handle) {
  if (!ctx) return set_error(EINVAL, "no context");
  uroce_destroy_msg d{UROCE_OBJ_FLOW, handle};
  return call(ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
}

ibv_ah* uroce_create_ah(uroce_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) return set_error(EINVAL, "no PD or attributes"), nullptr;
  if (!attr->is_global) return set_error(EINVAL, "RoCE needs a global address (ah_attr.is_global)"), nullptr;
  if (attr->port_num != 1) return set_error(EINVAL, "port_num must be 1"), nullptr;
  uroce_resolve_msg m{};
  std::memcpy(m.dgid, attr->grh.dgid.raw, 16);
  uroce_resolve_reply r{};
  if (call(pd->ctx, UROCE_MSG_RESOLVE, &m, sizeof m, -1, &r, sizeof r) != 0) return nullptr;
  auto* ah = new uroce_ah;
  std::memcpy(ah->dgid, attr->grh.dgid.raw, 16);
  std::memcpy(ah->dmac, r.mac, 6);
  ah->traffic_class = attr->grh.traffic_class;
  return &ah->ah;
}

int uroce_destroy_ah(ibv_ah* ibv) {
  auto* ah = reinterpret_cast<uroce_ah*>(ibv);
  if (!ah || ah->magic != uroce_ah::kAhMagic) return set_error(EINVAL, "not an address handle");
  ah->magic = 0;
  delete ah;
  return 0;
}

int uroce_modify_qp(uroce_qp* qp, ibv_qp_attr* a, int mask) {
  if (!qp || !a) return set_error(EINVAL, "no QP or attributes");
  // RoCE addresses by GID only: an address vector without a GRH is refused
  // here, as the kernel refuses it on a RoCE port (the message carries the
  // GID alone, and would be taken as a GID of zeros).
  if ((mask & IBV_QP_AV) && !a->ah_attr.is_global)
    return set_error(EINVAL, "RoCE needs a global address (ah_attr.is_global with the peer's GID)");
  const uroce_modify_qp_msg m = abi::to_msg(*a, mask, qp->handle);
  const int rc = call(qp->ctx, UROCE_MSG_MODIFY_QP, &m, sizeof m, -1, nullptr, 0);
  if (rc == 0 && (mask & IBV_QP_STATE) && a->qp_state == IBV_QPS_RESET) {
    // A QP made new forgets its past: completions of its own that its CQs
    // still hold (the flushes of its last error, say) are not handed out,
    // as ConnectX's provider cleans them from its CQs at this transition.
    // The daemon made every one of them before it answered.
    for (uroce_cq* cq : {qp->init.send_cq, qp->init.recv_cq})
      if (cq)
        cq->ring.edit_pending([qpn = qp->qpn](uroce_cq_entry& e) {
          if (e.qp_num == qpn) e.opcode = kDiscardedCompletion;
        });
  }
  return rc;
}

namespace {
int set_qp_opt(uroce_qp* qp, std::uint32_t opt, std::uint32_t value, const char* name) {
  if (!qp) return set_error(EINVAL, "no QP");
  if (qp->ctx->minor < 10) return set_error(ENOTSUP, "the daemon predates uroce's QP attributes (ABI minor 10)");
  uroce_qp_opt_msg m{};
  m.qp = qp->handle;
  m.opt = opt;
  m.value = value;
  if (name) {
    if (std::strlen(name) >= sizeof m.name) return set_error(EINVAL, "congestion control name too long");
    std::memcpy(m.name, name, std::strlen(name));
  }
  return call(qp->ctx, UROCE_MSG_SET_QP_OPT, &m, sizeof m, -1, nullptr, 0);
}
}  // namespace

int uroce_qp_set_cc(uroce_qp* qp, const char* name) {
  if (!name) return set_error(EINVAL, "no congestion control name");
  return set_qp_opt(qp, UROCE_QP_OPT_CC, 0, name);
}

int uroce_qp_set_selective_repeat(uroce_qp* qp, int on) {
  return set_qp_opt(qp, UROCE_QP_OPT_SR, on ? 1 : 0, nullptr);
}

int uroce_connect_qp(uroce_qp* qp, const uroce_rc_conn* c) {
  if (!qp || !c) return set_error(EINVAL, "connect_qp: no QP or no connection parameters");
  const auto pick = [](std::uint8_t v, std::uint8_t dflt) { return v != 0 ? v : dflt; };
  abi::Connect k;
  k.type = qp->init.qp_type;
  k.dest_qp_num = c->dest_qp_num;
  k.dgid = c->dgid;
  k.rq_psn = c->rq_psn;
  k.sq_psn = c->sq_psn;
  k.path_mtu = c->path_mtu != 0 ? c->path_mtu : IBV_MTU_1024;
  k.access = static_cast<unsigned>(c->access);
  k.timeout = pick(c->timeout, 14);
  k.retry_cnt = pick(c->retry_cnt, 7);
  k.rnr_retry = pick(c->rnr_retry, 7);
  k.min_rnr_timer = pick(c->min_rnr_timer, 12);
  k.max_rd_atomic = pick(c->max_rd_atomic, 4);
  k.max_dest_rd_atomic = pick(c->max_dest_rd_atomic, k.max_rd_atomic);
  return abi::bring_up(k, [&](const ibv_qp_attr& a, int mask) {
    ibv_qp_attr copy = a;
    return uroce_modify_qp(qp, &copy, mask);
  });
}

int uroce_destroy_qp(uroce_qp* qp) {
  if (!qp) return EINVAL;
  uroce_destroy_msg d{UROCE_OBJ_QP, qp->handle};
  const int rc = call(qp->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) {
    qp->ctx->qps.erase(qp->handle);
    ::munmap(qp->map, qp->map_len);
    delete qp;
  }
  return rc;
}

uroce_srq* uroce_create_srq(uroce_pd* pd, ibv_srq_init_attr* a) { return uroce_create_xrc_srq(pd, nullptr, nullptr, a); }

namespace {
uroce_srq* create_srq(uroce_pd* pd, uroce_xrcd* xrcd, uroce_cq* cq, ibv_srq_init_attr* a, std::uint32_t tm_tags,
                      std::uint32_t tm_ops);
}  // namespace

uroce_srq* uroce_create_xrc_srq(uroce_pd* pd, uroce_xrcd* xrcd, uroce_cq* cq, ibv_srq_init_attr* a) {
  return create_srq(pd, xrcd, cq, a, 0, 0);
}

uroce_srq* uroce_create_tm_srq(uroce_pd* pd, uroce_cq* cq, ibv_srq_init_attr* a, uint32_t max_tags, uint32_t max_ops) {
  if (!pd || !cq || !a) return set_error(EINVAL, "a tag-matching SRQ needs a PD, a CQ and attributes"), nullptr;
  if (pd->ctx->minor < 19) return set_error(EOPNOTSUPP, "this uroced has no tag matching (ABI minor < 19)"), nullptr;
  if (max_tags == 0 || max_tags > UROCE_TM_MAX_TAGS || max_ops == 0 || max_ops > UROCE_TM_MAX_OPS)
    return set_error(EINVAL, "tags 1..64 and operations 1..64"), nullptr;
  return create_srq(pd, nullptr, cq, a, max_tags, max_ops);
}

namespace {
uroce_srq* create_srq(uroce_pd* pd, uroce_xrcd* xrcd, uroce_cq* cq, ibv_srq_init_attr* a, std::uint32_t tm_tags,
                      std::uint32_t tm_ops) {
  if (!pd || !a) return set_error(EINVAL, "no PD or attributes"), nullptr;
  if (a->attr.srq_limit != 0) return set_error(EINVAL, "srq_limit (the low-watermark event) is not supported"), nullptr;
  if (xrcd && !cq) return set_error(EINVAL, "an XRC SRQ needs an XRC domain and a CQ"), nullptr;
  if (xrcd && pd->ctx->minor < 17) return set_error(EOPNOTSUPP, "this uroced has no XRC (ABI minor < 17)"), nullptr;
  if (cq && !xrcd && !tm_tags && pd->ctx->minor < 18)
    return set_error(EOPNOTSUPP, "this uroced has no work queues (ABI minor < 18)"), nullptr;
  uroce_create_srq_msg m{pd->handle, a->attr.max_wr, a->attr.max_sge, xrcd ? xrcd->handle : 0,
                         cq ? cq->handle : 0,   tm_tags,           tm_ops};
  // A daemon before minor 17 reads 12 bytes and answers the handle alone;
  // one before 19 reads 20.
  const bool old = pd->ctx->minor < 17;
  const std::size_t mlen = old ? offsetof(uroce_create_srq_msg, xrcd)
                           : pd->ctx->minor < 19 ? offsetof(uroce_create_srq_msg, tm_max_tags)
                                                 : sizeof m;
  uroce_create_srq_reply r{};
  int fd = -1;
  if (call(pd->ctx, UROCE_MSG_CREATE_SRQ, &m, mlen, -1, &r, old ? sizeof(uroce_handle_reply) : sizeof r, &fd) != 0)
    return nullptr;
  void* map = nullptr;
  std::size_t len = 0;
  if (!map_fd(fd, map, len, "SRQ ring")) return nullptr;
  auto srq = new uroce_srq{pd->ctx, r.handle, map, len, {}, r.srq_num};
  const std::uint32_t entries = std::bit_ceil(a->attr.max_wr);
  const std::uint32_t ops = tm_tags ? std::bit_ceil(tm_ops) : 0;
  const std::size_t ring_len = tm_tags ? uroce_ring_bytes(entries, sizeof(uroce_recv_entry)) : len;
  bool ok = len >= (tm_tags ? uroce_tm_srq_bytes(entries, ops, tm_tags) : ring_len) &&
            uroce::abi::Ring<uroce_recv_entry>::attach(map, ring_len, UROCE_RING_SRQ, srq->ring) ==
                uroce::abi::AttachError::kOk;
  if (ok && tm_tags) {
    auto* base = static_cast<std::uint8_t*>(map);
    ok = uroce::abi::Ring<uroce_tm_op>::attach(base + uroce_tm_ops_offset(entries),
                                               uroce_ring_bytes(ops, sizeof(uroce_tm_op)), UROCE_RING_TM_OPS,
                                               srq->ops) == uroce::abi::AttachError::kOk;
    srq->released = reinterpret_cast<const std::uint32_t*>(base + uroce_tm_released_offset(entries, ops));
    srq->gen.assign(tm_tags, 0);
  }
  if (!ok) {
    ::munmap(map, len);
    delete srq;
    return set_error(EPROTO, "bad SRQ ring from uroced"), nullptr;
  }
  a->attr.max_wr = srq->ring.capacity();
  return srq;
}
}  // namespace

std::uint32_t uroce_srq_num(const uroce_srq* srq) { return srq ? srq->srq_num : 0; }
std::uint32_t uroce_srq_handle(const uroce_srq* srq) { return srq ? srq->handle : 0; }

uroce_srq* uroce_create_wq(uroce_pd* pd, uroce_cq* cq, ibv_srq_init_attr* a) {
  if (!cq) return set_error(EINVAL, "a work queue needs a CQ"), nullptr;
  return uroce_create_xrc_srq(pd, nullptr, cq, a);
}

uroce_xrcd* uroce_open_xrcd(uroce_context* ctx, int fd, int oflags) {
  if (!ctx) return set_error(EINVAL, "no context"), nullptr;
  if (ctx->minor < 17) return set_error(EOPNOTSUPP, "this uroced has no XRC (ABI minor < 17)"), nullptr;
  uroce_open_xrcd_msg m{oflags, fd >= 0 ? 1u : 0u};
  uroce_handle_reply r{};
  if (call(ctx, UROCE_MSG_OPEN_XRCD, &m, sizeof m, fd, &r, sizeof r) != 0) return nullptr;
  return new uroce_xrcd{ctx, r.handle};
}

int uroce_close_xrcd(uroce_xrcd* xrcd) {
  if (!xrcd) return set_error(EINVAL, "no XRC domain");
  uroce_destroy_msg d{UROCE_OBJ_XRCD, xrcd->handle};
  const int rc = call(xrcd->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) delete xrcd;
  return rc;
}

int uroce_destroy_srq(uroce_srq* srq) {
  if (!srq) return set_error(EINVAL, "no SRQ");
  uroce_destroy_msg d{UROCE_OBJ_SRQ, srq->handle};
  const int rc = call(srq->ctx, UROCE_MSG_DESTROY, &d, sizeof d, -1, nullptr, 0);
  if (rc == 0) {
    ::munmap(srq->map, srq->map_len);
    delete srq;
  }
  return rc;
}

int uroce_completion_timestamps(const uroce_context* ctx) { return ctx && ctx->minor >= 13 ? 1 : 0; }

int uroce_odp(const uroce_context* ctx) { return ctx && (ctx->dev_flags & UROCE_DEVICE_ODP) ? 1 : 0; }
int uroce_abi_minor(const uroce_context* ctx) { return ctx ? ctx->minor : 0; }

}  // extern "C"
