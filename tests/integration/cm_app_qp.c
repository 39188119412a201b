/* rdma_cm with the application's own QPs: plain C against rdma-core's stock
 * <rdma/rdma_cma.h>, linked with `pkg-config librdmacm libibverbs`. Neither
 * side gives rdma_cm a QP (no rdma_create_qp): each makes its QP with
 * ibv_create_qp, names it by rdma_conn_param's qp_num, and brings it up
 * itself through rdma_init_qp_attr and ibv_modify_qp, as many applications
 * and runtimes do. The active side gets RDMA_CM_EVENT_CONNECT_RESPONSE and
 * ends the handshake with rdma_establish; the passive side brings its QP to
 * RTS before rdma_accept. Then the client WRITEs 64 KiB (many packets) into
 * the buffer the server's private data names and SENDs a note; the server
 * checks every byte and answers with a SEND; the client disconnects.
 *
 *   cm_app_qp server PORT
 *   cm_app_qp client ADDRESS PORT
 * Prints what it checked and "OK"; exits 0 only when every check held. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kBuf = 1 << 16, kNote = 64 };

static int failed;
static void check(int ok, const char* what) {
  printf("%s: %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) failed = 1;
}
#define DIE(what)                                     \
  do {                                                \
    fprintf(stderr, "%s: %s\n", what, strerror(errno)); \
    exit(1);                                          \
  } while (0)

/* What the server's private data tells the client. */
struct target {
  uint64_t addr;
  uint32_t rkey;
  uint32_t len;
};

static struct rdma_event_channel* ch;

/* The next CM event, which must be `want`; its private data copied out. */
static void expect_event(enum rdma_cm_event_type want, struct rdma_cm_id** id, void* priv, size_t plen) {
  struct rdma_cm_event* e;
  if (rdma_get_cm_event(ch, &e)) DIE("rdma_get_cm_event");
  if (e->event != want) {
    fprintf(stderr, "wanted %s, got %s (status %d)\n", rdma_event_str(want), rdma_event_str(e->event), e->status);
    exit(1);
  }
  printf("event: %s\n", rdma_event_str(e->event));
  if (id) *id = e->id;
  if (priv && e->param.conn.private_data && e->param.conn.private_data_len >= plen)
    memcpy(priv, e->param.conn.private_data, plen);
  rdma_ack_cm_event(e);
}

/* One completion within 10 s. */
static void wait_wc(struct ibv_cq* cq, struct ibv_wc* wc) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    const int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) DIE("ibv_poll_cq");
    if (n == 1) break;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 10) {
      fprintf(stderr, "no completion in 10 s\n");
      exit(1);
    }
  }
  if (wc->status != IBV_WC_SUCCESS) {
    fprintf(stderr, "completion %s\n", ibv_wc_status_str(wc->status));
    exit(1);
  }
}

/* The application's own QP, as it would make one for any transport. */
static struct ibv_qp* make_qp(struct ibv_pd* pd, struct ibv_cq* cq) {
  struct ibv_qp_init_attr a = {0};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 8;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  struct ibv_qp* qp = ibv_create_qp(pd, &a);
  if (!qp) DIE("ibv_create_qp");
  return qp;
}

/* The application moves its QP to `state` with what rdma_cm says. */
static void move(struct rdma_cm_id* id, struct ibv_qp* qp, enum ibv_qp_state state) {
  struct ibv_qp_attr a;
  int mask = 0;
  memset(&a, 0, sizeof a);
  a.qp_state = state;
  if (rdma_init_qp_attr(id, &a, &mask)) DIE("rdma_init_qp_attr");
  if (state == IBV_QPS_INIT) a.qp_access_flags |= IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(qp, &a, mask)) DIE("ibv_modify_qp");
  struct ibv_qp_attr q;
  struct ibv_qp_init_attr qi;
  check(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == state,
        state == IBV_QPS_INIT ? "the QP is in INIT"
                              : state == IBV_QPS_RTR ? "the QP is in RTR" : "the QP is in RTS");
}

static void post_recv(struct ibv_qp* qp, struct ibv_mr* mr, void* buf) {
  struct ibv_sge s = {(uintptr_t)buf, kNote, mr->lkey};
  struct ibv_recv_wr w = {0}, *bad;
  w.wr_id = 1;
  w.sg_list = &s;
  w.num_sge = 1;
  if (ibv_post_recv(qp, &w, &bad)) DIE("ibv_post_recv");
}

static void post_send(struct ibv_qp* qp, enum ibv_wr_opcode op, struct ibv_mr* mr, void* buf, uint32_t len,
                      const struct target* t) {
  struct ibv_sge s = {(uintptr_t)buf, len, mr->lkey};
  struct ibv_send_wr w = {0}, *bad;
  w.wr_id = 2;
  w.opcode = op;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = &s;
  w.num_sge = 1;
  if (t) {
    w.wr.rdma.remote_addr = t->addr;
    w.wr.rdma.rkey = t->rkey;
  }
  if (ibv_post_send(qp, &w, &bad)) DIE("ibv_post_send");
}

static uint8_t pattern(size_t i) { return (uint8_t)(i * 131 + (i >> 9) + 7); }

static int server(const char* port) {
  struct rdma_cm_id *listen, *id;
  if (rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP)) DIE("rdma_create_id");
  /* A loopback address names no RDMA device: the kernel's rdma_cm binds it
   * to none (id->verbs stays NULL, as for the any address), and libfabric's
   * verbs provider counts on that to list the devices' own addresses for
   * its listener. */
  {
    struct rdma_cm_id* lo_id;
    struct sockaddr_in lo = {0};
    lo.sin_family = AF_INET;
    lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (rdma_create_id(ch, &lo_id, NULL, RDMA_PS_TCP)) DIE("rdma_create_id");
    const int lo_rc = rdma_bind_addr(lo_id, (struct sockaddr*)&lo);
    check(lo_rc == 0 && lo_id->verbs == NULL, "rdma_bind_addr(127.0.0.1) binds no device, as on the kernel");
    rdma_destroy_id(lo_id);
  }
  struct sockaddr_in sin = {0};
  sin.sin_family = AF_INET;
  sin.sin_port = htons((uint16_t)atoi(port));
  if (rdma_bind_addr(listen, (struct sockaddr*)&sin)) DIE("rdma_bind_addr");
  if (rdma_listen(listen, 1)) DIE("rdma_listen");
  printf("listening on %s\n", port);
  fflush(stdout);
  expect_event(RDMA_CM_EVENT_CONNECT_REQUEST, &id, NULL, 0);
  check(id->qp == NULL, "the request's id has no QP of rdma_cm's");
  struct ibv_pd* pd = ibv_alloc_pd(id->verbs);
  struct ibv_cq* cq = pd ? ibv_create_cq(id->verbs, 16, NULL, NULL, 0) : NULL;
  uint8_t* buf = calloc(1, kBuf + kNote);
  struct ibv_mr* mr = cq && buf ? ibv_reg_mr(pd, buf, kBuf + kNote, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
                                : NULL;
  if (!mr) DIE("pd, cq or mr");
  struct ibv_qp* qp = make_qp(pd, cq);
  /* Brought up before the accept, with the request's values. */
  move(id, qp, IBV_QPS_INIT);
  post_recv(qp, mr, buf + kBuf);
  move(id, qp, IBV_QPS_RTR);
  move(id, qp, IBV_QPS_RTS);
  struct target t = {(uintptr_t)buf, mr->rkey, kBuf};
  struct rdma_conn_param cp = {0};
  cp.private_data = &t;
  cp.private_data_len = sizeof t;
  cp.responder_resources = cp.initiator_depth = 1;
  cp.qp_num = qp->qp_num;
  if (rdma_accept(id, &cp)) DIE("rdma_accept");
  expect_event(RDMA_CM_EVENT_ESTABLISHED, NULL, NULL, 0);
  struct ibv_wc wc;
  wait_wc(cq, &wc);  /* the client's note, after its WRITE */
  check(wc.opcode == IBV_WC_RECV && wc.byte_len == 6 && memcmp(buf + kBuf, "wrote", 6) == 0, "the note arrived");
  size_t bad = 0;
  for (size_t i = 0; i < kBuf; ++i) bad += buf[i] != pattern(i);
  check(bad == 0, "every byte of the 64 KiB WRITE");
  memcpy(buf + kBuf, "checked", 8);
  post_send(qp, IBV_WR_SEND, mr, buf + kBuf, 8, NULL);
  wait_wc(cq, &wc);
  expect_event(RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
  ibv_destroy_qp(qp);
  rdma_destroy_id(id);
  rdma_destroy_id(listen);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  free(buf);
  return 0;
}

static int client(const char* host, const char* port) {
  struct rdma_cm_id* id;
  struct addrinfo* ai;
  if (getaddrinfo(host, port, NULL, &ai)) DIE("getaddrinfo");
  if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) DIE("rdma_create_id");
  if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000)) DIE("rdma_resolve_addr");
  freeaddrinfo(ai);
  expect_event(RDMA_CM_EVENT_ADDR_RESOLVED, NULL, NULL, 0);
  if (rdma_resolve_route(id, 2000)) DIE("rdma_resolve_route");
  expect_event(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, NULL, 0);
  struct ibv_pd* pd = ibv_alloc_pd(id->verbs);
  struct ibv_cq* cq = pd ? ibv_create_cq(id->verbs, 16, NULL, NULL, 0) : NULL;
  uint8_t* buf = malloc(kBuf + kNote);
  struct ibv_mr* mr = cq && buf ? ibv_reg_mr(pd, buf, kBuf + kNote, IBV_ACCESS_LOCAL_WRITE) : NULL;
  if (!mr) DIE("pd, cq or mr");
  for (size_t i = 0; i < kBuf; ++i) buf[i] = pattern(i);
  struct ibv_qp* qp = make_qp(pd, cq);
  move(id, qp, IBV_QPS_INIT);
  post_recv(qp, mr, buf + kBuf);
  struct rdma_conn_param cp = {0};
  cp.responder_resources = cp.initiator_depth = 1;
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;
  cp.qp_num = qp->qp_num;
  if (rdma_connect(id, &cp)) DIE("rdma_connect");
  struct target t = {0};
  expect_event(RDMA_CM_EVENT_CONNECT_RESPONSE, NULL, &t, sizeof t);
  check(t.len == kBuf && t.rkey != 0, "the server's buffer, from its private data");
  move(id, qp, IBV_QPS_RTR);
  move(id, qp, IBV_QPS_RTS);
  if (rdma_establish(id)) DIE("rdma_establish");
  post_send(qp, IBV_WR_RDMA_WRITE, mr, buf, kBuf, &t);
  struct ibv_wc wc;
  wait_wc(cq, &wc);
  check(wc.opcode == IBV_WC_RDMA_WRITE, "the WRITE completed");
  memcpy(buf + kBuf + 32, "wrote", 6);
  post_send(qp, IBV_WR_SEND, mr, buf + kBuf + 32, 6, NULL);
  int got_reply = 0, sent = 0;
  while (!got_reply || !sent) {
    wait_wc(cq, &wc);
    if (wc.opcode == IBV_WC_RECV)
      got_reply = wc.byte_len == 8 && memcmp(buf + kBuf, "checked", 8) == 0 ? 1 : -1;
    else
      sent = 1;
    if (got_reply < 0) break;
  }
  check(got_reply == 1, "the server checked every byte and said so");
  if (rdma_disconnect(id)) DIE("rdma_disconnect");
  expect_event(RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0);
  ibv_destroy_qp(qp);
  rdma_destroy_id(id);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  free(buf);
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 3 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0) ||
      (strcmp(argv[1], "client") == 0 && argc < 4)) {
    fprintf(stderr, "usage: cm_app_qp server PORT | cm_app_qp client ADDRESS PORT\n");
    return 2;
  }
  ch = rdma_create_event_channel();
  if (!ch) DIE("rdma_create_event_channel");
  if (strcmp(argv[1], "server") == 0) server(argv[2]);
  else client(argv[2], argv[3]);
  rdma_destroy_event_channel(ch);
  if (!failed) printf("OK\n");
  return failed;
}
