/*
 * The uroce shared-memory ABI, version 1.
 *
 * An application and uroced share memory: rings of work requests and
 * completions live there, and so do registered buffers. Nothing on the fast
 * path crosses a system call. This header is the contract; it is plain C so
 * any language can speak it, and every offset is pinned by a static assert.
 *
 * Rings. Each ring is a uroce_ring_header followed by `entries` fixed-size
 * entries (a power of two). One side produces, the other consumes:
 *   send ring (per QP):   application -> daemon   uroce_send_entry
 *   recv ring (per QP):   application -> daemon   uroce_recv_entry
 *   srq ring (per SRQ):   application -> daemon   uroce_recv_entry
 *   cq ring   (per CQ):   daemon -> application   uroce_cq_entry
 *
 * Protocol (single producer, single consumer):
 *   produce(i): wait until i - cons < entries; write entry i % entries;
 *               then store seq = i + 1 (release) -- the seq is the valid
 *               flag and is written last; then store prod = i + 1 (release).
 *   consume(i): entry i % entries is ready when its seq == i + 1 (acquire);
 *               read it; then store cons = i + 1 (release).
 * prod and cons are each written by one side only, and sit on cache lines of
 * their own, so the two sides never write the same line.
 *
 * Versioning. The application and the daemon exchange (major, minor) when the
 * application attaches; each ring header repeats it. A different major is
 * refused; a newer minor may only add fields in reserved space, add message
 * types, or append fields to a control request (see session_proto.h).
 */
#ifndef UROCE_ABI_H
#define UROCE_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#define UROCE_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define UROCE_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define UROCE_ABI_MAGIC 0x45524f55u /* "UORE" read little-endian */
#define UROCE_ABI_MAJOR 1
#define UROCE_ABI_MINOR 20 /* 1: CQ notification words (arm, notified); 2: SRQs; 3: RDMA CM; 4: session page and doorbell;
                            5: one queue per verbs queue (the daemon consumes a send entry when it completes), inline
                            data, the UD address vector, the posts word, async events; 6: UD QPs for applications,
                            address resolution (UROCE_MSG_RESOLVE); 7: CM event channel (UROCE_MSG_CM_CHANNEL);
                            8: memory windows (UROCE_MSG_ALLOC_MW, IBV_WR_BIND_MW and IBV_WR_LOCAL_INV entries);
                            9: CM connections whose application brings its QP up (UROCE_CM_APP_QP,
                            UROCE_MSG_CM_ESTABLISH, the QP attributes in cm_event); UD through the CM
                            (SIDR: UROCE_CM_UD listens, UD QPs in CONNECT and ACCEPT); 10: uroce's QP attributes
                            (UROCE_MSG_SET_QP_OPT: congestion control, selective repeat); 11: the QP's state
                            in its send ring's header (qp_state); 12: a CM connection's ACK timeout
                            (UROCE_CM_ACK_TIMEOUT); 13: completion timestamps (uroce_cq_entry.timestamp);
                            14: an MR's exact bytes (uroce_reg_mr_exact after REG_MR and REG_MR_PIECES);
                            15: MRs changed in place (UROCE_MSG_REREG_MR), MRs of 0 bytes, multicast (UROCE_MSG_MCAST);
                            16: ODP MRs (UROCE_MSG_REG_MR_ODP, UROCE_DEVICE_ODP); raw packet QPs and flow
                            rules (UROCE_MSG_CREATE_FLOW); 17: XRC (UROCE_MSG_OPEN_XRCD, XRC SRQs and QPs,
                            uroce_send_entry.xrc_srqn); 18: receive work queues (SRQs with a CQ and no
                            domain) and RSS QPs over them (uroce_create_qp_msg.rss_*); 19: tag matching
                            (tag-matching SRQs: uroce_create_srq_msg.tm_*, the operations ring, the
                            tag of a completion in src_qp and tag_hi); 20: the session's work ring
                            (uroce_work_ring in the session page, work_queued in a ring's header): an
                            application names the QPs it posted to, and the daemon looks at those alone */
#define UROCE_ABI_CACHELINE 64
#define UROCE_ABI_MAX_SGE 4
#define UROCE_ABI_MAX_INLINE 64 /* inline bytes a send entry carries, in place of its SGEs */

enum uroce_ring_kind { UROCE_RING_SEND = 1, UROCE_RING_RECV = 2, UROCE_RING_SRQ = 3, UROCE_RING_CQ = 4, UROCE_RING_TM_OPS = 5 };

/* Three cache lines: what the ring is, the producer index, the consumer index. */
struct uroce_ring_header {
  uint32_t magic;      /* UROCE_ABI_MAGIC */
  uint16_t major;      /* UROCE_ABI_MAJOR */
  uint16_t minor;      /* UROCE_ABI_MINOR */
  uint32_t kind;       /* enum uroce_ring_kind */
  uint32_t entries;    /* a power of two */
  uint32_t entry_size; /* sizeof the entry type, checked on attach */
  uint32_t handle;     /* the QP/CQ/SRQ handle it belongs to */
  uint8_t reserved0[UROCE_ABI_CACHELINE - 24];
  uint32_t prod;     /* written by the producer only */
  uint32_t notified; /* CQ rings: the last `arm` the producer signalled (producer writes) */
  uint8_t reserved1[UROCE_ABI_CACHELINE - 8];
  uint32_t cons; /* written by the consumer only */
  uint32_t arm;  /* CQ rings: bumped by the consumer to ask for one notification */
  /* QP send rings: the QP's state (enum ibv_qp_state) plus one, written by
   * the daemon (the consumer) at every change; 0: not published (a daemon
   * before minor 11). The application refuses posts the state forbids. */
  uint32_t qp_state;
  /* Minor 20, QP send rings and tag-matching operations rings: 1 while the
   * queue is named in the session's work ring (below) and not yet taken.
   * The application sets it, 0 to 1, when it queues the name; the daemon
   * clears it when it takes the name, before it looks at the queue. */
  uint32_t work_queued;
  uint8_t reserved2[UROCE_ABI_CACHELINE - 16];
};

struct uroce_sge {
  uint64_t addr; /* in the application's address space */
  uint32_t length;
  uint32_t lkey;
};

/*
 * A send work request: 128 bytes. Names and values follow ibv_send_wr.
 * The daemon consumes it (advances cons) only when the work request has
 * completed, so the ring's depth is the send queue's depth: a full ring is
 * ENOMEM at post time, as in verbs. It copies an entry once, when it takes
 * it, and never reads the slot again.
 *   IBV_SEND_INLINE: the data (inline_len <= UROCE_ABI_MAX_INLINE bytes) is
 *     in place of sg_list, and num_sge is 0.
 *   What the operation needs is in `op`, one layout per kind of operation,
 *   each field named for what it is (stack/abi/send_entry.h writes them all):
 *     op.rdma: SEND, RDMA WRITE and READ (with immediate or invalidation),
 *       ATOMIC WRITE;
 *     op.atomic: compare-and-swap and fetch-and-add;
 *     op.bind (minor 8; RC and UC, num_sge 0): IBV_WR_BIND_MW. imm_or_inv
 *       is the window's R_Key now;
 *     op.flush (minor 9; RC, num_sge 0): UROCE_WR_FLUSH. imm_or_inv holds
 *       the FETH's bits (the placement type, UROCE_FLUSH_GLOBAL, in bits
 *       0-3; the selectivity level, UROCE_FLUSH_RANGE or UROCE_FLUSH_MR, in
 *       bits 4-5);
 *     op.ud: a UD send's address vector and remote QP, as a hardware
 *       WQE's datagram segment carries them.
 *   IBV_WR_LOCAL_INV: imm_or_inv is the key to invalidate; `op` is unused.
 *   The layouts name the bytes that earlier minors used for the same
 *   things, so every minor's entries read alike.
 */
/* IBTA 1.5's FLUSH (Memory Placement Extensions), with rdma-core 45's
 * numbers; rdma-core 44's header, which uroce builds against, has none. */
#define UROCE_WR_FLUSH 14                  /* IBV_WR_FLUSH */
#define UROCE_WC_FLUSH 8                   /* IBV_WC_FLUSH */
#define UROCE_ACCESS_FLUSH_GLOBAL (1 << 8) /* IBV_ACCESS_FLUSH_GLOBAL: an MR or QP that takes FLUSHes */
#define UROCE_ACCESS_FLUSH_PERSISTENT (1 << 9)
#define UROCE_FLUSH_GLOBAL 1u              /* placement types: global visibility */
#define UROCE_FLUSH_PERSISTENT 2u          /* persistence (uroce has no persistent memory: refused) */
#define UROCE_FLUSH_RANGE 0u               /* selectivity levels: the range, or the whole MR */
#define UROCE_FLUSH_MR 1u
/* 40 bytes each. xrc_srqn (minor 17): on an XRC send QP, the XRC SRQ the
 * request is for (its XRCETH); else 0. */
struct uroce_send_rdma {
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t reserved0;
  uint64_t reserved1[2];
  uint32_t reserved2;
  uint32_t xrc_srqn;
};
struct uroce_send_atomic {
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t reserved0;
  uint64_t compare_add;
  uint64_t swap;
  uint32_t reserved1;
  uint32_t xrc_srqn;
};
struct uroce_send_bind {
  uint64_t addr;     /* the window's range, in the MR's address space */
  uint32_t new_rkey; /* the window's R_Key once bound */
  uint32_t mr_lkey;  /* the MR it is bound to */
  uint64_t length;
  uint32_t access; /* the window's access flags (IBV_ACCESS_*) */
  uint32_t reserved0;
  uint64_t reserved1;
};
struct uroce_send_flush {
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t reserved0;
  uint64_t length;
  uint64_t reserved1;
  uint32_t reserved2;
  uint32_t xrc_srqn;
};
struct uroce_send_ud {
  uint8_t dmac[6]; /* the next hop's MAC */
  uint8_t traffic_class;
  uint8_t reserved0;
  uint32_t reserved1;
  uint32_t remote_qpn;
  uint8_t dgid[16]; /* an IPv4-mapped or IPv6 address */
  uint32_t remote_qkey;
  uint32_t reserved2;
};
struct uroce_send_entry {
  uint64_t wr_id;
  uint8_t opcode;      /* enum ibv_wr_opcode */
  uint8_t num_sge;     /* <= UROCE_ABI_MAX_SGE */
  uint16_t send_flags; /* enum ibv_send_flags */
  uint32_t imm_or_inv; /* immediate data (host order), the rkey to invalidate, a bind's window, FLUSH's FETH */
  union {
    struct uroce_send_rdma rdma;
    struct uroce_send_atomic atomic;
    struct uroce_send_bind bind;
    struct uroce_send_flush flush;
    struct uroce_send_ud ud;
  } op;
  uint32_t inline_len; /* IBV_SEND_INLINE: the bytes in place of sg_list */
  uint32_t seq; /* valid flag: entry index + 1, written last */
  struct uroce_sge sg_list[UROCE_ABI_MAX_SGE];
};
/* Where earlier minors had each field: the layouts must not move them. */
UROCE_STATIC_ASSERT(sizeof(struct uroce_send_entry) == 128, "send entry is 128 bytes");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_rdma, rkey) == 24, "rkey at 24");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_rdma, xrc_srqn) == 52, "xrc_srqn at 52");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_atomic, compare_add) == 32, "compare_add at 32");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_atomic, swap) == 40, "swap at 40");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_bind, mr_lkey) == 28, "a bind's MR at 28");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_bind, access) == 40, "a bind's access at 40");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_flush, length) == 32, "FLUSH's length at 32");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_ud, dmac) == 16, "UD MAC at 16");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_ud, traffic_class) == 22, "UD class at 22");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_ud, remote_qpn) == 28, "UD QPN at 28");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_ud, dgid) == 32, "UD GID at 32");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, op) + offsetof(struct uroce_send_ud, remote_qkey) == 48, "UD Q_Key at 48");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, inline_len) == 56, "inline_len at 56");

/* Bytes of shared memory a ring of `entries` entries of `entry_size` needs. */
static inline size_t uroce_ring_bytes(uint32_t entries, uint32_t entry_size) {
  return sizeof(struct uroce_ring_header) + (size_t)entries * entry_size;
}

/* A receive work request: 80 bytes. */
struct uroce_recv_entry {
  uint64_t wr_id;
  uint32_t num_sge;
  uint32_t seq; /* valid flag, written last */
  struct uroce_sge sg_list[UROCE_ABI_MAX_SGE];
};

/* A completion: 64 bytes. Names and values follow ibv_wc. */
struct uroce_cq_entry {
  uint64_t wr_id;
  uint32_t status; /* enum ibv_wc_status */
  uint32_t opcode; /* enum ibv_wc_opcode */
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_or_inv; /* imm_data (network order, as in ibv_wc) or invalidated_rkey */
  uint32_t qp_num;
  uint32_t src_qp;
  uint32_t wc_flags;
  uint16_t pkey_index;
  uint8_t reserved[6];
  /* minor 13: when the completion was made, in ns of the daemon's
   * CLOCK_MONOTONIC (the device's free-running clock: hca_core_clock
   * 1 GHz); 0 from an older daemon. */
  uint64_t timestamp;
  /* minor 19: a tag-matching completion (IBV_WC_TM_*) of a matched message
   * has its tag's high 32 bits here and the low 32 in src_qp, and the TMH's
   * app_ctx in vendor_err (which is an error's only otherwise). */
  uint32_t tag_hi;
  uint32_t seq; /* valid flag, written last */
};

/*
 * Tag matching (minor 19), as ConnectX offers it through ibv_post_srq_ops.
 * A tag-matching SRQ (uroce_create_srq_msg.tm_max_tags > 0) keeps a list of
 * tagged buffers besides its receives. Its mapping holds, after the receive
 * ring, at uroce_tm_ops_offset(): the operations ring (uroce_tm_op entries,
 * application -> daemon, the same protocol as every ring; the daemon takes
 * each at once, in order), then one uint32_t per tag, `released`.
 *   A tag's handle is its index, 0..tm_max_tags-1. The application counts
 *   its ADDs of each index (gen) and may ADD index i again only when
 *   released[i] == its count: the daemon writes the ADD's gen there when
 *   the tag leaves the list (its message completed, or a DEL took it).
 *   A message that reaches the SRQ starts with a TMH (16 bytes, struct
 *   ibv_tmh: opcode, app_ctx, tag, big-endian). EAGER and RNDV look for the
 *   oldest tag t with (tag & t.mask) == (t.tag & t.mask); an EAGER one puts
 *   what follows the TMH into the tag's buffer; an RNDV one (an RVH after
 *   the TMH: va, rkey, len) has the daemon READ len bytes from the sender
 *   into it, then SEND the sender a FIN (a TMH with IBV_TMH_FIN). A message
 *   that matches nothing, or any while the list is out of sync, is
 *   unexpected: it takes a receive, whole. An unexpected EAGER or RNDV stops
 *   matching until the application says, by a SYNC (or an ADD with
 *   IBV_OPS_TM_SYNC), that it has seen that many unexpected messages.
 */
#define UROCE_TM_MAX_TAGS 64       /* tm_caps.max_num_tags */
#define UROCE_TM_MAX_OPS 64        /* tm_caps.max_ops: the operations ring's depth at most */
#define UROCE_TM_MAX_SGE 1         /* tm_caps.max_sge */
#define UROCE_TM_MAX_RNDV_HDR 64   /* tm_caps.max_rndv_hdr_size */
#define UROCE_TMH_BYTES 16
#define UROCE_RVH_BYTES 16
struct uroce_tm_op {
  uint64_t wr_id;
  uint8_t opcode;  /* enum ibv_ops_wr_opcode: IBV_WR_TAG_ADD, IBV_WR_TAG_DEL, IBV_WR_TAG_SYNC */
  uint8_t flags;   /* enum ibv_ops_flags: IBV_OPS_SIGNALED, IBV_OPS_TM_SYNC */
  uint8_t num_sge; /* ADD: 0..UROCE_TM_MAX_SGE */
  uint8_t reserved0;
  uint32_t seq; /* valid flag, written last */
  uint64_t tag, mask, recv_wr_id; /* ADD */
  uint32_t handle;                /* ADD, DEL: the tag's index */
  uint32_t gen;                   /* ADD, DEL: the application's count of ADDs of that index */
  uint32_t unexpected_cnt;        /* SYNC, and ADD with IBV_OPS_TM_SYNC */
  uint32_t reserved1;
  struct uroce_sge sge; /* ADD */
  uint8_t reserved2[8];
};
/* Where a tag-matching SRQ's operations ring starts in its mapping, and
 * where the released words start. */
static inline size_t uroce_tm_ops_offset(uint32_t srq_entries) {
  return (uroce_ring_bytes(srq_entries, sizeof(struct uroce_recv_entry)) + UROCE_ABI_CACHELINE - 1) &
         ~(size_t)(UROCE_ABI_CACHELINE - 1);
}
static inline size_t uroce_tm_released_offset(uint32_t srq_entries, uint32_t ops_entries) {
  return uroce_tm_ops_offset(srq_entries) + uroce_ring_bytes(ops_entries, sizeof(struct uroce_tm_op));
}
static inline size_t uroce_tm_srq_bytes(uint32_t srq_entries, uint32_t ops_entries, uint32_t tags) {
  return uroce_tm_released_offset(srq_entries, ops_entries) + (size_t)tags * sizeof(uint32_t);
}

UROCE_STATIC_ASSERT(sizeof(struct uroce_ring_header) == 3 * UROCE_ABI_CACHELINE, "ring header is 3 cache lines");
UROCE_STATIC_ASSERT(sizeof(struct uroce_tm_op) == 80 && offsetof(struct uroce_tm_op, seq) == 12,
                    "tm op is 80 bytes, its seq at 12");
UROCE_STATIC_ASSERT(offsetof(struct uroce_cq_entry, tag_hi) == 56, "cq entry tag_hi at 56");
UROCE_STATIC_ASSERT(offsetof(struct uroce_ring_header, prod) == UROCE_ABI_CACHELINE, "prod on its own line");
UROCE_STATIC_ASSERT(offsetof(struct uroce_ring_header, cons) == 2 * UROCE_ABI_CACHELINE, "cons on its own line");
UROCE_STATIC_ASSERT(offsetof(struct uroce_ring_header, notified) == UROCE_ABI_CACHELINE + 4, "notified beside prod");
UROCE_STATIC_ASSERT(offsetof(struct uroce_ring_header, arm) == 2 * UROCE_ABI_CACHELINE + 4, "arm beside cons");
UROCE_STATIC_ASSERT(sizeof(struct uroce_sge) == 16, "sge is 16 bytes");
UROCE_STATIC_ASSERT(sizeof(struct uroce_send_entry) == 128, "send entry is 128 bytes");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, seq) == 60, "send entry seq at 60");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, sg_list) == 64, "send entry SGEs at 64");
UROCE_STATIC_ASSERT(offsetof(struct uroce_send_entry, inline_len) == 56, "send entry inline_len at 56");
UROCE_STATIC_ASSERT(UROCE_ABI_MAX_INLINE == sizeof(((struct uroce_send_entry*)0)->sg_list), "inline data fills sg_list");
UROCE_STATIC_ASSERT(sizeof(struct uroce_recv_entry) == 80, "recv entry is 80 bytes");
UROCE_STATIC_ASSERT(offsetof(struct uroce_recv_entry, seq) == 12, "recv entry seq at 12");
UROCE_STATIC_ASSERT(sizeof(struct uroce_cq_entry) == 64, "cq entry is one cache line");
UROCE_STATIC_ASSERT(offsetof(struct uroce_cq_entry, seq) == 60, "cq entry seq at 60");
UROCE_STATIC_ASSERT(offsetof(struct uroce_cq_entry, timestamp) == 48, "cq entry timestamp at 48");

/*
 * The session page (minor 4): one per session, made by the daemon, sealed
 * against shrinking, and handed over with the HELLO reply together with the
 * session's doorbell (a datagram socket). It tells a producer whether the
 * daemon may be blocked, so a post costs no system call while it is awake:
 *   producer (application), after publishing an entry in any of the
 *     session's SQ, RQ or SRQ rings: full fence; if daemon_sleeping != 0,
 *     send one byte on the doorbell (non-blocking; a full socket is fine,
 *     it is already readable).
 *   daemon, before blocking: daemon_sleeping = 1; full fence; look at every
 *     ring once more; block only if they are all empty; on waking,
 *     daemon_sleeping = 0.
 * Either the daemon's last look sees the entry, or the producer sees the
 * flag and rings: no wake-up is lost (virtio's notification suppression).
 */
struct uroce_session_page {
  uint32_t magic; /* UROCE_ABI_MAGIC */
  uint16_t major, minor;
  uint8_t reserved0[UROCE_ABI_CACHELINE - 8];
  uint32_t daemon_sleeping; /* written by the daemon only */
  uint32_t sleeps;          /* written by the daemon only: how often it blocked (statistics) */
  uint8_t reserved1[UROCE_ABI_CACHELINE - 8];
  /* Minor 5: bumped (atomically) by the application after it publishes
   * entries in any of the session's SQ or RQ rings, before the fence above.
   * The daemon looks at a session's queues only when this word has moved,
   * so an awake daemon's cost does not grow with idle QPs. */
  uint32_t posts;
  uint8_t reserved2[UROCE_ABI_CACHELINE - 4];
};

/*
 * The work ring (minor 20), in the session page after its header: the
 * names of the queues an application has published entries in, so the
 * daemon looks at those queues alone, whatever else the session holds.
 * Many producers (the application's threads, and its fork() children),
 * one consumer (the daemon):
 *   producer, after publishing entries in a queue: full fence; if the
 *     queue's work_queued is 0, set it to 1 (atomic exchange), and if it
 *     was 0 claim index i (compare-and-swap prod from i to i + 1, while
 *     i - cons < UROCE_WORK_ENTRIES), write slot i's `what`, then its seq
 *     = i + 1 (release). A full ring: set `overflow` instead, which makes
 *     the daemon look at every queue of the session once. Then the
 *     doorbell, as above.
 *   daemon: slot cons is ready when its seq == cons + 1; it reads `what`,
 *     stores cons + 1, clears the queue's work_queued, fences, and looks
 *     at the queue. Either its look sees an entry, or the producer saw 0
 *     and names the queue again: no post is left unseen.
 * `what` is a QP number (a QP's send and receive queues), or
 * UROCE_WORK_TM_SRQ | the session's handle of a tag-matching SRQ (its
 * operations ring). The daemon checks every name: one that is not the
 * session's own is counted and ignored.
 */
#define UROCE_WORK_ENTRIES 256u
#define UROCE_WORK_TM_SRQ 0x80000000u
struct uroce_work_slot {
  uint32_t seq;
  uint32_t what;
};
struct uroce_work_ring {
  uint32_t prod;     /* claimed by producers (compare-and-swap) */
  uint32_t overflow; /* set by a producer that found the ring full; cleared by the daemon */
  uint8_t reserved0[UROCE_ABI_CACHELINE - 8];
  uint32_t cons; /* written by the daemon only */
  uint8_t reserved1[UROCE_ABI_CACHELINE - 4];
  struct uroce_work_slot slots[UROCE_WORK_ENTRIES];
};
#define UROCE_WORK_RING_OFFSET (3u * UROCE_ABI_CACHELINE)

/*
 * Async events (minor 5): the daemon sends one uroce_async_msg datagram
 * on the session's doorbell socket (the application's end is otherwise
 * only written) for each event, as ibv_get_async_event reports them.
 */
struct uroce_async_msg {
  uint32_t event_type; /* enum ibv_event_type: IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL; minor 7: IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR */
  uint32_t handle;     /* the session's handle of the CQ or QP; the port number (1) for a port event */
};
#define UROCE_SESSION_PAGE_BYTES 4096u

UROCE_STATIC_ASSERT(sizeof(struct uroce_session_page) == 3 * UROCE_ABI_CACHELINE, "session page header is 3 lines");
UROCE_STATIC_ASSERT(offsetof(struct uroce_session_page, posts) == 2 * UROCE_ABI_CACHELINE, "posts on its own line");
UROCE_STATIC_ASSERT(offsetof(struct uroce_session_page, daemon_sleeping) == UROCE_ABI_CACHELINE,
                    "daemon_sleeping on its own line");
UROCE_STATIC_ASSERT(UROCE_WORK_RING_OFFSET >= sizeof(struct uroce_session_page) &&
                        UROCE_WORK_RING_OFFSET + sizeof(struct uroce_work_ring) <= UROCE_SESSION_PAGE_BYTES,
                    "the work ring fits in the session page, after its header");
UROCE_STATIC_ASSERT(offsetof(struct uroce_work_ring, cons) == UROCE_ABI_CACHELINE, "work ring cons on its own line");
UROCE_STATIC_ASSERT(offsetof(struct uroce_ring_header, work_queued) == 2 * UROCE_ABI_CACHELINE + 12,
                    "work_queued beside qp_state");

static inline struct uroce_work_ring* uroce_session_work(struct uroce_session_page* p) {
  return (struct uroce_work_ring*)((uint8_t*)p + UROCE_WORK_RING_OFFSET);
}


/* Whether a peer speaking (major, minor) can attach to us. */
static inline int uroce_abi_compatible(uint16_t major, uint16_t minor) {
  (void)minor; /* minor versions only add fields in reserved space */
  return major == UROCE_ABI_MAJOR;
}

#ifdef __cplusplus
}
#endif

#endif /* UROCE_ABI_H */
