// Wire benchmarks: parse + ICRC verify rate, and ICRC throughput against the
// raw library CRC-32 (zlib) on the same buffers.
#include <benchmark/benchmark.h>
#include <zlib.h>

#include <cstring>
#include <random>
#include <vector>

#include "stack/wire/builder.h"
#include "stack/wire/icrc.h"
#include "stack/wire/parser.h"

namespace {

using namespace uroce::wire;

std::vector<std::uint8_t> make_frame(std::size_t payload) {
  FrameSpec s;
  s.src = IpAddr::from_v4(10, 0, 0, 1);
  s.dst = IpAddr::from_v4(10, 0, 0, 2);
  s.opcode = op::kRcWriteOnly;
  s.ext.reth_len = static_cast<std::uint32_t>(payload);
  std::vector<std::uint8_t> pl(payload);
  std::mt19937 rng(1);
  for (auto& b : pl) b = static_cast<std::uint8_t>(rng());
  std::vector<std::uint8_t> f(frame_len(s, payload));
  if (build_frame(f, s, pl) != f.size()) std::abort();
  return f;
}

void BM_ParseVerify(benchmark::State& st) {
  const auto f = make_frame(static_cast<std::size_t>(st.range(0)));
  Packet pkt;
  for (auto _ : st) {
    auto r = parse_frame(f, ParseOptions{}, pkt);
    benchmark::DoNotOptimize(r);
    if (!r.ok()) st.SkipWithError("parse failed");
  }
  st.SetItemsProcessed(st.iterations());
  st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(f.size()));
}
BENCHMARK(BM_ParseVerify)->Arg(64)->Arg(4096);

void BM_ParseNoIcrc(benchmark::State& st) {
  const auto f = make_frame(static_cast<std::size_t>(st.range(0)));
  Packet pkt;
  ParseOptions o;
  o.verify_icrc = false;
  for (auto _ : st) benchmark::DoNotOptimize(parse_frame(f, o, pkt));
  st.SetItemsProcessed(st.iterations());
}
BENCHMARK(BM_ParseNoIcrc)->Arg(64)->Arg(4096);

// The ICRC over a frame's covered bytes (from the IP header to the ICRC)...
void BM_Icrc(benchmark::State& st) {
  const auto f = make_frame(static_cast<std::size_t>(st.range(0)));
  const ConstBytes l3(f.data() + 14, f.size() - 14 - 4);
  for (auto _ : st) benchmark::DoNotOptimize(icrc_compute(l3));
  st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(l3.size()));
}
BENCHMARK(BM_Icrc)->Arg(64)->Arg(1024)->Arg(4096);

// ...against the raw CRC-32 it is built on (ISA-L) and zlib's, the ICRC's
// before, over exactly the same bytes.
void BM_RawCrc32(benchmark::State& st) {
  const auto f = make_frame(static_cast<std::size_t>(st.range(0)));
  const ConstBytes l3(f.data() + 14, f.size() - 14 - 4);
  for (auto _ : st) benchmark::DoNotOptimize(crc32_raw(0, l3));
  st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(l3.size()));
}
BENCHMARK(BM_RawCrc32)->Arg(64)->Arg(1024)->Arg(4096);

void BM_ZlibCrc32(benchmark::State& st) {
  const auto f = make_frame(static_cast<std::size_t>(st.range(0)));
  const ConstBytes l3(f.data() + 14, f.size() - 14 - 4);
  for (auto _ : st) benchmark::DoNotOptimize(crc32_z(0, l3.data(), l3.size()));
  st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(l3.size()));
}
BENCHMARK(BM_ZlibCrc32)->Arg(64)->Arg(1024)->Arg(4096);

void BM_Build(benchmark::State& st) {
  FrameSpec s;
  s.opcode = op::kRcWriteOnly;
  std::vector<std::uint8_t> pl(static_cast<std::size_t>(st.range(0)), 7);
  std::vector<std::uint8_t> out(frame_len(s, pl.size()));
  for (auto _ : st) benchmark::DoNotOptimize(build_frame(out, s, pl));
  st.SetItemsProcessed(st.iterations());
}
BENCHMARK(BM_Build)->Arg(64)->Arg(4096);

// Single-core memcpy bandwidth, out of cache (64 MiB apart): the yardstick
// for a 64 KiB WRITE stream, whose payload crosses memory at least once.
void BM_Memcpy(benchmark::State& st) {
  const auto len = static_cast<std::size_t>(st.range(0));
  std::vector<std::uint8_t> src(64u << 20, 1), dst(64u << 20);
  std::size_t off = 0;
  for (auto _ : st) {
    std::memcpy(dst.data() + off, src.data() + off, len);
    benchmark::ClobberMemory();
    off = (off + len) % (src.size() - len);
  }
  st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(len));
}
BENCHMARK(BM_Memcpy)->Arg(65536);

}  // namespace

BENCHMARK_MAIN();
