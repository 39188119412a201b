// Full-path figures through liburoce: application -> shared ring -> uroced ->
// wire -> uroced -> shared ring -> application.
//   app_bench SOCK_A SOCK_B [iterations]
// Prints the half round-trip of an 8-byte SEND ping-pong (min, median, p99)
// and the rate of 8-byte WRITEs with 64 in flight. Both applications run in
// this one thread, so the figures include no thread hand-off.
#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "stack/verbs/uroce_verbs.h"

namespace {

struct End {
  uroce_context* ctx;
  uroce_pd* pd;
  uroce_cq* cq;
  uroce_qp* qp;
  std::uint8_t* buf;
  uroce_mr* mr;
  ibv_gid gid;
};

bool open_end(End& e, const char* sock) {
  e.ctx = uroce_open_device(sock);
  if (!e.ctx) return false;
  e.pd = uroce_alloc_pd(e.ctx);
  e.buf = static_cast<std::uint8_t*>(uroce_alloc_buf(e.ctx, 1 << 20));
  e.mr = uroce_reg_mr(e.pd, e.buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  e.cq = uroce_create_cq(e.ctx, 1024, nullptr, nullptr, 0);
  uroce_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = e.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 256;
  ia.cap.max_recv_wr = 256;
  e.qp = uroce_create_qp(e.pd, &ia);
  uroce_query_gid(e.ctx, 1, 0, &e.gid);
  return e.qp != nullptr;
}

bool connect(End& me, const End& peer) {
  uroce_rc_conn c{};
  c.dest_qp_num = uroce_qp_num(peer.qp);
  c.dgid = peer.gid;
  c.access = IBV_ACCESS_REMOTE_WRITE;
  return uroce_connect_qp(me.qp, &c) == 0;
}

void post_recv(End& e) {
  ibv_sge s{reinterpret_cast<std::uint64_t>(e.buf) + 4096, 64, uroce_mr_lkey(e.mr)};
  ibv_recv_wr r{};
  r.sg_list = &s;
  r.num_sge = 1;
  uroce_post_recv(e.qp, &r, nullptr);
}

bool send8(End& e, bool signaled) {
  ibv_sge s{reinterpret_cast<std::uint64_t>(e.buf), 8, uroce_mr_lkey(e.mr)};
  ibv_send_wr w{};
  w.opcode = IBV_WR_SEND;
  w.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  w.sg_list = &s;
  w.num_sge = 1;
  return uroce_post_send(e.qp, &w, nullptr) == 0;
}

/// Polls until a receive completion arrives; send completions are drained.
bool wait_recv(End& e) {
  ibv_wc wc[8];
  for (long spins = 0; spins < 2'000'000'000L; ++spins) {
    const int n = uroce_poll_cq(e.cq, 8, wc);
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) return false;
      if (wc[i].opcode == IBV_WC_RECV) return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: app_bench SOCK_A SOCK_B [iterations]\n");
    return 2;
  }
  const int iters = argc > 3 ? std::atoi(argv[3]) : 20000;
  End a{}, b{};
  if (!open_end(a, argv[1]) || !open_end(b, argv[2]) || !connect(a, b) || !connect(b, a)) {
    std::fprintf(stderr, "app_bench: setup failed: %s\n", uroce_last_error());
    return 1;
  }
  // Ping-pong: A sends, B answers; half of the round trip.
  std::vector<double> half;
  half.reserve(static_cast<std::size_t>(iters));
  for (int i = 0; i < 64; ++i) {
    post_recv(a);
    post_recv(b);
  }
  for (int i = 0; i < iters + 1000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!send8(a, false) || !wait_recv(b)) return std::fprintf(stderr, "ping failed\n"), 1;
    post_recv(b);
    if (!send8(b, false) || !wait_recv(a)) return std::fprintf(stderr, "pong failed\n"), 1;
    post_recv(a);
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 1000) half.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);  // after warm-up
  }
  std::sort(half.begin(), half.end());
  const auto pct = [&](double p) { return half[static_cast<std::size_t>(p * (half.size() - 1))]; };
  std::printf("half-RTT, 8-byte SEND ping-pong, %d iterations: min %.2f us, median %.2f us, p99 %.2f us\n", iters,
              half.front(), pct(0.5), pct(0.99));
  std::fflush(stdout);
  // Message rate: 8-byte WRITEs, 64 in flight, every 16th signaled.
  const int total = (iters * 10 + 15) / 16 * 16;  // a whole number of signaled groups
  int posted = 0, done = 0;
  ibv_sge s{reinterpret_cast<std::uint64_t>(a.buf), 8, uroce_mr_lkey(a.mr)};
  const auto t0 = std::chrono::steady_clock::now();
  ibv_wc wc[16];
  while (done < total) {
    while (posted < total && posted - done < 64) {
      ibv_send_wr w{};
      w.opcode = IBV_WR_RDMA_WRITE;
      w.send_flags = (posted % 16 == 15) ? IBV_SEND_SIGNALED : 0;
      w.sg_list = &s;
      w.num_sge = 1;
      w.wr.rdma.remote_addr = reinterpret_cast<std::uint64_t>(b.buf) + 8192;
      w.wr.rdma.rkey = uroce_mr_rkey(b.mr);
      if (uroce_post_send(a.qp, &w, nullptr) != 0) break;
      ++posted;
    }
    const int n = uroce_poll_cq(a.cq, 16, wc);
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) return std::fprintf(stderr, "write failed\n"), 1;
      done += 16;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("message rate, 8-byte WRITE, 64 in flight: %.0f msg/s (%d messages in %.3f s)\n", total / secs, total,
              secs);
  uroce_close_device(a.ctx);
  uroce_close_device(b.ctx);
  return 0;
}
