#!/bin/bash
# Start/stop stress: a memif daemon pair under traffic, stopped together,
# again and again. Each cycle starts two uroced joined by net_memif, runs
# uroce-perf write_bw between them through liburoce, then SIGTERMs both
# daemons at the same moment, mid-transfer. Every daemon must exit by itself
# (code 0), within 10 s, without a fatal signal: the shutdown races DPDK's
# interrupt thread (memif's peer hanging up) for as long as the daemon's
# teardown leaves one open.
#   tools/restart_stress.sh [BUILD_DIR] [CYCLES]      (root; 200 cycles by default)
set -u
build=$(realpath "${1:-build}")
CYCLES=${2:-200}
export UROCED=$build/control/uroced
. "$(dirname "$0")/../tests/integration/lib.sh"
need_root
PERF=$build/tools/perf/uroce-perf
for t in "$UROCED" "$PERF"; do [ -x "$t" ] || { echo "missing $t: build first"; exit 2; }; done

crashes=0 hangs=0 badexit=0 traffic=0
for c in $(seq 1 "$CYCLES"); do
  rm -f "$TMP"/m.sock "$TMP"/a.app "$TMP"/b.app
  start_daemon "" "a$c" --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock" --ip 10.88.0.1 --lcore 0 \
    --app-socket "$TMP/a.app"
  A=$LAST_PID
  for i in $(seq 100); do [ -S "$TMP/a.app" ] && break; sleep 0.05; done  # the memif server is up: the client connects once
  start_daemon "" "b$c" --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock" --ip 10.88.0.2 --lcore 1 \
    --app-socket "$TMP/b.app"
  B=$LAST_PID
  for i in $(seq 100); do [ -S "$TMP/a.app" ] && [ -S "$TMP/b.app" ] && break; sleep 0.05; done
  port=$((25000 + c % 500))
  "$PERF" write_bw -d "$TMP/a.app" -p $port -D 10 -s 4096 > "$TMP/srv.out" 2>&1 & ps=$!
  for i in $(seq 60); do [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] && break; sleep 0.05; done  # listening
  "$PERF" write_bw -d "$TMP/b.app" -p $port -D 10 -s 4096 127.0.0.1 > "$TMP/cli.out" 2>&1 & pc=$!
  for i in $(seq 60); do grep -q "BW" "$TMP/cli.out" 2>/dev/null && break; sleep 0.05; done  # connected
  if grep -q "BW" "$TMP/cli.out" 2>/dev/null; then traffic=$((traffic + 1)); else echo "cycle $c: no traffic: $(tail -n 1 "$TMP/cli.out")"; fi
  sleep "0.$((1 + RANDOM % 5))"  # 0.1-0.5 s of traffic
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
echo "restart stress: $CYCLES cycles of a memif daemon pair stopped together under traffic ($traffic with the write_bw pair connected and sending): $crashes crashes, $hangs hangs, $badexit other exits"
check "no daemon died of a signal" "[ $crashes -eq 0 ]"
check "no daemon hung at SIGTERM" "[ $hangs -eq 0 ]"
check "every daemon exited 0" "[ $badexit -eq 0 ]"
finish
