// Transport engine benchmarks on one core over an in-memory wire:
// message rate for 8-byte WRITE and SEND, goodput for 64 KiB WRITE at MTU 4096.
#include <benchmark/benchmark.h>

#include "tools/bench/loopback.h"

namespace {

using namespace uroce::bench;

// Keeps `depth` WRs in flight; counts completed messages.
void run_stream(benchmark::State& st, ibv_wr_opcode op, std::uint32_t len, ibv_mtu mtu, std::uint32_t depth) {
  Loopback lb(mtu, 2048, 8u << 20);
  Side& a = lb.side[0];
  Side& b = lb.side[1];
  Sge s{reinterpret_cast<std::uint64_t>(a.mem.data()), len, a.mr->lkey};
  Sge r{reinterpret_cast<std::uint64_t>(b.mem.data()), std::max<std::uint32_t>(len, 64), b.mr->lkey};
  SendWr wr;
  wr.opcode = op;
  wr.sg_list = {&s, 1};
  wr.remote_addr = reinterpret_cast<std::uint64_t>(b.mem.data());
  wr.rkey = b.mr->rkey;
  std::uint64_t inflight = 0, done = 0, posted = 0;
  ibv_wc wc[64];
  const bool send = op == IBV_WR_SEND;
  for (auto _ : st) {
    while (inflight < depth) {
      if (send) b.eng->post_recv(b.qp, RecvWr{posted, {&r, 1}});
      // Signal every 16th WR, as perftest does with its cq_mod.
      wr.wr_id = posted;
      wr.send_flags = (posted % 16 == 15) ? IBV_SEND_SIGNALED : 0;
      if (a.eng->post_send(a.qp, wr) != 0) break;
      ++posted;
      ++inflight;
    }
    lb.pump();
    int n = a.eng->poll_cq(a.cq, wc);
    for (int i = 0; i < n; ++i) {
      inflight -= 16;
      done += 16;
    }
    if (send)  // every receive completion, or B's CQ overflows and its QP goes to ERR
      while (b.eng->poll_cq(b.cq, wc) > 0) {
      }
  }
  st.counters["msgs"] = benchmark::Counter(static_cast<double>(done), benchmark::Counter::kIsRate);
  st.counters["goodput_Gbps"] =
      benchmark::Counter(static_cast<double>(done) * len * 8 / 1e9, benchmark::Counter::kIsRate);
}

// Half round trip of an 8-byte SEND ping-pong, engines only (no rings, no
// daemon, no wire driver): the baseline for the full-path figure.
void BM_PingPong8HalfRtt(benchmark::State& st) {
  Loopback lb(IBV_MTU_1024, 1024, 1u << 20);
  Side* s[2] = {&lb.side[0], &lb.side[1]};
  Sge sg[2], rg[2];
  for (int i = 0; i < 2; ++i) {
    sg[i] = Sge{reinterpret_cast<std::uint64_t>(s[i]->mem.data()), 8, s[i]->mr->lkey};
    rg[i] = Sge{reinterpret_cast<std::uint64_t>(s[i]->mem.data()) + 4096, 64, s[i]->mr->lkey};
    for (int k = 0; k < 512; ++k) s[i]->eng->post_recv(s[i]->qp, RecvWr{0, {&rg[i], 1}});
  }
  ibv_wc wc[8];
  auto one_way = [&](int from) {
    SendWr wr;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = {&sg[from], 1};
    s[from]->eng->post_send(s[from]->qp, wr);
    for (;;) {
      lb.pump();
      const int n = s[1 - from]->eng->poll_cq(s[1 - from]->cq, wc);
      bool got = false;
      for (int i = 0; i < n; ++i) got = got || wc[i].opcode == IBV_WC_RECV;
      if (got) break;
    }
    s[1 - from]->eng->post_recv(s[1 - from]->qp, RecvWr{0, {&rg[1 - from], 1}});
  };
  for (auto _ : st) {
    one_way(0);
    one_way(1);
  }
  // One iteration is one round trip: half of Time is the half-RTT.
}
BENCHMARK(BM_PingPong8HalfRtt)->MinTime(1.0);

void BM_Write8(benchmark::State& st) { run_stream(st, IBV_WR_RDMA_WRITE, 8, IBV_MTU_1024, 256); }
void BM_Send8(benchmark::State& st) { run_stream(st, IBV_WR_SEND, 8, IBV_MTU_1024, 256); }
void BM_Write64K(benchmark::State& st) { run_stream(st, IBV_WR_RDMA_WRITE, 65536, IBV_MTU_4096, 32); }
BENCHMARK(BM_Write8)->MinTime(1.0);
BENCHMARK(BM_Send8)->MinTime(1.0);
BENCHMARK(BM_Write64K)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
