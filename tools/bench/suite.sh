#!/bin/bash
# The side-by-side benchmark suite, one command, one run on this machine:
#   - uroce through the application path (uroce-perf -> liburoce -> rings ->
#     uroced -> link -> uroced -> uroce-perf): send_lat, write_lat and
#     write_bw, between two uroced over net_memif and over a veth pair with
#     net_af_packet, once per waiting mode (UROCE_BENCH_MODES):
#       wait  the defaults: daemons spin briefly, then block (doorbells,
#             poll tick); the tools spin briefly, then block on the channel
#       busy  daemons --busy-poll, tools --yield (busy-poll, yielding)
#     and the idle CPU of a daemon in the default mode;
#   - embedded mode (UROCE_BENCH_EMBEDDED=0 skips it): the same uroce-perf
#     tests with the node inside each uroce-perf process (no uroced), over
#     memif and over the veth pair;
#   - kernel TCP on the same veth (tcp_bench ping-pong and stream, same sizes):
#     what a user without RDMA would use;
#   - engine_bench (the engine alone, one core) and single-core memcpy;
#   - dpdk-testpmd txonly -> rxonly on the same vdevs: the link's ceiling.
# Writes OUT/results.tsv, OUT/table.md (the tables and the goal ratios) and
# two PNG plots (latency and bandwidth against message size, gnuplot).
#   tools/bench/suite.sh [BUILD_DIR] [OUT_DIR]     (root; about 5 minutes)
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
SIZES=${UROCE_BENCH_SIZES:-"64 4096 65536"}
MODES=${UROCE_BENCH_MODES:-"wait busy"}
LAT_ITERS=${UROCE_BENCH_LAT_ITERS:-1000}
# Iterations: busy mode (milliseconds a message) does few; the others run
# long enough to reach steady state (this VM's vCPUs wake slowly for the
# first thousand or so short sleeps: a 1,000-round run reads 5x its steady
# latency in embedded mode).
bw_iters() {  # SIZE MODE
  local k=1; [ "${2:-busy}" != busy ] && k=10
  if [ "$1" -le 4096 ]; then echo $((20000 * k)); else echo $((3000 * k)); fi
}
lat_iters() { if [ "${1:-busy}" = busy ]; then echo "$LAT_ITERS"; else echo $((LAT_ITERS * 20)); fi; }
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
  timeout 120 $NSA "$PERF" "$test" -d "$a" -p $PORT -s "$size" -n "$iters" --json "$@" > "$TMP/s.json" 2> "$TMP/s.err" &
  local sp=$!
  # An embedded server is listening once its memif socket or TCP port is up.
  for i in $(seq 60); do $NSA ss -ltn 2>/dev/null | grep -q ":$PORT " && break; sleep 0.05; done
  sleep 0.1
  timeout 120 $NSB "$PERF" "$test" -d "$b" -p $PORT -s "$size" -n "$iters" --json "$@" $PEER_IP > "$TMP/c.json" 2> "$TMP/c.err"
  wait $sp
}
NSA=""; NSB=""; PEER_IP=127.0.0.1  # embedded over veth: the client runs in B's namespace

app_flags() { [ "$1" = busy ] && echo "--yield"; }
daemon_flags() { [ "$1" = busy ] && echo "--busy-poll"; }

uroce_link() {  # LINK MODE SOCK_A SOCK_B
  local link=$1 mode=$2 a=$3 b=$4 size g m l w
  local af; af=$(app_flags "$mode")
  for size in $SIZES; do
    perf write_bw "$size" "$(bw_iters "$size" "$mode")" "$a" "$b" -m 4096 $af
    g=$(jf "$TMP/c.json" bw_average)  # MiB/s
    m=$(jf "$TMP/c.json" msg_rate_mpps)
    g=$(echo "${g:-0} * 1048576 * 8 / 1000000000" | bc -l)
    perf send_lat "$size" "$(lat_iters "$mode")" "$a" "$b" -m 4096 $af
    l=$(jf "$TMP/c.json" t_typical)
    perf write_lat "$size" "$(lat_iters "$mode")" "$a" "$b" -m 4096 $af
    w=$(jf "$TMP/c.json" t_typical)
    rec "uroce-$mode" "$link" bw_gbps "$size" "$(printf %.4f "$g")"
    rec "uroce-$mode" "$link" mrate_mpps "$size" "${m:-nan}"
    rec "uroce-$mode" "$link" lat_us "$size" "${l:-nan}"
    rec "uroce-$mode" "$link" wlat_us "$size" "${w:-nan}"
    printf '  uroce %-4s %-5s %6s B: %8.3f Gb/s %8s Mmsg/s  send_lat %8s us  write_lat %8s us\n' \
      "$mode" "$link" "$size" "$g" "${m:-?}" "${l:-?}" "${w:-?}"
  done
}

# Idle CPU of the last daemon started: its utime+stime over 10 s, in % of one core.
idle_cpu() {
  local pid=$1 a b hz
  hz=$(getconf CLK_TCK)
  sleep 1
  a=$(awk '{print $14+$15}' "/proc/$pid/stat")
  sleep 10
  b=$(awk '{print $14+$15}' "/proc/$pid/stat")
  echo "($b - $a) * 100 / ($hz * 10)" | bc -l
}

stop_all() {
  for p in $PIDS; do kill "$p" 2>/dev/null; done
  for p in $PIDS; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
  PIDS=""
}

for mode in $MODES; do
  df=$(daemon_flags "$mode")
  echo "== uroce over net_memif, mode $mode (two uroced, uroce-perf through liburoce)"
  start_daemon "" sa --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.96.0.1 --lcore 0 \
    --app-socket "$TMP/ma.app" $df
  sleep 1
  start_daemon "" sb --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.96.0.2 --lcore 1 \
    --app-socket "$TMP/mb.app" $df
  for i in $(seq 50); do [ -S "$TMP/ma.app" ] && [ -S "$TMP/mb.app" ] && break; sleep 0.1; done
  uroce_link memif "$mode" "$TMP/ma.app" "$TMP/mb.app"
  if [ "$mode" = wait ]; then
    c=$(idle_cpu "$LAST_PID")
    rec "uroce-$mode" memif idle_cpu_pct 0 "$(printf %.3f "$c")"
    printf '  uroce idle daemon: %.2f%% of a core\n' "$c"
  fi
  stop_all

  echo "== uroce over veth + net_af_packet, mode $mode (each uroced in its own namespace)"
  start_daemon "$NS_A" va --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 --app-socket "$TMP/va.app" $df
  start_daemon "$NS_B" vb --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 --app-socket "$TMP/vb.app" $df
  for i in $(seq 50); do [ -S "$TMP/va.app" ] && [ -S "$TMP/vb.app" ] && break; sleep 0.1; done
  uroce_link veth "$mode" "$TMP/va.app" "$TMP/vb.app"
  stop_all
done

if [ "${UROCE_BENCH_EMBEDDED:-1}" != 0 ]; then
  echo "== embedded mode over net_memif (the node inside each uroce-perf, no uroced)"
  EMB="--no-huge --mem-mb 256 --idle-spin-us 5"
  uroce_link memif embedded \
    "embedded:--port net_memif0 --vdev net_memif0,role=server,socket=$TMP/e.sock,bsize=8192 --ip 10.96.1.1 --lcore 0 --file-prefix ea-$$ $EMB" \
    "embedded:--port net_memif0 --vdev net_memif0,role=client,socket=$TMP/e.sock,bsize=8192 --ip 10.96.1.2 --lcore 1 --file-prefix eb-$$ $EMB"
  echo "== embedded mode over veth + net_af_packet (each uroce-perf in its own namespace)"
  # The TCP exchange crosses the veth too: the client dials A's kernel address.
  NSA="ip netns exec $NS_A"; NSB="ip netns exec $NS_B"; PEER_IP=10.90.1.1
  uroce_link veth embedded \
    "embedded:--port net_af_packet0 --vdev net_af_packet0,$AFP --ip 10.90.3.1 --lcore 0 --file-prefix ea-$$ $EMB" \
    "embedded:--port net_af_packet0 --vdev net_af_packet0,$AFP --ip 10.90.3.2 --lcore 1 --file-prefix eb-$$ $EMB"
  NSA=""; NSB=""; PEER_IP=127.0.0.1
fi

echo "== the engine alone (engine_bench) and single-core memcpy (wire_bench)"
if [ -x "$build/tools/bench/engine_bench" ]; then
  "$build/tools/bench/engine_bench" --benchmark_filter='BM_PingPong8HalfRtt|BM_Write8' --benchmark_format=json \
    > "$TMP/eb.json" 2> /dev/null
  "$build/tools/bench/wire_bench" --benchmark_filter='BM_Memcpy' --benchmark_format=json > "$TMP/wb.json" 2> /dev/null
  /usr/bin/python3 - "$TMP/eb.json" "$TMP/wb.json" "$RES" <<'PY'
import json, sys
eb = {b["name"].split("/")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
wb = {b["name"].split("/")[0]: b for b in json.load(open(sys.argv[2]))["benchmarks"]}
scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}
half = eb["BM_PingPong8HalfRtt"]["real_time"] * scale[eb["BM_PingPong8HalfRtt"]["time_unit"]] / 2
rate = eb["BM_Write8"]["msgs"] / 1e6
mc = wb["BM_Memcpy"]["bytes_per_second"] * 8 / 1e9
with open(sys.argv[3], "a") as f:
    f.write("engine\tmem\tlat_us\t8\t%.3f\nengine\tmem\tmrate_mpps\t8\t%.4f\nmemcpy\tcpu\tbw_gbps\t65536\t%.3f\n" % (half, rate, mc))
print("  engine: 8 B half-RTT %.2f us, 8 B WRITE %.2f M msg/s; memcpy 64 KiB: %.1f Gb/s" % (half, rate, mc))
PY
else
  echo "  (benchmarks not built: meson -Dbench=enabled)"
fi

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
sizes = sorted({k[3] for k in v if (k[0].startswith("uroce") or k[0] in ("tcp", "testpmd")) and k[2] != "idle_cpu_pct"})
def g(*k):
    return v.get(k)
def f(x, d=2):
    return "–" if x is None else ("%.*f" % (d, x))
def ratio(a, b):
    return "–" if a is None or b in (None, 0) else "%.2f" % (a / b)
out = []
modes = [m for m in ("wait", "busy", "embedded") if any(k[0] == "uroce-" + m for k in v)]
def col(m, ln):
    return "uroce-" + m, ln
out.append("### Half round trip, typical, us (uroce-perf send_lat / write_lat; TCP: ping-pong on the same veth)\n")
hdr = ["size"] + ["%s %s %s" % (t, m, ln) for t in ("send_lat", "write_lat") for m in modes for ln in ("memif", "veth")] + ["TCP veth"]
out.append("| " + " | ".join(hdr) + " |")
out.append("|" + "---|" * len(hdr))
for s in sizes:
    row = [str(s)]
    for metric in ("lat_us", "wlat_us"):
        for m in modes:
            for ln in ("memif", "veth"):
                row.append(f(g("uroce-" + m, ln, metric, s), 1))
    row.append(f(g("tcp", "veth", "lat_us", s), 1))
    out.append("| " + " | ".join(row) + " |")
out.append("\n### write_bw (Gb/s of payload, and M msg/s; MTU 4096)\n")
hdr = ["size"] + ["%s %s" % (m, ln) for m in modes for ln in ("memif", "veth")] + ["TCP veth", "testpmd memif", "testpmd veth"]
out.append("| " + " | ".join(hdr) + " |")
out.append("|" + "---|" * len(hdr))
for s in sizes:
    row = [str(s)]
    for m in modes:
        for ln in ("memif", "veth"):
            gb, mr = g("uroce-" + m, ln, "bw_gbps", s), g("uroce-" + m, ln, "mrate_mpps", s)
            row.append("%s (%s M/s)" % (f(gb, 3), f(mr, 3)))
    row += [f(g("tcp", "veth", "bw_gbps", s), 3), f(g("testpmd", "memif", "bw_gbps", s), 3), f(g("testpmd", "veth", "bw_gbps", s), 3)]
    out.append("| " + " | ".join(row) + " |")
out.append("\n### Goals (ratios within this run)\n")
out.append("| goal | measured | target |")
out.append("|---|---|---|")
s0 = sizes[0] if sizes else 64
tcp = g("tcp", "veth", "lat_us", s0)
for ln in ("memif", "veth"):
    out.append("| daemon, default waiting, %d B send_lat half-RTT / TCP's (%s) | %s (%s us vs %s us) | <= 1 |" % (
        s0, ln, ratio(g("uroce-wait", ln, "lat_us", s0), tcp), f(g("uroce-wait", ln, "lat_us", s0), 1), f(tcp, 1)))
for ln in ("memif", "veth"):
    out.append("| embedded, %d B send_lat half-RTT / TCP's (%s) | %s (%s us vs %s us) | <= 0.2 |" % (
        s0, ln, ratio(g("uroce-embedded", ln, "lat_us", s0), tcp), f(g("uroce-embedded", ln, "lat_us", s0), 1), f(tcp, 1)))
out.append("| embedded, %d B write_bw (memif) | %s M msg/s | >= 1 M msg/s |" % (
    s0, f(g("uroce-embedded", "memif", "mrate_mpps", s0), 3)))
out.append("| embedded %d B write_bw (memif) / engine_bench 8 B WRITE | %s (%s vs %s M msg/s) | >= 0.5 |" % (
    s0, ratio(g("uroce-embedded", "memif", "mrate_mpps", s0), g("engine", "mem", "mrate_mpps", 8)),
    f(g("uroce-embedded", "memif", "mrate_mpps", s0), 3), f(g("engine", "mem", "mrate_mpps", 8), 2)))
out.append("| daemon, default waiting, %d B write_bw (memif) / embedded's | %s (%s vs %s M msg/s) | >= 0.5 |" % (
    s0, ratio(g("uroce-wait", "memif", "mrate_mpps", s0), g("uroce-embedded", "memif", "mrate_mpps", s0)),
    f(g("uroce-wait", "memif", "mrate_mpps", s0), 3), f(g("uroce-embedded", "memif", "mrate_mpps", s0), 3)))
out.append("| daemon %d B write_bw (memif) / engine_bench 8 B WRITE | %s (%s vs %s M msg/s) | (report) |" % (
    s0, ratio(g("uroce-wait", "memif", "mrate_mpps", s0), g("engine", "mem", "mrate_mpps", 8)),
    f(g("uroce-wait", "memif", "mrate_mpps", s0), 3), f(g("engine", "mem", "mrate_mpps", 8), 2)))
out.append("| idle daemon, default waiting | %s %% of a core | < 1 %% |" % f(g("uroce-wait", "memif", "idle_cpu_pct", 0), 2))
big = max(sizes) if sizes else 65536
out.append("| %d B write_bw over memif / single-core memcpy | %s (%s vs %s Gb/s) | report |" % (
    big, ratio(g("uroce-wait", "memif", "bw_gbps", big), g("memcpy", "cpu", "bw_gbps", 65536)),
    f(g("uroce-wait", "memif", "bw_gbps", big), 2), f(g("memcpy", "cpu", "bw_gbps", 65536), 1)))
out.append("| engine alone, 8 B half-RTT | %s us | (reference) |" % f(g("engine", "mem", "lat_us", 8), 2))
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
