#!/bin/bash
# The congestion-control and loss-recovery experiments of docs/research.md,
# on the simulated fabric with uroce's own engines as hosts: every table
# and plot there comes from this one command.
#
#   tools/sim/experiments.sh [BUILD_DIR] [OUT_DIR]
#
# BUILD_DIR: where uroce-sim was built (default: build). OUT_DIR: where the
# tables (results.md), the raw results (*.jsonl) and the PNG plots go
# (default: docs/research). Deterministic: the same seeds, the same numbers.
# About two minutes of CPU on one core.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
out=${2:-$here/docs/research}
sim=$build/tools/sim/uroce-sim
[ -x "$sim" ] || { echo "no $sim: build first (tools/setup.sh build)" >&2; exit 2; }
command -v gnuplot > /dev/null || { echo "gnuplot is needed for the plots (tools/setup.sh installs it)" >&2; exit 2; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py=/usr/bin/python3

echo "== incast: N = 2, 4, 8, 16, 64 x none, dcqcn, swift, on a tail-drop and a PFC fabric"
: > "$out/incast.jsonl"
for fabric in taildrop pfc; do
  flag=""; [ $fabric = pfc ] && flag=--pfc
  for n in 2 4 8 16 64; do
    for cc in none dcqcn swift; do
      "$sim" incast --senders $n --cc $cc --ms 20 --pmax 0.1 $flag >> "$out/incast.jsonl"
    done
  done
done

echo "== incast time series: N = 16 on the PFC fabric"
for cc in none dcqcn swift; do
  "$sim" incast --senders 16 --cc $cc --ms 20 --pmax 0.1 --pfc --series "$tmp/series-$cc.jsonl" > /dev/null
  # 200 us bins: each flow's goodput, and the switch queue.
  $py - "$tmp/series-$cc.jsonl" "$tmp/rates-$cc.tsv" "$tmp/queue-$cc.tsv" <<'PY'
import json, sys, collections
rates = collections.defaultdict(lambda: collections.defaultdict(list)); queue = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line); b = int(r["t_s"] * 1e6 // 200)
    if "queue_bytes" in r: queue[b].append(r["queue_bytes"])
    else: rates[b][r["flow"]].append(r["goodput_bps"])
with open(sys.argv[2], "w") as f:
    for b in sorted(rates):
        flows = rates[b]
        f.write("%.1f %s\n" % (b * 0.2, " ".join("%.3f" % (sum(flows[k]) / len(flows[k]) / 1e9) for k in sorted(flows))))
with open(sys.argv[3], "w") as f:
    for b in sorted(queue): f.write("%.1f %.1f\n" % (b * 0.2, sum(queue[b]) / len(queue[b]) / 1024))
PY
done

echo "== loss recovery: 0.1, 1 and 5% loss x 1, 10, 50 us links x go-back-N, selective repeat"
: > "$out/loss.jsonl"
for loss in 0.001 0.01 0.05; do
  for d in 1 10 50; do
    for sr in "" --sr; do "$sim" loss --loss $loss --delay-us $d --ms 20 --depth 16 $sr >> "$out/loss.jsonl"; done
  done
done

echo "== flow-size mix: web search at 50% load, 16 hosts"
: > "$out/mix.jsonl"
for fabric in taildrop pfc; do
  flag=""; [ $fabric = pfc ] && flag=--pfc
  for cc in none dcqcn swift; do
    "$sim" mix --hosts 16 --load 0.5 --cc $cc --ms 200 --pmax 0.1 $flag >> "$out/mix.jsonl"
  done
  "$sim" mix --hosts 16 --load 0.5 --cc dcqcn --ms 200 --pmax 0.1 --sr $flag >> "$out/mix.jsonl"
done

echo "== tables"
$py - "$out" > "$out/results.md" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(out + "/incast.jsonl")]
print("### Incast (20 ms simulated, 10 Gb/s links, 1 us each, 512 KiB per port, RED 5/200 KB, Pmax 10%)\n")
print("| fabric | N | cc | goodput Gb/s | Jain | mean queue KiB | max queue KiB | drops | retransmitted | timeouts | CPU s |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %s | %d | %s | %.2f | %.3f | %.0f | %.0f | %d | %d | %d | %.2f |" % ("PFC" if r["pfc"] else "tail drop", r["senders"], r["cc"],
          r["goodput_gbps"], r["jain"], r["mean_queue_kb"], r["max_queue_kb"], r["drops"], r["retransmitted_pkts"], r["timeouts"], r["cpu_s"]))
rows = [json.loads(l) for l in open(out + "/loss.jsonl")]
print("\n### Loss recovery (one flow of 64 KiB WRITEs, 16 outstanding, 20 ms simulated)\n")
print("| loss | link delay us | recovery | goodput Gb/s | retransmitted packets | timeouts | completion p50 us | p99 us |")
print("|---:|---:|---|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %g%% | %g | %s | %.2f | %d | %d | %.0f | %.0f |" % (r["loss"] * 100, r["delay_us"], r["recovery"], r["goodput_gbps"],
          r["retransmitted_pkts"], r["timeouts"], r["mct_p50_us"], r["mct_p99_us"]))
rows = [json.loads(l) for l in open(out + "/mix.jsonl")]
print("\n### Flow-size mix (web search, 16 hosts, 50% load, 200 ms simulated)\n")
print("| fabric | cc | recovery | flows | short (< 100 KB) | short p50 us | short p99 us | short slowdown p50 | p99 | all p99 us | drops | CPU s |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %s | %s | %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.0f | %d | %.2f |" % ("PFC" if r["pfc"] else "tail drop", r["cc"], r["recovery"],
          r["finished"], r["short_flows"], r["short_p50_us"], r["short_p99_us"], r["short_slowdown_p50"], r["short_slowdown_p99"],
          r["all_p99_us"], r["drops"], r["cpu_s"]))
PY
$py - "$out/incast.jsonl" "$tmp/jain.tsv" "$out/loss.jsonl" "$tmp/loss.tsv" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for n in (2, 4, 8, 16, 64):
        cols = []
        for fabric in (False, True):
            for cc in ("none", "dcqcn", "swift"):
                cols += [r["jain"] for r in rows if r["senders"] == n and r["cc"] == cc and r["pfc"] == fabric]
        f.write("%d %s\n" % (n, " ".join("%.3f" % x for x in cols)))
rows = [json.loads(l) for l in open(sys.argv[3])]
with open(sys.argv[4], "w") as f:
    for loss in (0.001, 0.01, 0.05):
        cols = []
        for d in (1, 10, 50):
            for rec in ("go-back-N", "selective-repeat"):
                cols += [r["goodput_gbps"] for r in rows if r["loss"] == loss and r["delay_us"] == d and r["recovery"] == rec]
        f.write("%g %s\n" % (loss * 100, " ".join("%.3f" % x for x in cols)))
PY
# The mix: the short flows' completion p50 and p99, per congestion control
# (and dcqcn with selective repeat), on each fabric.
$py - "$out/mix.jsonl" "$tmp/mix.tsv" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for cc, rec, label in (("none", "go-back-N", "none"), ("dcqcn", "go-back-N", "dcqcn"), ("swift", "go-back-N", "swift"),
                           ("dcqcn", "selective-repeat", "dcqcn, selective repeat")):
        cols = []
        for fabric in (False, True):
            for r in rows:
                if r["cc"] == cc and r["recovery"] == rec and r["pfc"] == fabric:
                    cols += [r["short_p50_us"], r["short_p99_us"]]
        f.write('"%s" %s\n' % (label, " ".join("%.1f" % x for x in cols)))
PY

echo "== plots"
for cc in none dcqcn swift; do
  gnuplot <<GP
set terminal pngcairo size 800,400 font ",10"
set output "$out/incast16-rates-$cc.png"
set title "16:1 incast, PFC fabric, $cc: each flow's goodput (200 us bins)"
set xlabel "time (ms)"; set ylabel "Gb/s"; set yrange [0:*]; set key off
plot for [i=2:17] "$tmp/rates-$cc.tsv" using 1:i with lines lw 1
GP
done
gnuplot <<GP
set terminal pngcairo size 800,400 font ",10"
set output "$out/incast16-queue.png"
set title "16:1 incast, PFC fabric: the switch queue toward the receiver (200 us bins)"
set xlabel "time (ms)"; set ylabel "KiB"; set yrange [0:*]
plot "$tmp/queue-none.tsv" using 1:2 with lines lw 2 title "none", \
     "$tmp/queue-dcqcn.tsv" using 1:2 with lines lw 2 title "dcqcn", \
     "$tmp/queue-swift.tsv" using 1:2 with lines lw 2 title "swift", \
     200 with lines dt 2 lc rgb "gray" title "Kmax"
set output "$out/incast-jain.png"
set title "Incast: Jain's fairness index of the flows' goodput (second half of 20 ms)"
set xlabel "senders"; set ylabel "Jain's index"; set logscale x 2; set yrange [0:1.05]; set key bottom left
plot "$tmp/jain.tsv" using 1:2 with linespoints title "none, tail drop", \
     "" using 1:3 with linespoints title "dcqcn, tail drop", \
     "" using 1:4 with linespoints title "swift, tail drop", \
     "" using 1:5 with linespoints dt 2 title "none, PFC", \
     "" using 1:6 with linespoints dt 2 title "dcqcn, PFC", \
     "" using 1:7 with linespoints dt 2 title "swift, PFC"
unset logscale x
set output "$out/loss-goodput.png"
set title "One flow under random loss: goodput, go-back-N against selective repeat"
set xlabel "loss (%)"; set ylabel "goodput (Gb/s)"; set logscale x; set yrange [0:10]; set key top right
plot "$tmp/loss.tsv" using 1:2 with linespoints title "go-back-N, 1 us", \
     "" using 1:3 with linespoints title "selective repeat, 1 us", \
     "" using 1:4 with linespoints title "go-back-N, 10 us", \
     "" using 1:5 with linespoints title "selective repeat, 10 us", \
     "" using 1:6 with linespoints title "go-back-N, 50 us", \
     "" using 1:7 with linespoints title "selective repeat, 50 us"
unset logscale x
set output "$out/mix-short-fct.png"
set title "Flow-size mix (web search, 16 hosts, 50% load): completion time of the short flows (< 100 KB)"
unset xlabel; set ylabel "completion time (us)"; set logscale y; set yrange [10:*]; set key top right
set style data histograms; set style histogram clustered gap 1; set style fill solid 0.8 border -1; set boxwidth 0.9
plot "$tmp/mix.tsv" using 2:xticlabels(1) title "p50, tail drop", \
     "" using 3 title "p99, tail drop", \
     "" using 4 title "p50, PFC", \
     "" using 5 title "p99, PFC"
GP
ls -la "$out"
