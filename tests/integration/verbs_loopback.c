/* Your own verbs code on uroce: plain C against rdma-core's stock
 * <infiniband/verbs.h>, linked with `pkg-config libibverbs` (the system's
 * library; uroce-run swaps in uroce's at run time). Both ends live on one
 * device, connected to the port's own GID (loopback, as verbs test suites
 * and many applications do): RC SEND, WRITE, READ and both atomics, and a
 * UD datagram through an address handle, every byte checked; and MRs that
 * share and overlap pages of one heap object, registered and deregistered
 * in a random order, with WRITEs and READs through each checked against a
 * shadow copy of every byte.
 *
 *   verbs_loopback [DEVICE]      (default: the first device)
 * Prints "N passed, M failed"; exits 0 only when nothing failed. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int passed, failed;
static void check(int ok, const char* what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    printf("FAIL: %s\n", what);
  }
}

enum { kBuf = 1 << 16, kQkey = 0x1234 };

/* One CQ per end: completions of the sending QP on cq_a, the receiving one's on cq_b. */
static struct ibv_cq *cq_a, *cq_b;

/* One completion on cq within 5 s, or 0. */
static int wait_wc(struct ibv_cq* cq, struct ibv_wc* wc) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n != 0) return n == 1;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 5) return 0;
  }
}

/* rdma-core 45's FLUSH, which 44's header (this program's) does not have:
 * its numbers, and the slot it appended after struct ibv_qp_ex. A program
 * built with a newer header calls ibv_wr_flush through that slot. */
enum {
  kWrFlush = 14,
  kWcFlush = 8,
  kQpExWithFlush = 1 << 11,
  kAccessFlushGlobal = 1 << 8,
  kFlushGlobal = 1,
  kFlushRange = 0,
  kFlushMr = 1
};
struct qp_ex_45 {
  struct ibv_qp_ex base;
  void (*wr_flush)(struct ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, size_t len, uint8_t type, uint8_t level);
};
static int extra_access; /* added to an RC QP's access flags by to_rts */

static int to_rts(struct ibv_qp* qp, uint32_t dest_qpn, const union ibv_gid* gid, int ud) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (ud) {
    a.qkey = kQkey;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | extra_access;
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  if (ibv_modify_qp(qp, &a, mask)) return 0;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  mask = IBV_QP_STATE;
  if (!ud) {
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = 100;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
            IBV_QP_MIN_RNR_TIMER;
  }
  if (ibv_modify_qp(qp, &a, mask)) return 0;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 100;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (!ud) {
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(qp, &a, mask) == 0;
}

static struct ibv_qp* make_qp(struct ibv_pd* pd, struct ibv_cq* cq, enum ibv_qp_type type) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = type;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  return ibv_create_qp(pd, &ia);
}

static int post_send(struct ibv_qp* qp, enum ibv_wr_opcode op, void* local, uint32_t len, uint32_t lkey,
                     uint64_t remote, uint32_t rkey) {
  struct ibv_sge s = {(uintptr_t)local, len, lkey};
  struct ibv_send_wr w, *bad;
  memset(&w, 0, sizeof w);
  w.wr_id = op;
  w.opcode = op;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = &s;
  w.num_sge = 1;
  if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
    w.wr.atomic.remote_addr = remote;
    w.wr.atomic.rkey = rkey;
    w.wr.atomic.compare_add = op == IBV_WR_ATOMIC_FETCH_AND_ADD ? 5 : 105;
    w.wr.atomic.swap = 7;
  } else {
    w.wr.rdma.remote_addr = remote;
    w.wr.rdma.rkey = rkey;
  }
  struct ibv_wc wc;
  return ibv_post_send(qp, &w, &bad) == 0 && wait_wc(cq_a, &wc) && wc.status == IBV_WC_SUCCESS && wc.wr_id == op;
}

/* A signaled RDMA WRITE posted, not waited for: 1 if posted. */
static int post_write_signaled(struct ibv_qp* qp, uint64_t id, struct ibv_sge* s, uint64_t remote, uint32_t rkey) {
  struct ibv_send_wr w, *bad;
  memset(&w, 0, sizeof w);
  w.wr_id = id;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = s;
  w.num_sge = 1;
  w.wr.rdma.remote_addr = remote;
  w.wr.rdma.rkey = rkey;
  return ibv_post_send(qp, &w, &bad) == 0;
}

/* Up to `want` completions from an extended CQ (start_poll, next_poll,
 * end_poll), within 5 s; their wr_ids, opcodes and QP numbers. */
static int poll_ex(struct ibv_cq_ex* cq, uint64_t* ids, enum ibv_wc_opcode* ops, uint32_t* qpns, int want) {
  struct ibv_poll_cq_attr pa;
  memset(&pa, 0, sizeof pa);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int got = 0;
  while (got < want) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 5) break;
    const int rc = ibv_start_poll(cq, &pa);
    if (rc == ENOENT) continue;
    if (rc != 0) return -1;
    do {
      if (cq->status != IBV_WC_SUCCESS) {
        ibv_end_poll(cq);
        return -1;
      }
      ids[got] = cq->wr_id;
      ops[got] = ibv_wc_read_opcode(cq);
      qpns[got] = ibv_wc_read_qp_num(cq);
      ++got;
    } while (got < want && ibv_next_poll(cq) == 0);
    ibv_end_poll(cq);
  }
  return got;
}

static int post_recv(struct ibv_qp* qp, void* buf, uint32_t len, uint32_t lkey) {
  struct ibv_sge s = {(uintptr_t)buf, len, lkey};
  struct ibv_recv_wr w, *bad;
  memset(&w, 0, sizeof w);
  w.wr_id = 77;
  w.sg_list = &s;
  w.num_sge = 1;
  return ibv_post_recv(qp, &w, &bad) == 0;
}

int main(int argc, char** argv) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct ibv_device* dev = NULL;
  for (int i = 0; list && i < n; ++i)
    if (argc < 2 || strcmp(ibv_get_device_name(list[i]), argv[1]) == 0) {
      dev = list[i];
      break;
    }
  if (!dev) {
    printf("no such device: %s\n", argc < 2 ? "(any)" : argv[1]);
    printf("0 passed, 1 failed\n");
    return 1;
  }
  struct ibv_context* ctx = ibv_open_device(dev);
  struct ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : NULL;
  uint8_t* a = aligned_alloc(4096, kBuf);
  uint8_t* b = aligned_alloc(4096, kBuf);
  memset(a, 0, kBuf);
  memset(b, 0, kBuf);
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  struct ibv_mr* ma = pd ? ibv_reg_mr(pd, a, kBuf, access) : NULL;
  struct ibv_mr* mb = pd ? ibv_reg_mr(pd, b, kBuf, access) : NULL;
  cq_a = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
  cq_b = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
  check(ctx && pd && ma && mb && cq_a && cq_b, "device opened; PD, two MRs (malloc'd memory) and two CQs");
  if (failed) goto out;
  union ibv_gid gid;
  struct ibv_port_attr pa;
  check(ibv_query_gid(ctx, 1, 0, &gid) == 0 && ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
            pa.link_layer == IBV_LINK_LAYER_ETHERNET,
        "port 1 active, Ethernet; GID 0 read");

  /* RC: two QPs on this device, each connected to the other through the port's own GID. */
  struct ibv_qp* qa = make_qp(pd, cq_a, IBV_QPT_RC);
  struct ibv_qp* qb = make_qp(pd, cq_b, IBV_QPT_RC);
  check(qa && qb && to_rts(qa, qb->qp_num, &gid, 0) && to_rts(qb, qa->qp_num, &gid, 0),
        "two RC QPs connected to each other on one device (loopback)");
  if (failed) goto out;
  for (int i = 0; i < 8192; ++i) a[i] = (uint8_t)(i * 31 + 7);
  check(post_recv(qb, b, 8192, mb->lkey) && post_send(qa, IBV_WR_SEND, a, 4096, ma->lkey, 0, 0),
        "SEND completed");
  struct ibv_wc wc;
  check(wait_wc(cq_b, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == 4096 &&
            memcmp(a, b, 4096) == 0,
        "SEND received, every byte");
  check(post_send(qa, IBV_WR_RDMA_WRITE, a, 8192, ma->lkey, (uintptr_t)b + 16384, mb->rkey) &&
            memcmp(a, b + 16384, 8192) == 0,
        "WRITE of 8 KiB (8 packets), every byte");
  check(post_send(qa, IBV_WR_RDMA_READ, a + 32768, 8192, ma->lkey, (uintptr_t)b + 16384, mb->rkey) &&
            memcmp(a + 32768, a, 8192) == 0,
        "READ of it back, every byte");
  uint64_t v = 100, got = 0;
  memcpy(b + 40960, &v, 8);
  check(post_send(qa, IBV_WR_ATOMIC_FETCH_AND_ADD, a + 49152, 8, ma->lkey, (uintptr_t)b + 40960, mb->rkey) &&
            (memcpy(&got, a + 49152, 8), got == 100) && (memcpy(&v, b + 40960, 8), v == 105),
        "FETCH_ADD: 100 returned, 105 left");
  check(post_send(qa, IBV_WR_ATOMIC_CMP_AND_SWP, a + 49152, 8, ma->lkey, (uintptr_t)b + 40960, mb->rkey) &&
            (memcpy(&v, b + 40960, 8), v == 7),
        "CMP_SWAP: swapped");
  v = 0x0102030405060708ull;
  memcpy(a + 49160, &v, 8);
  check(post_send(qa, IBV_WR_ATOMIC_WRITE, a + 49160, 8, ma->lkey, (uintptr_t)b + 40968, mb->rkey) &&
            (memcpy(&got, b + 40968, 8), got == v) && (memcpy(&got, b + 40960, 8), got == 7),
        "ATOMIC_WRITE (ibv_post_send, 8 bytes from an SGE): stored, its neighbour untouched");

  /* ibv_resize_cq: a CQ of 2 grows to 64 and keeps its completions (the
   * refusal to shrink below what waits is Ring.CopyTo's unit test). */
  {
    struct ibv_cq* small = ibv_create_cq(ctx, 2, NULL, NULL, 0);
    struct ibv_qp* ra = small ? make_qp(pd, small, IBV_QPT_RC) : NULL;
    struct ibv_qp* rb = make_qp(pd, cq_b, IBV_QPT_RC);
    check(small && ra && rb && to_rts(ra, rb->qp_num, &gid, 0) && to_rts(rb, ra->qp_num, &gid, 0),
          "a QP whose send CQ holds 2");
    int posted = 0, got = 0, in_order = 1;
    struct ibv_sge s1 = {(uintptr_t)a, 8, ma->lkey};
    for (int i = 0; ra && i < 2; ++i) posted += post_write_signaled(ra, 500 + i, &s1, (uintptr_t)b + 8 * i, mb->rkey);
    struct timespec t0 = {0, 50 * 1000 * 1000};
    nanosleep(&t0, NULL);  /* both complete into the full CQ */
    check(small && ibv_resize_cq(small, 64) == 0 && small->cqe >= 64, "resize_cq 2 -> 64");
    for (int i = 2; ra && i < 16; ++i)  /* the send queue holds 16 */
      posted += post_write_signaled(ra, 500 + i, &s1, (uintptr_t)b + 8 * i, mb->rkey);
    while (small && got < posted) {
      struct ibv_wc wc2;
      if (!wait_wc(small, &wc2)) break;
      in_order &= wc2.wr_id == (uint64_t)(500 + got) && wc2.status == IBV_WC_SUCCESS;
      ++got;
    }
    if (!(posted == 16 && got == 16 && in_order)) printf("resize: %d posted, %d completions, in order %d\n", posted, got, in_order);
    check(posted == 16 && got == 16 && in_order, "all 16 completions, the 2 from before the resize first, in order");
    check(ra && rb && ibv_destroy_qp(ra) == 0 && ibv_destroy_qp(rb) == 0 && ibv_destroy_cq(small) == 0,
          "resized CQ destroyed");
  }

  /* An MR with an address space of its own (ibv_reg_mr_iova2): local and
   * remote accesses name its bytes from the IOVA on, not from where the
   * process has them. */
  {
    uint8_t* c = aligned_alloc(4096, 16384);
    memset(c, 0, 16384);
    const uint64_t iova = 0x100000000123ull;
    struct ibv_mr* mc = c ? ibv_reg_mr_iova2(pd, c, 16384, iova, access) : NULL;
    check(mc && mc->addr == c && mc->length == 16384, "ibv_reg_mr_iova2 with an IOVA of its own");
    for (int i = 0; i < 3000; ++i) a[i] = (uint8_t)(i * 5 + 1);
    check(mc && post_send(qa, IBV_WR_RDMA_WRITE, a, 3000, ma->lkey, iova + 500, mc->rkey) && memcmp(c + 500, a, 3000) == 0,
          "a WRITE to IOVA + 500 lands at the MR's byte 500");
    memset(a + 8192, 0, 3000);
    check(mc && post_send(qa, IBV_WR_RDMA_READ, a + 8192, 3000, ma->lkey, iova + 500, mc->rkey) &&
              memcmp(a + 8192, c + 500, 3000) == 0,
          "a READ from IOVA + 500 reads the MR's byte 500 on");
    check(mc && post_recv(qb, (void*)(uintptr_t)(iova + 6000), 64, mc->lkey) &&
              post_send(qa, IBV_WR_SEND, a, 64, ma->lkey, 0, 0) && wait_wc(cq_b, &wc) && wc.status == IBV_WC_SUCCESS &&
              memcmp(c + 6000, a, 64) == 0,
          "a receive into IOVA + 6000 (a local SGE in the IOVA space) lands at the MR's byte 6000");
    check(mc && ibv_dereg_mr(mc) == 0, "IOVA MR deregistered");
    free(c);
  }

  /* The extended verbs: a CQ from ibv_create_cq_ex, polled with
   * start/next/end_poll, and a QP from ibv_create_qp_ex posting a batch of
   * two with the wr_* builders (a WRITE from an SGE, a SEND of inline data). */
  struct ibv_cq_init_attr_ex cqa;
  memset(&cqa, 0, sizeof cqa);
  cqa.cqe = 64;
  cqa.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM;
  struct ibv_cq_ex* cqx = ibv_create_cq_ex(ctx, &cqa);
  cqa.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  cqa.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
  errno = 0;
  check(ibv_create_cq_ex(ctx, &cqa) == NULL && errno == EOPNOTSUPP, "create_cq_ex ignoring overruns: EOPNOTSUPP");
  cqa.comp_mask = 0;
  cqa.flags = 0;
  struct ibv_qp_init_attr_ex xa;
  memset(&xa, 0, sizeof xa);
  xa.qp_type = IBV_QPT_RC;
  xa.cap.max_send_wr = xa.cap.max_recv_wr = 16;
  xa.cap.max_send_sge = xa.cap.max_recv_sge = 1;
  xa.cap.max_inline_data = 64;
  xa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  xa.pd = pd;
  xa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO;
  check(cqx && (xa.send_cq = xa.recv_cq = ibv_cq_ex_to_cq(cqx), ibv_create_qp_ex(ctx, &xa) == NULL) && errno == EOPNOTSUPP,
        "create_qp_ex asking for TSO: EOPNOTSUPP");
  xa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ |
                      IBV_QP_EX_WITH_ATOMIC_WRITE | kQpExWithFlush;
  struct ibv_qp* xq = cqx ? ibv_create_qp_ex(ctx, &xa) : NULL;
  struct ibv_qp_ex* xqx = xq ? ibv_qp_to_qp_ex(xq) : NULL;
  struct ibv_qp* xb = make_qp(pd, cq_b, IBV_QPT_RC);
  extra_access = kAccessFlushGlobal; /* xb takes FLUSHes */
  check(cqx && xq && xqx && xb && to_rts(xq, xb->qp_num, &gid, 0) && to_rts(xb, xq->qp_num, &gid, 0),
        "an extended CQ and QP (create_cq_ex, create_qp_ex), connected on this device");
  extra_access = 0;
  if (failed) goto out;
  for (int i = 0; i < 8192; ++i) a[i] = (uint8_t)(i * 17 + 3);
  check(post_recv(xb, b + 30000, 64, mb->lkey), "receive posted");
  ibv_wr_start(xqx);
  xqx->wr_id = 1001;
  xqx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(xqx, mb->rkey, (uintptr_t)b + 20000);
  ibv_wr_set_sge(xqx, ma->lkey, (uintptr_t)a, 4096);
  xqx->wr_id = 1002;
  ibv_wr_send(xqx);
  ibv_wr_set_inline_data(xqx, a + 5000, 32);
  const uint64_t aw = 0x1122334455667788ull;
  memset(b + 49152, 0xAB, 24);
  xqx->wr_id = 1003;
  ibv_wr_atomic_write(xqx, mb->rkey, (uintptr_t)b + 49160, &aw);
  check(ibv_wr_complete(xqx) == 0, "wr_start, a WRITE, a SEND and an ATOMIC WRITE, wr_complete: posted");
  uint64_t ids[3] = {0, 0, 0};
  enum ibv_wc_opcode ops[3];
  uint32_t qpns[3];
  check(poll_ex(cqx, ids, ops, qpns, 3) == 3 && ids[0] == 1001 && ops[0] == IBV_WC_RDMA_WRITE && ids[1] == 1002 &&
            ops[1] == IBV_WC_SEND && ids[2] == 1003 && ops[2] == IBV_WC_ATOMIC_WRITE && qpns[0] == xq->qp_num,
        "all three completed, in order, read through start_poll/next_poll/end_poll");
  check(memcmp(b + 20000, a, 4096) == 0, "the WRITE landed, every byte");
  uint64_t got_aw = 0;
  memcpy(&got_aw, b + 49160, 8);
  check(got_aw == aw && b[49159] == 0xAB && b[49168] == 0xAB, "the ATOMIC WRITE stored its 8 bytes, and only those");
  check(wait_wc(cq_b, &wc) && wc.status == IBV_WC_SUCCESS && wc.byte_len == 32 && memcmp(b + 30000, a + 5000, 32) == 0,
        "the inline SEND landed, every byte");
  ibv_wr_start(xqx);
  ibv_wr_send(xqx);
  ibv_wr_set_sge(xqx, ma->lkey, (uintptr_t)a, 16);
  ibv_wr_send_tso(xqx, a, 16, 1000);
  check(ibv_wr_complete(xqx) == EOPNOTSUPP, "a batch with a TSO send: EOPNOTSUPP, nothing posted");
  /* FLUSH (IBTA 1.5), as a program built with rdma-core 45's header posts
   * it: a WRITE, then a FLUSH of its range and one of the whole MR, into an
   * MR that takes FLUSHes. */
  {
    struct ibv_device_attr_ex dx;
    memset(&dx, 0, sizeof dx);
    check(ibv_query_device_ex(ctx, NULL, &dx) == 0 && (dx.device_cap_flags_ex & (1ull << 38)),
          "query_device_ex: FLUSH with global visibility (IB_UVERBS_DEVICE_FLUSH_GLOBAL)");
    struct ibv_mr* fm = ibv_reg_mr(pd, b + 40960, 4096,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | kAccessFlushGlobal);
    struct qp_ex_45* x45 = (struct qp_ex_45*)xqx;
    check(fm && x45->wr_flush, "an MR with FLUSH access, and the wr_flush slot filled");
    if (fm && x45->wr_flush) {
      for (int i = 0; i < 2048; ++i) a[i] = (uint8_t)(i * 7 + 5);
      ibv_wr_start(xqx);
      xqx->wr_id = 2001;
      xqx->wr_flags = 0;
      ibv_wr_rdma_write(xqx, fm->rkey, (uintptr_t)b + 40960);
      ibv_wr_set_sge(xqx, ma->lkey, (uintptr_t)a, 2048);
      xqx->wr_id = 2002;
      xqx->wr_flags = IBV_SEND_SIGNALED;
      x45->wr_flush(xqx, fm->rkey, (uintptr_t)b + 40960, 2048, kFlushGlobal, kFlushRange);
      xqx->wr_id = 2003;
      x45->wr_flush(xqx, fm->rkey, (uintptr_t)b + 40960, 0, kFlushGlobal, kFlushMr);
      check(ibv_wr_complete(xqx) == 0, "wr_start, a WRITE, two FLUSHes, wr_complete: posted");
      uint64_t fids[2] = {0, 0};
      enum ibv_wc_opcode fops[2];
      uint32_t fqpns[2];
      check(poll_ex(cqx, fids, fops, fqpns, 2) == 2 && fids[0] == 2002 && (int)fops[0] == kWcFlush &&
                fids[1] == 2003 && (int)fops[1] == kWcFlush,
            "both FLUSHes completed, in order, as IBV_WC_FLUSH");
      check(memcmp(b + 40960, a, 2048) == 0, "the WRITE before them landed, every byte");
      /* Past the MR's end: the peer refuses it (a remote access error). */
      ibv_wr_start(xqx);
      xqx->wr_id = 2004;
      x45->wr_flush(xqx, fm->rkey, (uintptr_t)b + 40960 + 4000, 200, kFlushGlobal, kFlushRange);
      check(ibv_wr_complete(xqx) == 0 && poll_ex(cqx, fids, fops, fqpns, 1) == -1,
            "a FLUSH past its MR's end: a remote access error");
      ibv_dereg_mr(fm);
    }
  }
  check(ibv_destroy_qp(xq) == 0 && ibv_destroy_qp(xb) == 0 && ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0,
        "extended QP and CQ destroyed");

  /* MRs that share pages, in any order: small unaligned MRs over one heap
   * object (as rping registers its buffers), registered and deregistered at
   * random; after each step a WRITE through one live MR and a local store,
   * then the whole object against its shadow, and a READ back through
   * another live MR. Every page must stay one memory, whichever MR reaches it. */
  {
    enum { kRegion = 5 * 4096 + 700, kMrs = 12, kSteps = 100 };
    uint8_t* heap = malloc(kRegion + 123);
    uint8_t* r = heap + 123; /* not page aligned */
    uint8_t* shadow = malloc(kRegion);
    struct ibv_mr* mrs[kMrs] = {0};
    size_t mr_off[kMrs] = {0}, mr_len[kMrs] = {0};
    int regs = 0, deregs = 0, writes = 0, reads = 0, bad_reg = 0, bad_write = 0, bad_read = 0, bad_bytes = 0;
    srand(7);
    for (int i = 0; i < kRegion; ++i) r[i] = shadow[i] = (uint8_t)(i * 13 + 1);
    for (int step = 0; heap && shadow && step < kSteps; ++step) {
      int k = rand() % kMrs;
      if (mrs[k] && rand() % 3 == 0) {
        bad_reg += ibv_dereg_mr(mrs[k]) != 0;
        mrs[k] = NULL;
        ++deregs;
      } else if (!mrs[k]) {
        mr_off[k] = (size_t)(rand() % (kRegion - 1));
        mr_len[k] = 1 + (size_t)(rand() % (kRegion - mr_off[k] < 12000 ? kRegion - mr_off[k] : 12000));
        mrs[k] = ibv_reg_mr(pd, r + mr_off[k], mr_len[k], access);
        bad_reg += mrs[k] == NULL;
        ++regs;
      }
      /* A WRITE from `a` into part of a live MR, through its rkey. */
      int w = -1;
      for (int t = 0; t < kMrs && w < 0; ++t)
        if (mrs[(k + t) % kMrs]) w = (k + t) % kMrs;
      if (w < 0) continue;
      size_t off = mr_off[w] + (size_t)(rand() % mr_len[w]);
      size_t len = 1 + (size_t)(rand() % (mr_off[w] + mr_len[w] - off));
      for (size_t i = 0; i < len; ++i) a[i] = (uint8_t)(step * 7 + i * 3);
      if (post_send(qa, IBV_WR_RDMA_WRITE, a, (uint32_t)len, ma->lkey, (uintptr_t)(r + off), mrs[w]->rkey)) {
        memcpy(shadow + off, a, len);
        ++writes;
      } else {
        ++bad_write;
      }
      /* A store by the application itself, anywhere in the object. */
      size_t so = (size_t)(rand() % kRegion), sl = 1 + (size_t)(rand() % (kRegion - so < 3000 ? kRegion - so : 3000));
      memset(r + so, step, sl);
      memset(shadow + so, step, sl);
      for (int i = 0; i < kRegion; ++i) bad_bytes += r[i] != shadow[i];
      /* A READ of another live MR's whole range, through its rkey. */
      int q = -1;
      for (int t = 1; t <= kMrs && q < 0; ++t)
        if (mrs[(w + t) % kMrs]) q = (w + t) % kMrs;
      memset(b, 0xEE, mr_len[q]);
      if (post_send(qa, IBV_WR_RDMA_READ, b, (uint32_t)mr_len[q], mb->lkey, (uintptr_t)(r + mr_off[q]), mrs[q]->rkey) &&
          memcmp(b, shadow + mr_off[q], mr_len[q]) == 0)
        ++reads;
      else
        ++bad_read;
    }
    for (int k = 0; k < kMrs; ++k)
      if (mrs[k]) bad_reg += ibv_dereg_mr(mrs[k]) != 0;
    printf("overlapping MRs: %d registered, %d deregistered, %d WRITEs, %d READs\n", regs, deregs, writes, reads);
    check(heap && shadow && bad_reg == 0 && regs >= 20 && deregs >= 5, "overlapping MRs registered and deregistered in a random order");
    check(bad_write == 0 && writes >= 60 && bad_bytes == 0,
          "WRITEs through each and stores by the application: every byte of the object as its shadow");
    check(bad_read == 0 && reads >= 60, "READs through each: every byte as the shadow");
    free(heap);
    free(shadow);
  }

  /* UD: a datagram from one QP to another on this device, through an AH. */
  struct ibv_qp* ua = make_qp(pd, cq_a, IBV_QPT_UD);
  struct ibv_qp* ub = make_qp(pd, cq_b, IBV_QPT_UD);
  check(ua && ub && to_rts(ua, 0, &gid, 1) && to_rts(ub, 0, &gid, 1), "two UD QPs to RTS");
  if (failed) goto out;
  struct ibv_ah_attr aa;
  memset(&aa, 0, sizeof aa);
  aa.is_global = 1;
  aa.grh.dgid = gid;
  aa.grh.hop_limit = 64;
  aa.port_num = 1;
  struct ibv_ah* ah = ibv_create_ah(pd, &aa);
  check(ah != NULL, "an address handle to the port's own GID");
  if (!ah) goto out;
  memset(b, 0, 2048);
  check(post_recv(ub, b, 40 + 512, mb->lkey), "UD receive posted (40-byte GRH area, then 512)");
  struct ibv_sge s = {(uintptr_t)a, 512, ma->lkey};
  struct ibv_send_wr w, *bad;
  memset(&w, 0, sizeof w);
  w.wr_id = 55;
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = &s;
  w.num_sge = 1;
  w.wr.ud.ah = ah;
  w.wr.ud.remote_qpn = ub->qp_num;
  w.wr.ud.remote_qkey = kQkey;
  int sent = 0, recvd = 0;
  struct ibv_wc rwc;
  memset(&rwc, 0, sizeof rwc);
  if (ibv_post_send(ua, &w, &bad) == 0) {
    sent = wait_wc(cq_a, &wc) && wc.wr_id == 55 && wc.status == IBV_WC_SUCCESS;
    if (wait_wc(cq_b, &wc) && wc.wr_id == 77 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 40 + 512 &&
        (wc.wc_flags & IBV_WC_GRH) && wc.src_qp == ua->qp_num && memcmp(b + 40, a, 512) == 0) {
      recvd = 1;
      rwc = wc;
    }
  }
  check(sent && recvd, "UD datagram sent and received: source QP, GRH flag, every byte");
  struct ibv_ah_attr from;
  check(ibv_init_ah_from_wc(ctx, 1, &rwc, (struct ibv_grh*)b, &from) == 0 && from.is_global &&
            memcmp(from.grh.dgid.raw, gid.raw, 16) == 0,
        "ibv_init_ah_from_wc: the sender's GID from the GRH area");
  check(ibv_destroy_ah(ah) == 0, "AH destroyed");

  /* Memory windows: type 1 bound with ibv_bind_mw, type 2 with a BIND_MW
   * work request, both reached through their R_Keys by a WRITE or READ of
   * the other QP; a type 2 window invalidated by the peer's SEND_WITH_INV;
   * the MR under a bound window is EBUSY to deregister. Fresh QPs: the
   * refused accesses put theirs in ERR. */
  {
    struct ibv_device_attr da;
    check(ibv_query_device(ctx, &da) == 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
              (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) && da.max_mw > 0,
          "query_device: memory windows, type 2B, max_mw");
    uint8_t* c = aligned_alloc(4096, 16384);
    memset(c, 0, 16384);
    struct ibv_mr* mc = ibv_reg_mr(pd, c, 16384, access | IBV_ACCESS_MW_BIND);
    struct ibv_qp* pa = make_qp(pd, cq_a, IBV_QPT_RC);
    struct ibv_qp* pb = make_qp(pd, cq_b, IBV_QPT_RC);
    struct ibv_mw* w1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
    struct ibv_mw* w2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    check(mc && pa && pb && w1 && w2 && w1->type == IBV_MW_TYPE_1 && w2->type == IBV_MW_TYPE_2 &&
              to_rts(pa, pb->qp_num, &gid, 0) && to_rts(pb, pa->qp_num, &gid, 0),
          "an MR with MW_BIND access, two windows, two fresh RC QPs");
    if (failed) goto out;
    const uint32_t k1_before = w1->rkey;
    struct ibv_mw_bind mwb;
    memset(&mwb, 0, sizeof mwb);
    mwb.wr_id = 5001;
    mwb.send_flags = IBV_SEND_SIGNALED;
    mwb.bind_info.mr = mc;
    mwb.bind_info.addr = (uintptr_t)c + 4096;
    mwb.bind_info.length = 4096;
    mwb.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    check(ibv_bind_mw(pb, w1, &mwb) == 0 && wait_wc(cq_b, &wc) && wc.status == IBV_WC_SUCCESS &&
              wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 5001 && w1->rkey != k1_before,
          "type 1: ibv_bind_mw completes (IBV_WC_BIND_MW) and gives the window a new R_Key");
    for (int i = 0; i < 4096; ++i) a[i] = (uint8_t)(i * 3 + 11);
    check(post_send(pa, IBV_WR_RDMA_WRITE, a, 4096, ma->lkey, (uintptr_t)c + 4096, w1->rkey) &&
              memcmp(c + 4096, a, 4096) == 0,
          "a WRITE through the type 1 window's R_Key, every byte");
    memset(a + 8192, 0, 4096);
    check(post_send(pa, IBV_WR_RDMA_READ, a + 8192, 4096, ma->lkey, (uintptr_t)c + 4096, w1->rkey) &&
              memcmp(a + 8192, c + 4096, 4096) == 0,
          "a READ through it, every byte");
    check(ibv_dereg_mr(mc) == EBUSY, "the MR under a bound window: EBUSY to deregister");
    struct ibv_send_wr bw, *bad;
    memset(&bw, 0, sizeof bw);
    bw.wr_id = 5002;
    bw.opcode = IBV_WR_BIND_MW;
    bw.send_flags = IBV_SEND_SIGNALED;
    bw.bind_mw.mw = w2;
    bw.bind_mw.rkey = ibv_inc_rkey(w2->rkey);
    bw.bind_mw.bind_info.mr = mc;
    bw.bind_mw.bind_info.addr = (uintptr_t)c + 8192;
    bw.bind_mw.bind_info.length = 4096;
    bw.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    const uint32_t k2 = bw.bind_mw.rkey;
    check(ibv_post_send(pb, &bw, &bad) == 0 && wait_wc(cq_b, &wc) && wc.status == IBV_WC_SUCCESS &&
              wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 5002,
          "type 2: an IBV_WR_BIND_MW work request completes");
    for (int i = 0; i < 4096; ++i) a[i] = (uint8_t)(i * 7 + 5);
    check(post_send(pa, IBV_WR_RDMA_WRITE, a, 4096, ma->lkey, (uintptr_t)c + 8192, k2) && memcmp(c + 8192, a, 4096) == 0,
          "a WRITE through the type 2 window (bound through the peer QP), every byte");
    struct ibv_send_wr sw;
    struct ibv_sge ss = {(uintptr_t)a, 64, ma->lkey};
    memset(&sw, 0, sizeof sw);
    sw.wr_id = 5003;
    sw.opcode = IBV_WR_SEND_WITH_INV;
    sw.send_flags = IBV_SEND_SIGNALED;
    sw.sg_list = &ss;
    sw.num_sge = 1;
    sw.invalidate_rkey = k2;
    struct ibv_wc wa;
    check(post_recv(pb, b, 64, mb->lkey) && ibv_post_send(pa, &sw, &bad) == 0 && wait_wc(cq_b, &wc) &&
              wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == k2 &&
              wait_wc(cq_a, &wa) && wa.status == IBV_WC_SUCCESS,
          "SEND_WITH_INV of the type 2 window's R_Key: the receive says it was invalidated");
    memset(c + 8192, 0, 64);
    struct ibv_send_wr ww;
    memset(&ww, 0, sizeof ww);
    ww.wr_id = 5004;
    ww.opcode = IBV_WR_RDMA_WRITE;
    ww.send_flags = IBV_SEND_SIGNALED;
    ww.sg_list = &ss;
    ww.num_sge = 1;
    ww.wr.rdma.remote_addr = (uintptr_t)c + 8192;
    ww.wr.rdma.rkey = k2;
    check(ibv_post_send(pa, &ww, &bad) == 0 && wait_wc(cq_a, &wa) && wa.status == IBV_WC_REM_ACCESS_ERR &&
              c[8192] == 0,
          "a WRITE through the invalidated window: remote access error, nothing written");
    check(ibv_destroy_qp(pa) == 0 && ibv_destroy_qp(pb) == 0 && ibv_dealloc_mw(w1) == 0 && ibv_dealloc_mw(w2) == 0 &&
              ibv_dereg_mr(mc) == 0,
          "windows deallocated (the type 1 one while bound), then the MR deregistered");
    while (ibv_poll_cq(cq_a, 1, &wa) > 0 || ibv_poll_cq(cq_b, 1, &wa) > 0) {
    }  /* the destroyed QPs' flushes */
    free(c);
  }
  check(ibv_destroy_qp(ua) == 0 && ibv_destroy_qp(ub) == 0 && ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0,
        "QPs destroyed");
  check(ibv_destroy_cq(cq_a) == 0 && ibv_destroy_cq(cq_b) == 0 && ibv_dereg_mr(ma) == 0 && ibv_dereg_mr(mb) == 0 && ibv_dealloc_pd(pd) == 0 &&
            ibv_close_device(ctx) == 0,
        "CQ, MRs, PD and device closed");
out:
  if (list) ibv_free_device_list(list);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
