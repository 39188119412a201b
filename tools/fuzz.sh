#!/bin/bash
# Long fuzzing runs: each libFuzzer target of the ASan build (-Dfuzz=true,
# the code under test compiled with coverage), FUZZ_RUNS executions each
# (default 10 million), seeded from the project's fixtures and the shared
# real captures (read in place). Prints, per target, the executions, the
# rate, the coverage and the crashes; writes OUT/fuzz.tsv.
#   tools/fuzz.sh [ASAN_BUILD_DIR] [OUT_DIR]     (FUZZ_RUNS=N, FUZZ_TARGETS="parser cm options transport session",
#                                                 FUZZ_SECONDS=N to bound each target's time instead)
set -u
build=$(realpath "${1:-build-asan}")
out=$(mkdir -p "${2:-fuzz-out}" && realpath "${2:-fuzz-out}")
src=$(cd "$(dirname "$0")/.." && pwd)
runs=${FUZZ_RUNS:-10000000}
targets=${FUZZ_TARGETS:-"parser cm options transport session"}
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

for t in $targets; do
  bin=$build/tests/fuzz_$t
  [ -x "$bin" ] || { echo "missing $bin: build the ASan build with -Dfuzz=true"; exit 2; }
  corpus=$out/corpus-$t
  mkdir -p "$corpus" "$out/crashes-$t"
  seed "$t" "$corpus"
  echo "== $t: $runs runs ($(ls "$corpus" | wc -l) seeds)"
  t0=$(date +%s.%N)
  "$bin" -runs="$runs" "${limit[@]}" -max_len=9000 -print_final_stats=1 -artifact_prefix="$out/crashes-$t/" "$corpus" \
    > "$out/$t.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  secs=$(echo "$t1 - $t0" | bc -l)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$out/$t.log" | tail -1 | awk '{print $2}')
  ft=$(grep -oE 'ft: [0-9]+' "$out/$t.log" | tail -1 | awk '{print $2}')
  crashes=$(ls "$out/crashes-$t" | wc -l)
  [ $rc -ne 0 ] && [ "$crashes" -eq 0 ] && crashes="rc=$rc"
  rate=$(echo "${execs:-0} / $secs" | bc)
  printf '%s\t%s\t%.0f\t%s\t%s\t%s\t%s\n' "$t" "${execs:-?}" "$secs" "$rate" "${cov:-?}" "${ft:-?}" "$crashes" >> "$out/fuzz.tsv"
  echo "  $t: ${execs:-?} executions in $(printf %.0f "$secs") s ($rate/s), cov ${cov:-?}, ft ${ft:-?}, crashes $crashes"
done
column -t "$out/fuzz.tsv"
