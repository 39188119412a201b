#!/bin/bash
# Daemon lifecycle and addressing between two real daemons:
# (1) graceful stop on SIGTERM mid-transfer: QPs go to ERR, every outstanding
#     WR completes (flushed) and is delivered, the daemon exits cleanly;
# (2) IPv6 addresses with an 802.1Q tag (VID 100, PCP 3) across the bridge:
#     neighbour discovery, verified traffic, and a capture that shows both.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"

echo "== SIGTERM mid-transfer"
start_traffic "$NS_A" srv --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 --role server --forever \
  --ctl-socket "$TMP/srv.ctl"
spid=$LAST_PID
wait_listen "$NS_A" "$spid" 18515 || bad "the server listens on TCP 18515 (gave up after $PROBES looks)"
start_traffic "$NS_B" cli --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
  --role client --peer 10.90.1.1 --messages 100000000 --ctl-socket "$TMP/cli.ctl"
cpid=$LAST_PID
qp_total() { jget "$(ctl "$1" status 2>/dev/null)" "qp_totals.$2" 2>/dev/null; }
moving() { [ -S "$TMP/cli.ctl" ] && [ "$(qp_total "$TMP/cli.ctl" completions)" -ge 1000 ] 2>/dev/null; }
probe 400 moving || bad "the client completed 1000 messages (gave up after $PROBES looks)"
if [ -n "${UROCE_CTL:-}" ]; then
  "$UROCE_CTL" --socket "$TMP/cli.ctl" status > "$TMP/ctl-status.txt"; s1=$?
  sed 's/^/  ctl| /' "$TMP/ctl-status.txt" | head -8
  check "uroce-ctl status lists the QP in RTS with traffic" "[ $s1 -eq 0 ] && grep -qE '^  0x[0-9a-f]{6} RC   RTS +0x[0-9a-f]{6} 10.90.2.1 +[1-9]' '$TMP/ctl-status.txt'"
  "$UROCE_CTL" --socket "$TMP/cli.ctl" watch --count 2 --interval 200 > "$TMP/ctl-watch.txt"; s2=$?
  clear_seq=$(printf '\033[2J')
  check "uroce-ctl watch redraws in place, with rates the second time" "[ $s2 -eq 0 ] && [ \$(grep -c 'node: 1 pipeline' '$TMP/ctl-watch.txt') -eq 2 ] && grep -q '/s)' '$TMP/ctl-watch.txt' && grep -qF '$clear_seq' '$TMP/ctl-watch.txt'"
  "$UROCE_CTL" --socket "$TMP/no-such.ctl" status > "$TMP/ctl-bad.txt" 2>&1; s3=$?
  check "uroce-ctl on a dead socket: a clear error, exit 2" "[ $s3 -eq 2 ] && grep -q 'cannot talk to uroced' '$TMP/ctl-bad.txt'"
fi
# stop PID: SIGTERM, then waits for PID to end by itself, looking up to 600
# times; one still up then is killed (exit 137). No clock: the node gives a
# stop 2 s and then leaves without the stage's summary, so the summaries
# checked below prove that the flush ended the stop.
stop() {
  kill -TERM "$1"; looks=0
  while kill -0 "$1" 2>/dev/null && [ $looks -lt 600 ]; do looks=$((looks + 1)); sleep 0.05; done
  kill -0 "$1" 2>/dev/null && { kill -9 "$1"; echo "  $1 still up after $looks looks: killed"; }
  wait "$1"
}
stop "$cpid"; crc=$?
echo "  client: $(cat "$TMP/cli.out") (exit $crc; looked $looks times)"
check "the client stopped gracefully (exit 0)" "[ $crc -eq 0 ]"
check "its outstanding WRs were flushed and delivered" "grep -qE 'stopped by signal; [1-9][0-9]* outstanding WRs flushed' '$TMP/cli.out'"
check "a stopped run claims no SEND verified by the server (row 14): it says they are unverified" \
  "grep -q 'SENDs completed, not verified by the server' '$TMP/cli.out' && ! grep -q 'SENDs verified by the server' '$TMP/cli.out'"
check "the log shows the stop sequence" "grep -q 'stopping: flushing QPs' '$TMP/cli.err' && grep -q 'uroce-traffic stopped' '$TMP/cli.err'"
# The server has seen its client go once it has destroyed the client's QP
# and listens again: only then does "still up" mean anything.
served() { [ "$(jget "$(ctl "$TMP/srv.ctl" status 2>/dev/null)" pipeline.qps 2>/dev/null)" = 0 ]; }
probe 400 served || bad "the server released its client's QP (gave up after $PROBES looks)"
check "the --forever server is still up after its client left, listening again" "kill -0 $spid && listening '$NS_A' $spid 18515"
stop "$spid"; src=$?
echo "  server: $(cat "$TMP/srv.out") (exit $src)"
check "the server stopped gracefully on SIGTERM" "[ $src -eq 0 ] && grep -q 'stopped by signal' '$TMP/srv.out'"

echo "== IPv6 with an 802.1Q tag"
start_traffic "$NS_A" srv6 --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip fd00:92::1 --vlan 100 --pcp 3 --lcore 0 \
  --role server --capture "$TMP/srv6.pcap"
spid=$LAST_PID
wait_listen "$NS_A" "$spid" 18515 || bad "the IPv6 server listens on TCP 18515 (gave up after $PROBES looks)"
start_traffic "$NS_B" cli6 --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip fd00:92::2 --vlan 100 --pcp 3 --lcore 1 \
  --role client --peer 10.90.1.1 --messages 1000
cpid=$LAST_PID
wait "$cpid"; crc=$?; wait "$spid"
echo "  client: $(cat "$TMP/cli6.out")"
check "ipv6+vlan: verified traffic" "[ $crc -eq 0 ] && grep -q 'uroce-traffic: OK' '$TMP/cli6.out'"
check "ipv6+vlan: the peer was found by neighbour discovery" "grep -q 'neighbour learned.*ip=fd00:92::1' '$TMP/cli6.err'"
if [ -n "$UROCE_PCAP" ]; then
  shape=$("$UROCE_PCAP" --strict --json "$TMP/srv6.pcap" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
fs = d["frames"]
print(len(fs), all(f["ipver"] == 6 for f in fs), all(f["vlan"] == 0x6064 for f in fs))')
  echo "  capture: frames, all IPv6, all VLAN 100 PCP 3 = $shape"
  check "ipv6+vlan: the capture is IPv6 with the tag, and passes --strict" "echo '$shape' | grep -qE '^[1-9][0-9]* True True$'"
fi
finish
