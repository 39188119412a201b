/* The verbs API's rules on uroce, as the specification and rxe define them:
 * plain C against rdma-core's stock <infiniband/verbs.h>, linked with
 * `pkg-config libibverbs` (uroce-run swaps in uroce's library).
 *
 *   - every QP shape the API allows is accepted: RC, UC and UD, with and
 *     without an SRQ, with 0, 1 or 16 send and receive work requests (a
 *     send-only QP, a receive-only QP, an RQ-less QP on an SRQ), and the
 *     depths it reports are at least those asked; what exceeds the
 *     device's limits (max_qp_wr, max_sge) is refused with EINVAL;
 *   - a send-only RC QP (max_recv_wr 0) WRITEs to a peer, every byte checked;
 *   - posts the QP's state forbids are refused with EINVAL: a receive in
 *     RESET, a send in INIT or RTR;
 *   - a receive with more SGEs than the QP's max_recv_sge: EINVAL;
 *   - a full receive queue: ENOMEM exactly at the depth the QP reports;
 *   - a CQ over max_cqe, or with a comp_vector the device lacks: EINVAL;
 *   - an address vector without a GRH (RoCE addresses by GID): EINVAL;
 *   - page_size_cap holds the page size; phys_port_cnt_ex is phys_port_cnt;
 *   - the GID table: index 0 is the port's GID; the others, within
 *     gid_tbl_len, are empty (a zero GID; ibv_query_gid_ex: ENODATA);
 *   - memory unmapped or made read-only before its MR is deregistered:
 *     the deregistration is clean and touches nothing there;
 *   - fork: a child's writes to memory that is registered, or was, do not
 *     reach the parent (heap memory stays private across a fork);
 *   - an MR reaches its own bytes only, not the rest of its pages;
 *   - thread and parent domains: a parent domain is a PD for a QP, an MR
 *     and an extended CQ; a parent of a parent, or a plain PD given as a
 *     CQ's parent domain, is EINVAL;
 *   - device memory (ibv_alloc_dm): copies at 4-byte granules, bounds, a
 *     zero-based MR over part of it that a peer's WRITE reaches;
 *   - ibv_rereg_mr keeps the MR's keys and changes what they reach: its
 *     access (a WRITE after remote write is taken away: remote access
 *     error), its PD (another PD's QP cannot use it), its memory (a WRITE
 *     lands in the new bytes, and the old address is out of bounds);
 *     libibverbs's input rules (IBV_REREG_MR_ERR_INPUT) and the command's
 *     (flags 0, remote write without local write: IBV_REREG_MR_ERR_CMD),
 *     each with EINVAL;
 *   - an MR of 0 bytes registers, and reaches no byte;
 *   - a QP moved to RESET takes its own completions out of its CQ (the
 *     flushes of its error), and leaves those of other QPs;
 *   - multicast: a UD QP in a group (ibv_attach_mcast) receives what
 *     another QP sends to the group's GID and QPN 0xFFFFFF, and nothing
 *     after ibv_detach_mcast; an RC QP, or a unicast GID, is EINVAL;
 *   - completion timestamps: an extended CQ with the free-running and the
 *     wall-clock timestamp stamps a WRITE's completion between the times
 *     read before the post and after the poll; hca_core_clock is 1 GHz
 *     and ibv_query_rt_values_ex reads the same clock.
 *   - raw packet QPs: a frame sent to a group MAC comes back to the flow
 *     rule (ibv_create_flow) that matches it, every byte, and one of
 *     another EtherType does not; a flow on an RC QP is refused; a uid
 *     holds 64 flow rules (the daemon's default), then EDQUOT. Mode "raw"
 *     checks only that ibv_create_qp(RAW_PACKET) is EPERM (run it as a
 *     uid without CAP_NET_RAW).
 *   - XRC: the device says IBV_DEVICE_XRC; a file's XRC domain is made with
 *     O_CREAT only (without it, or with O_EXCL once it exists: EINVAL) and
 *     is shared by a second context (another session): a SEND from an XRC
 *     send QP of the first, through its XRC target QP, lands in the XRC
 *     SRQ the second made in the shared domain (ibv_get_srq_num), every
 *     byte, and completes in that SRQ's CQ with the target's QP number;
 *     an XRC QP takes no receives (EINVAL); a domain with a target QP in
 *     it does not close (EBUSY).
 *   - RSS: rss_caps; four work queues (ibv_create_wq, each with its own
 *     CQ, made RDY), an indirection table of them, and a raw packet QP
 *     over it hashing the IPv4 addresses with Microsoft's Toeplitz key: 16
 *     frames from 16 sources each land, every byte, in the work queue the
 *     hash names (computed here), over more than one queue; a receive on
 *     the RSS QP itself, another hash function or a short key are refused; a work
 *     queue in a table and a table a QP uses do not go (EBUSY).
 *
 *   - the enum strings (ibv_wc_status_str, ibv_event_type_str,
 *     ibv_node_type_str, ibv_port_state_str) are the system library's, each
 *     value and one past each end compared with rdma-core's libibverbs
 *     (UROCE_SYSTEM_IBVERBS), loaded beside this one by dlmopen.
 *
 *   verbs_rules [DEVICE] [odp|raw]      (default: the first device)
 * Prints "N passed, M failed"; exits 0 only when nothing failed. */
#define _GNU_SOURCE  /* dlmopen */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int passed, failed;
static void check(int ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char* fmt, ...) {
  if (ok) {
    ++passed;
    return;
  }
  ++failed;
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

static struct ibv_context* ctx;
static struct ibv_pd* pd;
static struct ibv_cq* cq;
static struct ibv_device_attr dev;

static const char* type_name(enum ibv_qp_type t) {
  return t == IBV_QPT_RC ? "RC" : t == IBV_QPT_UC ? "UC" : "UD";
}

static struct ibv_qp* make_qp(enum ibv_qp_type type, struct ibv_srq* srq, uint32_t send_wr, uint32_t recv_wr,
                              uint32_t send_sge, uint32_t recv_sge, struct ibv_qp_init_attr* out) {
  struct ibv_qp_init_attr a = {0};
  a.send_cq = a.recv_cq = cq;
  a.srq = srq;
  a.qp_type = type;
  a.cap.max_send_wr = send_wr;
  a.cap.max_recv_wr = recv_wr;
  a.cap.max_send_sge = send_sge;
  a.cap.max_recv_sge = recv_sge;
  struct ibv_qp* qp = ibv_create_qp(pd, &a);
  if (out) *out = a;
  return qp;
}

static int to_init(struct ibv_qp* qp, enum ibv_qp_type type) {
  struct ibv_qp_attr a = {0};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (type == IBV_QPT_UD) {
    a.qkey = 0x1234;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  return ibv_modify_qp(qp, &a, mask);
}

/* Moves an RC QP in INIT to RTR, connected to remote QPN on this device's
 * GID (with a GRH if global; without one, RoCE refuses it). */
static int to_rtr(struct ibv_qp* qp, uint32_t remote, int global) {
  union ibv_gid gid;
  if (ibv_query_gid(ctx, 1, 0, &gid)) return -1;
  struct ibv_qp_attr a = {0};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = remote;
  a.rq_psn = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = global;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.dlid = global ? 0 : 1;
  a.ah_attr.port_num = 1;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

/* Connects an RC QP in INIT to remote QPN on this device's GID, up to RTR (and RTS if rts). */
static int rc_up(struct ibv_qp* qp, uint32_t remote, int rts) {
  if (to_rtr(qp, remote, 1)) return -1;
  if (!rts) return 0;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 1;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

static int wait_wc(struct ibv_wc* wc) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    const int n = ibv_poll_cq(cq, 1, wc);
    if (n != 0) return n;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 5) return 0;
  }
}

/* Posts a signaled RDMA WRITE of [laddr, laddr + len) (lkey) to raddr (rkey). */
static int post_write(struct ibv_qp* qp, uint64_t wr_id, uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t raddr,
                      uint32_t rkey) {
  struct ibv_sge sg = {laddr, len, lkey};
  struct ibv_send_wr w = {0}, *bad = NULL;
  w.wr_id = wr_id;
  w.sg_list = &sg;
  w.num_sge = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = raddr;
  w.wr.rdma.rkey = rkey;
  return ibv_post_send(qp, &w, &bad);
}

static void shapes(void) {
  struct ibv_srq_init_attr sa = {0};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  struct ibv_srq* srq = ibv_create_srq(pd, &sa);
  check(srq != NULL, "create an SRQ: errno %d", errno);
  const enum ibv_qp_type types[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
  const uint32_t depths[] = {0, 1, 16};
  for (int t = 0; t < 3; ++t)
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
          if (s && !srq) continue;
          struct ibv_qp_init_attr a;
          struct ibv_qp* qp = make_qp(types[t], s ? srq : NULL, depths[i], depths[j], 1, 1, &a);
          check(qp != NULL, "%s QP, %s SRQ, max_send_wr %u, max_recv_wr %u: accepted (errno %d)", type_name(types[t]),
                s ? "with an" : "without", depths[i], depths[j], qp ? 0 : errno);
          if (!qp) continue;
          check(a.cap.max_send_wr >= depths[i] && (s || a.cap.max_recv_wr >= depths[j]),
                "%s QP: reported depths %u/%u are at least those asked, %u/%u", type_name(types[t]), a.cap.max_send_wr,
                a.cap.max_recv_wr, depths[i], depths[j]);
          check(ibv_destroy_qp(qp) == 0, "destroy the %s QP", type_name(types[t]));
        }
  /* Over the device's limits. */
  errno = 0;
  struct ibv_qp* qp = make_qp(IBV_QPT_RC, NULL, (uint32_t)dev.max_qp_wr + 1, 1, 1, 1, NULL);
  check(qp == NULL && errno == EINVAL, "max_send_wr over max_qp_wr (%d): EINVAL (errno %d)", dev.max_qp_wr, errno);
  if (qp) ibv_destroy_qp(qp);
  errno = 0;
  qp = make_qp(IBV_QPT_RC, NULL, 1, (uint32_t)dev.max_qp_wr + 1, 1, 1, NULL);
  check(qp == NULL && errno == EINVAL, "max_recv_wr over max_qp_wr: EINVAL (errno %d)", errno);
  if (qp) ibv_destroy_qp(qp);
  errno = 0;
  qp = make_qp(IBV_QPT_RC, NULL, 1, 1, (uint32_t)dev.max_sge + 1, 1, NULL);
  check(qp == NULL && errno == EINVAL, "max_send_sge over max_sge (%d): EINVAL (errno %d)", dev.max_sge, errno);
  if (qp) ibv_destroy_qp(qp);
  if (srq) ibv_destroy_srq(srq);
}

static void send_only(void) {
  /* A send-only RC QP WRITEs into a receive-capable one on the same device. */
  enum { kLen = 4096 };
  uint8_t* buf = calloc(2, kLen);
  struct ibv_mr* mr = buf ? ibv_reg_mr(pd, buf, 2 * kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : NULL;
  struct ibv_qp* a = make_qp(IBV_QPT_RC, NULL, 4, 0, 1, 0, NULL);
  struct ibv_qp* b = make_qp(IBV_QPT_RC, NULL, 4, 4, 1, 1, NULL);
  check(mr && a && b, "send-only QP, its peer and an MR (errno %d)", errno);
  if (!(mr && a && b)) goto out;
  int ok = to_init(a, IBV_QPT_RC) == 0 && to_init(b, IBV_QPT_RC) == 0 && rc_up(a, b->qp_num, 1) == 0 &&
           rc_up(b, a->qp_num, 1) == 0;
  check(ok, "send-only QP and its peer reach RTS (errno %d)", errno);
  if (!ok) goto out;
  for (int i = 0; i < kLen; ++i) buf[i] = (uint8_t)(i * 7 + 3);
  memset(buf + kLen, 0xee, kLen);
  check(post_write(a, 77, (uintptr_t)buf, kLen, mr->lkey, (uintptr_t)(buf + kLen), mr->rkey) == 0,
        "send-only QP posts a WRITE");
  struct ibv_wc wc;
  const int n = wait_wc(&wc);
  check(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 77, "the WRITE completes (status %d)",
        n == 1 ? (int)wc.status : -1);
  check(memcmp(buf, buf + kLen, kLen) == 0, "every byte of the WRITE arrived");
out:
  if (a) ibv_destroy_qp(a);
  if (b) ibv_destroy_qp(b);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
}

static void posts(void) {
  uint8_t* buf = calloc(1, 4096);
  struct ibv_mr* mr = buf ? ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_qp_init_attr ia;
  struct ibv_qp* qp = make_qp(IBV_QPT_RC, NULL, 4, 5, 1, 2, &ia);
  struct ibv_qp* peer = make_qp(IBV_QPT_RC, NULL, 4, 4, 1, 1, NULL);
  check(mr && qp && peer, "QPs and an MR for the post rules (errno %d)", errno);
  if (!(mr && qp && peer)) goto out;
  struct ibv_sge sg[3] = {{(uintptr_t)buf, 64, mr->lkey}, {(uintptr_t)buf + 64, 64, mr->lkey},
                          {(uintptr_t)buf + 128, 64, mr->lkey}};
  struct ibv_recv_wr r = {0}, *rbad = NULL;
  r.sg_list = sg;
  r.num_sge = 1;
  struct ibv_send_wr w = {0}, *sbad = NULL;
  w.sg_list = sg;
  w.num_sge = 1;
  w.opcode = IBV_WR_SEND;
  int rc = ibv_post_recv(qp, &r, &rbad);
  check(rc == EINVAL && rbad == &r, "a receive in RESET: EINVAL (got %d)", rc);
  check(to_init(qp, IBV_QPT_RC) == 0 && to_init(peer, IBV_QPT_RC) == 0, "the QPs go to INIT");
  rc = ibv_post_send(qp, &w, &sbad);
  check(rc == EINVAL && sbad == &w, "a send in INIT: EINVAL (got %d)", rc);
  r.num_sge = (int)ia.cap.max_recv_sge + 1;
  rc = ibv_post_recv(qp, &r, &rbad);
  check(rc == EINVAL && rbad == &r, "a receive with max_recv_sge + 1 (%u) SGEs: EINVAL (got %d)", ia.cap.max_recv_sge + 1,
        rc);
  r.num_sge = 1;
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  check(ibv_query_qp(qp, &qa, IBV_QP_CAP, &qi) == 0 && qa.cap.max_recv_wr == ia.cap.max_recv_wr,
        "query_qp reports the depth create_qp did (%u)", ia.cap.max_recv_wr);
  uint32_t taken = 0;
  for (; taken < ia.cap.max_recv_wr + 1; ++taken)
    if ((rc = ibv_post_recv(qp, &r, &rbad)) != 0) break;
  check(taken == ia.cap.max_recv_wr && rc == ENOMEM, "the receive queue takes exactly %u, then ENOMEM (took %u, got %d)",
        ia.cap.max_recv_wr, taken, rc);
  /* RoCE addresses by GID: an address vector without a GRH is EINVAL, as
   * the kernel refuses it on a RoCE port (qperf without -cm1 does this). */
  rc = to_rtr(qp, peer->qp_num, 0);
  check(rc == EINVAL, "RTR with an address vector without a GRH: EINVAL (got %d)", rc);
  check(rc_up(qp, peer->qp_num, 0) == 0, "the QP goes to RTR");
  rc = ibv_post_send(qp, &w, &sbad);
  check(rc == EINVAL, "a send in RTR: EINVAL (got %d)", rc);
out:
  if (qp) ibv_destroy_qp(qp);
  if (peer) ibv_destroy_qp(peer);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
}

static void cqs_and_attrs(void) {
  errno = 0;
  struct ibv_cq* c = ibv_create_cq(ctx, dev.max_cqe + 1, NULL, NULL, 0);
  check(c == NULL && errno == EINVAL, "a CQ over max_cqe (%d): EINVAL (errno %d)", dev.max_cqe, errno);
  if (c) ibv_destroy_cq(c);
  errno = 0;
  c = ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors);
  check(c == NULL && errno == EINVAL, "comp_vector num_comp_vectors (%d): EINVAL (errno %d)", ctx->num_comp_vectors, errno);
  if (c) ibv_destroy_cq(c);
  c = ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors - 1);
  check(c != NULL, "comp_vector num_comp_vectors - 1: accepted");
  if (c) ibv_destroy_cq(c);
  check(dev.page_size_cap >= (uint64_t)sysconf(_SC_PAGESIZE) && (dev.page_size_cap & (uint64_t)sysconf(_SC_PAGESIZE)),
        "page_size_cap 0x%llx holds the page size", (unsigned long long)dev.page_size_cap);
  struct ibv_device_attr_ex ex;
  memset(&ex, 0, sizeof ex);
  const int qrc = ibv_query_device_ex(ctx, NULL, &ex);
  check(qrc == 0 && ex.phys_port_cnt_ex == dev.phys_port_cnt, "phys_port_cnt_ex %u is phys_port_cnt %u",
        ex.phys_port_cnt_ex, dev.phys_port_cnt);
  /* The SRQ bounds are what ibv_create_srq enforces. */
  check(dev.max_srq > 0 && dev.max_srq_wr > 0 && dev.max_srq_sge > 0, "max_srq %d, max_srq_wr %d, max_srq_sge %d",
        dev.max_srq, dev.max_srq_wr, dev.max_srq_sge);
  struct ibv_srq_init_attr sa = {0};
  sa.attr.max_wr = (uint32_t)dev.max_srq_wr;
  sa.attr.max_sge = (uint32_t)dev.max_srq_sge;
  struct ibv_srq* s = ibv_create_srq(pd, &sa);
  check(s != NULL, "an SRQ of max_srq_wr and max_srq_sge: accepted (errno %d)", errno);
  if (s) ibv_destroy_srq(s);
  for (int k = 0; k < 2; ++k) {
    sa.attr.max_wr = (uint32_t)dev.max_srq_wr + (k == 0);
    sa.attr.max_sge = (uint32_t)dev.max_srq_sge + (k == 1);
    errno = 0;
    s = ibv_create_srq(pd, &sa);
    check(s == NULL && errno == EINVAL, "an SRQ over max_srq_%s: EINVAL (errno %d)", k == 0 ? "wr" : "sge", errno);
    if (s) ibv_destroy_srq(s);
  }
}

static void gids(void) {
  struct ibv_port_attr pa;
  union ibv_gid g, zero;
  struct ibv_gid_entry e;
  memset(&zero, 0, sizeof zero);
  memset(&pa, 0, sizeof pa);
  const int prc = ibv_query_port(ctx, 1, &pa);
  check(prc == 0 && pa.gid_tbl_len > 1, "gid_tbl_len %d has room past index 0", pa.gid_tbl_len);
  check(ibv_query_gid(ctx, 1, 0, &g) == 0 && memcmp(&g, &zero, sizeof g) != 0, "GID 0 is the port's address");
  check(ibv_query_gid_ex(ctx, 1, 0, &e, 0) == 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2, "GID 0 is RoCEv2");
  check(ibv_query_gid(ctx, 1, pa.gid_tbl_len - 1, &g) == 0 && memcmp(&g, &zero, sizeof g) == 0,
        "GID %d (the last) is empty: a zero GID", pa.gid_tbl_len - 1);
  errno = 0;
  int rc = ibv_query_gid_ex(ctx, 1, 1, &e, 0);
  check(rc == ENODATA, "ibv_query_gid_ex of an empty index: ENODATA (%d)", rc);
  struct ibv_gid_entry table[64];
  check(ibv_query_gid_table(ctx, table, 64, 0) == 1, "ibv_query_gid_table lists the one GID there is");
}

/* A child's write to BUF, then the parent's look: 1 when the parent still sees WANT. */
static int private_after_fork(volatile char* buf, char want) {
  pid_t pid = fork();
  if (pid == 0) {
    buf[0] = 'C';
    _exit(buf[0] == 'C' ? 0 : 1);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 0;
  return buf[0] == want;
}

/* Two RC QPs connected to each other on this device, at RTS: *a sends on
 * send_cq, *b on the common CQ. 0, or -1 (whatever was made is in *a, *b). */
static int rc_pair(struct ibv_cq* send_cq, struct ibv_qp** a, struct ibv_qp** b) {
  struct ibv_qp_init_attr qa = {0};
  qa.send_cq = send_cq;
  qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  *a = ibv_create_qp(pd, &qa);
  *b = make_qp(IBV_QPT_RC, NULL, 4, 4, 1, 1, NULL);
  return *a && *b && to_init(*a, IBV_QPT_RC) == 0 && to_init(*b, IBV_QPT_RC) == 0 && rc_up(*a, (*b)->qp_num, 1) == 0 &&
                 rc_up(*b, (*a)->qp_num, 1) == 0
             ? 0
             : -1;
}

/* A WRITE of len bytes at remote address to through rkey, from a fresh QP
 * pair: the completion's status (or -1 when the pair or post failed). */
static int write_status(struct ibv_mr* from, uint64_t to, uint32_t rkey, uint32_t len) {
  struct ibv_qp *a = NULL, *b = NULL;
  int st = -1;
  if (rc_pair(cq, &a, &b) == 0) {
    struct ibv_wc wc;
    if (post_write(a, 11, (uintptr_t)from->addr, len, from->lkey, to, rkey) == 0 && wait_wc(&wc) == 1) st = (int)wc.status;
  }
  if (a) ibv_destroy_qp(a);
  if (b) ibv_destroy_qp(b);
  return st;
}

/* An MR is its bytes, not its pages: a WRITE just before or just past an
 * MR over bytes 100..199 of a page is a remote access error. */
static void mr_bounds(void) {
  uint8_t* page = NULL;
  if (posix_memalign((void**)&page, 4096, 4096) != 0) page = NULL;
  uint8_t* src = calloc(1, 4096);
  struct ibv_mr* tgt = page ? ibv_reg_mr(pd, page + 100, 100, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : NULL;
  struct ibv_mr* from = src ? ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  check(tgt && from, "an MR over bytes 100..199 of a page, and one to write from");
  if (tgt && from) {
    const uint64_t base = (uintptr_t)(page + 100);
    check(write_status(from, base, tgt->rkey, 100) == IBV_WC_SUCCESS, "a WRITE of the MR's 100 bytes: success");
    check(write_status(from, base - 4, tgt->rkey, 8) == IBV_WC_REM_ACCESS_ERR, "a WRITE 4 bytes before it: remote access error");
    check(write_status(from, base + 96, tgt->rkey, 8) == IBV_WC_REM_ACCESS_ERR, "a WRITE 4 bytes past it: remote access error");
  }
  if (tgt) ibv_dereg_mr(tgt);
  if (from) ibv_dereg_mr(from);
  free(page);
  free(src);
}

/* ibv_rereg_mr: the keys stay, what they reach changes. */
static void rereg(void) {
  uint8_t *buf = calloc(1, 4096), *buf2 = calloc(1, 4096), *src = calloc(1, 4096);
  struct ibv_pd* pd2 = ibv_alloc_pd(ctx);
  const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  struct ibv_mr* t = buf ? ibv_reg_mr(pd, buf, 4096, rw) : NULL;
  struct ibv_mr* from = src ? ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  check(t && from && pd2 && buf2, "an MR to rereg, one to write from, and a second PD");
  if (!t || !from || !pd2 || !buf2) goto out;
  const uint32_t lkey = t->lkey, rkey = t->rkey;
  check(write_status(from, (uintptr_t)buf, rkey, 8) == IBV_WC_SUCCESS, "a WRITE to the MR before any rereg: success");
  int rc = ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
  check(rc == 0 && t->lkey == lkey && t->rkey == rkey, "rereg of the access to local write only: 0 (%d), same keys", rc);
  check(write_status(from, (uintptr_t)buf, rkey, 8) == IBV_WC_REM_ACCESS_ERR,
        "then a WRITE through its R_Key: remote access error");
  rc = ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, rw);
  check(rc == 0 && write_status(from, (uintptr_t)buf, rkey, 8) == IBV_WC_SUCCESS,
        "rereg back to remote write (%d): the WRITE succeeds again", rc);
  rc = ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0);
  check(rc == 0 && t->pd == pd2, "rereg into another PD: 0 (%d), mr->pd is it", rc);
  check(write_status(from, (uintptr_t)buf, rkey, 8) == IBV_WC_REM_ACCESS_ERR,
        "then a WRITE from a QP of the first PD: remote access error");
  check(ibv_dealloc_pd(pd2) == EBUSY, "the second PD cannot go while the MR is in it: EBUSY");
  rc = ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0);
  check(rc == 0 && write_status(from, (uintptr_t)buf, rkey, 8) == IBV_WC_SUCCESS,
        "rereg back into the first PD (%d): the WRITE succeeds again", rc);
  memset(src, 0x5a, 64);
  rc = ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2 + 16, 64, 0);
  check(rc == 0 && t->addr == buf2 + 16 && t->length == 64 && t->lkey == lkey && t->rkey == rkey,
        "rereg onto 64 other bytes: 0 (%d), mr->addr and length are theirs, same keys", rc);
  check(write_status(from, (uintptr_t)(buf2 + 16), rkey, 64) == IBV_WC_SUCCESS && buf2[16] == 0x5a && buf2[79] == 0x5a &&
            buf2[15] == 0 && buf2[80] == 0,
        "a WRITE of 64 bytes lands there, and nowhere around");
  check(write_status(from, (uintptr_t)buf, rkey, 8) == IBV_WC_REM_ACCESS_ERR,
        "a WRITE to the old address: remote access error");
  errno = 0;
  rc = ibv_rereg_mr(t, 1 << 3, NULL, NULL, 0, 0);
  check(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "rereg with an unknown flag: ERR_INPUT (%d), EINVAL", rc);
  errno = 0;
  rc = ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf, 0, 0);
  check(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "rereg onto 0 bytes: ERR_INPUT (%d), EINVAL", rc);
  errno = 0;
  rc = ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
  check(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "an access without CHANGE_ACCESS: ERR_INPUT (%d), EINVAL", rc);
  errno = 0;
  rc = ibv_rereg_mr(t, 0, NULL, NULL, 0, 0);
  check(rc == IBV_REREG_MR_ERR_CMD && errno == EINVAL, "rereg with no flag: ERR_CMD (%d), EINVAL", rc);
  errno = 0;
  rc = ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE);
  check(rc == IBV_REREG_MR_ERR_CMD && errno == EINVAL, "remote write without local write: ERR_CMD (%d), EINVAL", rc);
  check(write_status(from, (uintptr_t)(buf2 + 16), rkey, 64) == IBV_WC_SUCCESS, "refused rereg calls changed nothing");
out:
  if (t) ibv_dereg_mr(t);
  if (from) ibv_dereg_mr(from);
  if (pd2) ibv_dealloc_pd(pd2);
  free(buf);
  free(buf2);
  free(src);
}

/* An MR of no bytes: it registers, and a WRITE of one byte through it is a
 * remote access error. */
static void zero_byte_mr(void) {
  uint8_t* buf = calloc(1, 4096);
  struct ibv_mr* z = buf ? ibv_reg_mr(pd, buf + 8, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : NULL;
  struct ibv_mr* from = buf ? ibv_reg_mr(pd, buf + 1024, 64, IBV_ACCESS_LOCAL_WRITE) : NULL;
  check(z && z->length == 0, "an MR of 0 bytes registers");
  if (z && from)
    check(write_status(from, (uintptr_t)(buf + 8), z->rkey, 1) == IBV_WC_REM_ACCESS_ERR,
          "a WRITE of 1 byte through it: remote access error");
  if (z) ibv_dereg_mr(z);
  if (from) ibv_dereg_mr(from);
  free(buf);
}

/* Posts n receives of 8 bytes from mr on qp, moves it to ERR (each is
 * flushed into cq), and to RESET too if `reset`. */
static int flushed_qp(struct ibv_mr* mr, int n, int reset, struct ibv_qp** out) {
  struct ibv_qp *a = NULL, *b = NULL;
  if (rc_pair(cq, &a, &b) != 0) return -1;
  ibv_destroy_qp(b);
  *out = a;
  for (int i = 0; i < n; ++i) {
    struct ibv_sge sg = {(uintptr_t)mr->addr, 8, mr->lkey};
    struct ibv_recv_wr r = {0}, *bad = NULL;
    r.wr_id = 100 + (uint64_t)i;
    r.sg_list = &sg;
    r.num_sge = 1;
    if (ibv_post_recv(a, &r, &bad)) return -1;
  }
  struct ibv_qp_attr at = {0};
  at.qp_state = IBV_QPS_ERR;
  if (ibv_modify_qp(a, &at, IBV_QP_STATE)) return -1;
  at.qp_state = IBV_QPS_RESET;
  return reset ? ibv_modify_qp(a, &at, IBV_QP_STATE) : 0;
}

/* ibv_poll_cq for 200 ms: the completions, QP numbers in qpns. */
static int drain(uint32_t* qpns, int max) {
  struct timespec t0, t;
  int got = 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    struct ibv_wc wc;
    if (ibv_poll_cq(cq, 1, &wc) == 1 && got < max) qpns[got++] = wc.qp_num;
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 200);
  return got;
}

/* A QP moved to RESET forgets its completions still in its CQ. */
static void reset_forgets_completions(void) {
  uint8_t* buf = calloc(1, 4096);
  struct ibv_mr* mr = buf ? ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_qp *kept = NULL, *reset = NULL;
  uint32_t qpns[8];
  check(mr && flushed_qp(mr, 2, 0, &kept) == 0, "a QP with 2 receives, moved to ERR");
  if (mr && kept) {
    const int n = drain(qpns, 8);
    check(n == 2 && qpns[0] == kept->qp_num && qpns[1] == kept->qp_num, "its 2 flushed receives are in the CQ (%d)", n);
    ibv_destroy_qp(kept);
    kept = NULL;
  }
  const int ok = mr && flushed_qp(mr, 1, 0, &kept) == 0 && flushed_qp(mr, 3, 1, &reset) == 0;
  check(ok, "one QP with 1 receive moved to ERR, then one with 3 moved to ERR and RESET");
  if (ok) {
    const int n = drain(qpns, 8);
    check(n == 1 && qpns[0] == kept->qp_num, "the CQ holds the first QP's flush only (%d completions)", n);
  }
  if (kept) ibv_destroy_qp(kept);
  if (reset) ibv_destroy_qp(reset);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
}

/* A UD QP in RTS (Q_Key 0x1234). */
static struct ibv_qp* ud_up(void) {
  struct ibv_qp* qp = make_qp(IBV_QPT_UD, NULL, 4, 4, 1, 1, NULL);
  struct ibv_qp_attr a = {0};
  if (!qp || to_init(qp, IBV_QPT_UD)) return qp;
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return qp;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  return qp;
}

/* An address handle to a GID on port 1 (one hop). */
static struct ibv_ah* ah_to(const union ibv_gid* gid) {
  struct ibv_ah_attr aa = {0};
  aa.is_global = 1;
  aa.grh.dgid = *gid;
  aa.grh.hop_limit = 1;
  aa.port_num = 1;
  return ibv_create_ah(pd, &aa);
}

/* Multicast: a group's member receives, a QP that left does not. */
/* Polls the CQ for 300 ms: *sent once the send send_id completes, *got once
 * the receive recv_id completes with byte_len bytes and rbuf holds the n
 * bytes of want. With stop, returns as soon as both are set. */
static void await_pair(uint64_t send_id, uint64_t recv_id, uint32_t byte_len, const uint8_t* rbuf, const uint8_t* want,
                       size_t n, int stop, int* sent, int* got) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    struct ibv_wc wc;
    if (ibv_poll_cq(cq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS) {
      if (wc.wr_id == send_id) *sent = 1;
      if (wc.wr_id == recv_id && wc.byte_len == byte_len && memcmp(rbuf, want, n) == 0) *got = 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 300 && !(stop && *got && *sent));
}

static void multicast(void) {
  uint8_t* buf = calloc(1, 4096);
  struct ibv_mr* mr = buf ? ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_qp *tx = ud_up(), *rx = ud_up();
  struct ibv_qp* rc = make_qp(IBV_QPT_RC, NULL, 1, 1, 1, 1, NULL);
  union ibv_gid group = {0}, own;
  group.raw[10] = group.raw[11] = 0xff;
  group.raw[12] = 239, group.raw[13] = 1, group.raw[14] = 2, group.raw[15] = 3;
  check(mr && tx && rx && rc && ibv_query_gid(ctx, 1, 0, &own) == 0, "two UD QPs, an RC QP, an MR");
  if (!mr || !tx || !rx || !rc) goto out;
  check(dev.max_mcast_grp > 0 && dev.max_mcast_qp_attach > 0, "the device reports multicast (max_mcast_grp %d)",
        dev.max_mcast_grp);
  check(ibv_attach_mcast(rc, &group, 0) == EINVAL, "an RC QP joins no group: EINVAL");
  check(ibv_attach_mcast(rx, &own, 0) == EINVAL, "a unicast GID is no group: EINVAL");
  check(ibv_attach_mcast(rx, &group, 0) == 0, "a UD QP joins 239.1.2.3");
  struct ibv_ah* ah = ah_to(&group);
  check(ah != NULL, "an address handle to the group");
  for (int round = 0; ah && round < 2; ++round) {
    struct ibv_sge rs = {(uintptr_t)buf, 40 + 64, mr->lkey}, ss = {(uintptr_t)(buf + 1024), 64, mr->lkey};
    struct ibv_recv_wr r = {0}, *rbad = NULL;
    r.wr_id = 7;
    r.sg_list = &rs;
    r.num_sge = 1;
    struct ibv_send_wr w = {0}, *sbad = NULL;
    w.wr_id = 8;
    w.sg_list = &ss;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = 0xFFFFFF;
    w.wr.ud.remote_qkey = 0x1234;
    memset(buf, 0, 1024);
    memset(buf + 1024, 0x60 + round, 64);
    if (ibv_post_recv(rx, &r, &rbad) || ibv_post_send(tx, &w, &sbad)) {
      check(0, "posts to the group");
      break;
    }
    int sent = 0, got = 0;
    await_pair(8, 7, 40 + 64, buf + 40, buf + 1024, 64, round == 0, &sent, &got);
    if (round == 0) {
      check(sent && got, "a datagram to the group reaches the member, every byte");
      check(ibv_detach_mcast(rx, &group, 0) == 0, "the member leaves");
      check(ibv_detach_mcast(rx, &group, 0) == EINVAL, "leaving again: EINVAL");
    } else {
      check(sent && !got, "then a datagram to the group reaches it no more");
    }
  }
  if (ah) ibv_destroy_ah(ah);
out:
  if (tx) ibv_destroy_qp(tx);
  if (rx) ibv_destroy_qp(rx);
  if (rc) ibv_destroy_qp(rc);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
}

/* Datagrams posted unsignaled and the QP destroyed at once (rdmacm-utils'
 * mckey sends so): they go out before the QP goes, as a NIC has them in
 * hand by then. */
static void sent_before_destroy(void) {
  enum { kN = 4 };
  uint8_t* buf = calloc(1, 8192);
  struct ibv_mr* mr = buf ? ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_qp *tx = ud_up(), *rx = ud_up();
  union ibv_gid own;
  check(mr && tx && rx && ibv_query_gid(ctx, 1, 0, &own) == 0, "two UD QPs and an MR");
  if (!mr || !tx || !rx) goto out;
  struct ibv_ah* ah = ah_to(&own);
  int posted = ah != NULL;
  for (int i = 0; posted && i < kN; ++i) {
    struct ibv_sge rs = {(uintptr_t)(buf + i * 1024), 40 + 64, mr->lkey};
    struct ibv_recv_wr r = {0}, *rbad = NULL;
    r.wr_id = 100 + i;
    r.sg_list = &rs;
    r.num_sge = 1;
    posted = ibv_post_recv(rx, &r, &rbad) == 0;
  }
  for (int i = 0; posted && i < kN; ++i) {
    struct ibv_sge ss = {(uintptr_t)(buf + 4096 + i * 64), 64, mr->lkey};
    struct ibv_send_wr w = {0}, *sbad = NULL;
    w.wr_id = 200 + i;
    w.sg_list = &ss;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;  /* unsignaled */
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = rx->qp_num;
    w.wr.ud.remote_qkey = 0x1234;
    posted = ibv_post_send(tx, &w, &sbad) == 0;
  }
  const int destroyed = ibv_destroy_qp(tx) == 0;
  tx = NULL;
  int got = 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    struct ibv_wc wc;
    if (ibv_poll_cq(cq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id >= 100 && wc.wr_id < 100 + kN) ++got;
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while (got < kN && (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 500);
  check(posted && destroyed && got == kN,
        "%d unsignaled datagrams, their QP destroyed right after the posts: all arrive (%d of %d)", kN, got, kN);
  if (ah) ibv_destroy_ah(ah);
out:
  if (tx) ibv_destroy_qp(tx);
  if (rx) ibv_destroy_qp(rx);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
}

/* Device memory: allocated, copied to and from at 4-byte granules, and
 * written by a peer through a zero-based MR over it. */
static void device_memory(void) {
  struct ibv_device_attr_ex ex;
  memset(&ex, 0, sizeof ex);
  const int qrc = ibv_query_device_ex(ctx, NULL, &ex);
  check(qrc == 0 && ex.max_dm_size >= 4096, "max_dm_size %llu", (unsigned long long)ex.max_dm_size);
  struct ibv_alloc_dm_attr da = {.length = ex.max_dm_size + 1};
  errno = 0;
  check(ibv_alloc_dm(ctx, &da) == NULL && errno == EINVAL, "a DM over max_dm_size: EINVAL (%d)", errno);
  da.length = 256;
  struct ibv_dm* dm = ibv_alloc_dm(ctx, &da);
  check(dm != NULL, "a 256-byte DM (errno %d)", errno);
  if (!dm) return;
  uint8_t out[256], in[256];
  for (int i = 0; i < 256; ++i) out[i] = (uint8_t)(i * 13 + 1);
  check(ibv_memcpy_to_dm(dm, 0, out, 256) == 0 && ibv_memcpy_from_dm(in, dm, 0, 256) == 0 && memcmp(in, out, 256) == 0,
        "copied to the DM and back, every byte");
  check(ibv_memcpy_to_dm(dm, 2, out, 4) == EINVAL, "a copy at an offset not a multiple of 4: EINVAL");
  check(ibv_memcpy_to_dm(dm, 4, out, 6) == EINVAL, "a copy of a length not a multiple of 4: EINVAL");
  check(ibv_memcpy_from_dm(in, dm, 252, 8) == EINVAL, "a copy past the DM's end: EINVAL");
  errno = 0;
  check(ibv_reg_dm_mr(pd, dm, 0, 256, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL,
        "an MR over a DM without IBV_ACCESS_ZERO_BASED: EINVAL (%d)", errno);
  errno = 0;
  check(ibv_reg_dm_mr(pd, dm, 128, 132, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL,
        "an MR past the DM's end: EINVAL (%d)", errno);
  /* The DM's bytes 64..191 as a zero-based MR a peer WRITEs to. */
  struct ibv_mr* dmr =
      ibv_reg_dm_mr(pd, dm, 64, 128, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  check(dmr != NULL, "a zero-based MR over the DM's bytes 64..191 (errno %d)", errno);
  uint8_t* src = calloc(1, 4096);
  struct ibv_mr* smr = src ? ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_qp *a = NULL, *b = NULL;
  if (dmr && smr && rc_pair(cq, &a, &b) == 0) {
    for (int i = 0; i < 32; ++i) src[i] = (uint8_t)(0xa0 + i);
    struct ibv_wc wc; /* address 16, zero-based: the DM's byte 80 */
    check(post_write(a, 9, (uintptr_t)src, 32, smr->lkey, 16, dmr->rkey) == 0 && wait_wc(&wc) == 1 &&
              wc.status == IBV_WC_SUCCESS,
          "a WRITE to address 16 of the zero-based MR completes");
    check(ibv_memcpy_from_dm(in, dm, 80, 32) == 0 && memcmp(in, src, 32) == 0, "it landed at the DM's byte 80");
    check(ibv_memcpy_from_dm(in, dm, 64, 16) == 0 && memcmp(in, out + 64, 16) == 0, "the bytes before it are as they were");
  } else {
    check(0, "an MR to write from and two connected QPs");
  }
  if (a) ibv_destroy_qp(a);
  if (b) ibv_destroy_qp(b);
  if (smr) ibv_dereg_mr(smr);
  free(src);
  check(!dmr || ibv_free_dm(dm) == EBUSY, "the DM cannot be freed under its MR: EBUSY");
  if (dmr) ibv_dereg_mr(dmr);
  check(ibv_free_dm(dm) == 0, "then it is freed");
}

static int g_pd_allocs;
static void* pd_alloc(struct ibv_pd* p, void* pd_context, size_t size, size_t alignment, uint64_t type) {
  (void)p;
  (void)pd_context;
  (void)size;
  (void)alignment;
  (void)type;
  ++g_pd_allocs;
  return IBV_ALLOCATOR_USE_DEFAULT;
}
static void pd_free(struct ibv_pd* p, void* pd_context, void* ptr, uint64_t type) {
  (void)p;
  (void)pd_context;
  (void)ptr;
  (void)type;
}

/* Thread and parent domains: a parent domain is a PD for QPs, MRs and an
 * extended CQ; what is not a parent domain where one is asked is EINVAL. */
static void parent_domain(void) {
  struct ibv_td_init_attr ta = {0};
  struct ibv_td* td = ibv_alloc_td(ctx, &ta);
  check(td != NULL, "a thread domain (errno %d)", errno);
  struct ibv_parent_domain_init_attr pa = {0};
  pa.pd = pd;
  pa.td = td;
  pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  pa.alloc = pd_alloc;
  pa.free = pd_free;
  struct ibv_pd* par = ibv_alloc_parent_domain(ctx, &pa);
  check(par != NULL, "a parent domain over the PD, with the thread domain and allocators (errno %d)", errno);
  if (!par) goto out;
  struct ibv_parent_domain_init_attr pp = {0};
  pp.pd = par;
  errno = 0;
  check(ibv_alloc_parent_domain(ctx, &pp) == NULL && errno == EINVAL, "a parent domain over a parent domain: EINVAL");
  struct ibv_cq_init_attr_ex ca = {0};
  ca.cqe = 8;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  ca.parent_domain = pd;
  errno = 0;
  check(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EINVAL, "an extended CQ naming a plain PD as its parent domain: EINVAL");
  ca.parent_domain = par;
  struct ibv_cq_ex* xcq = ibv_create_cq_ex(ctx, &ca);
  check(xcq != NULL, "an extended CQ in the parent domain (errno %d)", errno);
  char* buf = malloc(4096);
  struct ibv_mr* mr = buf ? ibv_reg_mr(par, buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  check(mr != NULL && mr->pd == par, "an MR in the parent domain");
  struct ibv_qp_init_attr qa = {0};
  qa.send_cq = qa.recv_cq = xcq ? ibv_cq_ex_to_cq(xcq) : cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 2;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  struct ibv_qp* qp = ibv_create_qp(par, &qa);
  check(qp != NULL && to_init(qp, IBV_QPT_RC) == 0, "a QP in the parent domain reaches INIT");
  if (qp) ibv_destroy_qp(qp);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
  if (xcq) ibv_destroy_cq(ibv_cq_ex_to_cq(xcq));
  check(ibv_dealloc_pd(par) == 0, "the parent domain is freed (its PD stays)");
out:
  if (td) check(ibv_dealloc_td(td) == 0, "the thread domain is freed");
}

static uint64_t ns_of(clockid_t id) {
  struct timespec t;
  clock_gettime(id, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void timestamps(void) {
  struct ibv_device_attr_ex ex;
  memset(&ex, 0, sizeof ex);
  check(ibv_query_device_ex(ctx, NULL, &ex) == 0 && ex.hca_core_clock == 1000000 &&
            ex.completion_timestamp_mask == ~0ull,
        "hca_core_clock 1 GHz (%llu kHz), a 64-bit timestamp", (unsigned long long)ex.hca_core_clock);
  struct ibv_values_ex v = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK};
  const uint64_t r0 = ns_of(CLOCK_MONOTONIC);
  const int rrc = ibv_query_rt_values_ex(ctx, &v);
  const uint64_t r1 = ns_of(CLOCK_MONOTONIC);
  const uint64_t raw = (uint64_t)v.raw_clock.tv_sec * 1000000000ull + (uint64_t)v.raw_clock.tv_nsec;
  check(rrc == 0 && (v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK) && raw >= r0 && raw <= r1,
        "ibv_query_rt_values_ex: the raw clock is the monotonic clock (rc %d)", rrc);
  struct ibv_cq_init_attr_ex ca = {0};
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  struct ibv_cq_ex* xcq = ibv_create_cq_ex(ctx, &ca);
  check(xcq != NULL, "an extended CQ with both timestamps (errno %d)", errno);
  if (!xcq) return;
  enum { kLen = 64 };
  uint8_t* buf = calloc(2, kLen);
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, 2 * kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_qp *a = NULL, *b = NULL;
  int ok = mr && rc_pair(ibv_cq_ex_to_cq(xcq), &a, &b) == 0;
  check(ok, "two RC QPs, the first on the extended CQ, at RTS");
  if (ok) {
    const uint64_t m0 = ns_of(CLOCK_MONOTONIC), w0 = ns_of(CLOCK_REALTIME);
    check(post_write(a, 5, (uintptr_t)buf, kLen, mr->lkey, (uintptr_t)(buf + kLen), mr->rkey) == 0, "a WRITE posted");
    struct ibv_poll_cq_attr pa = {0};
    int rc;
    const uint64_t give_up = m0 + 10000000000ull;
    while ((rc = ibv_start_poll(xcq, &pa)) == ENOENT && ns_of(CLOCK_MONOTONIC) < give_up) {
    }
    const uint64_t m1 = ns_of(CLOCK_MONOTONIC), w1 = ns_of(CLOCK_REALTIME);
    check(rc == 0 && xcq->status == IBV_WC_SUCCESS && xcq->wr_id == 5, "the WRITE completes (rc %d)", rc);
    if (rc == 0) {
      const uint64_t ts = ibv_wc_read_completion_ts(xcq), wall = ibv_wc_read_completion_wallclock_ns(xcq);
      check(ts >= m0 && ts <= m1, "its timestamp is on the monotonic clock, between post and poll (%llu in %llu..%llu)",
            (unsigned long long)ts, (unsigned long long)m0, (unsigned long long)m1);
      /* The wall clock is the monotonic stamp plus the clocks' offset, read a moment apart: 1 ms of slack. */
      check(wall + 1000000 >= w0 && wall <= w1 + 1000000, "its wall-clock time is between post and poll");
      ibv_end_poll(xcq);
    }
  }
  if (a) ibv_destroy_qp(a);
  if (b) ibv_destroy_qp(b);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
  ibv_destroy_cq(ibv_cq_ex_to_cq(xcq));
}

/* Memory the application unmaps, or makes read-only, before it
 * deregisters (UCX's pools do): the deregistration neither crashes nor
 * maps anything there again. */
static void unmapped_before_dereg(void) {
  char* p = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  check(p != MAP_FAILED, "three pages");
  if (p == MAP_FAILED) return;
  struct ibv_mr* a = ibv_reg_mr(pd, p, 4096, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr* b = ibv_reg_mr(pd, p + 2 * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
  check(a && b, "an MR on the first page and one on the third");
  /* The first page unmapped and something else mapped there (inaccessible,
   * so a library that read it would crash); the third made read-only. */
  munmap(p, 4096);
  char* other = mmap(p, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  check(other == p, "another mapping where the first page was");
  mprotect(p + 2 * 4096, 4096, PROT_READ);
  check(!a || ibv_dereg_mr(a) == 0, "deregistered after its memory was unmapped");
  check(!b || ibv_dereg_mr(b) == 0, "deregistered after its memory was made read-only");
  munmap(p, 3 * 4096);
}

static void fork_private(void) {
  char* buf = malloc(3 * 4096);
  check(buf != NULL, "a heap buffer");
  if (!buf) return;
  buf[4096] = 'P';
  struct ibv_mr* mr = ibv_reg_mr(pd, buf + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
  check(mr != NULL, "registered");
  check(private_after_fork(buf + 4096, 'P'), "registered heap memory: the child's write stays in the child");
  if (mr) ibv_dereg_mr(mr);
  check(buf[4096] == 'P', "deregistered: the contents stay");
  check(private_after_fork(buf + 4096, 'P'), "heap memory once registered: the child's write stays in the child");
  free(buf);
}

/* Forked children that use the parent's context at once (rdma-core's
 * DMTest.test_multi_process_alloc_dm does: five children query the device
 * and allocate device memory): each call is answered to its caller, as
 * the kernel answers each command on a shared uverbs descriptor. */
static int queries_agree(int rounds) {
  for (int i = 0; i < rounds; ++i) {
    struct ibv_device_attr a;
    struct ibv_port_attr p;
    if (ibv_query_device(ctx, &a) || a.max_qp != dev.max_qp || a.max_cqe != dev.max_cqe || a.node_guid != dev.node_guid)
      return 0;
    if (ibv_query_port(ctx, 1, &p) || p.state != IBV_PORT_ACTIVE) return 0;
    struct ibv_alloc_dm_attr da = {.length = 4096};
    struct ibv_dm* dm = ibv_alloc_dm(ctx, &da);
    if (!dm || ibv_free_dm(dm)) return 0;
  }
  return 1;
}

static void forked_queries(void) {
  enum { kChildren = 6, kRounds = 300 };
  pid_t kids[kChildren];
  int started = 0;
  for (int i = 0; i < kChildren; ++i) {
    kids[i] = fork();
    if (kids[i] == 0) _exit(queries_agree(kRounds) ? 0 : 1);  /* _exit: the parent's session stays open */
    if (kids[i] > 0) ++started;
  }
  const int parent_ok = queries_agree(kRounds);
  int kids_ok = 0;
  for (int i = 0; i < kChildren; ++i) {
    int st = 0;
    if (kids[i] > 0 && waitpid(kids[i], &st, 0) == kids[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0) ++kids_ok;
  }
  check(started == kChildren && kids_ok == kChildren && parent_ok,
        "%d forked children and their parent query the device and port and allocate device memory through one "
        "context at once, %d times each: every answer right (children %d of %d, parent %d)",
        kChildren, kRounds, kids_ok, kChildren, parent_ok);
}

/* ODP (IBV_ACCESS_ON_DEMAND): where the device reports it, an MR over
 * memory never touched (and a hole unmapped after registration), an
 * implicit MR over the whole address space, and ibv_advise_mr's rules;
 * where it does not, the registration is EOPNOTSUPP, as the kernel
 * refuses it on a device without ODP. */
/* Raw packet QPs and flow steering. */
struct raw_flow_attr {
  struct ibv_flow_attr attr;
  struct ibv_flow_spec_eth eth;
};

static struct ibv_flow* eth_flow(struct ibv_qp* qp, uint16_t ethertype, uint32_t priority) {
  struct raw_flow_attr f;
  memset(&f, 0, sizeof f);
  f.attr.type = IBV_FLOW_ATTR_NORMAL;
  f.attr.size = sizeof f;
  f.attr.priority = priority;
  f.attr.num_of_specs = 1;
  f.attr.port = 1;
  f.eth.type = IBV_FLOW_SPEC_ETH;
  f.eth.size = sizeof f.eth;
  const uint8_t group[6] = {0x01, 0x00, 0x5e, 0x7f, 0x00, 0x09};
  memcpy(f.eth.val.dst_mac, group, 6);
  memset(f.eth.mask.dst_mac, 0xff, 6);
  f.eth.val.ether_type = htons(ethertype);
  f.eth.mask.ether_type = 0xffff;
  return ibv_create_flow(qp, &f.attr);
}

/* A raw packet QP to INIT (the port), RTR and RTS. */
static void raw_up(struct ibv_qp* qp) {
  struct ibv_qp_attr a = {0};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  int rc1 = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT);
  a.qp_state = IBV_QPS_RTR;
  int rc2 = ibv_modify_qp(qp, &a, IBV_QP_STATE);
  a.qp_state = IBV_QPS_RTS;
  int rc3 = ibv_modify_qp(qp, &a, IBV_QP_STATE);
  check(!rc1 && !rc2 && !rc3, "a raw packet QP: INIT (the port), RTR, RTS: %d %d %d", rc1, rc2, rc3);
}

static void raw_packet(void) {
  uint8_t* buf = calloc(1, 8192);
  struct ibv_mr* mr = buf ? ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_qp* qp = make_qp(IBV_QPT_RAW_PACKET, NULL, 4, 4, 1, 1, NULL);
  struct ibv_qp* rc = make_qp(IBV_QPT_RC, NULL, 1, 1, 1, 1, NULL);
  check(mr && qp && rc, "a raw packet QP (errno %d), an RC QP, an MR", errno);
  if (!mr || !qp || !rc) goto out;
  raw_up(qp);
  errno = 0;
  check(eth_flow(rc, 0x88b5, 0) == NULL && errno == EINVAL, "a flow rule on an RC QP: EINVAL (%d)", errno);
  struct ibv_flow* flow = eth_flow(qp, 0x88b5, 0);
  check(flow != NULL, "a flow rule: that group MAC and EtherType 0x88b5 (errno %d)", errno);
  for (int round = 0; flow && round < 2; ++round) {
    /* round 0: EtherType 0x88b5, which the rule matches; round 1: 0x88b6, which it does not. */
    uint8_t* frame = buf + 4096;
    const uint8_t head[14] = {0x01, 0x00, 0x5e, 0x7f, 0x00, 0x09, 0x02, 0, 0, 0, 0, 0x42, 0x88, 0xb5 + round};
    memcpy(frame, head, 14);
    for (int i = 14; i < 300; ++i) frame[i] = (uint8_t)(i * 7 + round);
    memset(buf, 0, 4096);
    struct ibv_sge rs = {(uintptr_t)buf, 2048, mr->lkey}, ss = {(uintptr_t)frame, 300, mr->lkey};
    struct ibv_recv_wr r = {0}, *rbad = NULL;
    r.wr_id = 17;
    r.sg_list = &rs;
    r.num_sge = 1;
    struct ibv_send_wr w = {0}, *sbad = NULL;
    w.wr_id = 18;
    w.sg_list = &ss;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    if (round == 0 && ibv_post_recv(qp, &r, &rbad)) {
      check(0, "a receive on the raw packet QP");
      break;
    }
    if (ibv_post_send(qp, &w, &sbad)) {
      check(0, "a frame posted on the raw packet QP");
      break;
    }
    int sent = 0, got = 0;
    await_pair(18, 17, 300, buf, frame, 300, round == 0, &sent, &got);
    if (round == 0) {
      check(sent && got, "the frame comes back to the matching rule's QP, all 300 bytes");
      if (sent && got) printf("raw: a frame comes back to the matching rule's QP\n");
    } else {
      check(sent && !got, "a frame of another EtherType does not");
    }
  }
  if (flow) check(ibv_destroy_flow(flow) == 0, "the rule is destroyed");
  struct ibv_flow* held[80];
  int n = 0;
  errno = 0;
  while (n < 80 && (held[n] = eth_flow(qp, (uint16_t)(0x9000 + n), 1)) != NULL) ++n;
  check(n == 64 && errno == EDQUOT, "a uid holds 64 flow rules, then EDQUOT (%d rules, errno %d)", n, errno);
  while (n > 0) ibv_destroy_flow(held[--n]);
out:
  if (qp) ibv_destroy_qp(qp);
  if (rc) ibv_destroy_qp(rc);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
}

/* The Toeplitz hash, written here from Microsoft's description (the test's
 * own, not uroce's). */
static uint32_t toeplitz(const uint8_t* key, const uint8_t* in, size_t n) {
  uint32_t h = 0, window = (uint32_t)key[0] << 24 | (uint32_t)key[1] << 16 | (uint32_t)key[2] << 8 | key[3];
  for (size_t i = 0; i < n; ++i)
    for (int b = 7; b >= 0; --b) {
      if (in[i] & (1u << b)) h ^= window;
      window = window << 1 | ((key[i + 4] >> b) & 1u);
    }
  return h;
}

/* RSS: work queues, an indirection table and an RSS QP over them. */
static void rss(void) {
  static const uint8_t key[40] = {0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
                                  0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
                                  0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa};
  enum { kWqs = 4, kFrames = 16, kLen = 200 };
  struct ibv_device_attr_ex ax;
  memset(&ax, 0, sizeof ax);
  const int qrc = ibv_query_device_ex(ctx, NULL, &ax);
  check(qrc == 0 && (ax.rss_caps.supported_qpts & (1u << IBV_QPT_RAW_PACKET)) &&
            ax.rss_caps.max_rwq_indirection_table_size >= kWqs &&
            (ax.rss_caps.rx_hash_function & IBV_RX_HASH_FUNC_TOEPLITZ) &&
            (ax.rss_caps.rx_hash_fields_mask & (IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4)) && ax.max_wq_type_rq > 0,
        "rss_caps: raw packet QPs, Toeplitz, IPv4 fields, tables of %u", ax.rss_caps.max_rwq_indirection_table_size);
  uint8_t* buf = calloc(1, 65536);
  struct ibv_mr* mr = buf ? ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_cq* cqs[kWqs] = {0};
  struct ibv_wq* wqs[kWqs] = {0};
  struct ibv_rwq_ind_table* tbl = NULL;
  struct ibv_qp* qp = NULL;
  struct ibv_flow* flow = NULL;
  struct ibv_qp* tx = make_qp(IBV_QPT_RAW_PACKET, NULL, 4, 1, 1, 1, NULL);
  int ok = mr && tx;
  for (int i = 0; ok && i < kWqs; ++i) {
    cqs[i] = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    struct ibv_wq_init_attr wa = {0};
    wa.wq_type = IBV_WQT_RQ;
    wa.max_wr = 32;
    wa.max_sge = 1;
    wa.pd = pd;
    wa.cq = cqs[i];
    wqs[i] = cqs[i] ? ibv_create_wq(ctx, &wa) : NULL;
    struct ibv_wq_attr m = {0};
    m.attr_mask = IBV_WQ_ATTR_STATE;
    m.wq_state = IBV_WQS_RDY;
    ok = wqs[i] && ibv_modify_wq(wqs[i], &m) == 0 && wqs[i]->state == IBV_WQS_RDY && wa.max_wr >= 32;
  }
  check(ok, "4 work queues, each with a CQ of its own, made RDY (errno %d)", errno);
  if (!ok) goto out;
  struct ibv_rwq_ind_table_init_attr ta = {0};
  ta.log_ind_tbl_size = 2;
  ta.ind_tbl = wqs;
  tbl = ibv_create_rwq_ind_table(ctx, &ta);
  check(tbl != NULL, "an indirection table of the 4 (errno %d)", errno);
  if (!tbl) goto out;
  struct ibv_qp_init_attr_ex qa = {0};
  qa.qp_type = IBV_QPT_RAW_PACKET;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH;
  qa.pd = pd;
  qa.rwq_ind_tbl = tbl;
  qa.rx_hash_conf.rx_hash_function = 1u << 1; /* a function other than Toeplitz */
  qa.rx_hash_conf.rx_hash_key_len = 40;
  qa.rx_hash_conf.rx_hash_key = (uint8_t*)key;
  qa.rx_hash_conf.rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4;
  errno = 0;
  check(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP, "a hash function other than Toeplitz: EOPNOTSUPP (%d)", errno);
  qa.rx_hash_conf.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
  qa.rx_hash_conf.rx_hash_key_len = 20;
  errno = 0;
  check(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EINVAL, "a 20-byte Toeplitz key: EINVAL (%d)", errno);
  qa.rx_hash_conf.rx_hash_key_len = 40;
  qp = ibv_create_qp_ex(ctx, &qa);
  check(qp != NULL, "an RSS QP over the table, hashing the IPv4 addresses (errno %d)", errno);
  if (!qp) goto out;
  struct ibv_sge sge = {(uintptr_t)buf, 64, mr->lkey};
  struct ibv_recv_wr r = {0}, *rbad = NULL;
  r.sg_list = &sge;
  r.num_sge = 1;
  check(ibv_post_recv(qp, &r, &rbad) == EINVAL, "a receive on the RSS QP itself: EINVAL");
  errno = 0;
  flow = eth_flow(qp, 0x0800, 0);
  check(flow != NULL, "a flow rule on the RSS QP (errno %d)", errno);
  if (!flow) goto out;
  /* Every queue gets receives, each of its own 1 KiB in buf. */
  for (int i = 0; i < kWqs; ++i)
    for (int k = 0; k < kFrames; ++k) {
      struct ibv_sge s = {(uintptr_t)(buf + 4096 + (i * kFrames + k) * 1024), 1024, mr->lkey};
      struct ibv_recv_wr w = {0}, *bad = NULL;
      w.wr_id = (uint64_t)(i * kFrames + k);
      w.sg_list = &s;
      w.num_sge = 1;
      if (ibv_post_wq_recv(wqs[i], &w, &bad)) ok = 0;
    }
  check(ok, "receives posted to each work queue (ibv_post_wq_recv)");
  raw_up(tx);
  int right = 0, used = 0, seen[kWqs] = {0};
  for (int f = 0; f < kFrames; ++f) {
    /* Eth to the group MAC | IPv4 10.0.0.f+1 -> 10.0.0.200 | UDP 4000 -> 9999. */
    uint8_t* frame = buf;
    memset(frame, 0, kLen);
    const uint8_t head[14] = {0x01, 0x00, 0x5e, 0x7f, 0x00, 0x09, 0x02, 0, 0, 0, 0, 0x42, 0x08, 0x00};
    memcpy(frame, head, 14);
    uint8_t* ip = frame + 14;
    ip[0] = 0x45;
    ip[2] = 0;
    ip[3] = kLen - 14;
    ip[8] = 64;
    ip[9] = 17;
    const uint8_t addrs[8] = {10, 0, 0, (uint8_t)(f + 1), 10, 0, 0, 200};
    memcpy(ip + 12, addrs, 8);
    ip[20] = 4000 >> 8, ip[21] = 4000 & 255, ip[22] = 9999 >> 8, ip[23] = 9999 & 255;
    for (int i = 42; i < kLen; ++i) frame[i] = (uint8_t)(i + f);
    const int want = (int)(toeplitz(key, addrs, 8) & (kWqs - 1));
    struct ibv_sge ss = {(uintptr_t)frame, kLen, mr->lkey};
    struct ibv_send_wr w = {0}, *sbad = NULL;
    w.wr_id = 1000 + f;
    w.sg_list = &ss;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(tx, &w, &sbad)) break;
    int got = -1, sent = 0;
    struct ibv_wc wc;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
      if (ibv_poll_cq(cq, 1, &wc) == 1 && wc.wr_id == 1000u + f) sent = 1;
      for (int i = 0; i < kWqs && got < 0; ++i)
        if (ibv_poll_cq(cqs[i], 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == kLen &&
            wc.qp_num == qp->qp_num && wc.wr_id / kFrames == (uint64_t)i &&
            memcmp(buf + 4096 + wc.wr_id * 1024, frame, kLen) == 0)
          got = i;
      clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 1000 && !(sent && got >= 0));
    if (got == want) ++right;
    if (got >= 0 && !seen[got]++) ++used;
  }
  check(right == kFrames && used > 1, "%d of %d frames in the work queue the hash names, every byte (%d queues used)",
        right, kFrames, used);
  if (right == kFrames && used > 1) printf("rss: %d frames spread over %d work queues as the Toeplitz hash says\n", right, used);
  check(ibv_destroy_wq(wqs[0]) == EBUSY, "a work queue in a table: EBUSY");
  check(ibv_destroy_rwq_ind_table(tbl) == EBUSY, "a table an RSS QP uses: EBUSY");
out:
  if (flow) ibv_destroy_flow(flow);
  if (qp) check(ibv_destroy_qp(qp) == 0, "the RSS QP is destroyed");
  if (tbl) check(ibv_destroy_rwq_ind_table(tbl) == 0, "then its table");
  for (int i = 0; i < kWqs; ++i) {
    if (wqs[i]) check(ibv_destroy_wq(wqs[i]) == 0, "then work queue %d", i);
    if (cqs[i]) ibv_destroy_cq(cqs[i]);
  }
  if (tx) ibv_destroy_qp(tx);
  if (mr) ibv_dereg_mr(mr);
  free(buf);
}

static void odp(void) {
  struct ibv_device_attr_ex ax;
  memset(&ax, 0, sizeof ax);
  check(ibv_query_device_ex(ctx, NULL, &ax) == 0, "ibv_query_device_ex for the ODP caps");
  const int have = (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0;
  const size_t len = 1u << 20;
  uint8_t* mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    check(0, "mmap of 1 MiB for the ODP checks");
    return;
  }
  const int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ON_DEMAND;
  errno = 0;
  struct ibv_mr* mr = ibv_reg_mr(pd, mem, len, all);
  if (!have) {
    printf("odp: the device reports no ODP\n");
    check(!mr && errno == EOPNOTSUPP, "no ODP caps: an ODP MR is EOPNOTSUPP (errno %d)", errno);
    if (mr) ibv_dereg_mr(mr);
    munmap(mem, len);
    return;
  }
  printf("odp: the device reports ODP\n");
  const uint32_t want = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                        IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  check((ax.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) &&
            (ax.odp_caps.per_transport_caps.rc_odp_caps & want) == want,
        "ODP caps: implicit, and every RC operation (what the checks below do)");
  check(mr != NULL, "an ODP MR over 1 MiB never touched (errno %d)", errno);
  uint8_t* src = calloc(1, 8192);
  struct ibv_mr* from = src ? ibv_reg_mr(pd, src, 8192, IBV_ACCESS_LOCAL_WRITE) : NULL;
  check(from != NULL, "a plain MR to write from");
  if (mr && from) {
    for (int i = 0; i < 8192; ++i) src[i] = (uint8_t)(i * 5 + 3);
    check(write_status(from, (uintptr_t)(mem + 512 * 1024 + 7), mr->rkey, 8192) == IBV_WC_SUCCESS,
          "a WRITE of 8 KiB into pages first touched by it: success");
    check(memcmp(mem + 512 * 1024 + 7, src, 8192) == 0, "the WRITE's bytes are in the application's pages");
    munmap(mem + 256 * 1024, 4096);  /* a hole, after the registration */
    check(write_status(from, (uintptr_t)(mem + 256 * 1024 + 16), mr->rkey, 64) == IBV_WC_REM_ACCESS_ERR,
          "a WRITE into a page unmapped since: remote access error");
    check(write_status(from, (uintptr_t)(mem + 16), mr->rkey, 64) == IBV_WC_SUCCESS && mem[16] == src[0],
          "and the next WRITE to a page that is there: success");
    /* ibv_advise_mr: ranges of the PD's ODP MRs only. */
    struct ibv_sge sg = {(uintptr_t)(mem + 4096), 8192, mr->lkey};
    check(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sg, 1) == 0,
          "ibv_advise_mr PREFETCH_WRITE, FLUSH, of an ODP range: 0");
    check(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sg, 1) == 0, "PREFETCH_NO_FAULT: 0");
    struct ibv_sge plain = {(uintptr_t)src, 64, from->lkey};
    check(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &plain, 1) == EINVAL, "advice on a plain MR: EINVAL");
    struct ibv_sge past = {(uintptr_t)(mem + len - 8), 64, mr->lkey};
    check(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &past, 1) == EINVAL, "advice past the MR: EINVAL");
    check(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x80, &sg, 1) == EINVAL, "unknown advice flags: EINVAL");
    check(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sg, 0) == EINVAL, "no ranges: EINVAL");
  }
  /* Implicit ODP: one MR over the whole address space; memory allocated
   * after it is reached through its keys, locally and remotely. */
  errno = 0;
  struct ibv_mr* imr = ibv_reg_mr(pd, NULL, SIZE_MAX, all);
  check(imr != NULL, "an implicit ODP MR (NULL, SIZE_MAX) (errno %d)", errno);
  uint8_t* late = malloc(4096);
  uint8_t* late_src = malloc(4096);
  if (imr && late && late_src) {
    memset(late, 0, 4096);
    memset(late_src, 0x3c, 4096);
    /* The source through the implicit MR's L_Key, the target through its R_Key. */
    struct ibv_mr fake = *imr;
    fake.addr = late_src;
    check(write_status(&fake, (uintptr_t)late, imr->rkey, 4096) == IBV_WC_SUCCESS && late[0] == 0x3c && late[4095] == 0x3c,
          "a WRITE from and to memory allocated after the implicit MR: success");
  }
  free(late);
  free(late_src);
  if (imr) check(ibv_dereg_mr(imr) == 0, "the implicit MR deregisters");
  if (from) ibv_dereg_mr(from);
  if (mr) check(ibv_dereg_mr(mr) == 0, "the ODP MR deregisters");
  free(src);
  munmap(mem, len);
}

static void xrc(void) {
  check((dev.device_cap_flags & IBV_DEVICE_XRC) != 0, "the device says IBV_DEVICE_XRC");
  char path[] = "/tmp/verbs_rules_xrc.XXXXXX";
  const int fd = mkstemp(path);
  struct ibv_context* ctx2 = ibv_open_device(ctx->device);
  struct ibv_pd* pd2 = ctx2 ? ibv_alloc_pd(ctx2) : NULL;
  struct ibv_cq* cq2 = ctx2 ? ibv_create_cq(ctx2, 16, NULL, NULL, 0) : NULL;
  check(fd >= 0 && pd2 && cq2, "a file for the XRC domain, and a second context (errno %d)", errno);
  if (fd < 0 || !pd2 || !cq2) return;
  struct ibv_xrcd_init_attr xa = {0};
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = fd;
  xa.oflags = 0;
  errno = 0;
  struct ibv_xrcd* none = ibv_open_xrcd(ctx, &xa);
  check(none == NULL && errno == EINVAL, "a file with no XRC domain, without O_CREAT: EINVAL (errno %d)", errno);
  xa.oflags = O_CREAT;
  struct ibv_xrcd* x1 = ibv_open_xrcd(ctx, &xa);
  struct ibv_xrcd* x2 = ibv_open_xrcd(ctx2, &xa);
  check(x1 && x2, "the file's XRC domain, opened from two contexts (errno %d)", errno);
  xa.oflags = O_CREAT | O_EXCL;
  errno = 0;
  struct ibv_xrcd* excl = ibv_open_xrcd(ctx2, &xa);
  check(excl == NULL && errno == EINVAL, "O_CREAT | O_EXCL once it exists: EINVAL (errno %d)", errno);
  if (!x1 || !x2) return;
  // The second context's XRC SRQ, in the shared domain, over its own memory.
  enum { kLen = 3000 };
  char* buf = calloc(1, 2 * kLen);
  struct ibv_mr* mr1 = ibv_reg_mr(pd, buf, kLen, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr* mr2 = ibv_reg_mr(pd2, buf + kLen, kLen, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_srq_init_attr_ex sa = {0};
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  sa.srq_type = IBV_SRQT_XRC;
  sa.pd = pd2;
  sa.xrcd = x2;
  sa.cq = cq2;
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  struct ibv_srq* srq = ibv_create_srq_ex(ctx2, &sa);
  uint32_t srqn = 0;
  check(srq && ibv_get_srq_num(srq, &srqn) == 0 && srqn != 0, "an XRC SRQ and its number (%u; errno %d)", srqn, errno);
  // The first context's target (domain only) and send QP (PD and send CQ).
  struct ibv_qp_init_attr_ex ta = {0};
  ta.qp_type = IBV_QPT_XRC_RECV;
  ta.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  ta.xrcd = x1;
  struct ibv_qp* tgt = ibv_create_qp_ex(ctx, &ta);
  struct ibv_qp_init_attr_ex ia = {0};
  ia.qp_type = IBV_QPT_XRC_SEND;
  ia.comp_mask = IBV_QP_INIT_ATTR_PD;
  ia.pd = pd;
  ia.send_cq = cq;
  ia.cap.max_send_wr = 4;
  ia.cap.max_send_sge = 1;
  struct ibv_qp* ini = ibv_create_qp_ex(ctx, &ia);
  check(tgt && ini, "an XRC target QP and an XRC send QP (errno %d)", errno);
  if (!srq || !tgt || !ini || !mr1 || !mr2) return;
  const int up = to_init(tgt, IBV_QPT_RC) == 0 && to_init(ini, IBV_QPT_RC) == 0 && to_rtr(tgt, ini->qp_num, 1) == 0 &&
                 rc_up(ini, tgt->qp_num, 1) == 0;
  check(up, "the target reaches RTR and the send QP RTS (errno %d)", errno);
  struct ibv_sge rs = {(uintptr_t)(buf + kLen), kLen, mr2->lkey};
  struct ibv_recv_wr rw = {.wr_id = 77, .sg_list = &rs, .num_sge = 1}, *rbad = NULL;
  check(ibv_post_srq_recv(srq, &rw, &rbad) == 0, "a receive on the XRC SRQ");
  check(ibv_post_recv(ini, &rw, &rbad) == EINVAL, "an XRC send QP takes no receives: EINVAL");
  for (int i = 0; i < kLen; ++i) buf[i] = (char)(i * 13 + 5);
  struct ibv_sge ss = {(uintptr_t)buf, kLen, mr1->lkey};
  struct ibv_send_wr sw = {.wr_id = 5, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED}, *sbad = NULL;
  sw.qp_type.xrc.remote_srqn = srqn;
  struct ibv_wc wc = {0}, rwc = {0};
  const int posted = up && ibv_post_send(ini, &sw, &sbad) == 0;
  check(posted && wait_wc(&wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 5,
        "the XRC SEND completes (status %d)", wc.status);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int got = 0;
  do {
    got = ibv_poll_cq(cq2, 1, &rwc);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while (posted && got == 0 && t.tv_sec - t0.tv_sec < 5);
  check(got == 1 && rwc.status == IBV_WC_SUCCESS && rwc.wr_id == 77 && rwc.byte_len == kLen &&
            rwc.qp_num == tgt->qp_num,
        "it lands in the other context's XRC SRQ and completes in its CQ, for the target QP (status %d, qp %u)",
        rwc.status, rwc.qp_num);
  check(memcmp(buf, buf + kLen, kLen) == 0, "every byte of the XRC SEND arrived");
  printf("XRC was checked across two contexts\n");
  errno = 0;
  check(ibv_close_xrcd(x1) == EBUSY, "a domain with a target QP in it does not close: EBUSY");
  ibv_destroy_qp(ini);
  ibv_destroy_qp(tgt);
  check(ibv_close_xrcd(x1) == 0, "once the target QP is gone, it closes");
  ibv_destroy_srq(srq);
  check(ibv_close_xrcd(x2) == 0, "and so does the other context's hold, once its SRQ is gone");
  ibv_dereg_mr(mr1);
  ibv_dereg_mr(mr2);
  free(buf);
  ibv_destroy_cq(cq2);
  ibv_dealloc_pd(pd2);
  ibv_close_device(ctx2);
  close(fd);
  unlink(path);
}

/* The enum strings, against rdma-core's own library in a link-map
 * namespace of its own (dlmopen), so both are loaded at once. That
 * namespace brings a second C library and heap, so it lives in a child,
 * which reports each function's count of differing values and the first. */
static void enum_strings(void) {
  const char* path = getenv("UROCE_SYSTEM_IBVERBS");
  struct {
    const char* name;
    const char* (*ours)(int);
    int last;
  } fns[] = {
      {"ibv_wc_status_str", (const char* (*)(int))ibv_wc_status_str, IBV_WC_TM_RNDV_INCOMPLETE},
      {"ibv_event_type_str", (const char* (*)(int))ibv_event_type_str, IBV_EVENT_WQ_FATAL},
      {"ibv_node_type_str", (const char* (*)(int))ibv_node_type_str, IBV_NODE_UNSPECIFIED},
      {"ibv_port_state_str", (const char* (*)(int))ibv_port_state_str, IBV_PORT_ACTIVE_DEFER},
  };
  enum { kFns = sizeof fns / sizeof fns[0] };
  int fds[2];
  check(path != NULL && pipe(fds) == 0, "UROCE_SYSTEM_IBVERBS names rdma-core's libibverbs (%s)", path ? path : "unset");
  if (!path) return;
  fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    int res[kFns][2];
    void* h = dlmopen(LM_ID_NEWLM, path, RTLD_NOW | RTLD_LOCAL);
    for (size_t f = 0; f < kFns; ++f) {
      const char* (*theirs)(int) = NULL;
      void* sym = h ? dlsym(h, fns[f].name) : NULL;
      memcpy(&theirs, &sym, sizeof sym); /* POSIX's way from dlsym to a function pointer */
      res[f][0] = theirs ? 0 : -1;
      res[f][1] = -2;
      for (int v = -1; theirs && v <= fns[f].last + 1; ++v)
        if (strcmp(fns[f].ours(v), theirs(v)) != 0 && !res[f][0]++) res[f][1] = v;
    }
    _exit(write(fds[1], res, sizeof res) == (ssize_t)sizeof res ? 0 : 1);
  }
  close(fds[1]);
  int res[kFns][2];
  const ssize_t got = read(fds[0], res, sizeof res);
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  check(got == (ssize_t)sizeof res, "the child loaded rdma-core's libibverbs and compared (exit status %d)", status);
  for (size_t f = 0; got == (ssize_t)sizeof res && f < kFns; ++f)
    check(res[f][0] == 0, "%s prints rdma-core's strings, %d values (%d differ; the first: %d, \"%s\")", fns[f].name,
          fns[f].last + 3, res[f][0], res[f][1], res[f][0] > 0 ? fns[f].ours(res[f][1]) : "");
}

int main(int argc, char** argv) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct ibv_device* d = NULL;
  for (int i = 0; list && i < n; ++i)
    if (argc < 2 || strcmp(ibv_get_device_name(list[i]), argv[1]) == 0) {
      d = list[i];
      break;
    }
  if (!d) {
    printf("verbs_rules: no such device\n");
    return 1;
  }
  ctx = ibv_open_device(d);
  pd = ctx ? ibv_alloc_pd(ctx) : NULL;
  cq = ctx ? ibv_create_cq(ctx, 256, NULL, NULL, 0) : NULL;
  if (!pd || !cq || ibv_query_device(ctx, &dev)) {
    printf("verbs_rules: cannot open %s\n", ibv_get_device_name(d));
    return 1;
  }
  if (argc > 2 && strcmp(argv[2], "odp") == 0) {
    odp();  /* only this: on a daemon without --odp */
  } else if (argc > 2 && strcmp(argv[2], "raw") == 0) {
    /* only this: as a uid without CAP_NET_RAW */
    errno = 0;
    struct ibv_qp* q = make_qp(IBV_QPT_RAW_PACKET, NULL, 4, 4, 1, 1, NULL);
    check(q == NULL && errno == EPERM, "without CAP_NET_RAW a raw packet QP is EPERM (errno %d)", errno);
    if (q) ibv_destroy_qp(q);
  } else {
    enum_strings();
    shapes();
    send_only();
    posts();
    cqs_and_attrs();
    gids();
    timestamps();
    mr_bounds();
    rereg();
    zero_byte_mr();
    reset_forgets_completions();
    multicast();
    sent_before_destroy();
    device_memory();
    parent_domain();
    unmapped_before_dereg();
    fork_private();
    forked_queries();
    raw_packet();
    rss();
    xrc();
    odp();
  }
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
