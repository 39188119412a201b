// Message rate against the number of connected QPs, engine only (one core,
// in-memory wire): 8-byte RDMA WRITEs spread round-robin over N QP pairs,
// with at most 1024 in flight in all. Shows what per-QP state costs as the
// working set grows from 1 to 10,000 QPs.
#include <benchmark/benchmark.h>

#include "tools/bench/loopback.h"

namespace {

using namespace uroce::bench;

void BM_QpScaling(benchmark::State& st) {
  const auto nqp = static_cast<std::uint32_t>(st.range(0));
  Loopback lb(IBV_MTU_1024, 64, 1u << 20, nqp + 16);
  std::vector<Qp*> qps{lb.side[0].qp};
  for (std::uint32_t i = 1; i < nqp; ++i) {
    auto [a, b] = lb.add_pair(64);
    if (!a) {
      st.SkipWithError("the engine refused a QP");
      return;
    }
    qps.push_back(a);
  }
  Side& s = lb.side[0];
  Side& r = lb.side[1];
  Sge sg{reinterpret_cast<std::uint64_t>(s.mem.data()), 8, s.mr->lkey};
  SendWr wr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = {&sg, 1};
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.remote_addr = reinterpret_cast<std::uint64_t>(r.mem.data());
  wr.rkey = r.mr->rkey;
  const std::uint32_t per_qp = std::max<std::uint32_t>(1, std::min<std::uint32_t>(16, 1024 / nqp));
  std::vector<std::uint32_t> inflight(nqp, 0);
  std::uint64_t done = 0, next = 0;
  ibv_wc wc[64];
  for (auto _ : st) {
    // Fill: visit QPs round-robin, up to per_qp outstanding each.
    for (std::uint32_t k = 0; k < 256; ++k) {
      const std::uint32_t q = static_cast<std::uint32_t>(next++ % nqp);
      if (inflight[q] >= per_qp) continue;
      wr.wr_id = q;
      if (s.eng->post_send(qps[q], wr) == 0) ++inflight[q];
    }
    lb.pump();
    int n;
    while ((n = s.eng->poll_cq(s.cq, wc)) > 0)
      for (int i = 0; i < n; ++i) {
        --inflight[wc[i].wr_id];
        ++done;
      }
  }
  st.counters["msgs"] = benchmark::Counter(static_cast<double>(done), benchmark::Counter::kIsRate);
  st.counters["qps"] = nqp;
}
BENCHMARK(BM_QpScaling)->Arg(1)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000)->MinTime(1.0)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
