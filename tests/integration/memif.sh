#!/bin/bash
# Two uroced over net_memif (shared memory, no kernel in the path): verified
# RC traffic clean; then with the daemons' own fault injection (drop, dup,
# reorder, corrupt) set at start on one side and changed at run time through
# the control socket on the other; and CE marks by one side's injector
# making CNPs that the other counts, and uroce-pcap finds on the wire; and
# those CNPs slowing the client's DCQCN (--cc dcqcn), whose rate, read by
# uroce-ctl telemetry, falls while the marks last and climbs back to line
# rate once the server's injector stops marking (changed live).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
SOCK=$TMP/memif.sock
run() {  # tag msgs size srv-extra -- cli-extra
  local tag=$1 msgs=$2 size=$3; shift 3
  local sx=() cx=() side=s
  for a in "$@"; do if [ "$a" = "--" ]; then side=c; elif [ $side = s ]; then sx+=("$a"); else cx+=("$a"); fi; done
  rm -f "$SOCK"
  start_traffic "" "srv-$tag" --port net_memif0 --vdev "net_memif0,role=server,socket=$SOCK" --ip 10.91.0.1 --lcore 0 \
    --role server --size "$size" --ctl-socket "$TMP/srv-$tag.ctl" "${sx[@]}"
  wait_listen "" "$LAST_PID" 18515 || bad "$tag: the server listens on TCP 18515 (gave up after $PROBES looks)"
  start_traffic "" "cli-$tag" --port net_memif0 --vdev "net_memif0,role=client,socket=$SOCK" --ip 10.91.0.2 --lcore 1 \
    --role client --peer 127.0.0.1 --messages "$msgs" --size "$size" --ctl-socket "$TMP/cli-$tag.ctl" "${cx[@]}"
}
wait_pair() {  # tag
  local cpid=$(echo $PIDS | awk '{print $NF}') spid=$(echo $PIDS | awk '{print $(NF-1)}')
  wait "$cpid"; local crc=$?; wait "$spid"; local src=$?
  echo "  client: $(cat "$TMP/cli-$1.out")"
  check "$1: client verified all traffic" "[ $crc -eq 0 ] && grep -q 'uroce-traffic: OK' '$TMP/cli-$1.out'"
  check "$1: server verified every SEND" "[ $src -eq 0 ] && grep -q ', 0 bad' '$TMP/srv-$1.out'"
}

echo "== memif, clean"
run clean 3000 4096
wait_pair clean

echo "== memif, faults injected by the daemons (server at start, changed at run time over its control socket)"
rm -f "$SOCK"
start_traffic "" srv-faulty --port net_memif0 --vdev "net_memif0,role=server,socket=$SOCK" --ip 10.91.0.1 --lcore 0 \
  --role server --size 4096 --ctl-socket "$TMP/srv-faulty.ctl" --timeout 10 --fault-rx drop=0.02,dup=0.02,reorder=0.03,corrupt=0.01
wait_listen "" "$LAST_PID" 18515 || bad "faulty: the server listens on TCP 18515 (gave up after $PROBES looks)"
reply=$(ctl "$TMP/srv-faulty.ctl" "fault tx drop=0.02,dup=0.01,rule=drop:0x11:5")
check "faulty: the control socket changes faults at run time" "echo '$reply' | grep -q '\"ok\": true'"
reply=$(ctl "$TMP/srv-faulty.ctl" "fault rx drop=2")
check "faulty: a bad fault spec gets a clear error, config unchanged" "echo '$reply' | grep -q 'bad value for fault key'"
st=$(ctl "$TMP/srv-faulty.ctl" status)
check "faulty: status shows the new TX config" "echo '$st' | grep -q '\"fault_tx\": {\"config\": \"drop=0.02,dup=0.01'"
check "faulty: status still shows the RX config" "echo '$st' | grep -q '\"fault_rx\": {\"config\": \"drop=0.02,dup=0.02,reorder=0.03'"
start_traffic "" cli-faulty --port net_memif0 --vdev "net_memif0,role=client,socket=$SOCK" --ip 10.91.0.2 --lcore 1 \
  --role client --peer 127.0.0.1 --messages 3000 --size 4096 --timeout 10
wait_pair faulty
srv_err=$(cat "$TMP/srv-faulty.err")
icrc=$(echo "$srv_err" | grep -o '"rx_icrc_err": *[0-9]*' | head -1 | sed 's/.*: *//')
fdrop=$(echo "$srv_err" | grep -o '"fault_rx": *{[^}]*' | grep -o '"dropped": *[0-9]*' | sed 's/.*: *//')
echo "  server: rx_icrc_err=$icrc fault_rx.dropped=$fdrop"
check "faulty: corrupted frames were caught by the ICRC and counted" "[ ${icrc:-0} -gt 0 ]"
check "faulty: the injector dropped frames" "[ ${fdrop:-0} -gt 0 ]"
check "faulty: the client retransmitted" "grep -q 'verified, [1-9][0-9]* retransmissions' '$TMP/cli-faulty.out'"

echo "== memif, ECN: the server's injector marks 20% of what it receives CE; it sends CNPs, the client counts them"
rm -f "$SOCK"
start_traffic "" srv-ecn --port net_memif0 --vdev "net_memif0,role=server,socket=$SOCK" --ip 10.91.0.1 --lcore 0 \
  --role server --size 4096 --timeout 10 --fault-rx ecn=0.2 --capture "$TMP/ecn.pcap"
wait_listen "" "$LAST_PID" 18515 || bad "ecn: the server listens on TCP 18515 (gave up after $PROBES looks)"
start_traffic "" cli-ecn --port net_memif0 --vdev "net_memif0,role=client,socket=$SOCK" --ip 10.91.0.2 --lcore 1 \
  --role client --peer 127.0.0.1 --messages 3000 --size 4096 --timeout 10
wait_pair ecn
qp_total() {  # FILE COUNTER: a QP counter's total in the final status a node prints
  grep -o '"qp_totals": *{[^}]*' "$1" | grep -o "\"$2\": *[0-9]*" | sed 's/.*: *//'
}
ce=$(qp_total "$TMP/srv-ecn.err" ce_marked)
sent=$(qp_total "$TMP/srv-ecn.err" cnp_sent)
rcvd=$(qp_total "$TMP/cli-ecn.err" cnp_received)
wire=$("$UROCE_PCAP" --json "$TMP/ecn.pcap" | /usr/bin/python3 -c '
import json, sys
print(sum(q.get("cnps", 0) for q in json.load(sys.stdin).get("qps", [])))')
echo "  server: ce_marked=$ce cnp_sent=$sent; client: cnp_received=$rcvd; CNPs in the capture: $wire"
check "ecn: CE marks counted, and CNPs sent at most one per 50 us (fewer than the marks)" \
  "[ ${ce:-0} -gt 100 ] && [ ${sent:-0} -gt 0 ] && [ ${sent:-0} -lt ${ce:-0} ]"
check "ecn: every CNP sent was received and counted by the client" "[ ${rcvd:-0} -eq ${sent:-0} ]"
check "ecn: uroce-pcap finds the CNPs on the wire" "[ ${wire:-0} -eq ${sent:-0} ]"

echo "== memif, DCQCN: the client reacts to the CNPs, and recovers once the server stops marking"
rm -f "$SOCK"
start_traffic "" srv-dcqcn --port net_memif0 --vdev "net_memif0,role=server,socket=$SOCK" --ip 10.91.0.1 --lcore 0 \
  --role server --size 4096 --timeout 16 --fault-rx ecn=0.2 --ctl-socket "$TMP/srv-dcqcn.ctl"
wait_listen "" "$LAST_PID" 18515 || bad "dcqcn: the server listens on TCP 18515 (gave up after $PROBES looks)"
start_traffic "" cli-dcqcn --port net_memif0 --vdev "net_memif0,role=client,socket=$SOCK" --ip 10.91.0.2 --lcore 1 \
  --role client --peer 127.0.0.1 --messages 100000 --size 4096 --timeout 16 --cc dcqcn --line-rate-mbps 10000 \
  --ctl-socket "$TMP/cli-dcqcn.ctl"
wait_sockets "$TMP/cli-dcqcn.ctl" || bad "dcqcn: the client's control socket is there (gave up after $PROBES looks)"
"$UROCE_CTL" --socket "$TMP/cli-dcqcn.ctl" telemetry --interval 20 --count 1000 > "$TMP/dcqcn.jsonl" 2>/dev/null &
TEL=$!
# dcqcn_rows: "PACED AFTER LOW" from the client's telemetry so far: rows of
# the dcqcn QP paced below the line, rows back at line rate (unpaced) after
# the last paced one, and rows paced below half the line.
dcqcn_rows() { /usr/bin/python3 - "$TMP/dcqcn.jsonl" <<'PY'
import json, sys
rows = []
for l in open(sys.argv[1]):
    try: rows.append(json.loads(l))
    except ValueError: pass  # a line being written
rows = [r for r in rows if r.get("algorithm") == "dcqcn"]
last = max((i for i, r in enumerate(rows) if r["pace_bps"] > 0), default=-1)
print(sum(r["pace_bps"] > 0 for r in rows), sum(r["pace_bps"] == 0 and r["rate_bps"] >= 10e9 for r in rows[last + 1:]) if last >= 0 else 0,
      sum(0 < r["pace_bps"] < 5e9 for r in rows))
PY
}
# No fixed window: the marks stop once the telemetry has seen the rate cut,
# and the recovery is awaited by looking at the telemetry (a bounded number
# of looks, not a time): DCQCN's own timer and byte counter set its pace.
# The cut is seen once a row is paced below half the line, as the check
# below asks (a few paced rows alone can still be above it under load).
cut_seen() { read -r pc af low <<< "$(dcqcn_rows)"; [ "${pc:-0}" -ge 3 ] && [ "${low:-0}" -ge 1 ]; }
probe 400 cut_seen || echo "  no paced row in the telemetry after $PROBES looks"
ctl "$TMP/srv-dcqcn.ctl" "fault rx off" > /dev/null
recovered() { read -r pc af low <<< "$(dcqcn_rows)"; [ "${af:-0}" -ge 1 ]; }
if probe 400 recovered; then echo "  marks off; back at line rate in the telemetry after $PROBES looks"
else echo "  marks off; not back at line rate after $PROBES looks"; fi
# One QP's algorithm, changed live over the control socket; refusals are clear.
qp0() { /usr/bin/python3 -c 'import json,sys; q=json.loads(sys.argv[1])["qp_list"][0]; print(q["qpn"] if sys.argv[2] == "qpn" else q["cc"]["algorithm"])' "$1" "$2"; }
qpn=$(qp0 "$(ctl "$TMP/cli-dcqcn.ctl" status)" qpn)
r_bad=$(ctl "$TMP/cli-dcqcn.ctl" "cc $qpn cubic")
r_noqp=$(ctl "$TMP/cli-dcqcn.ctl" "cc 0xfffff0 swift")
r_ok=$(ctl "$TMP/cli-dcqcn.ctl" "cc $qpn none")  # the reply names the QP's algorithm after the change
now_cc=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("cc", ""))' "$r_ok" 2>/dev/null)
check "cc: an unknown algorithm is refused by name" "echo '$r_bad' | grep -q 'no congestion control named'"
check "cc: a QP that is not there is refused" "echo '$r_noqp' | grep -q 'no such QP'"
check "cc: uroce-ctl's cc changes a live QP's algorithm (now $now_cc)" "echo '$r_ok' | grep -q '\"ok\": true' && [ '$now_cc' = none ]"
wait_pair dcqcn
kill $TEL 2>/dev/null; wait $TEL 2>/dev/null
read -r cut low alpha after <<< "$(/usr/bin/python3 - "$TMP/dcqcn.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("algorithm") == "dcqcn"]
# While marked: paced below the line (pace_bps > 0); the lowest rate seen.
paced = [r for r in rows if r["pace_bps"] > 0]
low = min((r["pace_bps"] for r in paced), default=0)
alpha = max((r["alpha"] for r in rows), default=0)
# After the last paced row: back at line rate (unpaced) with no CNP since.
last = max((i for i, r in enumerate(rows) if r["pace_bps"] > 0), default=-1)
after = [r for r in rows[last + 1:] if r["pace_bps"] == 0 and r["rate_bps"] >= 10e9]
print(len(paced), low, alpha, len(after))
PY
)"
echo "  client telemetry: $cut rows paced below line rate, lowest $((${low:-0} / 1000000)) Mb/s, alpha up to $alpha; $after rows back at line rate after"
check "dcqcn: CNPs cut the client's rate (paced below the 10 Gb/s line)" "[ ${cut:-0} -gt 0 ] && [ ${low:-0} -gt 0 ] && [ ${low:-0} -lt 5000000000 ]"
check "dcqcn: alpha rose with the CNPs" "/usr/bin/python3 -c 'import sys; sys.exit(0 if float(\"${alpha:-0}\") > 0.1 else 1)'"
check "dcqcn: the rate recovered to line rate once the marks stopped" "[ ${after:-0} -gt 0 ]"
err=$("$UROCED" --no-huge --port net_memif0 --ip 10.99.0.1 --cc cubic 2>&1 >/dev/null); rc=$?
check "cc: uroced refuses an unknown --cc by name" "[ $rc -ne 0 ] && echo '$err' | grep -q 'cc must be one of none, dcqcn, swift'"
finish
