#!/bin/bash
# Start/stop stress: a memif daemon pair under traffic, stopped together,
# again and again. Each cycle starts two uroced joined by net_memif, runs
# uroce-perf write_bw between them through liburoce, then SIGTERMs both
# daemons at the same moment, mid-transfer. Every daemon must exit by itself
# (code 0), within 10 s, without a fatal signal: the shutdown races DPDK's
# interrupt thread (memif's peer hanging up) for as long as the daemon's
# teardown leaves one open. Every cycle must carry traffic: daemon A's QP
# receives RoCE packets from B's, and more of them between the start of the
# traffic and the stop (read over the control sockets); the run fails unless
# every cycle did.
#   tools/restart_stress.sh [BUILD_DIR] [CYCLES]      (root; 200 cycles by default)
set -u
build=$(realpath "${1:-build}")
CYCLES=${2:-200}
export UROCED=$build/control/uroced
. "$(dirname "$0")/../tests/integration/lib.sh"
. "$(dirname "$0")/../tests/integration/ready.sh"
need_root
PERF=$build/tools/perf/uroce-perf
for t in "$UROCED" "$PERF"; do [ -x "$t" ] || { echo "missing $t: build first"; exit 2; }; done

crashes=0 hangs=0 badexit=0 traffic=0
for c in $(seq 1 "$CYCLES"); do
  rm -f "$TMP"/m.sock "$TMP"/a.app "$TMP"/b.app "$TMP"/a.ctl "$TMP"/b.ctl
  start_daemon "" "a$c" --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock" --ip 10.88.0.1 --lcore 0 \
    --app-socket "$TMP/a.app" --ctl-socket "$TMP/a.ctl"
  A=$LAST_PID
  for i in $(seq 100); do [ -S "$TMP/a.app" ] && break; sleep 0.05; done  # the memif server is up: the client connects once
  start_daemon "" "b$c" --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock" --ip 10.88.0.2 --lcore 1 \
    --app-socket "$TMP/b.app" --ctl-socket "$TMP/b.ctl"
  B=$LAST_PID
  for i in $(seq 100); do [ -S "$TMP/a.app" ] && [ -S "$TMP/b.app" ] && break; sleep 0.05; done
  port=$((25000 + c % 500))
  "$PERF" write_bw -d "$TMP/a.app" -p $port -D 10 -s 4096 > "$TMP/srv.out" 2>&1 & ps=$!
  wait_listen "" $ps $port || echo "cycle $c: the write_bw server is not listening after $PROBES looks"
  "$PERF" write_bw -d "$TMP/b.app" -p $port -D 10 -s 4096 127.0.0.1 > "$TMP/cli.out" 2>&1 & pc=$!
  # Traffic: daemon A's QPs have received RoCE packets (a new daemon each
  # cycle, so the count is this cycle's).
  rcvd() { jget "$(ctl "$TMP/a.ctl" status 2>/dev/null)" qp_totals.rcvd_pkts 2>/dev/null; }
  flowing() { [ "$(rcvd)" -gt 0 ] 2>/dev/null; }
  probe 200 flowing || echo "cycle $c: no packet received after $PROBES looks: $(tail -n 1 "$TMP/cli.out")"
  first=$(rcvd)
  sleep "0.$((1 + RANDOM % 5))"  # 0.1-0.5 s of traffic: the stop comes at a random point of it
  # Carried traffic: packets were flowing then, and still are at the stop.
  got=$(rcvd)
  if [ "${first:-0}" -gt 0 ] 2>/dev/null && [ "${got:-0}" -gt "${first:-0}" ] 2>/dev/null; then traffic=$((traffic + 1))
  else echo "cycle $c: no traffic (daemon A's QPs had received ${first:-?}, then ${got:-?} RoCE packets)"; fi
  kill -TERM "$A" "$B" 2>/dev/null
  for p in $A $B; do
    for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      hangs=$((hangs + 1)); echo "cycle $c: daemon $p still up 10 s after SIGTERM"; kill -9 "$p"
    fi
    wait "$p"; rc=$?
    if [ $rc -ge 128 ]; then
      crashes=$((crashes + 1)); echo "cycle $c: daemon $p died of signal $((rc - 128))"
    elif [ $rc -ne 0 ]; then
      badexit=$((badexit + 1)); echo "cycle $c: daemon $p exited $rc"
    fi
  done
  for f in "$TMP/a$c.err" "$TMP/b$c.err"; do
    if grep -q "fatal signal" "$f"; then grep -A20 "fatal signal" "$f" | head -24; else rm -f "$f" "${f%.err}.out"; fi
  done
  kill -9 $ps $pc 2>/dev/null; wait $ps $pc 2>/dev/null
  PIDS=""
  [ $((c % 20)) -eq 0 ] && echo "  $c cycles: $crashes crashes, $hangs hangs, $badexit other exits"
done
echo "restart stress: $CYCLES cycles of a memif daemon pair stopped together under traffic ($traffic carried traffic): $crashes crashes, $hangs hangs, $badexit other exits"
check "every cycle carried traffic ($traffic of $CYCLES)" "[ $traffic -eq $CYCLES ]"
check "no daemon died of a signal" "[ $crashes -eq 0 ]"
check "no daemon hung at SIGTERM" "[ $hangs -eq 0 ]"
check "every daemon exited 0" "[ $badexit -eq 0 ]"
finish
