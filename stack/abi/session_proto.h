/*
 * The session protocol between an application (liburoce) and uroced, on the
 * daemon's application socket (SOCK_STREAM, AF_UNIX). Plain C layout, version
 * UROCE_ABI_MAJOR: each request is one message, answered by one reply before
 * the next request. File descriptors (memfds of rings and registered memory)
 * travel as SCM_RIGHTS with the message that names them.
 *
 *   request:  uroce_msg_hdr { magic, major, type, len, seq } + body
 *   reply:    uroce_msg_hdr { magic, major, type | UROCE_MSG_REPLY, len, seq }
 *             + uroce_reply_status + reply body
 *
 * Compatibility: a newer minor may append fields to a request; the daemon
 * reads a shorter request from an older library with those fields zero.
 */
#ifndef UROCE_SESSION_PROTO_H
#define UROCE_SESSION_PROTO_H

#include <stdint.h>

#include "stack/abi/uroce_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UROCE_MSG_MAGIC 0x4d524f55u /* "UORM" */
#define UROCE_MSG_REPLY 0x8000u
#define UROCE_MSG_MAX 1024u

enum uroce_msg_type {
  UROCE_MSG_HELLO = 1,      /* body: hello;       reply: hello_reply */
  UROCE_MSG_ALLOC_PD = 2,   /* body: none;        reply: handle */
  UROCE_MSG_REG_MR = 3,     /* body: reg_mr + fd; reply: reg_mr_reply */
  UROCE_MSG_CREATE_CQ = 4,  /* body: create_cq;   reply: handle + fd of the CQ ring */
  UROCE_MSG_CREATE_QP = 5,  /* body: create_qp;   reply: create_qp_reply + fd of SQ and RQ rings */
  UROCE_MSG_MODIFY_QP = 6,  /* body: modify_qp;   reply: status (with the reason on error) */
  UROCE_MSG_DESTROY = 7,    /* body: destroy;     reply: status */
  UROCE_MSG_QUERY = 8,      /* body: query;       reply: device_attr (UROCE_OBJ_DEVICE) or modify_qp (UROCE_OBJ_QP) */
  UROCE_MSG_CREATE_SRQ = 9, /* body: create_srq;  reply: handle + fd of the SRQ ring (minor 2) */
  /* RDMA CM (minor 3): the daemon's CM agent on QP1 does the handshake. */
  UROCE_MSG_CM_LISTEN = 10,     /* body: cm (port);                 reply: status */
  UROCE_MSG_CM_CONNECT = 11,    /* body: cm (qp, dgid, port, param); reply: cm_id */
  UROCE_MSG_CM_ACCEPT = 12,     /* body: cm (qp, id, param);        reply: status */
  UROCE_MSG_CM_REJECT = 13,     /* body: cm (id, private data);     reply: status */
  UROCE_MSG_CM_DISCONNECT = 14, /* body: cm (id);                   reply: status */
  UROCE_MSG_CM_EVENT = 15,      /* body: none;  reply: cm_event, or EAGAIN when there is none */
  /* Minor 6: the MAC behind a GID, for a UD address handle (as the kernel
   * resolves one at ibv_create_ah). Answered once known: at once from the
   * neighbour table, or after ARP/ND, or EHOSTUNREACH after 3 s. */
  UROCE_MSG_RESOLVE = 16,       /* body: resolve;  reply: resolve_reply */
  /* Minor 7: a Unix datagram socket (the fd) that the daemon rings, never
   * blocking, each time it queues a CM event for the session, so the
   * application sleeps on it instead of asking again and again. */
  UROCE_MSG_CM_CHANNEL = 17,    /* body: none + fd;  reply: status */
  UROCE_MSG_CM_UNLISTEN = 18,   /* body: cm (port);  reply: status (minor 7) */
  /* Minor 7: an MR over several memfds, each piece mapped after the one
   * before (memory registered before in pieces stays where it is). */
  UROCE_MSG_REG_MR_PIECES = 19, /* body: reg_mr_pieces + one fd per piece; reply: reg_mr_reply */
  /* Minor 7: a CQ onto a new ring, with the completions not yet taken
   * (ibv_resize_cq); the application must not poll the CQ meanwhile. */
  UROCE_MSG_RESIZE_CQ = 20,     /* body: resize_cq;  reply: handle + fd of the new CQ ring */
  /* Minor 8: a memory window in one of the session's PDs, unbound (bound
   * by IBV_WR_BIND_MW send entries); UROCE_MSG_DESTROY with UROCE_OBJ_MW
   * frees it. Windows count against the session's MR limit. */
  UROCE_MSG_ALLOC_MW = 21,      /* body: alloc_mw;   reply: alloc_mw_reply */
  UROCE_MSG_CM_ESTABLISH = 22,  /* body: cm (id);    reply: status; the RTU of a UROCE_CM_APP_QP connect (minor 9) */
  /* Minor 10: uroce's own QP attributes: its congestion control (any
   * time), and selective repeat (before RTR, on both ends). */
  UROCE_MSG_SET_QP_OPT = 23,    /* body: qp_opt;     reply: status */
  /* Minor 15: an MR changed in place (ibv_rereg_mr), keeping its keys. With
   * IBV_REREG_MR_CHANGE_TRANSLATION the body goes on with the new memory,
   * as REG_MR_PIECES sends it (reg_mr_pieces, then reg_mr_exact), and one
   * fd per piece. */
  UROCE_MSG_REREG_MR = 24,      /* body: rereg_mr [+ reg_mr_pieces + reg_mr_exact + fds]; reply: reg_mr_reply */
  /* Minor 15: a UD QP joins or leaves a multicast group (ibv_attach_mcast,
   * ibv_detach_mcast). RESOLVE answers a group's GID with its multicast MAC. */
  UROCE_MSG_MCAST = 25,         /* body: mcast;      reply: status */
  /* Minor 16: an ODP MR (IBV_ACCESS_ON_DEMAND): nothing is shared up front;
   * the daemon reaches the bytes through the application's memory file
   * (its /proc/self/mem, opened read-write), sent with the session's first
   * ODP MR and kept for the session's life. Only where uroce_device_attr
   * says UROCE_DEVICE_ODP (the daemon's --odp). */
  UROCE_MSG_REG_MR_ODP = 26,    /* body: reg_mr_odp [+ fd the first time]; reply: reg_mr_reply */
  /* Minor 16: a flow rule (ibv_create_flow) steering the frames it matches,
   * from the wire and from this port's own raw packet QPs, to a raw packet
   * QP. UROCE_MSG_DESTROY with UROCE_OBJ_FLOW removes it. Raw packet QPs and
   * flows are for sessions of uid 0 or with CAP_NET_RAW, as on the kernel. */
  UROCE_MSG_CREATE_FLOW = 27,   /* body: flow;       reply: handle */
  /* Minor 17: an XRC domain (ibv_open_xrcd). With a file descriptor, the
   * domain of its file (its inode), which every session that opens that
   * file shares; without one, a domain of the session's own.
   * UROCE_MSG_DESTROY with UROCE_OBJ_XRCD closes the session's hold on it.
   * XRC SRQs (create_srq's xrcd and cq) and XRC QPs (IBV_QPT_XRC_SEND,
   * IBV_QPT_XRC_RECV with create_qp's xrcd) live in it. */
  UROCE_MSG_OPEN_XRCD = 28,     /* body: open_xrcd [+ fd]; reply: handle */
};

struct uroce_msg_hdr {
  uint32_t magic;
  uint16_t major;
  uint16_t type;
  uint32_t len; /* body bytes that follow */
  uint32_t seq;
};

/* Every reply body starts with this: 0 or an errno value, and a reason. */
struct uroce_reply_status {
  int32_t err;
  char why[124];
};

struct uroce_hello_msg {
  uint16_t major, minor;
  uint32_t pid;
};
struct uroce_hello_reply {
  uint32_t session;
  uint8_t gid[16]; /* the daemon's RoCE address (IPv4-mapped or IPv6) */
  uint8_t mac[6];
  uint16_t minor;
};

struct uroce_handle_reply {
  uint32_t handle;
};

struct uroce_reg_mr_msg {
  uint32_t pd;
  uint32_t access; /* enum ibv_access_flags */
  uint64_t app_va; /* where the application sees the memory */
  uint64_t length;
  uint64_t offset; /* into the passed memfd */
};
/* At most this many pieces (and descriptors) in one REG_MR_PIECES. */
#define UROCE_MR_MAX_PIECES 16u
struct uroce_reg_mr_piece {
  uint64_t offset; /* into the piece's memfd, page aligned */
  uint64_t length; /* page aligned */
};
struct uroce_reg_mr_pieces_msg {
  struct uroce_reg_mr_msg mr; /* length: the pieces' sum; offset: unused (0) */
  uint32_t count;             /* 1..UROCE_MR_MAX_PIECES: the descriptors that come along, in order */
  uint32_t pad;
  struct uroce_reg_mr_piece piece[UROCE_MR_MAX_PIECES];
};
/* Minor 14: appended to REG_MR's uroce_reg_mr_msg and to REG_MR_PIECES's
 * uroce_reg_mr_pieces_msg: the MR's own bytes within the mapped pages. The
 * MR is [app_va + head, app_va + head + byte_length) (app_va is then the
 * pages' start, modulo 2^64: a zero-based MR may start inside its first
 * page), and nothing outside it is reachable through its keys. Without it
 * (an older library) the MR is the whole pages. */
struct uroce_reg_mr_exact {
  uint64_t head;        /* the MR's first byte, from the first page's start: 0..4095 */
  uint64_t byte_length; /* 1..length - head; from minor 15 also 0 (an MR of no bytes) */
};
struct uroce_rereg_mr_msg {
  uint32_t handle; /* the MR */
  uint32_t flags;  /* IBV_REREG_MR_CHANGE_TRANSLATION, _PD, _ACCESS: at least one */
  uint32_t pd;     /* with IBV_REREG_MR_CHANGE_PD */
  uint32_t access; /* with IBV_REREG_MR_CHANGE_ACCESS: enum ibv_access_flags */
};
struct uroce_mcast_msg {
  uint32_t qp;
  uint32_t attach; /* 1: join, 0: leave */
  uint8_t gid[16]; /* the group: IPv4-mapped 224/4, or IPv6 ff00::/8 */
};
struct uroce_reg_mr_reply {
  uint32_t handle, lkey, rkey, pad;
};

struct uroce_alloc_mw_msg {
  uint32_t pd;
  uint32_t type; /* IBV_MW_TYPE_1 or IBV_MW_TYPE_2 */
};
struct uroce_alloc_mw_reply {
  uint32_t handle, rkey;
};

enum uroce_qp_opt {
  UROCE_QP_OPT_CC = 1, /* name: a congestion control ("none", "dcqcn", "swift", ...) */
  UROCE_QP_OPT_SR = 2  /* value: 1 selective repeat (IRN-style, uroce peers only), 0 go-back-N */
};
struct uroce_qp_opt_msg {
  uint32_t qp;    /* the QP's handle */
  uint32_t opt;   /* enum uroce_qp_opt */
  uint32_t value;
  char name[20];  /* NUL-terminated */
};

struct uroce_create_cq_msg {
  uint32_t entries;
};
struct uroce_resize_cq_msg {
  uint32_t handle;  /* the CQ's */
  uint32_t entries; /* 1..65536, and room for the completions waiting */
};

struct uroce_create_qp_msg {
  uint32_t pd, send_cq, recv_cq;
  uint32_t qp_type; /* enum ibv_qp_type: RC, UC; UD from minor 6 */
  uint32_t max_send_wr, max_recv_wr; /* ring sizes, rounded up to powers of two */
  uint32_t sq_sig_all;
  uint32_t srq; /* minor 2: an SRQ handle, or 0; with an SRQ, max_recv_wr is ignored */
  /* Minor 17: IBV_QPT_XRC_RECV's domain (pd, send_cq and recv_cq are then
   * 0: the QP takes those of the XRC SRQ each request names). An
   * IBV_QPT_XRC_SEND QP has a PD and a send CQ only (recv_cq 0). */
  uint32_t xrcd;
  /* Minor 18: receive-side scaling. rss_log_size != 0 makes a RAW_PACKET
   * QP that receives only, into the 2^rss_log_size work queues of
   * rss_wq (SRQ handles made with a CQ and no domain): each frame a flow
   * rule gives it goes to rss_wq[toeplitz(rss_key, fields) & (size - 1)].
   * The QP has a PD and no CQs or queues of its own. A library sends the
   * whole message only for such a QP (36 bytes otherwise). */
  uint32_t rss_log_size;               /* 0, or 1..UROCE_RSS_MAX_LOG */
  uint32_t rss_fields;                 /* IBV_RX_HASH_{SRC,DST}_{IPV4,IPV6}, _{SRC,DST}_PORT_{TCP,UDP} */
  uint8_t rss_key[40];                 /* Toeplitz */
  uint32_t rss_wq[1u << 6];            /* UROCE_RSS_MAX_LOG */
};
#define UROCE_RSS_MAX_LOG 6u
struct uroce_create_srq_msg {
  uint32_t pd;
  uint32_t max_wr;  /* ring size, rounded up to a power of two */
  uint32_t max_sge; /* <= UROCE_ABI_MAX_SGE */
  /* Minor 17: an XRC SRQ (IBV_SRQT_XRC): its domain and the CQ its
   * receives complete in; both 0 for a basic SRQ. Minor 18: a CQ and no
   * domain make a receive work queue (ibv_create_wq), an RSS table's entry. */
  uint32_t xrcd, cq;
  /* Minor 19: a tag-matching SRQ (IBV_SRQT_TM) when tm_max_tags > 0: up to
   * UROCE_TM_MAX_TAGS tags, an operations ring of tm_max_ops (rounded up to
   * a power of two, at most UROCE_TM_MAX_OPS), and `cq` is where its
   * operations complete (uroce_abi.h: the mapping's layout). */
  uint32_t tm_max_tags, tm_max_ops;
};
struct uroce_create_srq_reply {
  uint32_t handle;
  uint32_t srq_num; /* minor 17: an XRC SRQ's number, which XRC senders name (ibv_get_srq_num); else 0 */
};
struct uroce_open_xrcd_msg {
  int32_t oflags;  /* with an fd: O_CREAT makes the file's domain if it has none; O_CREAT | O_EXCL refuses one that exists */
  uint32_t has_fd; /* 1: the file's descriptor comes with the message */
};

struct uroce_create_qp_reply {
  uint32_t handle, qpn;
  uint32_t sq_entries, rq_entries;
  uint64_t rq_offset; /* where the RQ ring starts in the passed memfd; the SQ ring is at 0 */
};

/* ibv_qp_attr's wire-relevant fields, explicitly laid out (no pointers). */
struct uroce_modify_qp_msg {
  uint32_t qp;
  int32_t mask; /* enum ibv_qp_attr_mask */
  uint32_t qp_state, path_mtu, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags;
  uint8_t dgid[16];
  uint8_t traffic_class, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry;
  uint16_t pkey_index;
  uint8_t hop_limit, sl; /* minor 5: the GRH hop limit and the service level (were `pad`) */
  /* Minor 5, appended: the GRH flow label and cur_qp_state (IBV_QP_CUR_STATE). */
  uint32_t flow_label, cur_qp_state;
};

enum uroce_object {
  UROCE_OBJ_QP = 1,
  UROCE_OBJ_CQ = 2,
  UROCE_OBJ_MR = 3,
  UROCE_OBJ_PD = 4,
  UROCE_OBJ_DEVICE = 5,
  UROCE_OBJ_SRQ = 6,
  UROCE_OBJ_PORT = 7, /* QUERY only (minor 7): reply port_attr */
  UROCE_OBJ_MW = 8,   /* DESTROY (minor 8) */
  UROCE_OBJ_FLOW = 9, /* DESTROY (minor 16) */
  UROCE_OBJ_XRCD = 10 /* DESTROY (minor 17) */
};
struct uroce_destroy_msg {
  uint32_t object; /* enum uroce_object */
  uint32_t handle;
};

struct uroce_query_msg {
  uint32_t object; /* UROCE_OBJ_DEVICE, UROCE_OBJ_QP or UROCE_OBJ_PORT */
  uint32_t handle; /* the QP's; 0 for the device */
};

#define UROCE_CM_PRIVATE_MAX 56 /* a REQ's user private data after RDMA CM's header */

struct uroce_cm_msg {
  uint32_t qp; /* QP handle (CONNECT, ACCEPT) */
  uint32_t id; /* the connection (ACCEPT, REJECT, DISCONNECT) */
  uint8_t dgid[16];
  uint16_t port;
  uint8_t private_len;
  uint8_t mtu; /* enum ibv_mtu; 0: IBV_MTU_1024 */
  uint8_t responder_resources, initiator_depth, retry_cnt, rnr_retry;
  uint8_t private_data[UROCE_CM_PRIVATE_MAX];
  /* minor 9 (an older library's 88 bytes read as 0): */
  uint8_t flags; /* UROCE_CM_APP_QP (CONNECT, ACCEPT); UROCE_CM_UD (LISTEN, UNLISTEN); UROCE_CM_ACK_TIMEOUT */
  /* minor 12: with UROCE_CM_ACK_TIMEOUT (CONNECT, ACCEPT), the QP's local
   * ACK timeout, 0..31 (4.096 us * 2^n; rdma_set_option's
   * RDMA_OPTION_ID_ACK_TIMEOUT), instead of the agent's 14 (connect) or the
   * request's (accept). */
  uint8_t ack_timeout;
  uint8_t pad[2];
};
/* The application brings the QP up itself (rdma_cm's ids without a QP):
 * the agent never moves it; the REP is a CONNECT_RESPONSE event, answered
 * by UROCE_MSG_CM_ESTABLISH. */
#define UROCE_CM_APP_QP 1u
/* RDMA_PS_UDP's port space: a listen answers SIDR requests (UD). A CONNECT
 * or ACCEPT with a UD QP is a SIDR request or answer. */
#define UROCE_CM_UD 2u
#define UROCE_CM_ACK_TIMEOUT 4u
struct uroce_cm_id_reply {
  uint32_t id;
};
struct uroce_cm_event_msg {
  uint32_t event;  /* enum uroce_cm_event_type (rdma_cm_event_type's values) */
  uint32_t id;
  int32_t status;  /* REJECTED, UNREACHABLE: the IBTA reject reason */
  uint32_t peer_qpn;
  uint8_t peer_gid[16];
  uint16_t peer_port, local_port;
  uint8_t responder_resources, initiator_depth, mtu, private_len;
  uint8_t private_data[UROCE_CM_PRIVATE_MAX];
  /* minor 9: what the QP is to be brought up with (CONNECT_REQUEST,
   * CONNECT_RESPONSE), as rdma_init_qp_attr reports it. */
  uint32_t sq_psn, rq_psn;
  uint8_t retry_cnt, rnr_retry, ack_timeout, max_rd_atomic;
  uint8_t max_dest_rd_atomic;
  uint8_t ud;    /* a SIDR request (CONNECT_REQUEST) or answer (ESTABLISHED, UNREACHABLE: status is SIDR's) */
  uint8_t pad[2];
  uint32_t qkey; /* UD ESTABLISHED: the peer QP's Q_Key */
};

struct uroce_reg_mr_odp_msg {
  uint32_t pd;
  uint32_t access; /* ibv_access_flags, IBV_ACCESS_ON_DEMAND among them */
  uint64_t addr;   /* the application's; 0 with length UINT64_MAX: the whole address space (implicit ODP) */
  uint64_t length;
  uint64_t iova;   /* what peers and SGEs address its first byte as (implicit ODP: 0) */
};

/* What a flow rule matches: a frame's fields, in network byte order, each
 * compared under the mask (0 bits: any). An IPv4 address is IPv4-mapped. */
struct uroce_flow_key {
  uint8_t dmac[6];
  uint8_t smac[6];
  uint8_t ethertype[2]; /* the inner one, past an 802.1Q tag */
  uint8_t vlan[2];      /* the tag's TCI (0: untagged) */
  uint8_t src_ip[16];
  uint8_t dst_ip[16];
  uint8_t ip_proto;     /* IPv4 protocol, IPv6 next header */
  uint8_t tos;          /* IPv4 TOS, IPv6 traffic class */
  uint8_t sport[2];     /* TCP or UDP */
  uint8_t dport[2];
  uint8_t pad[2];
};
struct uroce_flow_msg {
  uint32_t qp;       /* a raw packet QP of the session */
  uint32_t priority; /* the lowest matching value takes the frame */
  struct uroce_flow_key value, mask;
};

struct uroce_resolve_msg {
  uint8_t dgid[16]; /* an IPv4-mapped or IPv6 address */
};
struct uroce_resolve_reply {
  uint8_t mac[6];
  uint16_t pad;
};

/* What this session may create (its limits) and what the daemon supports. */
struct uroce_device_attr {
  uint32_t max_qp, max_cq, max_mr, max_pd;
  uint32_t max_qp_wr, max_sge, max_cqe, max_qp_rd_atom;
  uint64_t max_mr_size;
  uint8_t mac[6];
  uint16_t flags; /* minor 16: UROCE_DEVICE_* (0 from an older daemon) */
  uint32_t max_srq, max_srq_wr; /* minor 18: CREATE_SRQ's bounds (an older daemon sends 48 bytes) */
};
#define UROCE_DEVICE_ODP 1u /* ODP MRs (UROCE_MSG_REG_MR_ODP) are allowed */

/* The port's link as its driver reports it (minor 7). */
struct uroce_port_attr {
  uint32_t state;      /* enum ibv_port_state: IBV_PORT_ACTIVE or IBV_PORT_DOWN */
  uint32_t speed_mbps; /* 0: the driver does not say */
  uint32_t mtu;        /* the Ethernet MTU; 0: the driver does not say */
};

UROCE_STATIC_ASSERT(sizeof(struct uroce_device_attr) == 56, "device_attr is 56 bytes (48 before minor 18)");
UROCE_STATIC_ASSERT(sizeof(struct uroce_port_attr) == 12, "port_attr is 12 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_msg_hdr) == 16, "message header is 16 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_reply_status) == 128, "reply status is 128 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_reg_mr_msg) == 32, "reg_mr is 32 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_reg_mr_exact) == 16, "reg_mr_exact is 16 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_rereg_mr_msg) == 16, "rereg_mr is 16 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_mcast_msg) == 24, "mcast is 24 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_reg_mr_odp_msg) == 32, "reg_mr_odp is 32 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_flow_key) == 56, "flow_key is 56 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_flow_msg) == 120, "flow is 120 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_reg_mr_pieces_msg) == 40 + 16 * UROCE_MR_MAX_PIECES, "reg_mr_pieces layout");
UROCE_STATIC_ASSERT(sizeof(struct uroce_create_qp_msg) == 340, "create_qp is 340 bytes (28 before minor 2, 32 before 17, 36 before 18)");
UROCE_STATIC_ASSERT(sizeof(struct uroce_cm_msg) == 92, "cm is 92 bytes (88 before minor 9)");
UROCE_STATIC_ASSERT(sizeof(struct uroce_cm_event_msg) == 116, "cm_event is 116 bytes (96 before minor 9)");
UROCE_STATIC_ASSERT(sizeof(struct uroce_create_srq_msg) == 28, "create_srq is 28 bytes (12 before minor 17, 20 before 19)");
UROCE_STATIC_ASSERT(sizeof(struct uroce_create_srq_reply) == 8 && sizeof(struct uroce_open_xrcd_msg) == 8,
                    "create_srq reply and open_xrcd are 8 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_alloc_mw_msg) == 8 && sizeof(struct uroce_alloc_mw_reply) == 8, "alloc_mw is 8 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_create_qp_reply) == 24, "create_qp reply is 24 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_qp_opt_msg) == 32, "qp_opt is 32 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_resolve_msg) == 16, "resolve is 16 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_resolve_reply) == 8, "resolve reply is 8 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_modify_qp_msg) == 72, "modify_qp is 72 bytes (64 before minor 5)");

#ifdef __cplusplus
}
#endif

#endif /* UROCE_SESSION_PROTO_H */
