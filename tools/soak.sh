#!/bin/bash
# The soak: two uroced over memif at full rate with 1% loss and 1% reordering
# on each side, for SOAK_SECONDS (default 600), while applications are
# started and SIGKILLed every few seconds. Verifying traffic runs throughout
# (uroce-rping -V rounds: every byte checked). The daemons' RSS and open
# descriptors are sampled every 10 s; at the end the traffic stops and the
# counters are reconciled: every frame one daemon's port sent, the other's
# received; no session is left; RSS and descriptors are flat.
#   tools/soak.sh [BUILD_DIR] [OUT_DIR]      (root; SOAK_SECONDS=60 for the CI run)
set -u
build=$(realpath "${1:-build}")
out=$(mkdir -p "${2:-soak-out}" && realpath "${2:-soak-out}")
export UROCED=$build/control/uroced
. "$(dirname "$0")/../tests/integration/lib.sh"
. "$(dirname "$0")/../tests/integration/ready.sh"
need_root
PERF=$build/tools/perf/uroce-perf
RPING=$build/tools/perf/uroce-rping
APP=$build/tests/integration/app_pair
for t in "$UROCED" "$PERF" "$RPING" "$APP"; do [ -x "$t" ] || { echo "missing $t: build first"; exit 2; }; done
SECS=${SOAK_SECONDS:-600}
LOSS="drop=0.01,reorder=0.01,reorder_us=200"
start_daemon "" sa --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.89.0.1 --lcore 0 \
  --app-socket "$TMP/a.app" --ctl-socket "$TMP/a.ctl" --fault-rx "$LOSS"
A=$LAST_PID
# The memif client connects once: the server must be up first (its
# application socket comes after its port; memif's own socket is abstract).
wait_sockets "$TMP/a.app" || bad "daemon A is up (gave up after $PROBES looks)"
start_daemon "" sb --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.89.0.2 --lcore 1 \
  --app-socket "$TMP/b.app" --ctl-socket "$TMP/b.ctl" --fault-rx "$LOSS"
B=$LAST_PID
wait_sockets "$TMP/a.app" "$TMP/b.app" || bad "both application sockets are there (gave up after $PROBES looks)"
PORT=$((24000 + $$ % 1000 * 4))

# Samples: RSS (kB) and open descriptors of each daemon: before any
# application (the baseline), then every 10 s, then after they are all gone.
rm -f "$out/rounds.tsv"
printf 't_s\trss_a_kb\tfds_a\trss_b_kb\tfds_b\n' > "$out/samples.tsv"
t0=$(date +%s)
sample() {
  printf '%s\t%s\t%s\t%s\t%s\n' $(( $(date +%s) - t0 )) "$(awk '/VmRSS/ {print $2}' /proc/$A/status)" "$(ls /proc/$A/fd | wc -l)" \
    "$(awk '/VmRSS/ {print $2}' /proc/$B/status)" "$(ls /proc/$B/fd | wc -l)" >> "$out/samples.tsv"
}
sample

echo "== soak: $SECS s, $LOSS on both daemons' receive"
# Full rate: write_bw for the whole run.
timeout $((SECS + 60)) "$PERF" write_bw -d "$TMP/a.app" -p $PORT -D "$SECS" -s 4096 > "$TMP/bw.srv" 2>&1 & bws=$!
wait_listen "" "" $PORT || bad "the write_bw server listens (gave up after $PROBES looks)"
timeout $((SECS + 60)) "$PERF" write_bw -d "$TMP/b.app" -p $PORT -D "$SECS" -s 4096 127.0.0.1 > "$TMP/bw.cli" 2>&1 & bwc=$!
# Verifying traffic: rping rounds of 200 validated pings, one after another;
# each round's end (ms since the start) and length go to rounds.tsv.
(
  k=0; fails=0
  start_ms=$(( $(date +%s%N) / 1000000 ))
  end=$(( $(date +%s) + SECS ))
  while [ "$(date +%s)" -lt "$end" ]; do
    r0=$(( $(date +%s%N) / 1000000 ))
    p=$((7400 + k % 50)); k=$((k + 1))
    timeout 60 "$RPING" -s -C 200 -p $p -d "$TMP/a.app" > "$TMP/rps.out" 2>&1 & sp=$!
    wait_line "$TMP/rps.out" '^listening'
    timeout 60 "$RPING" -c -a 10.89.0.1 -p $p -C 200 -V -d "$TMP/b.app" > "$TMP/rpc.out" 2>&1 || fails=$((fails + 1))
    wait $sp || fails=$((fails + 1))
    grep -q '^200 pings, data validated' "$TMP/rpc.out" || fails=$((fails + 1))
    r1=$(( $(date +%s%N) / 1000000 ))
    printf '%s\t%s\n' $((r1 - start_ms)) $((r1 - r0)) >> "$out/rounds.tsv"
  done
  echo "$k $fails" > "$TMP/rping.result"
) & rp=$!
# Churn: an application that opens both daemons and runs the op matrix,
# SIGKILLed after 0.5-1.9 s, every 2-3.5 s.
(
  n=0
  end=$(( $(date +%s) + SECS ))
  while [ "$(date +%s)" -lt "$end" ]; do
    "$APP" ops "$TMP/a.app" "$TMP/b.app" > /dev/null 2>&1 & v=$!
    d=$((5 + RANDOM % 15)); sleep "$((d / 10)).$((d % 10))"  # 0.5-1.9 s
    kill -9 $v 2>/dev/null; wait $v 2>/dev/null
    n=$((n + 1))
    sleep 1.5
  done
  echo "$n" > "$TMP/churn.result"
) & ch=$!
sleep 5; sample  # the first sample under load
while kill -0 $bwc 2>/dev/null; do sleep 10; kill -0 $A 2>/dev/null && kill -0 $B 2>/dev/null || break; sample; done
wait $bwc; bwcrc=$?; wait $bws; bwsrc=$?
wait $rp; wait $ch
sleep 3  # every application gone, retries settled
sample
ctl "$TMP/a.ctl" status > "$out/status_a.json"; ctl "$TMP/b.ctl" status > "$out/status_b.json"
for f in a b; do  # the biggest parts of each daemon's status, to see what grows
  /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("  status", sys.argv[2], len(json.dumps(d)), "bytes:", sorted(((len(json.dumps(v)), k) for k, v in d.items()), reverse=True)[:3])' \
    "$out/status_$f.json" $f
done
read -r rounds rfails < "$TMP/rping.result"
churned=$(cat "$TMP/churn.result")
column -t "$out/samples.tsv" | sed 's/^/  /'
rm -f "$out/summary.json"
/usr/bin/python3 - "$out/status_a.json" "$out/status_b.json" "$out/samples.tsv" "$out/summary.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rows = [l.split("\t") for l in open(sys.argv[3]).read().split("\n")[1:] if l]
base, load, last = rows[0], rows[1], rows[-1]
s = {
    "a_tx": a["ethdev"]["tx"], "b_rx": b["ethdev"]["rx"], "b_tx": b["ethdev"]["tx"], "a_rx": a["ethdev"]["rx"],
    "a_dropped_by_injector": a["fault_rx"]["dropped"], "b_dropped_by_injector": b["fault_rx"]["dropped"],
    "a_reordered": a["fault_rx"]["reordered"], "b_reordered": b["fault_rx"]["reordered"],
    "retransmitted": a["qp_totals"]["retransmitted_pkts"] + b["qp_totals"]["retransmitted_pkts"],
    "sessions_left": a["sessions"] + b["sessions"], "qps_left": a["pipeline"]["qps"] + b["pipeline"]["qps"],
    "rss_kb": [int(load[1]), int(last[1]), int(load[3]), int(last[3])],  # first sample under load, last
    "fds": [int(base[2]), int(last[2]), int(base[4]), int(last[4])],      # before any application, after all
}
json.dump(s, open(sys.argv[4], "w"), indent=1)
print("  " + json.dumps(s))
PY
sum=$(cat "$out/summary.json" 2>/dev/null)
check "the final status of both daemons was read and summarised" "[ -n '$sum' ]"
echo "  write_bw: $(grep -A1 '#bytes' "$TMP/bw.cli" | tail -1 | tr -s ' ')"
echo "  rping: $rounds rounds of 200 validated pings, $rfails failures; applications SIGKILLed: $churned"
check "both daemons alive after $SECS s" "kill -0 $A && kill -0 $B"
check "write_bw ran the whole time, both sides exit 0" "[ $bwcrc -eq 0 ] && [ $bwsrc -eq 0 ]"
check "every rping round validated its data ($rounds rounds)" "[ $rfails -eq 0 ] && [ $rounds -ge 1 ]"
# The rate of rounds, against controls from this run: the rounds must fill
# at least two thirds of the run at the typical (median) round's pace, so a
# loop that stalls for a third of the run fails; and the last third of the run must hold at least a quarter
# as many rounds as the first third, so a soak that slows as it goes fails.
read -r typical_ms floor first last <<< "$(/usr/bin/python3 - "$out/rounds.tsv" "$SECS" <<'PY'
import statistics, sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
secs = int(sys.argv[2])
med = statistics.median(d for _, d in rows) if rows else 0
floor = int(secs * 1000 * 2 / (3 * med)) if med else 1 << 30
third = secs * 1000 / 3
print(int(med), floor, sum(t <= third for t, _ in rows), sum(t > 2 * third for t, _ in rows))
PY
)"
echo "  rping rate: $rounds rounds in $SECS s; typical round ${typical_ms:-?} ms, so at least ${floor:-?} rounds; ${first:-?} in the first third, ${last:-?} in the last"
check "rping rounds kept their pace: at least two thirds of the run's worth at the typical round's length (${floor:-?})" \
  "[ $rounds -ge \${floor:-1073741824} ]"
check "rping rounds did not slow down: the last third of the run holds at least a quarter of the first third's (${last:-?} vs ${first:-?})" \
  "[ \$((4 * \${last:-0})) -ge \${first:-1} ] && [ \${first:-0} -gt 0 ]"
check "applications were killed mid-run ($churned)" "[ $churned -ge 3 ]"
check "frames reconcile: each daemon's port received every frame the other's sent" \
  "[ \$(jget '$sum' a_tx) -eq \$(jget '$sum' b_rx) ] && [ \$(jget '$sum' b_tx) -eq \$(jget '$sum' a_rx) ]"
check "loss and reordering were injected, and recovered by retransmission" \
  "[ \$(jget '$sum' a_dropped_by_injector) -gt 0 ] && [ \$(jget '$sum' b_reordered) -gt 0 ] && [ \$(jget '$sum' retransmitted) -gt 0 ]"
check "no session or QP left behind" "[ \$(jget '$sum' sessions_left) -eq 0 ] && [ \$(jget '$sum' qps_left) -eq 0 ]"
check "descriptors flat (as many after every application as before any, each daemon)" \
  "/usr/bin/python3 -c 'import json,sys; f=json.loads(sys.argv[1])[\"fds\"]; sys.exit(not (f[0]==f[1] and f[2]==f[3]))' '$sum'"
check "RSS flat (from the first sample under load to the last, grew under 16 MiB, each daemon)" \
  "/usr/bin/python3 -c 'import json,sys; r=json.loads(sys.argv[1])[\"rss_kb\"]; sys.exit(not all(b-a < 16384 for a,b in ((r[0],r[1]),(r[2],r[3]))))' '$sum'"
finish
