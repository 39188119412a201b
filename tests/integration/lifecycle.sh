#!/bin/bash
# Daemon lifecycle and addressing between two real daemons:
# (1) graceful stop on SIGTERM mid-transfer: QPs go to ERR, every outstanding
#     WR completes (flushed) and is delivered, the daemon exits cleanly;
# (2) IPv6 addresses with an 802.1Q tag (VID 100, PCP 3) across the bridge:
#     neighbour discovery, verified traffic, and a capture that shows both.
. "$(dirname "$0")/lib.sh"
need_root
make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"

echo "== SIGTERM mid-transfer"
start_traffic "$NS_A" srv --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 --role server --forever
spid=$LAST_PID
sleep 1
start_traffic "$NS_B" cli --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
  --role client --peer 10.90.1.1 --messages 100000000 --ctl-socket "$TMP/cli.ctl"
cpid=$LAST_PID
sleep 1.5
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
kill -TERM "$cpid"
t0=$(date +%s%N)
wait "$cpid"; crc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "  client: $(cat "$TMP/cli.out") (exit $crc after ${ms} ms)"
check "the client stopped gracefully (exit 0)" "[ $crc -eq 0 ]"
check "its outstanding WRs were flushed and delivered" "grep -qE 'stopped by signal; [1-9][0-9]* outstanding WRs flushed' '$TMP/cli.out'"
check "a stopped run claims no SEND verified by the server (row 14): it says they are unverified" \
  "grep -q 'SENDs completed, not verified by the server' '$TMP/cli.out' && ! grep -q 'SENDs verified by the server' '$TMP/cli.out'"
check "the log shows the stop sequence" "grep -q 'stopping: flushing QPs' '$TMP/cli.err' && grep -q 'uroce-traffic stopped' '$TMP/cli.err'"
check "within 3 s" "[ $ms -lt 3000 ]"
sleep 0.5
check "the --forever server is still up after its client left" "kill -0 $spid"
kill -TERM "$spid"; wait "$spid"; src=$?
echo "  server: $(cat "$TMP/srv.out") (exit $src)"
check "the server stopped gracefully on SIGTERM" "[ $src -eq 0 ] && grep -q 'stopped by signal' '$TMP/srv.out'"

echo "== IPv6 with an 802.1Q tag"
start_traffic "$NS_A" srv6 --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip fd00:92::1 --vlan 100 --pcp 3 --lcore 0 \
  --role server --capture "$TMP/srv6.pcap"
spid=$LAST_PID
sleep 1
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
