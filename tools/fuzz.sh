#!/bin/bash
# Long fuzzing runs: each libFuzzer target of the ASan build (-Dfuzz=true,
# the code under test compiled with coverage), FUZZ_RUNS executions each
# (default 10 million), seeded from the project's fixtures and the shared
# real captures (read in place). Prints, per target, the executions, the
# rate, the coverage and the crashes; writes OUT/fuzz.tsv.
#   tools/fuzz.sh [ASAN_BUILD_DIR] [OUT_DIR]     (FUZZ_RUNS=N, FUZZ_TARGETS="parser cm options transport session",
#                                                 FUZZ_SECONDS=N to bound each target's time instead,
#                                                 FUZZ_JOBS=N processes per target, default one per core)
# With several jobs, each runs FUZZ_RUNS/N executions and all share one
# corpus directory (libFuzzer re-reads it, so each finds what the others
# found); the executions reported are their sum, the coverage the largest.
set -u
build=$(realpath "${1:-build-asan}")
out=$(mkdir -p "${2:-fuzz-out}" && realpath "${2:-fuzz-out}")
src=$(cd "$(dirname "$0")/.." && pwd)
runs=${FUZZ_RUNS:-10000000}
targets=${FUZZ_TARGETS:-"parser cm options transport session"}
jobs=${FUZZ_JOBS:-$(nproc)}
# No allocation stacks: ASan's stack depot fills with the option parser's
# unique stacks and its inserts came to cost 40% of the time (800 runs/s
# against 3,500). A crash input is kept and replays with full stacks.
export ASAN_OPTIONS=${ASAN_OPTIONS:-malloc_context_size=0}
limit=()
[ -n "${FUZZ_SECONDS:-}" ] && limit=(-max_total_time="$FUZZ_SECONDS")
captures=$src/../shared/captures
printf 'target\truns\tseconds\texecs_per_s\tcov\tft\tcrashes\n' > "$out/fuzz.tsv"

seed() {  # TARGET DIR: fill the corpus
  local t=$1 d=$2
  case $t in
    parser)
      mkdir -p "$d.frames"
      "$build/tests/conformance/gen_frames" --count 400 --v6-count 100 --seed 5 --out "$d.frames" --corpus "$d" > /dev/null ;;
    cm)
      # The CM MADs of the real captures: UD SENDs to QP1, the MAD after BTH+DETH, before the ICRC.
      /usr/bin/python3 - "$d" "$captures"/rxe-linlinw5/rdma_cm.pcap "$captures"/rxe-linlinw5/rping.pcap \
        "$captures"/rxe-montybeatnik/*.pcap <<'PY'
import os, sys
from scapy.all import rdpcap, UDP
out, n = sys.argv[1], 0
for f in sys.argv[2:]:
    try:
        pkts = rdpcap(f)
    except Exception:
        continue
    for p in pkts:
        if UDP in p and p[UDP].dport == 4791:
            b = bytes(p[UDP].payload)
            if len(b) >= 12 + 8 + 256 and int.from_bytes(b[5:8], "big") == 1:
                open(os.path.join(out, "mad%d" % n), "wb").write(b[20:20 + 256]); n += 1
print(n, "MADs")
PY
      ;;
    options|transport|session) cp "$src"/tests/fuzz/seeds/$t/* "$d/" ;;
  esac
}

# The longest input worth making, per target: a jumbo frame; a MAD with room
# to spare; a command line or config of a realistic size; what the transport
# harness reads (it ignores longer inputs); for the session harness, a
# session of a dozen or more requests (each 2 bytes and a body of up to
# 255: enough to reach a connected QP with its MRs and windows), since its
# cost grows with the requests an input makes (about 11 us each, a round
# trip through the server's socket). At 2048 two processes made about 800
# runs/s, too few for 10 M in a session, while coverage grew slowly as
# inputs lengthened (cov 3599 at 1336-byte inputs, 3684 at 2048).
max_len() { case $1 in parser) echo 9000 ;; cm) echo 1024 ;; options) echo 1024 ;; transport) echo 4096 ;; session) echo 1024 ;; *) echo 8192 ;; esac; }

for t in $targets; do
  bin=$build/tests/fuzz_$t
  [ -x "$bin" ] || { echo "missing $bin: build the ASan build with -Dfuzz=true"; exit 2; }
  corpus=$out/corpus-$t
  mkdir -p "$corpus" "$out/crashes-$t"
  seed "$t" "$corpus"
  echo "== $t: $runs runs in $jobs jobs ($(ls "$corpus" | wc -l) seeds)"
  t0=$(date +%s.%N)
  pids=()
  for j in $(seq 1 "$jobs"); do
    "$bin" -runs=$(( (runs + jobs - 1) / jobs )) "${limit[@]}" -reload=10 -max_len="$(max_len "$t")" -print_final_stats=1 \
      -artifact_prefix="$out/crashes-$t/" "$corpus" > "$out/$t.$j.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  t1=$(date +%s.%N)
  secs=$(echo "$t1 - $t0" | bc -l)
  execs=0 cov=0 ft=0
  for j in $(seq 1 "$jobs"); do
    e=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.$j.log" | tail -1)
    c=$(grep -oE 'cov: [0-9]+' "$out/$t.$j.log" | tail -1 | awk '{print $2}')
    f=$(grep -oE 'ft: [0-9]+' "$out/$t.$j.log" | tail -1 | awk '{print $2}')
    execs=$((execs + ${e:-0}))
    [ "${c:-0}" -gt "$cov" ] && cov=$c
    [ "${f:-0}" -gt "$ft" ] && ft=$f
  done
  crashes=$(ls "$out/crashes-$t" | wc -l)
  [ $rc -ne 0 ] && [ "$crashes" -eq 0 ] && crashes="rc=$rc"
  rate=$(echo "$execs / $secs" | bc)
  printf '%s\t%s\t%.0f\t%s\t%s\t%s\t%s\n' "$t" "$execs" "$secs" "$rate" "$cov" "$ft" "$crashes" >> "$out/fuzz.tsv"
  echo "  $t: $execs executions in $(printf %.0f "$secs") s ($rate/s, $jobs jobs), cov $cov, ft $ft, crashes $crashes"
done
column -t "$out/fuzz.tsv"
