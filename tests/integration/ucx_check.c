/* ucx_check: UCX's own tag API (UCP) between two processes, with every byte
 * of every message checked. ucx_perftest (ucx-utils 1.13) measures but
 * checks no data, so this is the data test for UCX on uroce
 * (tests/integration/ucx.sh). Plain C against Debian's libucx-dev.
 *
 *   ucx_check -p PORT [-n ROUNDS] [-H DIR] [-a IP]          the server
 *   ucx_check -p PORT [-n ROUNDS] [-H DIR] [-a IP] HOST     the client
 *
 * A TCP connection to HOST:PORT carries the rest of the setup and the
 * final tally. Without -a the two exchange worker addresses over it, and
 * UCX wires up its endpoints itself, which needs a second, connectionless
 * transport besides rc_verbs (UCX says "no auxiliary transport"
 * otherwise). With -a, the client-server way: the server listens with
 * UCX on IP:PORT+1 and the client connects there, through UCX's
 * connection manager (rdmacm, uroce's librdmacm), so UCX_TLS=rc_verbs
 * alone does. Then, ROUNDS times,
 * for each size from 1 byte to 4 MiB (eager and rendezvous protocols
 * both): the client sends a message, the server checks it and sends one
 * back, the client checks that. Every message has its own pattern (sender,
 * round, size, offset). Before each receive the buffer is filled with the
 * complement of the expected bytes, and 64 guard bytes past the message
 * with a known value: a byte not placed, placed twice or misplaced is a
 * wrong byte; the received length must be the size sent.
 *
 * With -H DIR, once all messages are checked and before its endpoint and
 * QPs go, it creates DIR/held.PID and waits for DIR/release.PID (at
 * most 120 s), so that the test can read the daemon's per-QP status while the
 * QPs that carried the traffic still exist.
 *
 * Prints "ucx_check server|client: N passed, M failed" (one message is one
 * check); exits 0 only when nothing failed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

enum { kGuard = 64 };
static const size_t kSizes[] = {1, 7, 64, 1000, 4096, 8193, 65536, 262145, 1 << 20, 4 << 20};
static const size_t kMax = 4 << 20;

static unsigned char pattern(int from, int round, size_t size, size_t i) {
  return (unsigned char)((size_t)from * 101 + (size_t)round * 7 + size * 13 + i * 5 + (i >> 8) * 3 + 1);
}

static int write_all(int fd, const void* p, size_t n) {
  for (const char* c = p; n > 0;) {
    const ssize_t k = write(fd, c, n);
    if (k <= 0) return -1;
    c += k, n -= (size_t)k;
  }
  return 0;
}

static int read_all(int fd, void* p, size_t n) {
  for (char* c = p; n > 0;) {
    const ssize_t k = read(fd, c, n);
    if (k <= 0) return -1;
    c += k, n -= (size_t)k;
  }
  return 0;
}

/* The TCP connection that carries the worker addresses and the final tally. */
static ucp_conn_request_h g_conn_request;
static void on_conn_request(ucp_conn_request_h req, void* arg) {
  (void)arg;
  g_conn_request = req;
}

static int tcp_connect(const char* host, int port) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  if (getaddrinfo(host, service, &hints, &ai) != 0) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    close(fd);
    freeaddrinfo(ai);
    return -1;
  }
  freeaddrinfo(ai);
  return fd;
}

static int tcp_accept(int port) {
  const int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(ls, (struct sockaddr*)&a, sizeof a) != 0 || listen(ls, 1) != 0)
    return -1;
  const int fd = accept(ls, NULL, NULL);
  close(ls);
  return fd;
}

/* Progresses the worker until REQ (from a *_nbx call) completes. */
static ucs_status_t wait_req(ucp_worker_h w, void* req) {
  if (req == NULL) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  ucs_status_t st;
  while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) ucp_worker_progress(w);
  ucp_request_free(req);
  return st;
}

static void hold(const char* dir) {
  char held[4096], release[4096];
  snprintf(held, sizeof held, "%s/held.%d", dir, (int)getpid());
  snprintf(release, sizeof release, "%s/release.%d", dir, (int)getpid());
  FILE* f = fopen(held, "w");
  if (f) fclose(f);
  const struct timespec tick = {0, 10 * 1000 * 1000};
  for (int i = 0; i < 12000 && access(release, F_OK) != 0; ++i) nanosleep(&tick, NULL);
}

int main(int argc, char** argv) {
  int port = 0, rounds = 3, opt;
  const char *hold_dir = NULL, *cm_ip = NULL;
  while ((opt = getopt(argc, argv, "p:n:H:a:")) != -1) {
    if (opt == 'p') port = atoi(optarg);
    else if (opt == 'n') rounds = atoi(optarg);
    else if (opt == 'H') hold_dir = optarg;
    else if (opt == 'a') cm_ip = optarg;
    else return 2;
  }
  const char* host = optind < argc ? argv[optind] : NULL;
  const int client = host != NULL;
  const char* me = client ? "client" : "server";
  if (port <= 0 || rounds <= 0) {
    fprintf(stderr, "usage: ucx_check -p PORT [-n ROUNDS] [-H DIR] [-a IP] [HOST]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);

  ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
  ucp_config_t* config = NULL;
  ucp_context_h ctx = NULL;
  ucp_worker_h w = NULL;
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_address_t* addr = NULL;
  size_t addr_len = 0;
  ucs_status_t st;
  if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK || (st = ucp_init(&params, config, &ctx)) != UCS_OK ||
      (st = ucp_worker_create(ctx, &wp, &w)) != UCS_OK || (st = ucp_worker_get_address(w, &addr, &addr_len)) != UCS_OK) {
    fprintf(stderr, "ucx_check %s: UCX setup: %s\n", me, ucs_status_string(st));
    return 1;
  }
  ucp_config_release(config);

  struct sockaddr_in cm_addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port + 1))};
  ucp_listener_h listener = NULL;
  if (cm_ip && inet_pton(AF_INET, cm_ip, &cm_addr.sin_addr) != 1) {
    fprintf(stderr, "ucx_check %s: -a %s is not an IPv4 address\n", me, cm_ip);
    return 2;
  }
  if (cm_ip && !client) {  /* listening before the TCP port is: the client's probe of that port finds both ready */
    ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                .sockaddr = {(const struct sockaddr*)&cm_addr, sizeof cm_addr},
                                .conn_handler = {on_conn_request, NULL}};
    if ((st = ucp_listener_create(w, &lp, &listener)) != UCS_OK) {
      fprintf(stderr, "ucx_check server: ucp_listener_create on %s:%d: %s\n", cm_ip, port + 1, ucs_status_string(st));
      return 1;
    }
  }
  const int fd = client ? tcp_connect(host, port) : tcp_accept(port);
  if (fd < 0) {
    fprintf(stderr, "ucx_check %s: TCP %s port %d: %s\n", me, client ? "connect to" : "accept on", port, strerror(errno));
    return 1;
  }
  uint64_t peer_len = 0, my_len = cm_ip ? 0 : addr_len;
  unsigned char* peer = NULL;
  if (write_all(fd, &my_len, sizeof my_len) || write_all(fd, addr, my_len) || read_all(fd, &peer_len, sizeof peer_len) ||
      peer_len > (1 << 20) || (!cm_ip && peer_len == 0) || !(peer = malloc(peer_len + 1)) || read_all(fd, peer, peer_len)) {
    fprintf(stderr, "ucx_check %s: address exchange failed\n", me);
    return 1;
  }
  ucp_worker_release_address(w, addr);
  ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = (const ucp_address_t*)peer};
  if (cm_ip && client) {
    ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep_params.sockaddr = (ucs_sock_addr_t){(const struct sockaddr*)&cm_addr, sizeof cm_addr};
  } else if (cm_ip) {
    /* the client's request comes once it has connected over TCP; bounded only by the test's timeout */
    while (g_conn_request == NULL) ucp_worker_progress(w);
    ep_params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    ep_params.conn_request = g_conn_request;
  }
  ucp_ep_h ep = NULL;
  if ((st = ucp_ep_create(w, &ep_params, &ep)) != UCS_OK) {
    fprintf(stderr, "ucx_check %s: ucp_ep_create: %s\n", me, ucs_status_string(st));
    return 1;
  }

  unsigned char* out = malloc(kMax);
  unsigned char* in = malloc(kMax + kGuard);
  if (!out || !in) return 1;
  const int self = client ? 1 : 0, other = client ? 0 : 1;
  int passed = 0, failed = 0;
  long long wrong_total = 0;
  for (int r = 0; r < rounds; ++r) {
    for (size_t s = 0; s < sizeof kSizes / sizeof kSizes[0]; ++s) {
      const size_t size = kSizes[s];
      const ucp_tag_t tag = ((ucp_tag_t)r << 8) | s;
      for (int step = 0; step < 2; ++step) {
        if ((step == 0) == client) {  /* the client sends first, the server answers */
          for (size_t i = 0; i < size; ++i) out[i] = pattern(self, r, size, i);
          ucp_request_param_t sp = {0};
          if ((st = wait_req(w, ucp_tag_send_nbx(ep, out, size, tag, &sp))) != UCS_OK) {
            ++failed;
            printf("ucx_check %s: round %d, send of %zu bytes: %s\n", me, r, size, ucs_status_string(st));
          }
          continue;
        }
        for (size_t i = 0; i < size; ++i) in[i] = (unsigned char)~pattern(other, r, size, i);
        memset(in + size, 0x5a, kGuard);
        ucp_tag_recv_info_t info = {0};
        /* Always a request, and the length from ucp_tag_recv_request_test:
         * a receive that completed at once (the message was already there)
         * left recv_info unset once in UCX 1.13 (length 0, bytes right). */
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                                  .recv_info.tag_info = &info};
        void* req = ucp_tag_recv_nbx(w, in, size + kGuard, tag, (ucp_tag_t)-1, &rp);
        if (req != NULL && !UCS_PTR_IS_ERR(req)) {
          while ((st = ucp_tag_recv_request_test(req, &info)) == UCS_INPROGRESS) ucp_worker_progress(w);
          ucp_request_free(req);
        } else {
          st = UCS_PTR_STATUS(req);
        }
        size_t wrong = 0;
        for (size_t i = 0; i < size; ++i) wrong += in[i] != pattern(other, r, size, i);
        for (size_t i = size; i < size + kGuard; ++i) wrong += in[i] != 0x5a;
        if (st != UCS_OK || info.length != size || wrong) {
          ++failed;
          wrong_total += (long long)wrong;
          printf("ucx_check %s: round %d, %zu bytes: status %s, length %zu, %zu wrong bytes\n", me, r, size,
                 ucs_status_string(st), info.length, wrong);
        } else {
          ++passed;
        }
      }
    }
  }
  /* The tally travels both ways over TCP: each side ends only after the other has checked everything. */
  int32_t mine[2] = {passed, failed}, theirs[2] = {0, 0};
  if (write_all(fd, mine, sizeof mine) || read_all(fd, theirs, sizeof theirs)) {
    ++failed;
    printf("ucx_check %s: the peer's tally did not arrive\n", me);
  }
  printf("ucx_check %s: %d messages received, %lld wrong bytes; the peer: %d passed, %d failed\n", me, passed + failed,
         wrong_total, theirs[0], theirs[1]);
  if (hold_dir) hold(hold_dir);
  ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = 0};
  if ((st = wait_req(w, ucp_ep_close_nbx(ep, &cp))) != UCS_OK) printf("ucx_check %s: endpoint close: %s\n", me, ucs_status_string(st));
  char done = 1;
  if (write_all(fd, &done, 1) || read_all(fd, &done, 1)) printf("ucx_check %s: the peer left before closing\n", me);
  close(fd);
  if (listener) ucp_listener_destroy(listener);
  ucp_worker_destroy(w);
  ucp_cleanup(ctx);
  printf("ucx_check %s: %d passed, %d failed\n", me, passed, failed);
  free(out);
  free(in);
  free(peer);
  return failed ? 1 : 0;
}
