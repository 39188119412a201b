// Message rate against the number of connected QPs, engine only (one core,
// in-memory wire): scale_loop.h's workload, from 1 to 10,000 QPs. Shows
// what per-QP state costs as the working set grows. qp_scale_ipp counts
// the same workload's instructions (what of the fall is work, not memory).
#include <benchmark/benchmark.h>

#include "tools/bench/scale_loop.h"

namespace {

void BM_QpScaling(benchmark::State& st) {
  const auto nqp = static_cast<std::uint32_t>(st.range(0));
  uroce::bench::ScaleLoop loop(nqp);
  if (!loop.ok()) {
    st.SkipWithError("the engine refused a QP");
    return;
  }
  std::uint64_t done = 0;
  for (auto _ : st) done += loop.step();
  st.counters["msgs"] = benchmark::Counter(static_cast<double>(done), benchmark::Counter::kIsRate);
  st.counters["qps"] = nqp;
}
BENCHMARK(BM_QpScaling)->Arg(1)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000)->MinTime(1.0)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
