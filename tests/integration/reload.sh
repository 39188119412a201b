#!/bin/bash
# Live reconfiguration under traffic. Daemon A takes its options from a
# config file; while two connections carry verified traffic through it
# (uroce-pingpong -c: every message checked; uroce-rping -V: every round's
# SEND, READ and WRITE validated), the file is changed and A reloads:
#   1. by `uroce-ctl reload`: the congestion control of new QPs (dcqcn), the
#      session limits, the log format (JSON) and a metrics endpoint, all
#      applied; the endpoint serves;
#   2. by SIGHUP (what `systemctl reload` sends): TX fault injection on
#      (1% loss, which RC recovers from);
#   3. a change that cannot be live (the IP address, with the log level
#      beside it): refused, the option named, nothing applied;
#   4. by SIGHUP: faults off again.
# Both connections then finish with every byte verified on their first and
# only QPs, a QP made after the reload runs dcqcn while the old ones keep
# none, and A's status shows the new limits.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
PINGPONG=${UROCE_PINGPONG:?path to uroce-pingpong}
RPING=${UROCE_RPING:?path to uroce-rping}
PERF=${UROCE_PERF:?path to uroce-perf}
CTL=${UROCE_CTL:?path to uroce-ctl}

conf() {  # the daemon's whole configuration, then $@ appended (key = value lines)
  cat > "$TMP/a.conf.new" <<EOF
port = net_memif0
vdev = net_memif0,role=server,socket=$TMP/m.sock
ip = 10.95.0.1
lcore = 0
app-socket = $TMP/a.sock
ctl-socket = $TMP/a.ctl
EOF
  for kv in "$@"; do echo "$kv" >> "$TMP/a.conf.new"; done
  mv "$TMP/a.conf.new" "$TMP/a.conf"
}
conf
start_daemon "" da --config "$TMP/a.conf"
DA=$LAST_PID
wait_sockets "$TMP/a.sock" "$TMP/a.ctl"
start_daemon "" db --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock" --ip 10.95.0.2 --lcore 1 \
  --app-socket "$TMP/b.sock" --ctl-socket "$TMP/b.ctl"
check "both daemons are up" "wait_sockets '$TMP/a.sock' '$TMP/b.sock'"
status() { ctl "$TMP/a.ctl" status; }
# qps_of_a: A's QPs, "QPN:ALGORITHM" each.
qps_of_a() {
  status | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print(" ".join("%d:%s" % (q["qpn"], (q.get("cc") or {}).get("algorithm", "none")) for q in d["qp_list"]))'
}

echo "== traffic: uroce-pingpong -c and uroce-rping -V through A"
"$PINGPONG" -d "$TMP/a.sock" -p 7581 -s 4096 -n 40000 -c > "$TMP/pp-s.out" 2>&1 & pps=$!
"$RPING" -s -C 3000 -S 4096 -p 7582 -d "$TMP/a.sock" > "$TMP/rp-s.out" 2>&1 & rps=$!
probe 200 grep -q '^listening' "$TMP/rp-s.out" || true
"$PINGPONG" -d "$TMP/b.sock" -p 7581 -s 4096 -n 40000 -c 127.0.0.1 > "$TMP/pp-c.out" 2>&1 & ppc=$!
"$RPING" -c -a 10.95.0.1 -p 7582 -C 3000 -S 4096 -V -d "$TMP/b.sock" > "$TMP/rp-c.out" 2>&1 & rpc=$!
probe 400 eval '[ "$(status | /usr/bin/python3 -c "import json,sys; print(len(json.load(sys.stdin)[\"qp_list\"]))")" -ge 2 ]'
before=$(qps_of_a)
echo "  A's QPs before: $before"
check "both connections are up on A (two QPs, congestion control none)" "[ \$(echo '$before' | wc -w) -ge 2 ] && ! echo '$before' | grep -qv ':none'"

echo "== 1. uroce-ctl reload: cc, limits, log format, metrics"
MPORT=$((20000 + $$ % 20000))
conf "cc = dcqcn" "max-sessions = 77" "max-qps-per-uid = 99" "log-format = json" "metrics = 127.0.0.1:$MPORT"
"$CTL" --socket "$TMP/a.ctl" reload > "$TMP/r1.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/r1.out"
check "reload applied cc, limits, log and metrics" \
  "[ $rc -eq 0 ] && grep -q '\"ok\":true' '$TMP/r1.out' && grep -q '\"cc\"' '$TMP/r1.out' && grep -q '\"limits\"' '$TMP/r1.out' && grep -q '\"log\"' '$TMP/r1.out' && grep -q '\"metrics\"' '$TMP/r1.out'"
check "the new metrics endpoint serves /metrics" \
  "/usr/bin/python3 -c 'import urllib.request,sys; t=urllib.request.urlopen(\"http://127.0.0.1:$MPORT/metrics\", timeout=5).read().decode(); sys.exit(0 if \"uroce_\" in t else 1)'"
check "A's status has the new limits" \
  "status | /usr/bin/python3 -c 'import json,sys; l=json.load(sys.stdin)[\"limits\"]; sys.exit(0 if l[\"max_sessions\"] == 77 and l[\"max_qps_per_uid\"] == 99 else 1)'"
check "A logs in JSON from the reload on" "probe 100 eval 'tail -n 3 \"$TMP/da.err\" \"$TMP/da.out\" 2>/dev/null | grep -q \"^{\"'"

echo "== 2. SIGHUP: TX faults on (1% loss)"
conf "cc = dcqcn" "max-sessions = 77" "max-qps-per-uid = 99" "log-format = json" "metrics = 127.0.0.1:$MPORT" "fault-tx = drop=0.01"
kill -HUP $DA
check "SIGHUP reloaded: A logged the fault change, and keeps running" \
  "probe 200 eval 'grep -h reloaded \"$TMP\"/da.* | grep -q fault' && kill -0 $DA"
sleep 1

echo "== 3. a change that cannot be live: refused, named, nothing applied"
sed -i 's/^ip = 10.95.0.1$/ip = 10.95.0.9/' "$TMP/a.conf"
echo "log-level = debug" >> "$TMP/a.conf"
"$CTL" --socket "$TMP/a.ctl" reload > "$TMP/r3.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/r3.out"
check "reload refused: it names ip, and uroce-ctl exits 1" \
  "[ $rc -eq 1 ] && grep -q '\"ok\":false' '$TMP/r3.out' && grep -q 'not_live' '$TMP/r3.out' && grep -q '\"ip\"' '$TMP/r3.out'"
check "nothing of it applied (the log level stayed: no debug lines)" "! grep -hq '\"level\":\"debug\"' '$TMP'/da.*"

echo "== 4. SIGHUP: faults off"
conf "cc = dcqcn" "max-sessions = 77" "max-qps-per-uid = 99" "log-format = json" "metrics = 127.0.0.1:$MPORT"
kill -HUP $DA
probe 200 eval '[ $(grep -h reloaded "$TMP"/da.* | wc -l) -ge 3 ]' || true

echo "== the traffic ends"
wait $ppc; c1=$?; wait $pps; s1=$?
wait $rpc; c2=$?; wait $rps; s2=$?
tail -n 1 "$TMP/pp-c.out" "$TMP/rp-c.out" | sed 's/^/  /'
check "uroce-pingpong: 40000 messages of 4096 bytes each way, every one checked, on its one QP" \
  "[ $c1 -eq 0 ] && [ $s1 -eq 0 ] && ! bad_data '$TMP/pp-c.out' '$TMP/pp-s.out'"
check "uroce-rping: 3000 rounds of SEND, READ and WRITE, data validated, on its one QP" \
  "[ $c2 -eq 0 ] && [ $s2 -eq 0 ] && grep -q '^3000 pings, data validated' '$TMP/rp-c.out'"
retx=$(status | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["qp_totals"]["retransmitted_pkts"])')
echo "  A retransmitted $retx packets (the 1% TX loss of step 2)"
check "the faults the SIGHUP turned on took effect (A retransmitted)" "[ ${retx:-0} -gt 0 ]"

echo "== a QP made after the reload takes the new default (dcqcn)"
# Long enough to be looked at (a short run can end between two looks):
# stopped once seen.
"$PERF" write_bw -d "$TMP/a.sock" -p 7583 -s 4096 -n 100000000 > "$TMP/bw-s.out" 2>&1 & bws=$!
probe 200 listening "" "" 7583 || true
"$PERF" write_bw -d "$TMP/b.sock" -p 7583 -s 4096 -n 100000000 127.0.0.1 > "$TMP/bw-c.out" 2>&1 &
bwc=$!
probe 400 eval 'qps_of_a | grep -q dcqcn'; got=$?
echo "  A's QPs: $(qps_of_a)"
check "the new QP runs dcqcn" "[ $got -eq 0 ]"
kill $bwc $bws 2> /dev/null; wait $bwc; wait $bws
check "daemon A is still up" "kill -0 $DA"
finish
