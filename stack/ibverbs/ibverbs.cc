// libibverbs.so.1 for uroce: a drop-in for rdma-core's library, so that
// verbs programs run on uroce unmodified (LD_LIBRARY_PATH picks it; the
// programs are linked BIND_NOW without RPATH). Built against Debian's
// rdma-core 44 headers, so every struct a program sees has rdma-core's
// layout; the objects wrap liburoce's (stack/verbs).
//
// Built so far: devices and contexts; the device, port, GID and P_Key
// queries; PDs, MRs, completion channels (real descriptors), CQs (and
// ibv_create_cq_ex's polling), RC, UC and UD QPs (and ibv_create_qp_ex's
// wr_* builders), UD address handles, SRQs and async events, with the data
// path (post, poll, arm) through the context's ops straight into
// liburoce's rings; and every
// public symbol of Debian's libibverbs.so.1 with its exact version node
// (the version script libibverbs.map), so any verbs binary loads. What is
// not built yet fails cleanly: a function returning a pointer returns NULL
// with errno EOPNOTSUPP, one returning an int returns EOPNOTSUPP (or -1
// with errno set where rdma-core's does), never a crash.
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <pthread.h>
#include <time.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// Thirty-three names have two versions, IBVERBS_1.0 (the 2006 ABI) and
// IBVERBS_1.1 (the default). Their implementations here are named
// uroce_impl_<name> (the header's prototypes renamed with them, so they are
// still checked against rdma-core's), and bound to <name>@@IBVERBS_1.1 with
// .symver below; two of them are function-like macros in the header and
// are renamed after it.
#define ibv_ack_async_event uroce_impl_ibv_ack_async_event
#define ibv_ack_cq_events uroce_impl_ibv_ack_cq_events
#define ibv_alloc_pd uroce_impl_ibv_alloc_pd
#define ibv_attach_mcast uroce_impl_ibv_attach_mcast
#define ibv_close_device uroce_impl_ibv_close_device
#define ibv_create_ah uroce_impl_ibv_create_ah
#define ibv_create_cq uroce_impl_ibv_create_cq
#define ibv_create_qp uroce_impl_ibv_create_qp
#define ibv_create_srq uroce_impl_ibv_create_srq
#define ibv_dealloc_pd uroce_impl_ibv_dealloc_pd
#define ibv_dereg_mr uroce_impl_ibv_dereg_mr
#define ibv_destroy_ah uroce_impl_ibv_destroy_ah
#define ibv_destroy_cq uroce_impl_ibv_destroy_cq
#define ibv_destroy_qp uroce_impl_ibv_destroy_qp
#define ibv_destroy_srq uroce_impl_ibv_destroy_srq
#define ibv_detach_mcast uroce_impl_ibv_detach_mcast
#define ibv_free_device_list uroce_impl_ibv_free_device_list
#define ibv_get_async_event uroce_impl_ibv_get_async_event
#define ibv_get_cq_event uroce_impl_ibv_get_cq_event
#define ibv_get_device_guid uroce_impl_ibv_get_device_guid
#define ibv_get_device_list uroce_impl_ibv_get_device_list
#define ibv_get_device_name uroce_impl_ibv_get_device_name
#define ibv_modify_qp uroce_impl_ibv_modify_qp
#define ibv_modify_srq uroce_impl_ibv_modify_srq
#define ibv_open_device uroce_impl_ibv_open_device
#define ibv_query_device uroce_impl_ibv_query_device
#define ibv_query_gid uroce_impl_ibv_query_gid
#define ibv_query_pkey uroce_impl_ibv_query_pkey
#define ibv_query_qp uroce_impl_ibv_query_qp
#define ibv_query_srq uroce_impl_ibv_query_srq
#define ibv_resize_cq uroce_impl_ibv_resize_cq
#include <infiniband/verbs.h>
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stack/abi/uroce_abi.h"  // the SGE and inline limits of a send entry
#include "stack/abi/session_proto.h"
#include "stack/verbs/uroce_verbs.h"

// Not in the installed headers (rdma-core's driver.h): declared with
// rdma-core's signatures.
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
extern "C" {
int uroce_impl_ibv_query_port(struct ibv_context* context, uint8_t port_num, struct _compat_ibv_port_attr* port_attr);
struct ibv_mr* uroce_impl_ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access);
int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num, unsigned int index,
                       enum ibv_gid_type_sysfs* type);
int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);
const char* ibv_get_sysfs_path(void);
int ibv_dontfork_range(void* base, size_t size);
int ibv_dofork_range(void* base, size_t size);
void ibv_copy_qp_attr_from_kern(void* dst, void* src);
void ibv_copy_ah_attr_from_kern(void* dst, void* src);
void ibv_copy_path_rec_from_kern(void* dst, void* src);
void ibv_copy_path_rec_to_kern(void* dst, void* src);
}

namespace {

/// One uroce device: liburoce's (a daemon's application socket, or an
/// embedded spec) behind rdma-core's struct. Made once per path and kept
/// for the process's life, as rdma-core keeps its devices: a context's
/// `device` stays valid after ibv_free_device_list.
struct UDevice {
  ibv_device dev{};
  std::string path;  // for uroce_open_device
  int index = 0;
};

struct UContext {
  uroce_context* u = nullptr;
  // A context imported from another (ibv_import_device) shares its
  // session `u`: the last UContext on it (g_contexts) closes it.
  // Async events name liburoce's objects: these find the verbs ones.
  std::mutex mu;
  std::vector<std::pair<uroce_cq*, ibv_cq*>> cqs;
  std::vector<std::pair<uroce_qp*, ibv_qp*>> qps;
  verbs_context v{};  // ends with the ibv_context handed out
};

/// An rdma-core object (first, so a pointer to it is a pointer to the
/// wrapper) and the liburoce object behind it.
template <class Verbs, class Uroce>
struct Wrap {
  Verbs v{};
  Uroce* u = nullptr;
  static Wrap* of(Verbs* v) { return reinterpret_cast<Wrap*>(v); }
};
using UPd = Wrap<ibv_pd, uroce_pd>;
using UMr = Wrap<ibv_mr, uroce_mr>;
using UChannel = Wrap<ibv_comp_channel, uroce_comp_channel>;
using UMw = Wrap<ibv_mw, uroce_mw>;
using USrq = Wrap<ibv_srq, uroce_srq>;  // an XRC SRQ's number is liburoce's (ibv_get_srq_num)
using UXrcd = Wrap<ibv_xrcd, uroce_xrcd>;

/// A receive work queue (ibv_create_wq) is liburoce's (an SRQ with a CQ of
/// its own); an indirection table is its work queues, in the library alone
/// (the daemon gets the list with each RSS QP). The counts (under g_mu)
/// keep a work queue while a table names it, and a table while a QP does.
struct UWq {
  ibv_wq v{};
  uroce_srq* u = nullptr;
  int tables = 0;
};
struct UIndTable {
  ibv_rwq_ind_table v{};
  std::vector<UWq*> wqs;
  int qps = 0;
};

/// A CQ is an ibv_cq_ex (ibv_create_cq_ex), whose start is laid out as
/// ibv_cq: the ibv_cq handed out is that prefix (ibv_cq_ex_to_cq).
struct UCq {
  ibv_cq_ex x{};
  uroce_cq* u = nullptr;
  ibv_wc cur{};  // the completion start_poll/next_poll hold
  uroce_wc_extra ex{};  // its timestamp (ns of CLOCK_MONOTONIC) and tag-matching info
  ibv_cq& cq() { return *reinterpret_cast<ibv_cq*>(&x); }
};
static_assert(offsetof(ibv_cq_ex, cqe) == offsetof(ibv_cq, cqe) &&
                  offsetof(ibv_cq_ex, async_events_completed) == offsetof(ibv_cq, async_events_completed),
              "ibv_cq is the prefix of ibv_cq_ex");

/// A QP is an ibv_qp_ex (its first member the ibv_qp handed out), so the
/// wr_* builders work on every QP. What they build waits in `slots`, one
/// per send queue entry, made at create: wr_complete posts them as one list.
struct UQp {
  ibv_qp_ex x{};
  // rdma-core 45 appended wr_flush to ibv_qp_ex; 44's header, which this
  // library is built against, ends before it. The slot is here, right after,
  // so that a program built with a newer header finds it (ibv_wr_flush).
  void (*wr_flush)(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, size_t len, uint8_t type,
                   uint8_t level) = nullptr;
  uroce_qp* u = nullptr;
  struct Slot {
    ibv_send_wr wr;
    ibv_sge sge[UROCE_ABI_MAX_SGE];
    std::uint8_t inl[UROCE_ABI_MAX_INLINE];  // wr_set_inline_data's bytes, until the post copies them
  };
  std::vector<Slot> slots;
  std::size_t built = 0;
  int err = 0;  // the first builder error since wr_start, returned by wr_complete
  UIndTable* rss = nullptr;  // an RSS QP's indirection table
  ibv_qp& qp() { return x.qp_base; }
};

UCq* ucq(ibv_cq* c) { return reinterpret_cast<UCq*>(c); }
UQp* uqp(ibv_qp* q) { return reinterpret_cast<UQp*>(q); }
USrq* usrq(ibv_srq* q) { return USrq::of(q); }
UXrcd* uxrcd(ibv_xrcd* x) { return UXrcd::of(x); }

std::mutex g_mu;
// Never destroyed (every device ever listed): an application may exit()
// from one thread while another still uses a device (rping's CM thread
// does), and a static destructor would free it under that thread.
std::vector<std::unique_ptr<UDevice>>& g_devices = *new std::vector<std::unique_ptr<UDevice>>;

// Shared PDs (ibv_import_device, ibv_import_pd, ibv_import_mr), within a
// process: a context's cmd_fd is a memfd whose only use is to name it (no
// kernel device behind uroce), and PDs and MRs get handles, process-wide,
// by which an importing context finds them. Under g_mu.
enum class Exp : std::uint8_t { kPd, kMr, kDm };
// Parent domains (ibv_alloc_parent_domain): a second wrapper of their PD's
// liburoce PD, freed alone by ibv_dealloc_pd. Under g_mu.
std::set<ibv_pd*>& g_parent_domains = *new std::set<ibv_pd*>;
// ODP MRs by L_Key, for ibv_advise_mr. Under g_mu.
std::map<std::uint32_t, ibv_mr*>& g_odp_mrs = *new std::map<std::uint32_t, ibv_mr*>;
constexpr std::size_t kMaxDm = 256 * 1024;  // the largest device memory (ibv_alloc_dm)
struct Exported {
  uroce_context* u;
  void* obj;  // UPd*, UMr* or UDm*, as `kind` says
  Exp kind;
};
std::map<std::uint32_t, Exported>& g_exported = *new std::map<std::uint32_t, Exported>;
std::uint32_t g_next_handle = 1;
std::uint32_t export_handle(uroce_context* u, void* obj, Exp kind) {
  std::lock_guard<std::mutex> lock(g_mu);
  const std::uint32_t h = g_next_handle++;
  g_exported[h] = {u, obj, kind};
  return h;
}
void unexport(std::uint32_t h) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_exported.erase(h);
}
void* find_exported(uroce_context* u, std::uint32_t h, Exp kind) {
  std::lock_guard<std::mutex> lock(g_mu);
  const auto it = g_exported.find(h);
  return it != g_exported.end() && it->second.u == u && it->second.kind == kind ? it->second.obj : nullptr;
}

UContext* ucontext(ibv_context* c) {
  return reinterpret_cast<UContext*>(reinterpret_cast<char*>(c) - offsetof(UContext, v) -
                                     offsetof(verbs_context, context));
}
UDevice* udevice(ibv_device* d) { return reinterpret_cast<UDevice*>(d); }

int fail(int err) {
  errno = err;
  return err;
}
template <class T>
T* fail_null(int err) {
  errno = err;
  return nullptr;
}

// ---------------------------------------------------------------- queries

int query_port_full(ibv_context* c, uint8_t port, ibv_port_attr* a) {
  if (!c || !a) return fail(EINVAL);
  if (const int rc = uroce_query_port(ucontext(c)->u, port, a)) return fail(rc);
  return 0;
}

int vctx_query_port(ibv_context* c, uint8_t port, ibv_port_attr* attr, size_t len) {
  ibv_port_attr full{};
  if (const int rc = query_port_full(c, port, &full)) return rc;
  std::memcpy(attr, &full, std::min(len, sizeof full));
  return 0;
}

int vctx_query_device_ex(ibv_context* c, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                         size_t len) {
  if (!c || !attr) return fail(EINVAL);
  if (input && input->comp_mask) return fail(EINVAL);
  ibv_device_attr_ex full{};
  if (const int rc = ibv_query_device(c, &full.orig_attr)) return rc;
  // FLUSH with global visibility (rdma-core 45's IB_UVERBS_DEVICE_FLUSH_GLOBAL;
  // not persistence: uroce has no persistent memory).
  full.device_cap_flags_ex = full.orig_attr.device_cap_flags | (1ull << 38);
  full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;
  full.max_dm_size = kMaxDm;
  if (uroce_abi_minor(ucontext(c)->u) >= 18) {
    // RSS over receive work queues (raw packet QPs): Toeplitz over IPv4,
    // IPv6, TCP and UDP fields, tables of up to 64 queues.
    full.rss_caps.supported_qpts = 1u << IBV_QPT_RAW_PACKET;
    full.rss_caps.max_rwq_indirection_tables = static_cast<uint32_t>(full.orig_attr.max_qp);
    full.rss_caps.max_rwq_indirection_table_size = 1u << UROCE_RSS_MAX_LOG;
    full.rss_caps.rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 |
                                        IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP |
                                        IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP;
    full.rss_caps.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
    full.max_wq_type_rq = static_cast<uint32_t>(full.orig_attr.max_srq);
  }
  if (uroce_abi_minor(ucontext(c)->u) >= 19) {
    // Tag matching on RC (uroce_abi.h): EAGER and rendezvous, as ConnectX.
    full.tm_caps.max_rndv_hdr_size = UROCE_TM_MAX_RNDV_HDR;
    full.tm_caps.max_num_tags = UROCE_TM_MAX_TAGS;
    full.tm_caps.flags = IBV_TM_CAP_RC;
    full.tm_caps.max_ops = UROCE_TM_MAX_OPS;
    full.tm_caps.max_sge = UROCE_TM_MAX_SGE;
  }
  if (uroce_odp(ucontext(c)->u)) {
    // ODP (the daemon's --odp, or embedded mode): every access is made when
    // it happens, through the process's memory file; implicit MRs too.
    full.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
    constexpr std::uint32_t kRecv = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
    full.odp_caps.per_transport_caps.rc_odp_caps =
        kRecv | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC;
    full.odp_caps.per_transport_caps.uc_odp_caps = kRecv | IBV_ODP_SUPPORT_WRITE;
    full.odp_caps.per_transport_caps.ud_odp_caps = kRecv;
    full.xrc_odp_caps = full.odp_caps.per_transport_caps.rc_odp_caps;  // XRC is RC underneath
  }
  if (uroce_completion_timestamps(ucontext(c)->u)) {
    // Completion timestamps: CLOCK_MONOTONIC in ns, a 64-bit count at 1 GHz.
    full.completion_timestamp_mask = ~std::uint64_t{0};
    full.hca_core_clock = 1'000'000;  // kHz
  }
  std::memcpy(attr, &full, std::min(len, sizeof full));
  return 0;
}

/// ibv_query_rt_values_ex: the free-running clock completions are stamped
/// with (CLOCK_MONOTONIC), now.
int vctx_query_rt_values(ibv_context* c, ibv_values_ex* values) {
  if (!c || !values) return EINVAL;
  if (!uroce_completion_timestamps(ucontext(c)->u)) return EOPNOTSUPP;
  std::uint32_t done = 0;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    clock_gettime(CLOCK_MONOTONIC, &values->raw_clock);
    done |= IBV_VALUES_MASK_RAW_CLOCK;
  }
  values->comp_mask = done;
  return 0;
}

// The data path: the header's inline ibv_post_send, ibv_post_recv,
// ibv_post_srq_recv, ibv_poll_cq and ibv_req_notify_cq call these through
// the context's ops, straight into liburoce's rings.
int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return uroce_post_send(uqp(qp)->u, wr, bad); }

// Memory windows: the header's inline ibv_alloc_mw, ibv_dealloc_mw and
// ibv_bind_mw call these through the context's ops.
ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  uroce_mw* u = uroce_alloc_mw(UPd::of(pd)->u, type);
  if (!u) return fail_null<ibv_mw>(errno ? errno : EINVAL);
  auto* w = new UMw();
  w->u = u;
  w->v.context = pd->context;
  w->v.pd = pd;
  w->v.rkey = uroce_mw_rkey(u);
  w->v.handle = w->v.rkey;
  w->v.type = type;
  return &w->v;
}
int op_dealloc_mw(ibv_mw* mw) {
  if (!mw) return EINVAL;
  UMw* w = UMw::of(mw);
  if (const int rc = uroce_dealloc_mw(w->u)) return rc;
  delete w;
  return 0;
}
// Type 1 (ibv_bind_mw): a bind work request with the next R_Key, which the
// window takes once it is posted (as rdma-core's providers do).
int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* b) {
  ibv_send_wr wr{};
  wr.wr_id = b->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = b->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = b->bind_info;
  ibv_send_wr* bad = nullptr;
  if (const int rc = uroce_post_send(uqp(qp)->u, &wr, &bad)) return rc;
  mw->rkey = wr.bind_mw.rkey;
  return 0;
}
int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return uroce_post_recv(uqp(qp)->u, wr, bad); }
int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return uroce_post_srq_recv(usrq(srq)->u, wr, bad);
}
int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc) { return uroce_poll_cq(ucq(cq)->u, n, wc); }
int op_req_notify_cq(ibv_cq* cq, int solicited_only) { return uroce_req_notify_cq(ucq(cq)->u, solicited_only); }

// ------------------------------------------------- CQs, and ibv_cq_ex polling

// ibv_cq_ex's polling: start_poll takes one completion, next_poll the next,
// the read_* functions read the one held.
UCq* ucq_ex(ibv_cq_ex* x) { return reinterpret_cast<UCq*>(x); }
int cq_take(ibv_cq_ex* x) {
  UCq* c = ucq_ex(x);
  const int n = uroce_poll_cq_ex(c->u, 1, &c->cur, &c->ex);
  if (n < 0) return errno ? errno : EIO;
  if (n == 0) return ENOENT;
  x->status = c->cur.status;
  x->wr_id = c->cur.wr_id;
  return 0;
}
int cq_start_poll(ibv_cq_ex* x, ibv_poll_cq_attr* attr) { return attr && attr->comp_mask ? EINVAL : cq_take(x); }
int cq_next_poll(ibv_cq_ex* x) { return cq_take(x); }
void cq_end_poll(ibv_cq_ex*) {}
ibv_wc_opcode cq_read_opcode(ibv_cq_ex* x) { return ucq_ex(x)->cur.opcode; }
uint32_t cq_read_vendor_err(ibv_cq_ex* x) { return ucq_ex(x)->cur.vendor_err; }
uint32_t cq_read_byte_len(ibv_cq_ex* x) { return ucq_ex(x)->cur.byte_len; }
__be32 cq_read_imm_data(ibv_cq_ex* x) { return ucq_ex(x)->cur.imm_data; }
uint32_t cq_read_qp_num(ibv_cq_ex* x) { return ucq_ex(x)->cur.qp_num; }
uint32_t cq_read_src_qp(ibv_cq_ex* x) { return ucq_ex(x)->cur.src_qp; }
unsigned int cq_read_wc_flags(ibv_cq_ex* x) { return ucq_ex(x)->cur.wc_flags; }
uint32_t cq_read_slid(ibv_cq_ex* x) { return ucq_ex(x)->cur.slid; }
uint8_t cq_read_sl(ibv_cq_ex* x) { return ucq_ex(x)->cur.sl; }
uint8_t cq_read_dlid_path_bits(ibv_cq_ex* x) { return ucq_ex(x)->cur.dlid_path_bits; }
// The device's free-running clock is CLOCK_MONOTONIC in ns (hca_core_clock
// 1 GHz); the wall clock is that plus CLOCK_REALTIME's lead over it now.
std::uint64_t clock_ns(clockid_t id) {
  timespec t{};
  clock_gettime(id, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(t.tv_nsec);
}
uint64_t cq_read_completion_ts(ibv_cq_ex* x) { return ucq_ex(x)->ex.timestamp; }
uint64_t cq_read_completion_wallclock_ns(ibv_cq_ex* x) {
  return ucq_ex(x)->ex.timestamp + (clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC));
}
// What no uroce completion carries: 0.
uint16_t cq_read_zero16(ibv_cq_ex*) { return 0; }
uint32_t cq_read_zero32(ibv_cq_ex*) { return 0; }
// A matched message's tag and the TMH's app_ctx; 0 for other completions.
void cq_read_tm_info(ibv_cq_ex* x, ibv_wc_tm_info* tm) {
  tm->tag = ucq_ex(x)->ex.tag;
  tm->priv = ucq_ex(x)->ex.tm_priv;
}

/// The wc_flags create_cq_ex can serve: what an ibv_wc carries; and the
/// fields of what uroce never makes (a stripped CVLAN, a flow tag, tag
/// matching): a completion never has them, and their read_* give 0.
constexpr uint64_t kCqExFlags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                                IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
                                IBV_WC_EX_WITH_DLID_PATH_BITS | IBV_WC_EX_WITH_CVLAN | IBV_WC_EX_WITH_FLOW_TAG |
                                IBV_WC_EX_WITH_TM_INFO;

UCq* make_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  if (!context || cqe <= 0) return fail_null<UCq>(EINVAL);
  auto* c = new UCq();
  // liburoce hands our CQ back from uroce_get_cq_event as its context.
  c->u = uroce_create_cq(ucontext(context)->u, cqe, c, channel ? UChannel::of(channel)->u : nullptr,
                         comp_vector);
  if (!c->u) {
    delete c;
    return fail_null<UCq>(errno ? errno : ENOMEM);
  }
  ibv_cq_ex& x = c->x;
  x.context = context;
  x.channel = channel;
  x.cq_context = cq_context;
  x.cqe = cqe;
  pthread_mutex_init(&x.mutex, nullptr);
  pthread_cond_init(&x.cond, nullptr);
  x.start_poll = cq_start_poll;
  x.next_poll = cq_next_poll;
  x.end_poll = cq_end_poll;
  x.read_opcode = cq_read_opcode;
  x.read_vendor_err = cq_read_vendor_err;
  x.read_byte_len = cq_read_byte_len;
  x.read_imm_data = cq_read_imm_data;
  x.read_qp_num = cq_read_qp_num;
  x.read_src_qp = cq_read_src_qp;
  x.read_wc_flags = cq_read_wc_flags;
  x.read_slid = cq_read_slid;
  x.read_sl = cq_read_sl;
  x.read_dlid_path_bits = cq_read_dlid_path_bits;
  x.read_completion_ts = cq_read_completion_ts;
  x.read_cvlan = cq_read_zero16;
  x.read_flow_tag = cq_read_zero32;
  x.read_tm_info = cq_read_tm_info;
  x.read_completion_wallclock_ns = cq_read_completion_wallclock_ns;
  UContext* uc = ucontext(context);
  std::lock_guard<std::mutex> lk(uc->mu);
  uc->cqs.emplace_back(c->u, &c->cq());
  return c;
}

ibv_cq_ex* vctx_create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* a) {
  if (!context || !a) return fail_null<ibv_cq_ex>(EINVAL);
  constexpr uint64_t kTs = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  const bool ts = uroce_completion_timestamps(ucontext(context)->u) != 0;
  if (a->wc_flags & ~(kCqExFlags | (ts ? kTs : 0))) return fail_null<ibv_cq_ex>(EOPNOTSUPP);
  if (a->comp_mask & ~uint32_t{IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD})
    return fail_null<ibv_cq_ex>(EOPNOTSUPP);
  if (a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
    // A CQ may name a parent domain (its allocators); uroce's CQ rings are
    // the daemon's shared memory, so the domain only has to be one.
    std::lock_guard<std::mutex> lock(g_mu);
    if (!a->parent_domain || !g_parent_domains.count(a->parent_domain)) return fail_null<ibv_cq_ex>(EINVAL);
  }
  // Single-threaded is a hint; ignoring overruns is not something uroce does.
  if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (a->flags & ~uint32_t{IBV_CREATE_CQ_ATTR_SINGLE_THREADED}))
    return fail_null<ibv_cq_ex>(EOPNOTSUPP);
  UCq* c = make_cq(context, static_cast<int>(a->cqe), a->cq_context, a->channel, static_cast<int>(a->comp_vector));
  return c ? &c->x : nullptr;
}

// ------------------------------------------------- QPs, and the wr_* builders

UQp* uqp_ex(ibv_qp_ex* x) { return reinterpret_cast<UQp*>(x); }

/// A new WR of the batch, with the QP's wr_id and wr_flags as they are now.
ibv_send_wr* wr_begin(ibv_qp_ex* x, ibv_wr_opcode op) {
  UQp* q = uqp_ex(x);
  if (q->built >= q->slots.size()) {
    if (!q->err) q->err = ENOMEM;  // more than the send queue holds
    return nullptr;
  }
  UQp::Slot& sl = q->slots[q->built++];
  sl.wr = ibv_send_wr{};
  sl.wr.wr_id = x->wr_id;
  sl.wr.send_flags = x->wr_flags;
  sl.wr.opcode = op;
  sl.wr.sg_list = sl.sge;
  return &sl.wr;
}
/// The WR the setters apply to: the last one begun.
UQp::Slot* wr_current(ibv_qp_ex* x) {
  UQp* q = uqp_ex(x);
  if (q->built == 0) {
    if (!q->err) q->err = EINVAL;  // a setter before any operation
    return nullptr;
  }
  return &q->slots[q->built - 1];
}
void wr_refuse(ibv_qp_ex* x) {
  UQp* q = uqp_ex(x);
  if (!q->err) q->err = EOPNOTSUPP;
}

void wr_rdma(ibv_qp_ex* x, ibv_wr_opcode op, uint32_t rkey, uint64_t addr, __be32 imm) {
  if (ibv_send_wr* w = wr_begin(x, op)) {
    w->wr.rdma.rkey = rkey;
    w->wr.rdma.remote_addr = addr;
    w->imm_data = imm;
  }
}
void wr_rdma_write(ibv_qp_ex* x, uint32_t rkey, uint64_t addr) { wr_rdma(x, IBV_WR_RDMA_WRITE, rkey, addr, 0); }
void wr_rdma_write_imm(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, __be32 imm) {
  wr_rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr, imm);
}
void wr_rdma_read(ibv_qp_ex* x, uint32_t rkey, uint64_t addr) { wr_rdma(x, IBV_WR_RDMA_READ, rkey, addr, 0); }
void wr_atomic(ibv_qp_ex* x, ibv_wr_opcode op, uint32_t rkey, uint64_t addr, uint64_t compare_add, uint64_t swap) {
  if (ibv_send_wr* w = wr_begin(x, op)) {
    w->wr.atomic.rkey = rkey;
    w->wr.atomic.remote_addr = addr;
    w->wr.atomic.compare_add = compare_add;
    w->wr.atomic.swap = swap;
  }
}
void wr_atomic_cmp_swp(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
  wr_atomic(x, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr, compare, swap);
}
void wr_atomic_fetch_add(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, uint64_t add) {
  wr_atomic(x, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr, add, 0);
}
// ATOMIC WRITE: the 8 bytes at atomic_wr are taken now (as rdma-core's
void wr_set_inline_data(ibv_qp_ex* x, void* addr, size_t length);
// providers do), carried inline.
void wr_atomic_write(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, const void* atomic_wr) {
  if (ibv_send_wr* w = wr_begin(x, IBV_WR_ATOMIC_WRITE)) {
    w->wr.rdma.rkey = rkey;
    w->wr.rdma.remote_addr = addr;
    wr_set_inline_data(x, const_cast<void*>(atomic_wr), 8);
  }
}
// FLUSH (rdma-core 45's ibv_wr_flush, in the slot after ibv_qp_ex): the
// target, its length, the placement type and the selectivity level, carried
// in the atomic fields as liburoce takes them.
void wr_flush(ibv_qp_ex* x, uint32_t rkey, uint64_t addr, size_t len, uint8_t type, uint8_t level) {
  if (ibv_send_wr* w = wr_begin(x, static_cast<ibv_wr_opcode>(UROCE_WR_FLUSH))) {
    w->wr.atomic.rkey = rkey;
    w->wr.atomic.remote_addr = addr;
    w->wr.atomic.compare_add = len;
    w->wr.atomic.swap = static_cast<uint64_t>(type) | static_cast<uint64_t>(level) << 4;
  }
}
void wr_send(ibv_qp_ex* x) { (void)wr_begin(x, IBV_WR_SEND); }
void wr_send_imm(ibv_qp_ex* x, __be32 imm) {
  if (ibv_send_wr* w = wr_begin(x, IBV_WR_SEND_WITH_IMM)) w->imm_data = imm;
}
void wr_send_inv(ibv_qp_ex* x, uint32_t rkey) {
  if (ibv_send_wr* w = wr_begin(x, IBV_WR_SEND_WITH_INV)) w->invalidate_rkey = rkey;
}
void wr_set_ud_addr(ibv_qp_ex* x, ibv_ah* ah, uint32_t qpn, uint32_t qkey) {
  if (UQp::Slot* sl = wr_current(x)) {
    sl->wr.wr.ud.ah = ah;
    sl->wr.wr.ud.remote_qpn = qpn;
    sl->wr.wr.ud.remote_qkey = qkey;
  }
}
void wr_set_sge_list(ibv_qp_ex* x, size_t n, const ibv_sge* list) {
  UQp::Slot* sl = wr_current(x);
  if (!sl) return;
  if (n > UROCE_ABI_MAX_SGE) {
    UQp* q = uqp_ex(x);
    if (!q->err) q->err = EINVAL;
    return;
  }
  std::copy(list, list + n, sl->sge);
  sl->wr.num_sge = static_cast<int>(n);
  sl->wr.send_flags &= ~static_cast<unsigned>(IBV_SEND_INLINE);
}
void wr_set_sge(ibv_qp_ex* x, uint32_t lkey, uint64_t addr, uint32_t length) {
  const ibv_sge one{addr, length, lkey};
  wr_set_sge_list(x, 1, &one);
}
void wr_set_inline_data_list(ibv_qp_ex* x, size_t n, const ibv_data_buf* bufs) {
  UQp::Slot* sl = wr_current(x);
  if (!sl) return;
  size_t len = 0;
  for (size_t i = 0; i < n; ++i) {
    if (len + bufs[i].length > sizeof sl->inl) {
      UQp* q = uqp_ex(x);
      if (!q->err) q->err = EINVAL;  // over max_inline_data
      return;
    }
    std::memcpy(sl->inl + len, bufs[i].addr, bufs[i].length);
    len += bufs[i].length;
  }
  sl->sge[0] = {reinterpret_cast<uintptr_t>(sl->inl), static_cast<uint32_t>(len), 0};
  sl->wr.num_sge = 1;
  sl->wr.send_flags |= IBV_SEND_INLINE;
}
void wr_set_inline_data(ibv_qp_ex* x, void* addr, size_t length) {
  const ibv_data_buf one{addr, length};
  wr_set_inline_data_list(x, 1, &one);
}
void wr_start(ibv_qp_ex* x) {
  UQp* q = uqp_ex(x);
  q->built = 0;
  q->err = 0;
}
int wr_complete(ibv_qp_ex* x) {
  UQp* q = uqp_ex(x);
  const std::size_t n = q->built;
  const int err = q->err;
  q->built = 0;
  q->err = 0;
  if (err) return err;  // nothing of the batch is posted, as a provider's builders do
  if (n == 0) return 0;
  for (std::size_t i = 0; i < n; ++i) q->slots[i].wr.next = i + 1 < n ? &q->slots[i + 1].wr : nullptr;
  ibv_send_wr* bad = nullptr;
  return uroce_post_send(q->u, &q->slots[0].wr, &bad);
}
void wr_abort(ibv_qp_ex* x) { wr_start(x); }
void wr_bind_mw(ibv_qp_ex* x, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  if (ibv_send_wr* w = wr_begin(x, IBV_WR_BIND_MW)) {
    w->bind_mw.mw = mw;
    w->bind_mw.rkey = rkey;
    if (info) w->bind_mw.bind_info = *info;
  }
}
void wr_local_inv(ibv_qp_ex* x, uint32_t rkey) {
  if (ibv_send_wr* w = wr_begin(x, IBV_WR_LOCAL_INV)) w->invalidate_rkey = rkey;
}
// What uroce does not do: the batch fails at wr_complete with EOPNOTSUPP.
void wr_send_tso(ibv_qp_ex* x, void*, uint16_t, uint16_t) { wr_refuse(x); }
void wr_set_xrc_srqn(ibv_qp_ex* x, uint32_t srqn) {
  if (UQp::Slot* sl = wr_current(x)) sl->wr.qp_type.xrc.remote_srqn = srqn;
}

/// rdma-core 45's IBV_QP_EX_WITH_FLUSH.
constexpr uint64_t kQpExWithFlush = 1u << 11;
static_assert(offsetof(UQp, wr_flush) == sizeof(ibv_qp_ex), "wr_flush follows ibv_qp_ex, as in rdma-core 45");
/// The send operations uroce's QPs carry (ibv_qp_init_attr_ex.send_ops_flags).
constexpr uint64_t kSendOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                              IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                              IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                              IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_BIND_MW |
                              IBV_QP_EX_WITH_LOCAL_INV | kQpExWithFlush;

/// `xrcd`: an XRC target QP's domain (then pd is NULL).
UQp* make_qp(ibv_pd* pd, ibv_qp_init_attr* attr, ibv_xrcd* xrcd = nullptr, UIndTable* tbl = nullptr,
             const ibv_rx_hash_conf* hash = nullptr) {
  if (!attr) return fail_null<UQp>(EINVAL);
  if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD &&
      attr->qp_type != IBV_QPT_RAW_PACKET && attr->qp_type != IBV_QPT_XRC_SEND && attr->qp_type != IBV_QPT_XRC_RECV)
    return fail_null<UQp>(EOPNOTSUPP);  // driver QPs
  // An XRC send QP has no receive CQ; an XRC target has no PD and no CQs;
  // an RSS QP a PD and its table alone.
  if (tbl ? !pd
          : attr->qp_type == IBV_QPT_XRC_RECV
              ? !xrcd
              : !pd || !attr->send_cq || (!attr->recv_cq && attr->qp_type != IBV_QPT_XRC_SEND))
    return fail_null<UQp>(EINVAL);
  ibv_context* const context = pd ? pd->context : xrcd->context;
  uroce_qp_init_attr ia{};
  ia.send_cq = attr->send_cq && attr->qp_type != IBV_QPT_XRC_RECV ? ucq(attr->send_cq)->u : nullptr;
  ia.recv_cq = attr->recv_cq && attr->qp_type != IBV_QPT_XRC_RECV ? ucq(attr->recv_cq)->u : nullptr;
  ia.qp_type = attr->qp_type;
  ia.cap = attr->cap;
  ia.sq_sig_all = attr->sq_sig_all;
  ia.srq = attr->srq ? usrq(attr->srq)->u : nullptr;
  ia.xrcd = xrcd ? uxrcd(xrcd)->u : nullptr;
  std::vector<uroce_srq*> wqs;
  if (tbl) {
    ia.send_cq = ia.recv_cq = nullptr;
    for (UWq* w : tbl->wqs) wqs.push_back(w->u);
    ia.rss_log_size = static_cast<uint32_t>(std::countr_zero(wqs.size()));
    ia.rss_wqs = wqs.data();
    ia.rss_fields = hash->rx_hash_fields_mask;
    ia.rss_key = hash->rx_hash_key;
  }
  uroce_qp* u = uroce_create_qp(pd ? UPd::of(pd)->u : nullptr, &ia);
  if (!u) return fail_null<UQp>(errno ? errno : EINVAL);
  auto* q = new UQp();
  q->u = u;
  if (tbl) {
    std::lock_guard<std::mutex> lock(g_mu);
    ++tbl->qps;
    q->rss = tbl;
  }
  ibv_qp& qp = q->qp();
  qp.context = context;
  qp.qp_context = attr->qp_context;
  qp.pd = pd;
  qp.send_cq = attr->send_cq;
  qp.recv_cq = attr->recv_cq;
  qp.srq = attr->srq;
  qp.qp_num = uroce_qp_num(u);
  qp.state = IBV_QPS_RESET;
  qp.qp_type = attr->qp_type;
  pthread_mutex_init(&qp.mutex, nullptr);
  pthread_cond_init(&qp.cond, nullptr);
  // The caps the QP got (rounded up to the rings' sizes), as verbs reports them.
  ibv_qp_attr qa{};
  uroce_qp_init_attr got{};
  if (uroce_query_qp(u, &qa, IBV_QP_CAP, &got) == 0) attr->cap = got.cap;
  q->slots.resize(std::max<uint32_t>(attr->cap.max_send_wr, 1));
  ibv_qp_ex& x = q->x;
  x.comp_mask = 0;
  x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_send_tso = wr_send_tso;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_xrc_srqn = wr_set_xrc_srqn;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_atomic_write = wr_atomic_write;
  q->wr_flush = wr_flush;
  UContext* uc = ucontext(context);
  std::lock_guard<std::mutex> lk(uc->mu);
  uc->qps.emplace_back(u, &qp);
  return q;
}

ibv_qp* vctx_create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* a) {
  if (!context || !a) return fail_null<ibv_qp>(EINVAL);
  // An XRC target QP names its domain and no PD; every other QP a PD.
  ibv_xrcd* xrcd = (a->comp_mask & IBV_QP_INIT_ATTR_XRCD) ? a->xrcd : nullptr;
  if (a->qp_type == IBV_QPT_XRC_RECV ? !xrcd : (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || xrcd))
    return fail_null<ibv_qp>(EINVAL);
  // TSO and the rest: not uroce's.
  const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                         IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH;
  if (a->comp_mask & ~known) return fail_null<ibv_qp>(EOPNOTSUPP);
  UIndTable* tbl = nullptr;
  if (a->comp_mask & (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH)) {
    // RSS: a raw packet QP with both, a Toeplitz key of 40 bytes, and
    // fields of IPv4, IPv6, TCP and UDP (IPsec's SPI and inner headers: none).
    constexpr uint64_t kFields = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 |
                                 IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP |
                                 IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP;
    const ibv_rx_hash_conf& h = a->rx_hash_conf;
    if (!(a->comp_mask & IBV_QP_INIT_ATTR_IND_TABLE) || !(a->comp_mask & IBV_QP_INIT_ATTR_RX_HASH) ||
        !a->rwq_ind_tbl || a->qp_type != IBV_QPT_RAW_PACKET || a->srq)
      return fail_null<ibv_qp>(EINVAL);
    if (h.rx_hash_function != IBV_RX_HASH_FUNC_TOEPLITZ || (h.rx_hash_fields_mask & ~kFields))
      return fail_null<ibv_qp>(EOPNOTSUPP);
    if (h.rx_hash_key_len != 40 || !h.rx_hash_key) return fail_null<ibv_qp>(EINVAL);
    tbl = reinterpret_cast<UIndTable*>(a->rwq_ind_tbl);
  }
  if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags) return fail_null<ibv_qp>(EOPNOTSUPP);
  if ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (a->send_ops_flags & ~kSendOps))
    return fail_null<ibv_qp>(EOPNOTSUPP);  // TSO
  // ibv_qp_init_attr is the start of ibv_qp_init_attr_ex (rdma-core's own
  // ibv_create_qp_ex passes one as the other); make_qp writes the caps got.
  static_assert(offsetof(ibv_qp_init_attr_ex, sq_sig_all) == offsetof(ibv_qp_init_attr, sq_sig_all));
  UQp* q = make_qp(a->qp_type == IBV_QPT_XRC_RECV ? nullptr : a->pd, reinterpret_cast<ibv_qp_init_attr*>(a), xrcd, tbl,
                   tbl ? &a->rx_hash_conf : nullptr);
  return q ? &q->qp() : nullptr;
}

// ------------------------------------------------------------------- XRC

ibv_xrcd* vctx_open_xrcd(ibv_context* context, ibv_xrcd_init_attr* a) {
  if (!context || !a) return fail_null<ibv_xrcd>(EINVAL);
  if (a->comp_mask & ~static_cast<uint32_t>(IBV_XRCD_INIT_ATTR_RESERVED - 1)) return fail_null<ibv_xrcd>(EOPNOTSUPP);
  // As rdma-core's own ibv_cmd_open_xrcd: both the fd and the flags named.
  if (!(a->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(a->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
    return fail_null<ibv_xrcd>(EINVAL);
  if (a->oflags & ~(O_CREAT | O_EXCL)) return fail_null<ibv_xrcd>(EINVAL);
  uroce_xrcd* u = uroce_open_xrcd(ucontext(context)->u, a->fd, a->oflags);
  if (!u) return fail_null<ibv_xrcd>(errno ? errno : EINVAL);
  auto* x = new UXrcd();
  x->u = u;
  x->v.context = context;
  return &x->v;
}

int vctx_close_xrcd(ibv_xrcd* xrcd) {
  if (!xrcd) return fail(EINVAL);
  UXrcd* x = uxrcd(xrcd);
  if (const int rc = uroce_close_xrcd(x->u)) return fail(rc);
  delete x;
  return 0;
}

/// The SRQ handed out, over liburoce's.
ibv_srq* wrap_srq(ibv_context* context, ibv_pd* pd, uroce_srq* u, void* srq_context) {
  auto* q = new USrq();
  q->u = u;
  ibv_srq& s = q->v;
  s.context = context;
  s.srq_context = srq_context;
  s.pd = pd;
  pthread_mutex_init(&s.mutex, nullptr);
  pthread_cond_init(&s.cond, nullptr);
  return &s;
}

ibv_srq* vctx_create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* a) {
  if (!context || !a) return fail_null<ibv_srq>(EINVAL);
  const uint32_t known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                         IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
  if (a->comp_mask & ~known) return fail_null<ibv_srq>(EOPNOTSUPP);
  if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd) return fail_null<ibv_srq>(EINVAL);
  const ibv_srq_type type = (a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? a->srq_type : IBV_SRQT_BASIC;
  if (type == IBV_SRQT_TM) {
    // Tag matching: a CQ for its operations, and the list's size and depth.
    if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_TM) || !(a->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !a->cq)
      return fail_null<ibv_srq>(EINVAL);
    ibv_srq_init_attr ia{a->srq_context, a->attr};
    uroce_srq* u = uroce_create_tm_srq(UPd::of(a->pd)->u, ucq(a->cq)->u, &ia, a->tm_cap.max_num_tags, a->tm_cap.max_ops);
    if (!u) return fail_null<ibv_srq>(errno ? errno : EINVAL);
    a->attr = ia.attr;
    return wrap_srq(context, a->pd, u, a->srq_context);
  }
  if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) return fail_null<ibv_srq>(EINVAL);
  ibv_xrcd* xrcd = nullptr;
  ibv_cq* cq = nullptr;
  if (type == IBV_SRQT_XRC) {
    // XRC: its domain and the CQ its receives complete in, both required.
    if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !(a->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !a->xrcd || !a->cq)
      return fail_null<ibv_srq>(EINVAL);
    xrcd = a->xrcd;
    cq = a->cq;
  }
  ibv_srq_init_attr ia{a->srq_context, a->attr};
  uroce_srq* u = uroce_create_xrc_srq(UPd::of(a->pd)->u, xrcd ? uxrcd(xrcd)->u : nullptr, cq ? ucq(cq)->u : nullptr, &ia);
  if (!u) return fail_null<ibv_srq>(errno ? errno : EINVAL);
  a->attr = ia.attr;
  return wrap_srq(context, a->pd, u, a->srq_context);
}

int vctx_post_srq_ops(ibv_srq* srq, ibv_ops_wr* op, ibv_ops_wr** bad) {
  if (!srq) return EINVAL;
  return uroce_post_srq_ops(usrq(srq)->u, op, bad) ? (errno ? errno : EINVAL) : 0;
}

// ------------------------------------------------------ work queues and RSS

int wq_post_recv(ibv_wq* wq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return uroce_post_srq_recv(reinterpret_cast<UWq*>(wq)->u, wr, bad);
}

ibv_wq* vctx_create_wq(ibv_context* context, ibv_wq_init_attr* a) {
  if (!context || !a) return fail_null<ibv_wq>(EINVAL);
  if (a->wq_type != IBV_WQT_RQ) return fail_null<ibv_wq>(EOPNOTSUPP);
  if ((a->comp_mask & ~static_cast<uint32_t>(IBV_WQ_INIT_ATTR_FLAGS)) ||
      ((a->comp_mask & IBV_WQ_INIT_ATTR_FLAGS) && a->create_flags))
    return fail_null<ibv_wq>(EOPNOTSUPP);  // scatter FCS, VLAN stripping, delay drop, padding
  if (!a->pd || !a->cq || a->max_wr == 0) return fail_null<ibv_wq>(EINVAL);
  ibv_srq_init_attr ia{};
  ia.attr.max_wr = a->max_wr;
  ia.attr.max_sge = std::max<uint32_t>(a->max_sge, 1);
  uroce_srq* u = uroce_create_wq(UPd::of(a->pd)->u, ucq(a->cq)->u, &ia);
  if (!u) return fail_null<ibv_wq>(errno ? errno : EINVAL);
  auto* w = new UWq();
  w->u = u;
  ibv_wq& q = w->v;
  q.context = context;
  q.wq_context = a->wq_context;
  q.pd = a->pd;
  q.cq = a->cq;
  q.wq_num = uroce_srq_handle(u);
  q.handle = q.wq_num;
  q.state = IBV_WQS_RESET;
  q.wq_type = IBV_WQT_RQ;
  q.post_recv = wq_post_recv;
  a->max_wr = ia.attr.max_wr;  // the queue's real depth
  return &q;
}

int vctx_modify_wq(ibv_wq* wq, ibv_wq_attr* a) {
  if (!wq || !a) return EINVAL;
  if (a->attr_mask & ~static_cast<uint32_t>(IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE | IBV_WQ_ATTR_FLAGS))
    return EINVAL;
  if ((a->attr_mask & IBV_WQ_ATTR_FLAGS) && a->flags_mask) return EOPNOTSUPP;
  if ((a->attr_mask & IBV_WQ_ATTR_CURR_STATE) && a->curr_wq_state != wq->state) return EINVAL;
  if (a->attr_mask & IBV_WQ_ATTR_STATE) {
    // RESET and RDY. The queue takes frames from its creation (the state
    // is kept and reported, not enforced); ERR, which would flush, is refused.
    if (a->wq_state == IBV_WQS_ERR) return EOPNOTSUPP;
    if (a->wq_state != IBV_WQS_RESET && a->wq_state != IBV_WQS_RDY) return EINVAL;
    wq->state = a->wq_state;
  }
  return 0;
}

int vctx_destroy_wq(ibv_wq* wq) {
  if (!wq) return EINVAL;
  auto* w = reinterpret_cast<UWq*>(wq);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (w->tables) return EBUSY;
  }
  if (const int rc = uroce_destroy_srq(w->u)) return rc;
  pthread_cond_destroy(&wq->cond);
  pthread_mutex_destroy(&wq->mutex);
  delete w;
  return 0;
}

ibv_rwq_ind_table* vctx_create_rwq_ind_table(ibv_context* context, ibv_rwq_ind_table_init_attr* a) {
  if (!context || !a || !a->ind_tbl) return fail_null<ibv_rwq_ind_table>(EINVAL);
  if (a->comp_mask) return fail_null<ibv_rwq_ind_table>(EOPNOTSUPP);
  if (a->log_ind_tbl_size > UROCE_RSS_MAX_LOG) return fail_null<ibv_rwq_ind_table>(EINVAL);
  auto* t = new UIndTable();
  for (uint32_t i = 0; i < (1u << a->log_ind_tbl_size); ++i) {
    if (!a->ind_tbl[i] || a->ind_tbl[i]->context != context) {
      delete t;
      return fail_null<ibv_rwq_ind_table>(EINVAL);
    }
    t->wqs.push_back(reinterpret_cast<UWq*>(a->ind_tbl[i]));
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (UWq* w : t->wqs) ++w->tables;
  }
  t->v.context = context;
  static std::atomic<uint32_t> next{1};
  t->v.ind_tbl_handle = t->v.ind_tbl_num = next++;
  return &t->v;
}

int vctx_destroy_rwq_ind_table(ibv_rwq_ind_table* table) {
  if (!table) return EINVAL;
  auto* t = reinterpret_cast<UIndTable*>(table);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (t->qps) return EBUSY;
    for (UWq* w : t->wqs) --w->tables;
  }
  delete t;
  return 0;
}

int vctx_get_srq_num(ibv_srq* srq, uint32_t* num) {
  if (!srq || !num) return EINVAL;
  const std::uint32_t n = uroce_srq_num(usrq(srq)->u);
  if (n == 0) return EINVAL;  // a basic SRQ has none
  *num = n;
  return 0;
}

// The GID table: the port's address, as a RoCE v2 GID (IPv4-mapped for
// IPv4), at index 0.

}  // namespace

extern "C" {

// ---------------------------------------------------------------- devices

ibv_device** ibv_get_device_list(int* num_devices) {
  int n = 0;
  uroce_device** list = uroce_get_device_list(&n);
  if (!list) {
    if (num_devices) *num_devices = 0;
    return fail_null<ibv_device*>(errno ? errno : ENOMEM);
  }
  std::vector<ibv_device*> out;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    for (int i = 0; i < n; ++i) {
      const std::string path = uroce_get_device_path(list[i]);
      UDevice* d = nullptr;
      for (auto& k : g_devices)
        if (k->path == path) d = k.get();
      if (!d) {
        auto nd = std::make_unique<UDevice>();
        nd->path = path;
        nd->index = static_cast<int>(g_devices.size());
        nd->dev.node_type = IBV_NODE_CA;
        nd->dev.transport_type = IBV_TRANSPORT_IB;
        std::snprintf(nd->dev.name, sizeof nd->dev.name, "%s", uroce_get_device_name(list[i]));
        std::snprintf(nd->dev.dev_name, sizeof nd->dev.dev_name, "uroce%d", nd->index);
        // No sysfs: these name nothing, so sysfs reads fail cleanly.
        nd->dev.dev_path[0] = '\0';
        nd->dev.ibdev_path[0] = '\0';
        d = nd.get();
        g_devices.push_back(std::move(nd));
      }
      out.push_back(&d->dev);
    }
  }
  uroce_free_device_list(list);
  auto** arr = static_cast<ibv_device**>(std::calloc(out.size() + 1, sizeof(ibv_device*)));
  if (!arr) return fail_null<ibv_device*>(ENOMEM);
  for (std::size_t i = 0; i < out.size(); ++i) arr[i] = out[i];
  if (num_devices) *num_devices = static_cast<int>(out.size());
  return arr;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

int ibv_get_device_index(ibv_device* device) { return device ? udevice(device)->index : -1; }

__be64 ibv_get_device_guid(ibv_device* device) {
  if (!device) return 0;
  uroce_context* u = uroce_open_device(udevice(device)->path.c_str());
  if (!u) return 0;
  ibv_device_attr a{};
  const int rc = uroce_query_device(u, &a);
  uroce_close_device(u);
  return rc == 0 ? a.node_guid : 0;
}

namespace {
std::vector<UContext*>& g_contexts = *new std::vector<UContext*>;  // open ones, under g_mu
/// The file behind fd, as (device, inode); {0, 0} when fd is not open.
std::pair<dev_t, ino_t> file_id(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}
ibv_context* make_context(ibv_device* device, uroce_context* u, int cmd_fd);
}  // namespace

ibv_context* ibv_open_device(ibv_device* device) {
  if (!device) return fail_null<ibv_context>(EINVAL);
  uroce_context* u = uroce_open_device(udevice(device)->path.c_str());
  if (!u) return fail_null<ibv_context>(ENODEV);
  const int token = ::memfd_create("uroce-context", MFD_CLOEXEC);
  return make_context(device, u, token);
}

namespace {
ibv_dm* vctx_alloc_dm(ibv_context* c, ibv_alloc_dm_attr* a);
ibv_td* vctx_alloc_td(ibv_context* c, ibv_td_init_attr* a);
int vctx_dealloc_td(ibv_td* td);
ibv_pd* vctx_alloc_parent_domain(ibv_context* c, ibv_parent_domain_init_attr* a);
int vctx_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg, uint32_t n);
ibv_flow* vctx_create_flow(ibv_qp* qp, ibv_flow_attr* a);
int vctx_destroy_flow(ibv_flow* flow);
int vctx_free_dm(ibv_dm* dm);
ibv_mr* vctx_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t off, size_t len, unsigned int access);
}  // namespace

namespace {
ibv_context* make_context(ibv_device* device, uroce_context* u, int cmd_fd) {
  auto* c = new UContext();
  c->u = u;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_contexts.push_back(c);
  }
  verbs_context& v = c->v;
  v.sz = sizeof(verbs_context);
  v.query_port = vctx_query_port;
  v.query_device_ex = vctx_query_device_ex;
  v.query_rt_values = vctx_query_rt_values;
  v.create_qp_ex = vctx_create_qp_ex;
  v.open_xrcd = vctx_open_xrcd;
  v.close_xrcd = vctx_close_xrcd;
  v.create_srq_ex = vctx_create_srq_ex;
  v.post_srq_ops = vctx_post_srq_ops;
  v.get_srq_num = vctx_get_srq_num;
  v.create_wq = vctx_create_wq;
  v.modify_wq = vctx_modify_wq;
  v.destroy_wq = vctx_destroy_wq;
  v.create_rwq_ind_table = vctx_create_rwq_ind_table;
  v.destroy_rwq_ind_table = vctx_destroy_rwq_ind_table;
  v.create_cq_ex = vctx_create_cq_ex;
  v.alloc_dm = vctx_alloc_dm;
  v.free_dm = vctx_free_dm;
  v.reg_dm_mr = vctx_reg_dm_mr;
  v.alloc_td = vctx_alloc_td;
  v.dealloc_td = vctx_dealloc_td;
  v.alloc_parent_domain = vctx_alloc_parent_domain;
  v.advise_mr = vctx_advise_mr;
  v.ibv_create_flow = vctx_create_flow;
  v.ibv_destroy_flow = vctx_destroy_flow;
  ibv_context& ctx = v.context;
  ctx.device = device;
  ctx.cmd_fd = cmd_fd;
  ctx.async_fd = uroce_async_fd(u);
  ctx.num_comp_vectors = 1;
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  pthread_mutex_init(&ctx.mutex, nullptr);
  ctx.ops.post_send = op_post_send;
  ctx.ops.post_recv = op_post_recv;
  ctx.ops.post_srq_recv = op_post_srq_recv;
  ctx.ops.poll_cq = op_poll_cq;
  ctx.ops.req_notify_cq = op_req_notify_cq;
  ctx.ops.alloc_mw = op_alloc_mw;
  ctx.ops.dealloc_mw = op_dealloc_mw;
  ctx.ops.bind_mw = op_bind_mw;
  return &ctx;
}
}  // namespace

int ibv_close_device(ibv_context* context) {
  if (!context) return fail(EINVAL);
  UContext* c = ucontext(context);
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    std::erase(g_contexts, c);
    last = std::none_of(g_contexts.begin(), g_contexts.end(), [c](const UContext* o) { return o->u == c->u; });
  }
  const int rc = last ? uroce_close_device(c->u) : 0;
  if (context->cmd_fd >= 0) ::close(context->cmd_fd);
  pthread_mutex_destroy(&context->mutex);
  delete c;
  return rc;
}

/// A context on the session of the open context whose cmd_fd is (a
/// duplicate of) cmd_fd; it owns cmd_fd from here. Within this process
/// only: a descriptor from another process names no session here
/// (EOPNOTSUPP, docs/verbs.md).
ibv_context* ibv_import_device(int cmd_fd) {
  const auto id = file_id(cmd_fd);
  if (id.second == 0) return fail_null<ibv_context>(EBADF);
  UContext* from = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (UContext* c : g_contexts)
      if (file_id(c->v.context.cmd_fd) == id) from = c;
  }
  if (!from) return fail_null<ibv_context>(EOPNOTSUPP);
  return make_context(from->v.context.device, from->u, cmd_fd);
}

int ibv_query_device(ibv_context* context, ibv_device_attr* device_attr) {
  if (!context || !device_attr) return fail(EINVAL);
  if (const int rc = uroce_query_device(ucontext(context)->u, device_attr)) return fail(rc);
  device_attr->vendor_id = 0xffffff;  // no vendor's: the value rxe reports
  device_attr->vendor_part_id = 0;
  return 0;
}

int uroce_impl_ibv_query_port(ibv_context* context, uint8_t port_num, _compat_ibv_port_attr* port_attr) {
  // Older programs' struct: everything before `flags`, never more.
  return vctx_query_port(context, port_num, reinterpret_cast<ibv_port_attr*>(port_attr),
                         offsetof(ibv_port_attr, flags));
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  if (!context || !gid) return fail(EINVAL);
  if (const int rc = uroce_query_gid(ucontext(context)->u, port_num, index, gid)) return fail(rc);
  return 0;
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size) {
  if (!context || !entry || flags || entry_size < sizeof(ibv_gid_entry) || port_num > 255) return fail(EINVAL);
  if (port_num != 1) return fail(EINVAL);
  if (gid_index != 0) return fail(ENODATA);  // empty, or past the table: no GID there
  ibv_gid_entry e{};
  if (const int rc = ibv_query_gid(context, static_cast<uint8_t>(port_num), static_cast<int>(gid_index), &e.gid))
    return rc;
  e.gid_index = gid_index;
  e.port_num = port_num;
  e.gid_type = IBV_GID_TYPE_ROCE_V2;
  // The host netdev, where the daemon gives the kernel one (named as the
  // device: docs/deploy.md); 0 (none) otherwise.
  e.ndev_ifindex = if_nametoindex(context->device->name);
  std::memcpy(entry, &e, sizeof e);
  return 0;
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                             size_t entry_size) {
  if (!context || (!entries && max_entries) || flags || entry_size < sizeof(ibv_gid_entry)) {
    errno = EINVAL;
    return -EINVAL;
  }
  if (max_entries < 1) {  // fewer entries than the table holds GIDs
    errno = EINVAL;
    return -EINVAL;
  }
  // The populated entries only: index 0.
  if (const int rc = _ibv_query_gid_ex(context, 1, 0, entries, 0, entry_size)) return -rc;
  return 1;
}

int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, ibv_gid_type_sysfs* type) {
  if (!context || !type || port_num != 1 || index != 0) return fail(EINVAL);  // an empty entry has no type
  *type = IBV_GID_TYPE_SYSFS_ROCE_V2;
  return 0;
}

int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  if (!context || !pkey || port_num != 1 || index != 0) return fail(EINVAL);
  *pkey = htobe16(0xffff);  // the default partition, full member
  return 0;
}

int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (!context || port_num != 1) return fail(EINVAL), -1;
  if ((be16toh(pkey) & 0x7fff) != 0x7fff) return fail(ENOENT), -1;
  return 0;
}

int ibv_read_sysfs_file(const char*, const char*, char*, size_t) {
  errno = ENOENT;  // no sysfs for uroce devices
  return -1;
}

const char* ibv_get_sysfs_path(void) { return "/sys"; }

// -------------------------------------------------------------------- PDs

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (!context) return fail_null<ibv_pd>(EINVAL);
  uroce_pd* u = uroce_alloc_pd(ucontext(context)->u);
  if (!u) return fail_null<ibv_pd>(errno ? errno : ENOMEM);
  auto* p = new UPd();
  p->u = u;
  p->v.context = context;
  p->v.handle = export_handle(ucontext(context)->u, p, Exp::kPd);
  return &p->v;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  if (!pd) return fail(EINVAL);
  auto* p = UPd::of(pd);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_parent_domains.erase(pd)) {  // a parent domain: its PD is not its own
      delete p;
      return 0;
    }
  }
  if (const int rc = uroce_dealloc_pd(p->u)) return fail(rc);
  unexport(pd->handle);
  delete p;
  return 0;
}

// An imported PD or MR is a second wrapper of the same liburoce object;
// unimporting frees the wrapper only (the object is its exporter's).
ibv_pd* ibv_import_pd(ibv_context* context, uint32_t pd_handle) {
  if (!context) return fail_null<ibv_pd>(EINVAL);
  auto* from = static_cast<UPd*>(find_exported(ucontext(context)->u, pd_handle, Exp::kPd));
  if (!from || from->v.handle != pd_handle) return fail_null<ibv_pd>(EINVAL);
  auto* p = new UPd();
  p->u = from->u;
  p->v.context = context;
  p->v.handle = pd_handle;
  return &p->v;
}
void ibv_unimport_pd(ibv_pd* pd) { delete UPd::of(pd); }

// ------------------------------------------------------------- strings

const char* ibv_node_type_str(enum ibv_node_type t) {
  switch (t) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    default: return "unknown";
  }
}

const char* ibv_port_state_str(enum ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "no state change (NOP)";
    case IBV_PORT_DOWN: return "down";
    case IBV_PORT_INIT: return "init";
    case IBV_PORT_ARMED: return "armed";
    case IBV_PORT_ACTIVE: return "active";
    case IBV_PORT_ACTIVE_DEFER: return "active defer";
    default: return "unknown";
  }
}

const char* ibv_event_type_str(enum ibv_event_type e) {
  switch (e) {
    case IBV_EVENT_CQ_ERR: return "CQ error";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
    case IBV_EVENT_COMM_EST: return "communication established";
    case IBV_EVENT_SQ_DRAINED: return "send queue drained";
    case IBV_EVENT_PATH_MIG: return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_LID_CHANGE: return "LID change";
    case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
    case IBV_EVENT_SM_CHANGE: return "SM change";
    case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
    case IBV_EVENT_GID_CHANGE: return "GID table change";
    case IBV_EVENT_WQ_FATAL: return "WQ fatal";
    default: return "unknown";
  }
}

// What rdma-core's library prints (logs of unmodified programs read the
// same on uroce as on rxe); liburoce's own names (uroce_wc_status_str) are
// the short enum names its tools print.
const char* ibv_wc_status_str(enum ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR: return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR: return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR: return "local access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR: return "aborted error";
    case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
    case IBV_WC_FATAL_ERR: return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout error";
    case IBV_WC_GENERAL_ERR: return "general error";
    case IBV_WC_TM_ERR: return "TM error";
    case IBV_WC_TM_RNDV_INCOMPLETE: return "TM software rendezvous";
    default: return "unknown";
  }
}

// --------------------------------------------------------------- rates

namespace {
struct RateRow {
  ibv_rate rate;
  int mult;  // of 2.5 Gb/s; 0 where it is not a multiple
  int mbps;
};
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},     {IBV_RATE_5_GBPS, 2, 5000},       {IBV_RATE_10_GBPS, 4, 10000},
    {IBV_RATE_20_GBPS, 8, 20000},     {IBV_RATE_30_GBPS, 12, 30000},    {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},    {IBV_RATE_80_GBPS, 32, 80000},    {IBV_RATE_120_GBPS, 48, 120000},
    {IBV_RATE_14_GBPS, 0, 14062},     {IBV_RATE_56_GBPS, 0, 56250},     {IBV_RATE_112_GBPS, 0, 112500},
    {IBV_RATE_168_GBPS, 0, 168750},   {IBV_RATE_25_GBPS, 0, 25781},     {IBV_RATE_100_GBPS, 0, 103125},
    {IBV_RATE_200_GBPS, 0, 206250},   {IBV_RATE_300_GBPS, 0, 309375},   {IBV_RATE_28_GBPS, 0, 28125},
    {IBV_RATE_50_GBPS, 0, 53125},     {IBV_RATE_400_GBPS, 0, 425000},   {IBV_RATE_600_GBPS, 0, 637500},
    {IBV_RATE_800_GBPS, 0, 850000},   {IBV_RATE_1200_GBPS, 0, 1275000},
};
}  // namespace

int ibv_rate_to_mult(enum ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate && r.mult) return r.mult;
  return -1;
}

enum ibv_rate mult_to_ibv_rate(int mult) {
  for (const RateRow& r : kRates)
    if (r.mult && r.mult == mult) return r.rate;
  return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(enum ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

enum ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const RateRow& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

// ---------------------------------------------------------------- fork

// Registered memory is shared memfds; liburoce's fork handlers give a child
// its own copy (as a kernel with fork-safe pinning does): nothing to prepare.
int ibv_fork_init(void) { return 0; }
enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
int ibv_dontfork_range(void*, size_t) { return 0; }
int ibv_dofork_range(void*, size_t) { return 0; }

// ------------------------------------------------- MRs

static uroce_context* UContext_of_pd(ibv_pd* pd) { return ucontext(pd->context)->u; }

static ibv_mr* reg_mr_at(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  if (!pd) return fail_null<ibv_mr>(EINVAL);
  uroce_mr* u = uroce_reg_mr_iova(UPd::of(pd)->u, addr, length, iova, access);
  if (!u) return fail_null<ibv_mr>(errno ? errno : EINVAL);
  auto* m = new UMr();
  m->u = u;
  m->v.context = pd->context;
  m->v.pd = pd;
  m->v.addr = addr;
  m->v.length = length;
  m->v.lkey = uroce_mr_lkey(u);
  m->v.rkey = uroce_mr_rkey(u);
  m->v.handle = export_handle(UContext_of_pd(pd), m, Exp::kMr);
  if (access & IBV_ACCESS_ON_DEMAND) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_odp_mrs[m->v.lkey] = &m->v;
  }
  return &m->v;
}
ibv_mr* uroce_impl_ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return reg_mr_at(pd, addr, length, reinterpret_cast<uintptr_t>(addr), access);
}
ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  if (access & IBV_ACCESS_OPTIONAL_RANGE) access &= ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);
  return reg_mr_at(pd, addr, length, iova, static_cast<int>(access));
}
ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

// ------------------------------------------------- device memory
}  // extern "C"
namespace {

// Thread domains and parent domains. A thread domain promises that one
// thread uses what is made in it; uroce's posts take no lock anyway, so it
// changes nothing. A parent domain is a PD (every verb that takes one takes
// it) with a thread domain and the application's allocators for the
// provider's buffers; uroce's queues are the daemon's shared memory, which
// those allocators cannot provide, so they are never called.
ibv_td* vctx_alloc_td(ibv_context* c, ibv_td_init_attr* a) {
  if (!c || !a || a->comp_mask != 0) return fail_null<ibv_td>(EINVAL);
  auto* td = new ibv_td();
  td->context = c;
  return td;
}
int vctx_dealloc_td(ibv_td* td) {
  delete td;
  return 0;
}
// ibv_advise_mr: each range must lie in an ODP MR of the PD. A prefetch
// faults the pages in now (for writing, with PREFETCH_WRITE), so that the
// accesses to come find them; NO_FAULT has nothing to do, as an ODP access
// here is never stalled on a page that is there.
// Flow rules (ibv_create_flow) for raw packet QPs: the specs of the
// ethernet, IPv4 (and its extended form), IPv6, TCP and UDP layers, each
// value under its mask, turned into uroce's match key. A layer implies the
// one below it (an IPv4 spec, the IPv4 ethertype; a UDP spec, protocol
// 17), as the kernel's do. What the key cannot match (TTL, hop limit, flow
// label, inner headers, tunnels, actions) is EOPNOTSUPP, never ignored.
int flow_key_from_specs(const ibv_flow_attr* a, uroce_flow_key& v, uroce_flow_key& m) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(a + 1);
  // Each spec says its size, as rdma-core's own walk reads them (the attr's
  // `size` is not filled in by every caller: pyverbs leaves it 0).
  const auto* end = p + 4096;
  const auto set = [](std::uint8_t* vf, std::uint8_t* mf, const void* val, const void* mask, std::size_t n) {
    const auto* vv = static_cast<const std::uint8_t*>(val);
    const auto* mm = static_cast<const std::uint8_t*>(mask);
    for (std::size_t i = 0; i < n; ++i) {
      vf[i] = static_cast<std::uint8_t>((vf[i] & ~mm[i]) | (vv[i] & mm[i]));
      mf[i] |= mm[i];
    }
  };
  const auto exact = [&](std::uint8_t* vf, std::uint8_t* mf, std::initializer_list<std::uint8_t> bytes) {
    std::size_t i = 0;
    for (std::uint8_t b : bytes) {
      vf[i] = b;
      mf[i++] = 0xff;
    }
  };
  const std::uint8_t v4map[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const std::uint8_t ones[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  for (unsigned i = 0; i < a->num_of_specs; ++i) {
    ibv_flow_spec_type type;
    std::uint16_t size;
    if (p + sizeof(ibv_flow_spec_type) + 2 > end) return EINVAL;
    std::memcpy(&type, p, sizeof type);
    std::memcpy(&size, p + offsetof(ibv_flow_spec_eth, size), 2);
    if (size == 0 || p + size > end) return EINVAL;
    switch (static_cast<unsigned>(type)) {
      case IBV_FLOW_SPEC_ETH: {
        ibv_flow_spec_eth s{};
        if (size < sizeof s) return EINVAL;
        std::memcpy(&s, p, sizeof s);
        set(v.dmac, m.dmac, s.val.dst_mac, s.mask.dst_mac, 6);
        set(v.smac, m.smac, s.val.src_mac, s.mask.src_mac, 6);
        set(v.ethertype, m.ethertype, &s.val.ether_type, &s.mask.ether_type, 2);
        set(v.vlan, m.vlan, &s.val.vlan_tag, &s.mask.vlan_tag, 2);
        break;
      }
      case IBV_FLOW_SPEC_IPV4:
      case IBV_FLOW_SPEC_IPV4_EXT: {
        ibv_flow_spec_ipv4_ext s{};
        const std::size_t need = type == IBV_FLOW_SPEC_IPV4 ? sizeof(ibv_flow_spec_ipv4) : sizeof s;
        if (size < need) return EINVAL;
        if (type == IBV_FLOW_SPEC_IPV4) {
          ibv_flow_spec_ipv4 b{};
          std::memcpy(&b, p, sizeof b);
          s.val.src_ip = b.val.src_ip;
          s.val.dst_ip = b.val.dst_ip;
          s.mask.src_ip = b.mask.src_ip;
          s.mask.dst_ip = b.mask.dst_ip;
        } else {
          std::memcpy(&s, p, sizeof s);
          if (s.mask.ttl || s.mask.flags) return EOPNOTSUPP;
        }
        exact(v.ethertype, m.ethertype, {0x08, 0x00});
        set(v.src_ip, m.src_ip, v4map, ones, 12);
        set(v.dst_ip, m.dst_ip, v4map, ones, 12);
        set(v.src_ip + 12, m.src_ip + 12, &s.val.src_ip, &s.mask.src_ip, 4);
        set(v.dst_ip + 12, m.dst_ip + 12, &s.val.dst_ip, &s.mask.dst_ip, 4);
        set(&v.ip_proto, &m.ip_proto, &s.val.proto, &s.mask.proto, 1);
        set(&v.tos, &m.tos, &s.val.tos, &s.mask.tos, 1);
        break;
      }
      case IBV_FLOW_SPEC_IPV6: {
        ibv_flow_spec_ipv6 s{};
        if (size < sizeof s) return EINVAL;
        std::memcpy(&s, p, sizeof s);
        if (s.mask.flow_label || s.mask.hop_limit) return EOPNOTSUPP;
        exact(v.ethertype, m.ethertype, {0x86, 0xdd});
        set(v.src_ip, m.src_ip, s.val.src_ip, s.mask.src_ip, 16);
        set(v.dst_ip, m.dst_ip, s.val.dst_ip, s.mask.dst_ip, 16);
        set(&v.ip_proto, &m.ip_proto, &s.val.next_hdr, &s.mask.next_hdr, 1);
        set(&v.tos, &m.tos, &s.val.traffic_class, &s.mask.traffic_class, 1);
        break;
      }
      case IBV_FLOW_SPEC_TCP:
      case IBV_FLOW_SPEC_UDP: {
        ibv_flow_spec_tcp_udp s{};
        if (size < sizeof s) return EINVAL;
        std::memcpy(&s, p, sizeof s);
        exact(&v.ip_proto, &m.ip_proto, {static_cast<std::uint8_t>(type == IBV_FLOW_SPEC_TCP ? 6 : 17)});
        set(v.sport, m.sport, &s.val.src_port, &s.mask.src_port, 2);
        set(v.dport, m.dport, &s.val.dst_port, &s.mask.dst_port, 2);
        break;
      }
      default: return EOPNOTSUPP;  // inner headers, tunnels, ESP, MPLS, actions
    }
    p += size;
  }
  return 0;
}

struct UFlow {
  ibv_flow v{};
  std::uint32_t handle = 0;
};

ibv_flow* vctx_create_flow(ibv_qp* qp, ibv_flow_attr* a) {
  if (!qp || !a || a->comp_mask) return fail_null<ibv_flow>(EINVAL);
  if (qp->qp_type != IBV_QPT_RAW_PACKET) return fail_null<ibv_flow>(EINVAL);
  if (a->type != IBV_FLOW_ATTR_NORMAL || a->flags) return fail_null<ibv_flow>(EOPNOTSUPP);
  if (a->port != 1) return fail_null<ibv_flow>(EINVAL);
  uroce_flow_key v{}, m{};
  if (const int rc = flow_key_from_specs(a, v, m)) return fail_null<ibv_flow>(rc);
  auto* f = new UFlow();
  if (const int rc = uroce_create_flow(uqp(qp)->u, a->priority, &v, &m, &f->handle)) {
    delete f;
    return fail_null<ibv_flow>(rc);
  }
  f->v.context = qp->context;
  f->v.handle = f->handle;
  return &f->v;
}

int vctx_destroy_flow(ibv_flow* flow) {
  if (!flow) return EINVAL;
  auto* f = reinterpret_cast<UFlow*>(flow);
  const int rc = uroce_destroy_flow(ucontext(flow->context)->u, f->handle);
  if (rc == 0) delete f;
  return rc;
}

int vctx_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg, uint32_t n) {
  if (!pd || !sg || n == 0 || (flags & ~static_cast<uint32_t>(IBV_ADVISE_MR_FLAG_FLUSH))) return EINVAL;
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (uint32_t i = 0; i < n; ++i) {
      const auto it = g_odp_mrs.find(sg[i].lkey);
      if (it == g_odp_mrs.end() || (it->second->pd != pd && UPd::of(it->second->pd)->u != UPd::of(pd)->u)) return EINVAL;
      const ibv_mr* mr = it->second;
      const auto base = reinterpret_cast<std::uintptr_t>(mr->addr);
      const bool implicit = mr->addr == nullptr && mr->length == SIZE_MAX;
      if (!implicit && (sg[i].addr < base || sg[i].length > mr->length || sg[i].addr - base > mr->length - sg[i].length))
        return EINVAL;
    }
  }
  if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) return 0;
  const int how = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
  for (uint32_t i = 0; i < n; ++i) {
    if (sg[i].length == 0) continue;
    const std::uintptr_t from = sg[i].addr & ~std::uintptr_t{4095};
    const std::uintptr_t to = (sg[i].addr + sg[i].length + 4095) & ~std::uintptr_t{4095};
    if (::madvise(reinterpret_cast<void*>(from), to - from, how) != 0 && errno != EINVAL &&
        (flags & IBV_ADVISE_MR_FLAG_FLUSH))
      return errno;  // a synchronous prefetch of pages that are not there (an older kernel: EINVAL, a hint only)
  }
  return 0;
}

ibv_pd* vctx_alloc_parent_domain(ibv_context* c, ibv_parent_domain_init_attr* a) {
  constexpr std::uint32_t kKnown = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  if (!c || !a || !a->pd || (a->comp_mask & ~kKnown) || a->pd->context != c) return fail_null<ibv_pd>(EINVAL);
  if ((a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) && (!a->alloc || !a->free)) return fail_null<ibv_pd>(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_parent_domains.count(a->pd)) return fail_null<ibv_pd>(EINVAL);  // a parent domain's PD is a plain PD
  auto* p = new UPd();
  p->u = UPd::of(a->pd)->u;
  p->v.context = c;
  p->v.handle = a->pd->handle;
  g_parent_domains.insert(&p->v);
  return &p->v;
}

// A software device has no memory on a chip: a DM is the process's own
// memory (private until an MR is registered over it, then shared with the
// daemon like any MR's), with the rules of a NIC's DM that programs are
// written to: at most kMaxDm bytes each, copies at 4-byte aligned offsets
// and lengths, MRs over it zero-based (IBV_ACCESS_ZERO_BASED).
struct UDm {
  ibv_dm v{};
  std::uint8_t* base = nullptr;
  std::size_t len = 0, map_len = 0;
  int mrs = 0;  // MRs registered over it (free_dm is EBUSY meanwhile); under g_mu
  bool imported = false;  // ibv_import_dm's: the memory is another UDm's
};
UDm* udm(ibv_dm* dm) { return reinterpret_cast<UDm*>(dm); }
std::map<ibv_mr*, UDm*>& g_dm_mrs = *new std::map<ibv_mr*, UDm*>;  // under g_mu
std::set<ibv_mr*>& g_imported_mrs = *new std::set<ibv_mr*>;     // ibv_import_mr's; under g_mu

bool dm_range_ok(const UDm* d, uint64_t off, size_t len) {
  return (off & 3) == 0 && (len & 3) == 0 && off <= d->len && len <= d->len - off;
}
int dm_memcpy_to(ibv_dm* dm, uint64_t off, const void* src, size_t len) {
  UDm* d = udm(dm);
  if (!src || !dm_range_ok(d, off, len)) return EINVAL;
  std::memcpy(d->base + off, src, len);
  return 0;
}
int dm_memcpy_from(void* dst, ibv_dm* dm, uint64_t off, size_t len) {
  UDm* d = udm(dm);
  if (!dst || !dm_range_ok(d, off, len)) return EINVAL;
  std::memcpy(dst, d->base + off, len);
  return 0;
}
ibv_dm* vctx_alloc_dm(ibv_context* c, ibv_alloc_dm_attr* a) {
  if (!c || !a || a->comp_mask != 0 || a->length == 0 || a->length > kMaxDm || a->log_align_req > 12)
    return fail_null<ibv_dm>(EINVAL);  // page alignment at most
  auto* d = new UDm();
  d->len = a->length;
  d->map_len = (a->length + 4095) & ~std::size_t{4095};
  void* p = ::mmap(nullptr, d->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    delete d;
    return fail_null<ibv_dm>(ENOMEM);
  }
  d->base = static_cast<std::uint8_t*>(p);
  d->v.context = c;
  d->v.memcpy_to_dm = dm_memcpy_to;
  d->v.memcpy_from_dm = dm_memcpy_from;
  d->v.handle = export_handle(ucontext(c)->u, d, Exp::kDm);
  return &d->v;
}
int vctx_free_dm(ibv_dm* dm) {
  UDm* d = udm(dm);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (d->mrs > 0) return EBUSY;  // an MR still covers it
  }
  unexport(dm->handle);
  ::munmap(d->base, d->map_len);
  delete d;
  return 0;
}
ibv_mr* vctx_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t off, size_t len, unsigned int access) {
  if (!pd || !dm || !(access & IBV_ACCESS_ZERO_BASED)) return fail_null<ibv_mr>(EINVAL);
  UDm* d = udm(dm);
  if (off > d->len || len > d->len - off) return fail_null<ibv_mr>(EINVAL);
  // Zero-based: the MR's address 0 is the DM's byte `off`.
  ibv_mr* mr = reg_mr_at(pd, d->base + off, len, 0, static_cast<int>(access & ~unsigned{IBV_ACCESS_ZERO_BASED}));
  if (!mr) return nullptr;
  mr->addr = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  ++d->mrs;
  g_dm_mrs[mr] = d;
  return mr;
}
}  // namespace
extern "C" {

// ------------------------------------------------- not built yet: clean refusals

ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) { return fail_null<ibv_mr>(EOPNOTSUPP); }
// As libibverbs checks the input (IBV_REREG_MR_ERR_INPUT) before the
// provider's command (IBV_REREG_MR_ERR_CMD), errno saying why either way.
int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  const auto input = [] {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  };
  if (!mr) return input();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_dm_mrs.count(mr) || g_imported_mrs.count(mr)) return input();  // not an MR of the application's memory
  }
  if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) return input();
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) return input();
  if (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) return input();
  // The PD counts only with CHANGE_PD (pyverbs passes whatever it has).
  const bool new_pd = (flags & IBV_REREG_MR_CHANGE_PD) != 0;
  if (new_pd && (!pd || pd->context != mr->context)) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_CMD;
  }
  auto* m = UMr::of(mr);
  if (const int rc = uroce_rereg_mr(m->u, flags, new_pd ? UPd::of(pd)->u : nullptr, addr, length, access)) {
    errno = rc;
    return IBV_REREG_MR_ERR_CMD;
  }
  if (new_pd) mr->pd = pd;
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    mr->addr = addr;
    mr->length = length;
  }
  mr->lkey = uroce_mr_lkey(m->u);
  mr->rkey = uroce_mr_rkey(m->u);
  return 0;
}
int ibv_dereg_mr(ibv_mr* mr) {
  if (!mr) return fail(EINVAL);
  auto* m = UMr::of(mr);
  if (const int rc = uroce_dereg_mr(m->u)) return fail(rc);
  unexport(mr->handle);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (const auto it = g_dm_mrs.find(mr); it != g_dm_mrs.end()) {
      --it->second->mrs;
      g_dm_mrs.erase(it);
    }
    if (const auto it = g_odp_mrs.find(mr->lkey); it != g_odp_mrs.end() && it->second == mr) g_odp_mrs.erase(it);
  }
  delete m;
  return 0;
}
ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (!pd) return fail_null<ibv_mr>(EINVAL);
  auto* from = static_cast<UMr*>(find_exported(UContext_of_pd(pd), mr_handle, Exp::kMr));
  if (!from || from->v.handle != mr_handle) return fail_null<ibv_mr>(EINVAL);
  auto* m = new UMr();
  m->u = from->u;
  m->v = from->v;
  m->v.context = pd->context;
  m->v.pd = pd;
  std::lock_guard<std::mutex> lock(g_mu);
  g_imported_mrs.insert(&m->v);
  return &m->v;
}
void ibv_unimport_mr(ibv_mr* mr) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_imported_mrs.erase(mr);
  }
  delete UMr::of(mr);
}
ibv_dm* ibv_import_dm(ibv_context* context, uint32_t dm_handle) {
  if (!context) return fail_null<ibv_dm>(EINVAL);
  auto* from = static_cast<UDm*>(find_exported(ucontext(context)->u, dm_handle, Exp::kDm));
  if (!from || from->v.handle != dm_handle) return fail_null<ibv_dm>(EINVAL);
  auto* d = new UDm(*from);
  d->v.context = context;
  d->mrs = 0;
  d->imported = true;
  return &d->v;
}
void ibv_unimport_dm(ibv_dm* dm) {
  if (dm && udm(dm)->imported) delete udm(dm);
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  if (!context) return fail_null<ibv_comp_channel>(EINVAL);
  uroce_comp_channel* u = uroce_create_comp_channel(ucontext(context)->u);
  if (!u) return fail_null<ibv_comp_channel>(errno ? errno : ENOMEM);
  auto* c = new UChannel();
  c->u = u;
  c->v.context = context;
  c->v.fd = uroce_comp_channel_fd(u);  // a real descriptor: poll, epoll and O_NONBLOCK work on it
  c->v.refcnt = 0;
  return &c->v;
}
int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (!channel) return fail(EINVAL);
  auto* c = UChannel::of(channel);
  if (const int rc = uroce_destroy_comp_channel(c->u)) return fail(rc);
  delete c;
  return 0;
}

ibv_cq* uroce_impl_ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                                 int comp_vector) {
  UCq* c = make_cq(context, cqe, cq_context, channel, comp_vector);
  return c ? &c->cq() : nullptr;
}
int uroce_impl_ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (!cq) return fail(EINVAL);
  UCq* c = ucq(cq);
  if (const int rc = uroce_resize_cq(c->u, cqe)) return fail(rc);
  c->cq().cqe = uroce_cq_capacity(c->u);
  return 0;
}
int uroce_impl_ibv_destroy_cq(ibv_cq* cq) {
  if (!cq) return fail(EINVAL);
  UCq* c = ucq(cq);
  if (const int rc = uroce_destroy_cq(c->u)) return fail(rc);
  UContext* uc = ucontext(cq->context);
  {
    std::lock_guard<std::mutex> lk(uc->mu);
    std::erase_if(uc->cqs, [&](const auto& e) { return e.second == cq; });
  }
  pthread_cond_destroy(&cq->cond);
  pthread_mutex_destroy(&cq->mutex);
  delete c;
  return 0;
}
int uroce_impl_ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  if (!channel || !cq) return fail(EINVAL), -1;
  uroce_cq* u = nullptr;
  void* ours = nullptr;
  if (uroce_get_cq_event(UChannel::of(channel)->u, &u, &ours) != 0) return -1;  // errno set
  UCq* c = static_cast<UCq*>(ours);
  *cq = &c->cq();
  if (cq_context) *cq_context = c->cq().cq_context;
  return 0;
}
void uroce_impl_ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (cq) uroce_ack_cq_events(ucq(cq)->u, nevents);
}

int uroce_impl_ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  if (!context || !event) return fail(EINVAL), -1;
  UContext* uc = ucontext(context);
  uroce_async_event e{};
  if (uroce_get_async_event(uc->u, &e) != 0) return -1;  // errno set
  *event = ibv_async_event{};
  event->event_type = e.event_type;
  std::lock_guard<std::mutex> lk(uc->mu);
  for (const auto& [u, v] : uc->cqs)
    if (u == e.cq) event->element.cq = v;
  for (const auto& [u, v] : uc->qps)
    if (u == e.qp) event->element.qp = v;
  if (e.event_type == IBV_EVENT_PORT_ACTIVE || e.event_type == IBV_EVENT_PORT_ERR) event->element.port_num = e.port_num;
  return 0;
}
void uroce_impl_ibv_ack_async_event(ibv_async_event*) {}

ibv_srq* uroce_impl_ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!pd || !attr) return fail_null<ibv_srq>(EINVAL);
  uroce_srq* u = uroce_create_srq(UPd::of(pd)->u, attr);
  if (!u) return fail_null<ibv_srq>(errno ? errno : EINVAL);
  return wrap_srq(pd->context, pd, u, attr->srq_context);
}
int uroce_impl_ibv_modify_srq(ibv_srq*, ibv_srq_attr*, int) { return fail(EOPNOTSUPP); }
int uroce_impl_ibv_query_srq(ibv_srq*, ibv_srq_attr*) { return fail(EOPNOTSUPP); }
int uroce_impl_ibv_destroy_srq(ibv_srq* srq) {
  if (!srq) return fail(EINVAL);
  USrq* q = usrq(srq);
  if (const int rc = uroce_destroy_srq(q->u)) return fail(rc);
  pthread_cond_destroy(&srq->cond);
  pthread_mutex_destroy(&srq->mutex);
  delete q;
  return 0;
}

ibv_qp* uroce_impl_ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  UQp* q = make_qp(pd, attr);
  return q ? &q->qp() : nullptr;
}
int uroce_impl_ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  if (!qp || !attr) return fail(EINVAL);
  uroce_qp_init_attr got{};
  if (const int rc = uroce_query_qp(uqp(qp)->u, attr, attr_mask, &got)) return fail(rc);
  if (init_attr) {
    *init_attr = ibv_qp_init_attr{};
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->srq = qp->srq;
    init_attr->cap = got.cap;
    init_attr->qp_type = qp->qp_type;
    init_attr->sq_sig_all = got.sq_sig_all;
  }
  return 0;
}
int uroce_impl_ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  if (!qp || !attr) return fail(EINVAL);
  if (const int rc = uroce_modify_qp(uqp(qp)->u, attr, attr_mask)) return fail(rc);
  if (attr_mask & IBV_QP_STATE) qp->state = attr->qp_state;
  return 0;
}
int uroce_impl_ibv_destroy_qp(ibv_qp* qp) {
  if (!qp) return fail(EINVAL);
  UQp* q = uqp(qp);
  if (const int rc = uroce_destroy_qp(q->u)) return fail(rc);
  if (q->rss) {
    std::lock_guard<std::mutex> lock(g_mu);
    --q->rss->qps;
  }
  UContext* uc = ucontext(qp->context);
  {
    std::lock_guard<std::mutex> lk(uc->mu);
    std::erase_if(uc->qps, [&](const auto& e) { return e.second == qp; });
  }
  pthread_cond_destroy(&qp->cond);
  pthread_mutex_destroy(&qp->mutex);
  delete q;
  return 0;
}
ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) { return qp ? &uqp(qp)->x : fail_null<ibv_qp_ex>(EINVAL); }
int ibv_query_qp_data_in_order(ibv_qp*, enum ibv_wr_opcode, uint32_t) { return 0; }  // no guarantee given
int ibv_query_ece(ibv_qp*, ibv_ece*) { return fail(EOPNOTSUPP); }
int ibv_set_ece(ibv_qp*, ibv_ece*) { return fail(EOPNOTSUPP); }
// The LID is IB's: RoCE addresses a group by its GID alone.
int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  if (!qp || !gid) return fail(EINVAL);
  const int rc = uroce_mcast(uqp(qp)->u, gid, 1);
  return rc ? fail(rc) : 0;
}
int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  if (!qp || !gid) return fail(EINVAL);
  const int rc = uroce_mcast(uqp(qp)->u, gid, 0);
  return rc ? fail(rc) : 0;
}

// UD address handles are liburoce's (the daemon resolves the MAC, as the
// kernel does for rxe); rdma-core's struct is their first member.
ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) return fail_null<ibv_ah>(EINVAL);
  ibv_ah* ah = uroce_create_ah(UPd::of(pd)->u, attr);
  if (!ah) return fail_null<ibv_ah>(errno ? errno : EINVAL);
  ah->context = pd->context;
  ah->pd = pd;
  return ah;
}
int ibv_destroy_ah(ibv_ah* ah) {
  if (const int rc = uroce_destroy_ah(ah)) return fail(rc);
  return 0;
}
int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah_attr) {
  // RoCE needs the GRH area of the receive: the IPv6 header, or for RoCE v2
  // over IPv4 twenty bytes then the IPv4 header (IBTA A17.4.5.1).
  if (!context || !wc || !grh || !ah_attr || port_num != 1 || !(wc->wc_flags & IBV_WC_GRH)) return fail(EINVAL);
  const auto* b = reinterpret_cast<const uint8_t*>(grh);
  *ah_attr = ibv_ah_attr{};
  ah_attr->port_num = port_num;
  ah_attr->sl = wc->sl;
  ah_attr->is_global = 1;
  ah_attr->grh.sgid_index = 0;
  ah_attr->grh.hop_limit = 0xff;
  const bool v4 = (b[20] >> 4) == 4 && std::all_of(b, b + 20, [](uint8_t x) { return x == 0; });
  if (v4) {
    uint8_t* gid = ah_attr->grh.dgid.raw;  // the sender's address, IPv4-mapped
    gid[10] = gid[11] = 0xff;
    std::memcpy(gid + 12, b + 20 + 12, 4);
    ah_attr->grh.traffic_class = b[20 + 1];
  } else if ((b[0] >> 4) == 6) {
    std::memcpy(ah_attr->grh.dgid.raw, b + 8, 16);  // the IPv6 source address
    ah_attr->grh.traffic_class = static_cast<uint8_t>(((b[0] & 0x0f) << 4) | (b[1] >> 4));
    ah_attr->grh.flow_label = ((b[1] & 0x0fu) << 16) | (b[2] << 8) | b[3];
  } else {
    return fail(EINVAL);
  }
  return 0;
}
ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (!pd) return fail_null<ibv_ah>(EINVAL);
  ibv_ah_attr a{};
  if (const int rc = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &a)) return fail_null<ibv_ah>(rc);
  return ibv_create_ah(pd, &a);
}
int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t*, uint16_t*) { return fail(EOPNOTSUPP); }

// The kernel ABI's marshalling helpers: uroce has no kernel ABI. They
// return nothing, so they leave `dst` as it is.
void ibv_copy_qp_attr_from_kern(void*, void*) {}
void ibv_copy_ah_attr_from_kern(void*, void*) {}
void ibv_copy_path_rec_from_kern(void*, void*) {}
void ibv_copy_path_rec_to_kern(void*, void*) {}

}  // extern "C"

// ------------------------------------------- IBVERBS_1.0 compatibility symbols
//
// Programs linked against the 2006 ABI (before IBVERBS_1.1) bind to these
// versions. Their structs differ from today's, so they get a clean refusal:
// NULL with errno EOPNOTSUPP where a pointer is returned, EOPNOTSUPP where
// an int is, nothing for a void.
#define UROCE_COMPAT(kind, name)                                          \
  extern "C" kind compat_1_0_##name(...) { return compat_##kind(); }      \
  __asm__(".symver compat_1_0_" #name "," #name "@IBVERBS_1.0");

namespace {
using ptr = void*;
using num = int;
using none = void;
ptr compat_ptr() {
  errno = EOPNOTSUPP;
  return nullptr;
}
num compat_num() {
  errno = EOPNOTSUPP;
  return EOPNOTSUPP;
}
none compat_none() {}
}  // namespace

UROCE_COMPAT(ptr, ibv_get_device_list)
UROCE_COMPAT(none, ibv_free_device_list)
UROCE_COMPAT(ptr, ibv_get_device_name)
UROCE_COMPAT(ptr, ibv_get_device_guid)  // a GUID of 0
UROCE_COMPAT(ptr, ibv_open_device)
UROCE_COMPAT(num, ibv_close_device)
UROCE_COMPAT(num, ibv_get_async_event)
UROCE_COMPAT(none, ibv_ack_async_event)
UROCE_COMPAT(num, ibv_query_device)
UROCE_COMPAT(num, ibv_query_port)
UROCE_COMPAT(num, ibv_query_gid)
UROCE_COMPAT(num, ibv_query_pkey)
UROCE_COMPAT(ptr, ibv_alloc_pd)
UROCE_COMPAT(num, ibv_dealloc_pd)
UROCE_COMPAT(ptr, ibv_reg_mr)
UROCE_COMPAT(num, ibv_dereg_mr)
UROCE_COMPAT(ptr, ibv_create_cq)
UROCE_COMPAT(num, ibv_resize_cq)
UROCE_COMPAT(num, ibv_destroy_cq)
UROCE_COMPAT(num, ibv_get_cq_event)
UROCE_COMPAT(none, ibv_ack_cq_events)
UROCE_COMPAT(ptr, ibv_create_srq)
UROCE_COMPAT(num, ibv_modify_srq)
UROCE_COMPAT(num, ibv_query_srq)
UROCE_COMPAT(num, ibv_destroy_srq)
UROCE_COMPAT(ptr, ibv_create_qp)
UROCE_COMPAT(num, ibv_query_qp)
UROCE_COMPAT(num, ibv_modify_qp)
UROCE_COMPAT(num, ibv_destroy_qp)
UROCE_COMPAT(ptr, ibv_create_ah)
UROCE_COMPAT(num, ibv_destroy_ah)
UROCE_COMPAT(num, ibv_attach_mcast)
UROCE_COMPAT(num, ibv_detach_mcast)

// The same 33 names' default versions, IBVERBS_1.1, bound as rdma-core
// binds them (the version script lists the names in both nodes).
__asm__(".symver uroce_impl_ibv_ack_async_event,ibv_ack_async_event@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_ack_cq_events,ibv_ack_cq_events@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_alloc_pd,ibv_alloc_pd@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_attach_mcast,ibv_attach_mcast@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_close_device,ibv_close_device@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_create_ah,ibv_create_ah@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_create_cq,ibv_create_cq@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_create_qp,ibv_create_qp@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_create_srq,ibv_create_srq@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_dealloc_pd,ibv_dealloc_pd@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_dereg_mr,ibv_dereg_mr@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_destroy_ah,ibv_destroy_ah@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_destroy_cq,ibv_destroy_cq@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_destroy_qp,ibv_destroy_qp@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_destroy_srq,ibv_destroy_srq@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_detach_mcast,ibv_detach_mcast@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_free_device_list,ibv_free_device_list@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_get_async_event,ibv_get_async_event@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_get_cq_event,ibv_get_cq_event@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_get_device_guid,ibv_get_device_guid@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_get_device_list,ibv_get_device_list@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_get_device_name,ibv_get_device_name@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_modify_qp,ibv_modify_qp@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_modify_srq,ibv_modify_srq@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_open_device,ibv_open_device@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_query_device,ibv_query_device@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_query_gid,ibv_query_gid@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_query_pkey,ibv_query_pkey@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_query_port,ibv_query_port@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_query_qp,ibv_query_qp@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_query_srq,ibv_query_srq@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_reg_mr,ibv_reg_mr@@IBVERBS_1.1");
__asm__(".symver uroce_impl_ibv_resize_cq,ibv_resize_cq@@IBVERBS_1.1");

// ibv_register_driver@IBVERBS_1.1 (not the default version either): the
// old way for a provider to register itself. uroce has no providers.
extern "C" void compat_1_1_ibv_register_driver(const char*, void*) {}
__asm__(".symver compat_1_1_ibv_register_driver,ibv_register_driver@IBVERBS_1.1");

// For uroce's librdmacm.so.1 (stack/rdmacm), which runs the CM through
// liburoce on the objects this library made: the liburoce objects behind
// a context and a QP. Exported in their own version node, UROCE_PRIVATE_1.
extern "C" uroce_context* uroce_ibv_context(ibv_context* c) { return c ? ucontext(c)->u : nullptr; }
extern "C" uroce_qp* uroce_ibv_qp(ibv_qp* q) { return q ? uqp(q)->u : nullptr; }
/// The context's QP with that number, for librdmacm's ids whose
/// application made its own QP (rdma_conn_param's qp_num); NULL if none.
extern "C" ibv_qp* uroce_ibv_qp_by_num(ibv_context* c, uint32_t qp_num) {
  if (!c) return nullptr;
  UContext* uc = ucontext(c);
  std::lock_guard<std::mutex> lk(uc->mu);
  for (const auto& [u, v] : uc->qps)
    if (v->qp_num == qp_num) return v;
  return nullptr;
}
