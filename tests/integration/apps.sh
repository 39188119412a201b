#!/bin/bash
# Applications on liburoce against two uroced over memif: every operation,
# hostile sessions, an application that crashes, and several at once.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
need_prog tshark tshark
APP=${APP_PAIR:?path to app_pair}
# bsize=8192: whole frames in one memif buffer (DPDK 22.11 memif duplicates
# chained frames, docs/deploy.md); the CM test sends 4 KiB messages.
start_daemon "" da --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.94.0.1 --lcore 0 \
  --app-socket "$TMP/a.app" --ctl-socket "$TMP/a.ctl" --capture "$TMP/a.pcap"
A_PID=$LAST_PID
# The memif client connects once: the server must be up first (its
# application socket comes after its port; memif's own socket is abstract).
wait_sockets "$TMP/a.app" || bad "daemon A is up (gave up after $PROBES looks)"
start_daemon "" db --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.94.0.2 --lcore 1 \
  --app-socket "$TMP/b.app" --ctl-socket "$TMP/b.ctl"
B_PID=$LAST_PID
for i in $(seq 1 50); do [ -S "$TMP/a.app" ] && [ -S "$TMP/b.app" ] && break; sleep 0.1; done
# The daemons find each other by ARP when a QP goes to RTR: prime it.
check "application socket is owner/group only (0660)" "[ \$(stat -c %a '$TMP/a.app') = 660 ]"

echo "== every operation, two applications on two daemons"
"$APP" ops "$TMP/a.app" "$TMP/b.app" > "$TMP/ops.out" 2>&1; rc=$?
tail -n 3 "$TMP/ops.out" | sed 's/^/  /'
check "ops: all checks passed" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/ops.out'"

echo "== uroce-ctl lists sessions with their pid and QPs"
"$APP" hold "$TMP/a.app" 3 > "$TMP/hold.out" 2>&1 & hp=$!
for i in $(seq 1 30); do grep -q qpn "$TMP/hold.out" && break; sleep 0.1; done
qpn=$(awk '/qpn/ {printf "0x%06x", $2}' "$TMP/hold.out")
"$UROCE_CTL" --socket "$TMP/a.ctl" status > "$TMP/ctl.out" 2>&1
sed -n '/^sessions:/,/^$/p' "$TMP/ctl.out" | sed 's/^/  /'
check "uroce-ctl: the holding application's session, pid and QP are listed" \
  "grep -E '^ +[0-9]+ +$hp +1 +1 +[0-9]+ +1 +$qpn' '$TMP/ctl.out'"
wait $hp

echo "== completion channels: an armed CQ wakes an eventfd"
"$APP" events "$TMP/a.app" "$TMP/b.app" > "$TMP/events.out" 2>&1; rc=$?
tail -n 3 "$TMP/events.out" | sed 's/^/  /'
check "events: all checks passed" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/events.out'"

echo "== a shared receive queue feeding two QPs"
"$APP" srq "$TMP/a.app" "$TMP/b.app" > "$TMP/srq.out" 2>&1; rc=$?
tail -n 3 "$TMP/srq.out" | sed 's/^/  /'
check "srq: all checks passed" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/srq.out'"

echo "== uroce's QP attributes through the library: congestion control, selective repeat"
"$APP" qpopt "$TMP/a.app" "$TMP/b.app" > "$TMP/qpopt.out" 2>&1; rc=$?
tail -n 3 "$TMP/qpopt.out" | sed 's/^/  /'
check "qpopt: all checks passed" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/qpopt.out'"

echo "== UD through the library: address handles resolved by the daemons, datagrams both ways"
"$APP" ud "$TMP/a.app" "$TMP/b.app" > "$TMP/ud.out" 2>&1; rc=$?
grep FAIL "$TMP/ud.out" | sed 's/^/  /'; tail -n 1 "$TMP/ud.out" | sed 's/^/  /'
check "ud: all checks passed" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/ud.out'"

echo "== RDMA CM: the handshake on QP1, data, reject, disconnect, a client that dies"
"$APP" cm "$TMP/a.app" "$TMP/b.app" > "$TMP/cm.out" 2>&1; rc=$?
grep FAIL "$TMP/cm.out" | sed 's/^/  /'; tail -n 1 "$TMP/cm.out" | sed 's/^/  /'
check "cm: all checks passed" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/cm.out'"
st=$(ctl "$TMP/a.ctl" status)
echo "  daemon A's CM counters: $(echo "$st" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["cm"])')"
"$UROCE_CTL" --socket "$TMP/a.ctl" status | grep '^RDMA CM' | sed 's/^/  /'
check "cm: uroce-ctl shows the CM agent's counters" "'$UROCE_CTL' --socket '$TMP/a.ctl' status | grep -qE '^RDMA CM \(QP1\): [0-9]+ connections; MADs rx [1-9]'"
check "cm: daemon A counted its handshakes" "[ \$(jget '$st' cm.established) -ge 2 ] && [ \$(jget '$st' cm.rejects_sent) -ge 2 ]"

echo "== uroce-rping against itself, 30 pings validated, daemon A holding back some frames it receives"
# Reordering lets the client's next SEND overtake the ACK of the server's
# go-ahead, as loss did live against rxe: the server must keep that early
# receive completion, not drop it while it waits for its SEND's.
ctl "$TMP/a.ctl" "fault rx reorder=0.3,reorder_us=3000" > /dev/null
"$UROCE_RPING" -s -C 30 -p 7301 -d "$TMP/a.app" > "$TMP/rps.out" 2>&1 & sp=$!
for i in $(seq 50); do grep -q '^listening' "$TMP/rps.out" && break; sleep 0.1; done
timeout 120 "$UROCE_RPING" -c -a 10.94.0.1 -p 7301 -C 30 -V -d "$TMP/b.app" > "$TMP/rpc.out" 2>&1; rc=$?
wait $sp; src=$?
reord=$(ctl "$TMP/a.ctl" status | grep -o '"fault_rx": {[^}]*' | grep -o '"reordered": [0-9]*' | awk '{print $2}')
ctl "$TMP/a.ctl" "fault rx off" > /dev/null
echo "  client: $(tail -n 1 "$TMP/rpc.out"); server: $(tail -n 1 "$TMP/rps.out"); frames reordered by daemon A: ${reord:-?}"
check "rping: 30 pings validated by the client, 30 served, with ${reord:-0} frames reordered" \
  "[ $rc -eq 0 ] && [ $src -eq 0 ] && grep -q '^30 pings, data validated' '$TMP/rpc.out' && grep -q '^30 pings' '$TMP/rps.out' && [ ${reord:-0} -gt 0 ]"

echo "== the device list: a run directory of sockets plus \$UROCE_DEVICES"
mkdir -p "$TMP/run" && ln -sf "$TMP/a.app" "$TMP/run/uroce0.sock" && touch "$TMP/run/not-a-socket.sock"
UROCE_RUN_DIR="$TMP/run" UROCE_DEVICES="$TMP/b.app:$TMP/a.app" "$APP" devices 2 > "$TMP/dev.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/dev.out"
check "devices: uroce0 from the run directory and b.app from the list, both usable" \
  "[ $rc -eq 0 ] && grep -q '^device uroce0 ' '$TMP/dev.out' && grep -q '^device b.app ' '$TMP/dev.out'"

echo "== out-of-band TCP exchange (loopback), then connect and WRITE with what was learnt"
"$APP" oob "$TMP/a.app" "$TMP/b.app" $((20000 + $$ % 20000)) > "$TMP/oob.out" 2>&1; rc=$?
tail -n 3 "$TMP/oob.out" | sed 's/^/  /'
check "oob: all checks passed" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/oob.out'"

echo "== hostile sessions"
"$APP" hostile "$TMP/a.app" "$TMP/b.app" > "$TMP/hostile.out" 2>&1; rc=$?
tail -n 3 "$TMP/hostile.out" | sed 's/^/  /'
check "hostile: all refused, victims unharmed" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/hostile.out'"

echo "== an application crashes holding a QP, MR and CQ"
( "$APP" crash "$TMP/a.app" > "$TMP/crash.out" 2>&1 ) 2>/dev/null  # it aborts on purpose
# The daemon sees the session's socket close: wait until it has cleaned up.
st=""
released() { st=$(ctl "$TMP/a.ctl" status); [ "$(jget "$st" sessions 2>/dev/null)" = 0 ] && [ "$(jget "$st" pipeline.qps 2>/dev/null)" = 0 ]; }
probe 400 released || echo "  not released after $PROBES looks"
echo "  after the crash: sessions=$(jget "$st" sessions) qps=$(jget "$st" pipeline.qps)"
check "crash: the session and its QP are gone" "[ $(jget "$st" sessions) -eq 0 ] && [ $(jget "$st" pipeline.qps) -eq 0 ]"

echo "== four applications at once"
pids=""
for i in 1 2 3 4; do "$APP" ops "$TMP/a.app" "$TMP/b.app" > "$TMP/many$i.out" 2>&1 & pids="$pids $!"; done
okc=0; for p in $pids; do wait $p && okc=$((okc+1)); done
check "many: all four passed" "[ $okc -eq 4 ]"
st=$(ctl "$TMP/a.ctl" status)
check "many: everything released afterwards" "[ $(jget "$st" sessions) -eq 0 ] && [ $(jget "$st" pipeline.qps) -eq 0 ]"
echo "== a full send queue is ENOMEM at post time"
"$APP" sqfull "$TMP/a.app" "$TMP/b.app" > "$TMP/sqfull.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/sqfull.out" | tail -3
check "sqfull: ENOMEM once the ring and the engine's queue are full; no refusals" \
  "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/sqfull.out'"

echo "== no RNR on a clean link: each receive posted before its SEND is told to go"
r0=$(jget "$(ctl "$TMP/b.ctl" status)" qp_totals.send_rnr_err)
"$APP" rnr "$TMP/a.app" "$TMP/b.app" 10000 > "$TMP/rnr.out" 2>&1; rc=$?
r1=$(jget "$(ctl "$TMP/b.ctl" status)" qp_totals.send_rnr_err)
tail -n 1 "$TMP/rnr.out" | sed 's/^/  /'
echo "  RNR NAKs sent by daemon B during the run: $((r1 - r0))"
check "rnr: 10,000 SENDs into receives posted just before, all delivered" \
  "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/rnr.out'"
check "rnr: daemon B sent no RNR NAK" "[ $((r1 - r0)) -eq 0 ]"
read -r RNR_QPN RNR_QPN_A < <(awk '/^qpn/ {print $2, $3}' "$TMP/rnr.out")

echo "== port events: the peer daemon stops and starts again (memif's link follows it)"
"$APP" port "$TMP/a.app" > "$TMP/port.out" 2>&1 & pp=$!
for i in $(seq 1 50); do grep -q ready "$TMP/port.out" && break; sleep 0.1; done
kill "$B_PID"; wait "$B_PID" 2>/dev/null
for i in $(seq 1 100); do grep -q down "$TMP/port.out" && break; sleep 0.1; done
start_daemon "" db2 --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.94.0.2 --lcore 1 \
  --app-socket "$TMP/b.app" --ctl-socket "$TMP/b.ctl"
B_PID=$LAST_PID
wait $pp; rc=$?
sed 's/^/  /' "$TMP/port.out"
check "port events: PORT_ERR when the link went down, PORT_ACTIVE when it came back, query_port agreeing" \
  "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/port.out'"

# Daemon A's capture, read once A has stopped (so every frame is on disk).
kill -TERM "$A_PID" 2>/dev/null; while kill -0 "$A_PID" 2>/dev/null; do sleep 0.1; done
# tshark: its exit status is checked and it must have read frames, so a
# tshark that cannot run (or reads nothing) fails the checks, not passes them.
TSHARK=${TSHARK:-tshark}
TSH_IB="-d udp.port==4791,infiniband --disable-protocol rpcordma"
frames=$("$TSHARK" -r "$TMP/a.pcap" $TSH_IB -T fields -e frame.number 2> "$TMP/tshark.err" | wc -l; exit "${PIPESTATUS[0]}"); r0=$?
attrs=$("$TSHARK" -r "$TMP/a.pcap" $TSH_IB -Y infiniband.mad.attributeid -T fields -e infiniband.mad.attributeid \
  2>> "$TMP/tshark.err" | sort -u | tr '\n' ' '; exit "${PIPESTATUS[0]}"); r1=$?
malformed=$("$TSHARK" -r "$TMP/a.pcap" $TSH_IB -Y _ws.malformed -T fields -e frame.number 2>> "$TMP/tshark.err" | wc -l; \
  exit "${PIPESTATUS[0]}"); r2=$?
echo "  tshark (exit $r0 $r1 $r2): $frames frames; CM attributes on the wire: $attrs; malformed frames: $malformed"
[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && [ $r2 -eq 0 ] || grep -v 'Running as user' "$TMP/tshark.err" | head -3 | sed 's/^/  tshark: /'
check "cm: tshark read daemon A's capture (exit $r0, $frames frames)" "[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $frames -gt 0 ]"
check "cm: tshark dissects REQ, REJ, REP, RTU, DREQ and DREP in daemon A's capture, none malformed" \
  "[ '$attrs' = '0x0010 0x0012 0x0013 0x0014 0x0015 0x0016 ' ] && [ $r2 -eq 0 ] && [ $malformed -eq 0 ]"
if [ -n "$UROCE_PCAP" ] && [ -s "$TMP/a.pcap" ] && [ -n "${RNR_QPN:-}" ]; then
  # Nothing in this suite should draw an RNR NAK (every receive is posted
  # before its SEND), so the whole capture is counted; the rnr run is its
  # largest share of SENDs.
  read -r sends rnrs < <("$UROCE_PCAP" --json --quiet "$TMP/a.pcap" | /usr/bin/python3 -c "
import json, sys
q = json.load(sys.stdin)['qps']
print(sum(x['messages'] for x in q if x['destqp'] == $RNR_QPN), sum(x['rnr_naks'] for x in q))")
  echo "  capture: ${sends:-?} messages to QP $RNR_QPN (the rnr run's B, among others), ${rnrs:-?} RNR NAKs in all"
  check "rnr: the capture holds the 10,000 SENDs and no RNR NAK at all" "[ \${sends:-0} -ge 10000 ] && [ \${rnrs:-1} -eq 0 ]"
fi

echo "== no lost wake-up: posts and completions while the daemon sleeps between them"
# A daemon that never spins and polls only once a second: each post must
# wake it through the session's doorbell, and each completion wake the
# application through its channel. One lost wake-up waits a whole tick,
# tens of thousands of times the run's typical round (posts to their
# completions); the bound is 5,000 times that typical round, measured in
# the same run (no clock).
# (UROCE_WAKE_POSTS=1000000 for the long run.)
start_daemon "" dw --port net_memif1 --vdev "net_memif1,role=server,socket=$TMP/w.sock" --ip 10.94.0.9 --lcore 0 \
  --app-socket "$TMP/w.app" --ctl-socket "$TMP/w.ctl" --idle-spin-us 0 --poll-tick-us 1000000 --idle-max-us 1000000
wait_sockets "$TMP/w.app" || bad "the sleeping daemon is up (gave up after $PROBES looks)"
n=${UROCE_WAKE_POSTS:-100000}
"$APP" wakes "$TMP/w.app" "$n" 5000 > "$TMP/wakes.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/wakes.out"
st=$(ctl "$TMP/w.ctl" status)
sleeps=$(jget "$st" dataplane.idle_sleeps); bells=$(jget "$st" wait.doorbells)
echo "  daemon: $sleeps sleeps, $bells doorbells"
check "wakes: $n posts, each completion in order, no round over 5,000 x the typical one" \
  "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/wakes.out'"
check "wakes: the daemon slept and was woken by doorbells (the path was exercised)" \
  "[ \${sleeps:-0} -ge $((n / 2)) ] && [ \${bells:-0} -ge $((n / 2)) ]"
finish
