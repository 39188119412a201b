// qp_scale's workload for callgrind: N QP pairs, a fixed number of rounds
// after a warm-up that is the same whatever the rounds.
// tools/bench/ipp.sh runs it twice with different round counts and divides
// the difference in instructions by the difference in messages, so setup
// and warm-up cancel out.
//   qp_scale_ipp QPS ROUNDS
#include <cstdio>
#include <cstdlib>

#include "tools/bench/scale_loop.h"

int main(int argc, char** argv) {
  const auto nqp = static_cast<std::uint32_t>(argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1);
  const long rounds = argc > 2 ? std::atol(argv[2]) : 200;
  uroce::bench::ScaleLoop loop(nqp);
  if (nqp == 0 || !loop.ok()) return std::fprintf(stderr, "the engine refused a QP\n"), 1;
  std::uint64_t done = 0;
  // The same warm-up whatever the rounds: every QP has had two messages.
  for (std::uint32_t i = 0; i < 2 * (nqp / 256 + 1) + 16; ++i) loop.step();
  for (long i = 0; i < rounds; ++i) done += loop.step();
  std::printf("messages: %lu\n", static_cast<unsigned long>(done));
  return 0;
}
