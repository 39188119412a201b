/*
 * liburoce: the verbs-like application library of uroce.
 *
 * Names and semantics follow rdma-core's infiniband/verbs.h, and the work
 * request, completion and QP attribute structs are rdma-core's own, so a
 * verbs program ports by renaming ibv_ calls to uroce_ ones.
 *
 * The fast path (uroce_post_send, uroce_post_recv, uroce_poll_cq) writes and
 * reads rings in memory shared with uroced: no system call, no copy, while
 * the daemon is awake. A daemon that has gone to sleep says so in the
 * session page, and a post then rings its doorbell (one send). In embedded
 * mode (below) passes of the pipeline run on the calling thread (the port's
 * I/O included): a poll that finds nothing, or that follows posts, runs
 * one; so does every 16th post of a burst (the posts between go out with
 * it, or with that poll, a wait or uroce_progress: one transmit burst for
 * many posts). Under UROCE_EMBEDDED_PROGRESS=thread (and the drop-in
 * libibverbs), where a thread turns the node while the program blocks
 * elsewhere, every post runs one.
 * Registered memory is shared too: allocate it with uroce_alloc_buf, or
 * register ordinary memory, which is then remapped in place onto shared
 * memory (its contents are kept; whole pages are remapped, so keep MRs on
 * page-aligned buffers of their own).
 *
 * Two modes, chosen when the device is opened. Daemon mode (a socket path):
 * uroced runs the engine and the port for every application on the host,
 * isolates them and cleans up after a crash. Embedded mode (a device path
 * "embedded:OPTIONS", or $UROCE_EMBEDDED=OPTIONS, which makes every open
 * embedded and lists one device, "embedded"): the engine, its pipeline and
 * the DPDK port run inside this process, which then has the port to itself.
 * OPTIONS are uroced's (--port, --vdev, --ip, --no-huge, --lcore, ...; the
 * thread that opens the device is pinned to --lcore by the EAL). Progress is
 * manual, as libfabric's FI_PROGRESS_MANUAL: posting, polling and waiting in
 * liburoce turn the loop, on any context, and a blocking wait keeps ARP, the
 * CM and timers running. An application that waits on a descriptor of its
 * own (a channel fd, a TCP socket) waits with uroce_wait_fd, or keeps
 * calling uroce_progress while it does (until then, up to 15 of its last
 * posts have not left, and its peer sees no ACKs). One
 * embedded node per process: it starts with the first open, stays when the
 * last context closes (an open after that finds it running), and stops
 * when the process exits; it cannot be started twice, as DPDK's EAL cannot.
 *
 * Errors: functions returning pointers return NULL and set errno; functions
 * returning int return 0 or an errno value. uroce_last_error() gives the
 * reason in words (per thread).
 */
#ifndef UROCE_VERBS_H
#define UROCE_VERBS_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct uroce_context;
struct uroce_pd;
struct uroce_mr;
struct uroce_cq;
struct uroce_comp_channel;
struct uroce_qp;
struct uroce_srq;
struct uroce_device;
struct uroce_xrcd;

struct uroce_qp_init_attr {
  struct uroce_cq* send_cq;
  struct uroce_cq* recv_cq;
  /* IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RAW_PACKET; IBV_QPT_XRC_SEND
   * (a PD and send_cq; no receive side) or IBV_QPT_XRC_RECV (xrcd alone:
   * the PD may be NULL, no CQs, no posts) */
  enum ibv_qp_type qp_type;
  struct ibv_qp_cap cap;    /* max_send_wr, max_recv_wr (max_send_sge/max_recv_sge <= 4) */
  int sq_sig_all;
  struct uroce_srq* srq; /* receives come from this SRQ; cap.max_recv_wr is then ignored */
  struct uroce_xrcd* xrcd; /* IBV_QPT_XRC_RECV's domain */
  /* Receive-side scaling (ABI minor 18): an IBV_QPT_RAW_PACKET QP that
   * receives only, into the 2^rss_log_size (1..64) work queues of rss_wqs
   * (uroce_create_wq), each frame by the Toeplitz hash of rss_fields
   * (IBV_RX_HASH_*: IPv4, IPv6, TCP and UDP fields) under the 40-byte
   * rss_key; no CQs, no SRQ, no posts. 0: not RSS. */
  uint32_t rss_log_size;
  struct uroce_srq** rss_wqs;
  uint64_t rss_fields;
  const uint8_t* rss_key;
};

/* The devices: every uroced application socket found in $UROCE_RUN_DIR
 * (default /run/uroce; a device is <dir>/<name>.sock), then each path in
 * $UROCE_DEVICES (colon-separated). NULL-terminated, as ibv_get_device_list;
 * *num_devices (if not NULL) gets the count. Free with uroce_free_device_list. */
struct uroce_device** uroce_get_device_list(int* num_devices);
void uroce_free_device_list(struct uroce_device** list);
const char* uroce_get_device_name(const struct uroce_device* device);
/* The device's socket, for uroce_open_device. */
const char* uroce_get_device_path(const struct uroce_device* device);

/* Opens a device by name from the device list, or by socket path (a name
 * with a '/') or embedded spec ("embedded:OPTIONS"), or the first listed
 * device when name is NULL or empty.
 * NULL with errno ENODEV when there is no such device. */
struct uroce_context* uroce_open_device_by_name(const char* name);

/* Attach to a daemon's application socket, or start or share this
 * process's embedded node ("embedded:OPTIONS" or $UROCE_EMBEDDED); checks the
 * ABI version. */
struct uroce_context* uroce_open_device(const char* socket_path);

/* Embedded mode: one turn of this process's node (receive, transport,
 * timers, transmit; the control sockets about every millisecond), whichever
 * context `ctx` is (progress is the process's; `ctx` may be NULL). Returns
 * the work done; 0, with nothing done, in a process without an embedded
 * node. Posting and polling call it already. */
int uroce_progress(struct uroce_context* ctx);

/* Waits until `fd` is readable (1), `timeout_ms` passes (0; -1 waits without
 * end) or an error (-1, errno). In embedded mode the wait turns the node's
 * loop, so use it for any wait of the application's own (a TCP exchange,
 * a peer's byte in memory) while a peer may need this process to answer.
 * `fd` < 0: in embedded mode at most one idle sleep of the node, in daemon
 * mode sched_yield(), which gives the core to the daemon. */
int uroce_wait_fd(int fd, int timeout_ms);
int uroce_close_device(struct uroce_context* ctx);
/* The daemon's GID (its RoCE address; IPv4-mapped for IPv4). */
int uroce_query_gid(struct uroce_context* ctx, uint8_t port_num, int index, union ibv_gid* gid);
/* The session's limits and the daemon's capabilities, in rdma-core's struct. */
int uroce_query_device(struct uroce_context* ctx, struct ibv_device_attr* attr);
/* One port (port_num 1), Ethernet link layer, always active. */
int uroce_query_port(struct uroce_context* ctx, uint8_t port_num, struct ibv_port_attr* attr);

struct uroce_pd* uroce_alloc_pd(struct uroce_context* ctx);
/* EBUSY while QPs or MRs still use it. */
int uroce_dealloc_pd(struct uroce_pd* pd);

/* Shared memory for buffers: page-aligned, zeroed. */
void* uroce_alloc_buf(struct uroce_context* ctx, size_t length);

struct uroce_mr* uroce_reg_mr(struct uroce_pd* pd, void* addr, size_t length, int access);
/* The same with an address space of its own (ibv_reg_mr_iova2): local and
 * remote accesses name addr's bytes at iova onwards, as on rdma-core. */
struct uroce_mr* uroce_reg_mr_iova(struct uroce_pd* pd, void* addr, size_t length, uint64_t iova, int access);
int uroce_dereg_mr(struct uroce_mr* mr);
/* ibv_rereg_mr: the MR in place, keeping its keys (the daemon's, ABI minor
 * 15). flags: IBV_REREG_MR_CHANGE_*; pd with _PD, access with _ACCESS,
 * [addr, addr + length) with _TRANSLATION. 0, or an errno. */
int uroce_rereg_mr(struct uroce_mr* mr, int flags, struct uroce_pd* pd, void* addr, size_t length, int access);
uint32_t uroce_mr_lkey(const struct uroce_mr* mr);
uint32_t uroce_mr_rkey(const struct uroce_mr* mr);

/* Memory windows (IBTA 10.6.7), type 1 (IBV_MW_TYPE_1) and type 2B
 * (IBV_MW_TYPE_2), allocated unbound. A window is bound by posting an
 * IBV_WR_BIND_MW work request on an RC or UC QP of its PD: uroce_post_send
 * reads only wr->bind_mw.mw->rkey (the window: an ibv_mw holding
 * uroce_mw_rkey's key, or the key of its last bind), wr->bind_mw.rkey (its
 * new R_Key: ibv_inc_rkey of the old one), and bind_info's mr->lkey (the
 * MR, registered with IBV_ACCESS_MW_BIND; a type 1 window with no MR and
 * length 0 comes unbound), addr, length and mw_access_flags. A type 2
 * window serves the QP it was bound through, until IBV_WR_LOCAL_INV or a
 * peer's SEND_WITH_INV invalidates it. Windows count against the
 * session's MR limit; an MR with windows bound to it is EBUSY to
 * deregister. */
struct uroce_mw;
struct uroce_mw* uroce_alloc_mw(struct uroce_pd* pd, enum ibv_mw_type type);
/* Unbinds it, if bound, and frees it. */
int uroce_dealloc_mw(struct uroce_mw* mw);
/* The R_Key it was allocated with. */
uint32_t uroce_mw_rkey(const struct uroce_mw* mw);

/* Completion channels: a pollable fd for blocking waits, as in verbs. Arm a CQ
 * with uroce_req_notify_cq, then poll it once more (the usual verbs
 * pattern); uroce_get_cq_event blocks until an armed CQ gets a completion
 * (or, if the application made the channel's fd O_NONBLOCK, says EAGAIN at
 * once, as rdma-core's channel read does). The fd can go into poll/epoll. solicited_only is accepted but
 * any completion notifies (spurious wake-ups are allowed by verbs). */
struct uroce_comp_channel* uroce_create_comp_channel(struct uroce_context* ctx);
int uroce_destroy_comp_channel(struct uroce_comp_channel* channel); /* EBUSY while CQs use it */
int uroce_comp_channel_fd(const struct uroce_comp_channel* channel);
int uroce_req_notify_cq(struct uroce_cq* cq, int solicited_only);
int uroce_get_cq_event(struct uroce_comp_channel* channel, struct uroce_cq** cq, void** cq_context);
void uroce_ack_cq_events(struct uroce_cq* cq, unsigned int nevents);

/* As ibv_create_cq: channel may be NULL; comp_vector is ignored (one vector). */
struct uroce_cq* uroce_create_cq(struct uroce_context* ctx, int cqe, void* cq_context,
                                 struct uroce_comp_channel* channel, int comp_vector);
/* ibv_resize_cq: the CQ moves to a ring of at least cqe entries, keeping the
 * completions not yet polled (EINVAL if cqe leaves no room for them). Do not
 * poll the CQ from another thread meanwhile, as verbs asks. */
int uroce_resize_cq(struct uroce_cq* cq, int cqe);
/* The entries the CQ holds (its ring's, a power of two >= the cqe asked). */
int uroce_cq_capacity(const struct uroce_cq* cq);
/* EBUSY while a QP uses it. */
int uroce_destroy_cq(struct uroce_cq* cq);

struct uroce_qp* uroce_create_qp(struct uroce_pd* pd, struct uroce_qp_init_attr* attr);
uint32_t uroce_qp_num(const struct uroce_qp* qp);

/* UD address handles (uroced ABI minor 6). As the kernel does at
 * ibv_create_ah, uroced resolves the MAC behind attr->grh.dgid (at once
 * from its neighbour table, else by ARP/ND, waiting up to 3 s; then
 * EHOSTUNREACH). attr->is_global must be set (RoCE) and port_num 1. The
 * returned ibv_ah is what a UD send names in wr.ud.ah; its context and pd
 * fields are left for the caller. */
struct ibv_ah* uroce_create_ah(struct uroce_pd* pd, struct ibv_ah_attr* attr);
int uroce_destroy_ah(struct ibv_ah* ah);
int uroce_modify_qp(struct uroce_qp* qp, struct ibv_qp_attr* attr, int attr_mask);
/* ibv_attach_mcast (attach 1) and ibv_detach_mcast (0), for a UD QP and a
 * multicast GID (ABI minor 15). 0, or an errno. */
int uroce_mcast(struct uroce_qp* qp, const union ibv_gid* gid, int attach);
/* uroce's own QP attributes (ABI minor 10; ENOTSUP from an older daemon):
 * - its congestion control, by name ("none", "dcqcn", "swift"), at any
 *   time (docs/research.md): any on an RC or UC QP; on a UD QP only one that
 *   needs no ACKs ("none", "dcqcn"), else EOPNOTSUPP;
 * - selective repeat (IRN-style; RC without an SRQ), set before RTR on both
 *   ends, and only between uroce peers: it carries SENDs and WRITEs; READs,
 *   atomics and the rest go one at a time, fenced, as IBTA go-back-N. */
int uroce_qp_set_cc(struct uroce_qp* qp, const char* name);
int uroce_qp_set_selective_repeat(struct uroce_qp* qp, int on);
int uroce_destroy_qp(struct uroce_qp* qp);
/* The QP's current attributes from the daemon (all of them, whatever attr_mask says). */
int uroce_query_qp(struct uroce_qp* qp, struct ibv_qp_attr* attr, int attr_mask, struct uroce_qp_init_attr* init_attr);

/* Connecting an RC (or UC) QP to a peer whose QP number, GID and first PSN
 * came out of band: RESET -> INIT -> RTR -> RTS in one call, as the
 * ibv_*_pingpong examples do by hand. Zero fields take the default shown. */
struct uroce_rc_conn {
  uint32_t dest_qp_num;
  union ibv_gid dgid;
  uint32_t rq_psn;          /* the peer's sq_psn */
  uint32_t sq_psn;          /* ours; the peer's rq_psn */
  enum ibv_mtu path_mtu;    /* 0: IBV_MTU_1024 */
  int access;               /* IBV_ACCESS_REMOTE_*; 0: none */
  uint8_t timeout;          /* 0: 14 (67 ms) */
  uint8_t retry_cnt;        /* 0: 7 */
  uint8_t rnr_retry;        /* 0: 7 (infinite) */
  uint8_t min_rnr_timer;    /* 0: 12 */
  uint8_t max_rd_atomic;    /* READs/atomics we have outstanding; 0: 4 */
  uint8_t max_dest_rd_atomic; /* READs/atomics we accept at once; 0: as max_rd_atomic */
};
int uroce_connect_qp(struct uroce_qp* qp, const struct uroce_rc_conn* conn);

/* Out-of-band exchange of what two sides need to connect, over TCP, the way
 * perftest does it. With host NULL, listens on port (all addresses) and
 * accepts one peer; otherwise connects to host:port, retrying until the peer
 * listens. Sends `mine`, receives `theirs` (a fixed 48-byte message in network
 * byte order, with a magic and version). Gives up after timeout_ms:
 * ETIMEDOUT; a peer that is not speaking this exchange: EPROTO. */
struct uroce_conn_info {
  uint32_t qp_num;
  uint32_t psn;
  union ibv_gid gid;
  uint32_t rkey;
  uint64_t addr;
};
int uroce_exchange_tcp(const char* host, uint16_t port, int timeout_ms, const struct uroce_conn_info* mine,
                       struct uroce_conn_info* theirs);

/* Shared receive queues: as ibv_create_srq (attr->attr.max_wr, max_sge <= 4;
 * srq_limit is not supported and must be 0). EBUSY on destroy while a QP uses it. */
struct uroce_srq* uroce_create_srq(struct uroce_pd* pd, struct ibv_srq_init_attr* attr);
int uroce_destroy_srq(struct uroce_srq* srq);

/* XRC (ABI minor 17), as ibv_open_xrcd: with fd -1 a domain of this
 * context's own; else the domain of that file, shared with every process
 * that opens it (oflags: O_CREAT makes it if the file has none; O_CREAT |
 * O_EXCL fails, EINVAL, if it has one; without O_CREAT none is EINVAL).
 * EBUSY on close while an XRC SRQ or target QP of this context is in it. */
struct uroce_xrcd* uroce_open_xrcd(struct uroce_context* ctx, int fd, int oflags);
int uroce_close_xrcd(struct uroce_xrcd* xrcd);
/* An XRC SRQ: its receives complete in `cq`; XRC send QPs name it by
 * uroce_srq_num (wr->qp_type.xrc.remote_srqn) through a target QP of the
 * same domain. */
struct uroce_srq* uroce_create_xrc_srq(struct uroce_pd* pd, struct uroce_xrcd* xrcd, struct uroce_cq* cq,
                                       struct ibv_srq_init_attr* attr);
uint32_t uroce_srq_num(const struct uroce_srq* srq); /* 0 for a basic SRQ */
/* A receive work queue (ABI minor 18; ibv_create_wq's IBV_WQT_RQ): an SRQ
 * whose receives complete in `cq`, an entry of RSS QPs' tables. Posted to
 * with uroce_post_srq_recv; EBUSY on destroy while an RSS QP names it. */
struct uroce_srq* uroce_create_wq(struct uroce_pd* pd, struct uroce_cq* cq, struct ibv_srq_init_attr* attr);
uint32_t uroce_srq_handle(const struct uroce_srq* srq); /* its number in the session (a work queue's wq_num) */
int uroce_post_srq_recv(struct uroce_srq* srq, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad_wr);
/* Tag matching (ABI minor 19; uroce_abi.h), as ibv_create_srq_ex's
 * IBV_SRQT_TM: an SRQ with a list of up to max_tags (<= UROCE_TM_MAX_TAGS)
 * tagged buffers, changed by uroce_post_srq_ops (IBV_WR_TAG_ADD, whose
 * handle it returns in wr->tm.handle; _DEL; _SYNC; at most max_ops
 * outstanding), whose operations complete in `cq`. One thread posts to an
 * SRQ at a time, as for every uroce post. ENOMEM when every tag is in use
 * or the operations queue is full. */
struct uroce_srq* uroce_create_tm_srq(struct uroce_pd* pd, struct uroce_cq* cq, struct ibv_srq_init_attr* attr,
                                      uint32_t max_tags, uint32_t max_ops);
int uroce_post_srq_ops(struct uroce_srq* srq, struct ibv_ops_wr* wr, struct ibv_ops_wr** bad_op);

/* FLUSH (IBTA 1.5; rdma-core 44's ibv_send_wr has no fields for it): opcode
 * UROCE_WR_FLUSH (uroce_abi.h), RC only, num_sge 0; wr.atomic.remote_addr
 * and rkey name the target, compare_add is its length, swap the placement
 * type (UROCE_FLUSH_GLOBAL) | the selectivity level (UROCE_FLUSH_RANGE or
 * UROCE_FLUSH_MR) << 4. The peer's QP and MR need UROCE_ACCESS_FLUSH_GLOBAL;
 * it completes as UROCE_WC_FLUSH. */
int uroce_post_send(struct uroce_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad_wr);
int uroce_post_recv(struct uroce_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad_wr);
int uroce_poll_cq(struct uroce_cq* cq, int num_entries, struct ibv_wc* wc);
/* The same, with each completion's timestamp (ns of CLOCK_MONOTONIC when
 * the daemon made it) in timestamps[i]. */
int uroce_poll_cq_ts(struct uroce_cq* cq, int num_entries, struct ibv_wc* wc, uint64_t* timestamps);
/* The same, with each completion's timestamp and, for a tag-matching one
 * of a matched message, its tag and the TMH's app_ctx (ibv_wc_tm_info). */
struct uroce_wc_extra {
  uint64_t timestamp;
  uint64_t tag;
  uint32_t tm_priv;
  uint32_t reserved;
};
int uroce_poll_cq_ex(struct uroce_cq* cq, int num_entries, struct ibv_wc* wc, struct uroce_wc_extra* extra);
/* 1 when the daemon stamps completions (ABI minor 13), else 0. */
int uroce_completion_timestamps(const struct uroce_context* ctx);
/* Whether ODP MRs (IBV_ACCESS_ON_DEMAND) can be registered, as the last
 * uroce_query_device found (the daemon's --odp; always in embedded mode). */
int uroce_odp(const struct uroce_context* ctx);
/* The ABI minor version of the daemon (or embedded node) behind the context. */
int uroce_abi_minor(const struct uroce_context* ctx);
/* A flow rule steering the frames that match `value` under `mask` to the
 * raw packet QP `qp` (ABI minor 16); its handle in *handle. 0 or an errno. */
struct uroce_flow_key;
int uroce_create_flow(struct uroce_qp* qp, uint32_t priority, const struct uroce_flow_key* value,
                      const struct uroce_flow_key* mask, uint32_t* handle);
int uroce_destroy_flow(struct uroce_context* ctx, uint32_t handle);

/* Async events, as ibv_get_async_event: IBV_EVENT_CQ_ERR names a CQ that
 * overflowed (completions were lost, and are counted by uroced), and
 * IBV_EVENT_QP_FATAL each QP that completes into it, which uroced moved to
 * ERR; IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE say the daemon's link
 * went down or came up (its driver's link state, looked at every 200 ms;
 * uroce_query_port reports it too). uroce_get_async_event blocks until one comes; uroce_async_fd is a
 * descriptor that is readable when one is waiting (for poll/epoll). */
struct uroce_async_event {
  enum ibv_event_type event_type;
  struct uroce_cq* cq; /* IBV_EVENT_CQ_ERR */
  struct uroce_qp* qp; /* IBV_EVENT_QP_FATAL */
  uint8_t port_num;    /* IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR: the daemon's port's link came up or went down */
};
int uroce_get_async_event(struct uroce_context* ctx, struct uroce_async_event* event);
int uroce_async_fd(const struct uroce_context* ctx);
/* Waits for completions without holding a core: polls; if there is none,
 * polls on, yielding the core between empty polls, for at least spin_us (0:
 * not at all) or, while this CQ's recent waits were short, twice their
 * length (at most 200 us), then arms the CQ and blocks on its completion
 * channel (the CQ needs one) until a completion arrives or timeout_ms pass
 * (-1: no limit; 0: one poll). Returns the completions taken (up to
 * num_entries), 0 on timeout, or -1 with errno (EINVAL: no channel). On a
 * shared core, polling that yields and then blocking beats busy polling:
 * the daemon that produces the completion needs the core, and gets it at
 * the next empty poll; a ping-pong's next message is polled for, not slept
 * through (a wake-up costs tens of microseconds in a VM). A wake-up drains the
 * channel, so mixing this with uroce_get_cq_event on one channel only costs
 * spurious events. */
int uroce_poll_cq_wait(struct uroce_cq* cq, int num_entries, struct ibv_wc* wc, int spin_us, int timeout_ms);

/* RDMA CM: connection setup with rdma_cm's wire protocol (CM MADs on QP1,
 * RoCE service IDs), done by the daemon's CM agent, so a librdmacm peer
 * (rping, ib_*_bw -R) can connect to us and we to it. The QP must be RC in
 * RESET or INIT; the agent takes it to RTS (and to ERR on disconnect). With
 * a UD QP, connect and accept are SIDR's request and answer (udaddy).
 * Events are rdma_cm's; uroce_cm_get_event waits up to timeout_ms
 * (ETIMEDOUT; 0 polls once, EAGAIN when there is none; negative: no end),
 * asleep on uroce_cm_fd: a descriptor (made at the first call) that the
 * daemon makes readable each time it queues an event for this context, for
 * poll/epoll. A readable uroce_cm_fd may be spurious: uroce_cm_get_event
 * with timeout 0 then says EAGAIN. */
enum uroce_cm_event_type {
  UROCE_CM_EVENT_CONNECT_REQUEST = 4, /* RDMA_CM_EVENT_CONNECT_REQUEST: accept or reject it */
  UROCE_CM_EVENT_CONNECT_RESPONSE = 5, /* the REP of a UROCE_CM_APP_QP connect: bring the QP up, then uroce_cm_establish */
  UROCE_CM_EVENT_UNREACHABLE = 7,     /* no answer, or the handshake failed (status: reason) */
  UROCE_CM_EVENT_REJECTED = 8,        /* the peer rejected (status: IBTA reject reason; 28: by the application) */
  UROCE_CM_EVENT_ESTABLISHED = 9,
  UROCE_CM_EVENT_DISCONNECTED = 10,
};
struct uroce_cm_event {
  enum uroce_cm_event_type event;
  uint32_t id; /* the connection */
  int status;
  uint32_t peer_qp_num;
  union ibv_gid peer_gid;
  uint16_t peer_port, local_port;
  uint8_t responder_resources, initiator_depth;
  enum ibv_mtu mtu;
  uint8_t private_data_len;
  uint8_t private_data[56];
  /* CONNECT_REQUEST and CONNECT_RESPONSE: what the QP is to be brought up
   * with (rdma_init_qp_attr's values): its send PSN (the peer's starting
   * PSN) and receive PSN, the retries, the ACK timeout (4.096 us * 2^n), and
   * the READ/atomic depths each way. */
  uint32_t sq_psn, rq_psn;
  uint8_t retry_count, rnr_retry_count, timeout;
  uint8_t max_rd_atomic, max_dest_rd_atomic;
  /* UD (SIDR): a CONNECT_REQUEST from a UD peer (accept it with a UD QP),
   * its ESTABLISHED (peer_qp_num and qkey name the QP to send to) or
   * UNREACHABLE (status: the SIDR status; 1: nobody listens, 2: rejected). */
  uint8_t ud;
  uint32_t qkey;
};
/* As rdma_conn_param; zero fields take defaults (MTU 1024, retries 7). */
struct uroce_cm_param {
  const void* private_data;
  uint8_t private_data_len; /* at most 56 */
  uint8_t responder_resources, initiator_depth;
  uint8_t retry_count, rnr_retry_count;
  enum ibv_mtu mtu;
  /* UROCE_CM_APP_QP (uroce_cm_connect, uroce_cm_accept): the application
   * brings the QP up itself and the agent never moves it (rdma_cm's ids
   * without a QP). Connecting, the QP is in RESET or INIT and the REP comes
   * as CONNECT_RESPONSE; accepting, it is any state but ERR, brought up with
   * the request's values. */
  uint8_t flags;
  /* With UROCE_CM_ACK_TIMEOUT in flags: the QP's local ACK timeout, 0..31. */
  uint8_t ack_timeout;
};
#ifndef UROCE_CM_APP_QP
#define UROCE_CM_APP_QP 1u /* as session_proto.h */
#endif
/* The port's GID table: index 0 is the port's address (its RoCEv2 GID); the
 * other entries are empty (a zero GID), as a kernel port's table has room
 * for more addresses than it holds. */
#ifndef UROCE_GID_TABLE_LEN
#define UROCE_GID_TABLE_LEN 16
#endif
#ifndef UROCE_CM_ACK_TIMEOUT
#define UROCE_CM_ACK_TIMEOUT 4u /* as session_proto.h */
#endif
int uroce_cm_listen(struct uroce_context* ctx, uint16_t port);
int uroce_cm_unlisten(struct uroce_context* ctx, uint16_t port);
/* The same in RDMA_PS_UDP's port space: SIDR requests, answered with a UD QP. */
int uroce_cm_listen_ud(struct uroce_context* ctx, uint16_t port);
int uroce_cm_unlisten_ud(struct uroce_context* ctx, uint16_t port);
int uroce_cm_connect(struct uroce_qp* qp, const union ibv_gid* dgid, uint16_t port, const struct uroce_cm_param* param,
                     uint32_t* id);
int uroce_cm_accept(struct uroce_qp* qp, uint32_t id, const struct uroce_cm_param* param);
int uroce_cm_reject(struct uroce_context* ctx, uint32_t id, const void* private_data, uint8_t private_data_len);
int uroce_cm_disconnect(struct uroce_context* ctx, uint32_t id);
/* The RTU of a UROCE_CM_APP_QP connect, after its CONNECT_RESPONSE
 * (rdma_establish); EINVAL when no such connection waits for it. */
int uroce_cm_establish(struct uroce_context* ctx, uint32_t id);
int uroce_cm_get_event(struct uroce_context* ctx, int timeout_ms, struct uroce_cm_event* event);
int uroce_cm_fd(struct uroce_context* ctx);

/* The name of a completion status ("SUCCESS", "RETRY_EXC_ERR", ...). */
const char* uroce_wc_status_str(enum ibv_wc_status status);

const char* uroce_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* UROCE_VERBS_H */
