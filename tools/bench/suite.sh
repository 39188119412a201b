#!/bin/bash
# The side-by-side benchmark suite, one command, one run on this machine:
#   - uroce (uroce-perf write_bw and send_lat, perftest's method) between two
#     uroced over net_memif, and over a veth pair with net_af_packet;
#   - kernel TCP on the same veth (tcp_bench ping-pong and stream, same sizes):
#     what a user without RDMA would use;
#   - dpdk-testpmd txonly -> rxonly on the same vdevs: the link's ceiling.
# Writes OUT/results.tsv, OUT/table.md (the table of ratios) and two PNG
# plots (latency and bandwidth against message size, gnuplot).
#   tools/bench/suite.sh [BUILD_DIR] [OUT_DIR]     (root; about 4 minutes)
set -u
build=$(realpath "${1:-build}")
out=$(mkdir -p "${2:-bench-out}" && realpath "${2:-bench-out}")
export UROCED=$build/control/uroced UROCE_PCAP=$build/tools/uroce-pcap
. "$(dirname "$0")/../../tests/integration/lib.sh"
need_root
. "$(dirname "$0")/bench_lib.sh"
PERF=$build/tools/perf/uroce-perf
TCPB=$build/tools/bench/tcp_bench
for t in "$UROCED" "$PERF" "$TCPB"; do [ -x "$t" ] || { echo "missing $t: build first"; exit 2; }; done
SIZES=${UROCE_BENCH_SIZES:-"64 256 1024 4096 16384 65536"}
LAT_ITERS=${UROCE_BENCH_LAT_ITERS:-500}
bw_iters() { if [ "$1" -le 4096 ]; then echo 20000; else echo 3000; fi; }
RES="$out/results.tsv"
printf 'stack\tlink\tmetric\tsize\tvalue\n' > "$RES"
rec() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$RES"; }
jf() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results'][0][sys.argv[2]])" "$1" "$2" 2>/dev/null; }
PORT=$((22000 + $$ % 1000 * 4))
started=$(date +%s)
make_link

# perf TEST SIZE ITERS SOCK_A SOCK_B EXTRA...: a uroce-perf pair; the client's JSON in $TMP/c.json
perf() {
  local test=$1 size=$2 iters=$3 a=$4 b=$5; shift 5
  PORT=$((PORT + 1))
  timeout 120 "$PERF" "$test" -d "$a" -p $PORT -s "$size" -n "$iters" --json --yield "$@" > "$TMP/s.json" 2> "$TMP/s.err" &
  local sp=$!
  sleep 0.2
  timeout 120 "$PERF" "$test" -d "$b" -p $PORT -s "$size" -n "$iters" --json --yield "$@" 127.0.0.1 > "$TMP/c.json" 2> "$TMP/c.err"
  wait $sp
}

uroce_link() {  # LINK SOCK_A SOCK_B
  local link=$1 a=$2 b=$3 size g l
  for size in $SIZES; do
    perf write_bw "$size" "$(bw_iters "$size")" "$a" "$b" -m 4096
    g=$(jf "$TMP/c.json" bw_average)  # MiB/s
    g=$(echo "${g:-0} * 1048576 * 8 / 1000000000" | bc -l)
    perf send_lat "$size" "$LAT_ITERS" "$a" "$b" -m 4096
    l=$(jf "$TMP/c.json" t_typical)
    rec uroce "$link" bw_gbps "$size" "$(printf %.4f "$g")"
    rec uroce "$link" lat_us "$size" "${l:-nan}"
    printf '  uroce %-5s %6s B: %8.3f Gb/s  %8s us half-RTT\n' "$link" "$size" "$g" "${l:-?}"
  done
}

stop_all() {
  for p in $PIDS; do kill "$p" 2>/dev/null; done
  for p in $PIDS; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
  PIDS=""
}

echo "== uroce over net_memif (two uroced, uroce-perf through liburoce)"
start_daemon "" sa --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.96.0.1 --lcore 0 \
  --app-socket "$TMP/ma.app"
sleep 1
start_daemon "" sb --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.96.0.2 --lcore 1 \
  --app-socket "$TMP/mb.app"
for i in $(seq 50); do [ -S "$TMP/ma.app" ] && [ -S "$TMP/mb.app" ] && break; sleep 0.1; done
uroce_link memif "$TMP/ma.app" "$TMP/mb.app"
stop_all

echo "== uroce over veth + net_af_packet (each uroced in its own namespace)"
start_daemon "$NS_A" va --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 --app-socket "$TMP/va.app"
start_daemon "$NS_B" vb --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 --app-socket "$TMP/vb.app"
for i in $(seq 50); do [ -S "$TMP/va.app" ] && [ -S "$TMP/vb.app" ] && break; sleep 0.1; done
uroce_link veth "$TMP/va.app" "$TMP/vb.app"
stop_all

echo "== kernel TCP on the same veth (tcp_bench: ping-pong and stream)"
ip netns exec "$NS_A" "$TCPB" server --port 18600 > /dev/null 2>&1 &
tcp_srv=$!
for size in $SIZES; do
  ip netns exec "$NS_B" "$TCPB" client 10.90.1.1 --port 18600 --mode pingpong --size "$size" --iters 2000 --json > "$TMP/t.json"
  l=$(/usr/bin/python3 -c "import json; print(json.load(open('$TMP/t.json'))['t_typical'])")
  ip netns exec "$NS_B" "$TCPB" client 10.90.1.1 --port 18600 --mode stream --size "$size" --iters "$(bw_iters "$size")0" --json > "$TMP/t.json"
  m=$(/usr/bin/python3 -c "import json; print(json.load(open('$TMP/t.json'))['MBps'])")
  g=$(echo "$m * 8 / 1000" | bc -l)
  rec tcp veth lat_us "$size" "$l"
  rec tcp veth bw_gbps "$size" "$(printf %.4f "$g")"
  printf '  tcp   veth  %6s B: %8.3f Gb/s  %8s us half-RTT\n' "$size" "$g" "$l"
done
kill $tcp_srv 2>/dev/null

echo "== dpdk-testpmd txonly -> rxonly on the same vdevs: the ceiling"
for link in memif veth; do
  for size in $SIZES; do
    # One RoCE packet carries up to 4096 bytes (MTU 4096) plus 58 bytes of
    # Ethernet/IPv4/UDP/BTH/ICRC: the ceiling is that frame's rate times the payload.
    pay=$(( size < 4096 ? size : 4096 ))
    pps=$(testpmd "$link" $((pay + 58)) 6)
    g=$(echo "${pps:-0} * $pay * 8 / 1000000000" | bc -l)
    rec testpmd "$link" bw_gbps "$size" "$(printf %.4f "$g")"
    printf '  testpmd %-5s %6s B (frame %5d): %9s pps = %8.3f Gb/s of payload\n' "$link" "$size" $((pay + 58)) "${pps:-?}" "$g"
  done
done

echo "== the table"
/usr/bin/python3 - "$RES" "$out/table.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
v = {(r["stack"], r["link"], r["metric"], int(r["size"])): float(r["value"]) for r in rows if r["value"] not in ("", "nan")}
sizes = sorted({k[3] for k in v})
def g(*k):
    return v.get(k)
def f(x, d=2):
    return "–" if x is None else ("%.*f" % (d, x))
def ratio(a, b):
    return "–" if a is None or b in (None, 0) else "%.2f" % (a / b)
out = []
out.append("### Bandwidth (Gb/s of payload; uroce: uroce-perf write_bw, MTU 4096)\n")
out.append("| size | uroce memif | testpmd memif | uroce / ceiling (memif) | uroce veth | testpmd veth | TCP veth | uroce / ceiling (veth) | uroce / TCP (veth) |")
out.append("|---|---|---|---|---|---|---|---|---|")
for s in sizes:
    um, tm = g("uroce", "memif", "bw_gbps", s), g("testpmd", "memif", "bw_gbps", s)
    uv, tv, tc = g("uroce", "veth", "bw_gbps", s), g("testpmd", "veth", "bw_gbps", s), g("tcp", "veth", "bw_gbps", s)
    out.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (s, f(um, 3), f(tm, 3), ratio(um, tm), f(uv, 3), f(tv, 3), f(tc, 3), ratio(uv, tv), ratio(uv, tc)))
out.append("\n### Latency (half round trip, typical, us; uroce: uroce-perf send_lat; TCP: ping-pong)\n")
out.append("| size | uroce memif | uroce veth | TCP veth | uroce veth / TCP |")
out.append("|---|---|---|---|---|")
for s in sizes:
    lm, lv, lt = g("uroce", "memif", "lat_us", s), g("uroce", "veth", "lat_us", s), g("tcp", "veth", "lat_us", s)
    out.append("| %d | %s | %s | %s | %s |" % (s, f(lm, 1), f(lv, 1), f(lt, 1), ratio(lv, lt)))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
# Series for the plots.
import os
d = os.path.dirname(sys.argv[2])
for metric in ("bw_gbps", "lat_us"):
    for (st, ln) in sorted({(k[0], k[1]) for k in v if k[2] == metric}):
        with open(os.path.join(d, "%s_%s_%s.dat" % (metric, st, ln)), "w") as fh:
            for s in sizes:
                if (st, ln, metric, s) in v:
                    fh.write("%d %s\n" % (s, v[(st, ln, metric, s)]))
PY

if command -v gnuplot > /dev/null; then
  cd "$out"
  series() {  # metric -> a gnuplot plot list
    local m=$1 f list=""
    for f in ${m}_*.dat; do
      [ -s "$f" ] || continue
      local t=${f#${m}_}; t=${t%.dat}; t=${t/_/ over }
      list="$list${list:+, }'$f' using 1:2 with linespoints title '$t'"
    done
    echo "$list"
  }
  gnuplot <<GP
set terminal pngcairo size 900,560 noenhanced
set logscale x 2
set grid
set key top left
set xlabel 'message size (bytes)'
set output 'latency.png'
set title 'Half round-trip latency (typical) vs message size'
set ylabel 'microseconds'
set logscale y
plot $(series lat_us)
set output 'bandwidth.png'
set title 'Bandwidth vs message size (payload)'
set ylabel 'Gb/s'
plot $(series bw_gbps)
GP
  cd - > /dev/null
  echo "plots: $out/latency.png $out/bandwidth.png"
else
  echo "gnuplot not installed (tools/setup.sh installs gnuplot-nox): no plots"
fi
echo "results: $RES; table: $out/table.md; took $(( $(date +%s) - started )) s"
