#!/bin/bash
# The compat layer's cost: Debian's unmodified perftest (ib_write_lat,
# ib_send_lat, ib_write_bw) through uroce's libibverbs.so.1 (tools/uroce-run)
# against uroce-perf, uroce's own perftest, over liburoce directly; the same
# two uroced over net_memif, the same sizes, MTU, depth and busy polling
# (perftest's way), interleaved, REPS rounds each. Prints the medians and
# the ratio (stock / uroce-perf: latency above 1 and message rate below 1
# are the compat layer's overhead). A benchmark, never a pass/fail test.
#   tools/bench/compat.sh [BUILD_DIR]        (root; UROCE_COMPAT_REPS=5)
set -u
build=$(realpath "${1:-build}")
export UROCED=$build/control/uroced UROCE_PCAP=$build/tools/uroce-pcap
. "$(dirname "$0")/../../tests/integration/lib.sh"
need_root
unset LD_LIBRARY_PATH  # uroced's EAL needs the system's libibverbs
PERF=$build/tools/perf/uroce-perf
URUN=$(dirname "$0")/../uroce-run
IBV=$build/stack/ibverbs
for t in "$UROCED" "$PERF" "$IBV/libibverbs.so.1"; do [ -e "$t" ] || { echo "missing $t: build first"; exit 2; }; done
command -v ib_write_lat > /dev/null || { echo "perftest is not installed"; exit 2; }
REPS=${UROCE_COMPAT_REPS:-5}
LAT_N=${UROCE_COMPAT_LAT_ITERS:-5000}
BW_N=${UROCE_COMPAT_BW_ITERS:-50000}
PORT=$((23000 + $$ % 1000 * 4))

mkdir -p "$TMP/ra" "$TMP/rb"
start_daemon "" ca --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.97.0.1 --lcore 0 \
  --app-socket "$TMP/ra/uroce0.sock"
sleep 1
start_daemon "" cb --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.97.0.2 --lcore 1 \
  --app-socket "$TMP/rb/uroce0.sock"
for i in $(seq 50); do [ -S "$TMP/ra/uroce0.sock" ] && [ -S "$TMP/rb/uroce0.sock" ] && break; sleep 0.1; done

# pair STOCK|UROCE TEST ARGS...: server and client; the client's output in $TMP/c.out
pair() {
  local kind=$1 test=$2; shift 2
  PORT=$((PORT + 1))
  if [ "$kind" = stock ]; then
    timeout 120 "$URUN" --lib "$IBV" --run-dir "$TMP/ra" "ib_$test" -d uroce0 -x 0 -p $PORT "$@" > "$TMP/s.out" 2>&1 & local sp=$!
    sleep 0.7
    timeout 120 "$URUN" --lib "$IBV" --run-dir "$TMP/rb" "ib_$test" -d uroce0 -x 0 -p $PORT "$@" 127.0.0.1 > "$TMP/c.out" 2>&1
  else
    timeout 120 "$PERF" "$test" -d "$TMP/ra/uroce0.sock" -p $PORT --busy-poll "$@" > "$TMP/s.out" 2>&1 & local sp=$!
    sleep 0.7
    timeout 120 "$PERF" "$test" -d "$TMP/rb/uroce0.sock" -p $PORT --busy-poll "$@" 127.0.0.1 > "$TMP/c.out" 2>&1
  fi
  wait $sp
}
# The figure from a run's client output: t_typical (µs) for latency, MsgRate (Mpps) for bandwidth.
figure() {  # TEST
  case $1 in
    *_lat) awk '$1 ~ /^[0-9]+$/ && NF >= 5 {print $5; exit}' "$TMP/c.out" ;;
    *_bw) awk '$1 ~ /^[0-9]+$/ && NF >= 5 {print $5; exit}' "$TMP/c.out" ;;
  esac
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "?"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

declare -A V
for rep in $(seq "$REPS"); do
  for test in write_lat send_lat write_bw; do
    case $test in
      *_lat) args=(-s 64 -n "$LAT_N" -m 1024) ;;
      *) args=(-s 64 -n "$BW_N" -m 1024 -t 128) ;;
    esac
    for kind in stock uroce; do
      pair $kind $test "${args[@]}"
      f=$(figure $test)
      V[$kind.$test]="${V[$kind.$test]:-} ${f:-?}"
    done
  done
  echo "  round $rep: $(for k in "${!V[@]}"; do echo -n "$k:${V[$k]##* } "; done)"
done

printf '\n%-10s %-22s %-22s %s\n' test "perftest via compat" "uroce-perf" "ratio (stock/uroce)"
for test in write_lat send_lat write_bw; do
  s=$(echo ${V[stock.$test]} | tr ' ' '\n' | grep -v '?' | median)
  u=$(echo ${V[uroce.$test]} | tr ' ' '\n' | grep -v '?' | median)
  unit="us t_typical"; [ "${test#*_}" = bw ] && unit="Mpps"
  r=$(echo "scale=3; $s / $u" | bc -l 2>/dev/null)
  printf '%-10s %-22s %-22s %s\n' "$test" "$s $unit" "$u $unit" "${r:-?}"
done
echo "(64-byte messages, MTU 1024, busy polling, median of $REPS rounds; all rounds: ${V[*]})"
finish_ok=1
