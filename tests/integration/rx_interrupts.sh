#!/bin/bash
# RX interrupts: on a PMD that has them (net_tap), an idle loop blocks until
# a frame comes instead of waking on the poll tick. Two uroced on tap
# devices, bridged by the kernel in one namespace, with a poll tick of half a
# second: round trips complete at once only if frames end the daemons'
# sleeps (on the tick, 300 send_lat round trips would take minutes). The
# same with the node embedded in each uroce-perf. memif has no RX interrupt,
# and says so; and a daemon with nothing to wait on but its timer sleeps.
. "$(dirname "$0")/lib.sh"
need_root
PERF=${UROCE_PERF:?path to uroce-perf}
[ -c /dev/net/tun ] || { echo "SKIP: no /dev/net/tun"; exit 77; }
ip netns add "$NS_A"
ip -n "$NS_A" link add br0 type bridge
ip -n "$NS_A" link set br0 up
ip -n "$NS_A" link set lo up
SLOW="--poll-tick-us 500000 --idle-warm-ms 0 --idle-max-us 500000"
BASE=$((26000 + ($$ % 200) * 10))
N=0
enslave() {  # TAP CTL: once the node is up (its control socket), bridge its tap
  for i in $(seq 100); do [ -S "$2" ] && break; sleep 0.1; done
  # The kernel side of a DPDK tap has the port's MAC: a bridge port's own
  # MAC is local to the bridge, which would keep frames for the port. Give
  # the kernel side another, after the port has started (starting sets it).
  N=$((N + 1))
  ip -n "$NS_A" link set "$1" address "02:00:00:98:00:0$N"
  ip -n "$NS_A" link set "$1" master br0 up
}
py() { /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); $1" "$2"; }

echo "== two uroced on net_tap, a poll tick of 0.5 s"
start_daemon "$NS_A" ta --port net_tap0 --vdev "net_tap0,iface=rxa$$" --ip 10.98.0.1 --lcore 0 \
  --app-socket "$TMP/a.app" --ctl-socket "$TMP/a.ctl" $SLOW
start_daemon "$NS_A" tb --port net_tap0 --vdev "net_tap0,iface=rxb$$" --ip 10.98.0.2 --lcore 1 \
  --app-socket "$TMP/b.app" --ctl-socket "$TMP/b.ctl" $SLOW
enslave "rxa$$" "$TMP/a.ctl"; enslave "rxb$$" "$TMP/b.ctl"
for i in $(seq 50); do [ -S "$TMP/a.app" ] && [ -S "$TMP/b.app" ] && break; sleep 0.1; done
grep -o 'rx_interrupts=[a-z]*' "$TMP/ta.err" | head -1 | sed 's/^/  daemon A: /'
st=$(ctl "$TMP/a.ctl" status)
check "net_tap: the daemon blocks on the port's RX interrupt" "[ \$(jget '$st' wait.rx_interrupts) = True ]"
timeout 60 ip netns exec "$NS_A" "$PERF" send_lat -d "$TMP/a.app" -p $BASE -n 300 --json > "$TMP/s.json" 2> "$TMP/s.err" & sp=$!
sleep 0.3
timeout 60 ip netns exec "$NS_A" "$PERF" send_lat -d "$TMP/b.app" -p $BASE -n 300 --json 127.0.0.1 > "$TMP/c.json" 2> "$TMP/c.err"; crc=$?
wait $sp; src=$?
st=$(ctl "$TMP/a.ctl" status)
echo "  send_lat: $(py 'x=r["results"][0]; print("%d round trips, %.1f us typical" % (x["iterations"], x["t_typical"]))' "$TMP/c.json" 2>/dev/null); A woke on RX $(jget "$st" wait.rx_wakes) times"
check "send_lat: 300 round trips through two sleeping daemons, none waiting for the 0.5 s tick" \
  "[ $crc -eq 0 ] && [ $src -eq 0 ] && py 'x=r[\"results\"][0]; sys.exit(not (x[\"iterations\"]==300 and x[\"t_typical\"] < 50000))' $TMP/c.json"
check "daemon A's sleeps were ended by frames" "[ \$(jget '$st' wait.rx_wakes) -gt 0 ]"
for p in $PIDS; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=""

echo "== embedded nodes on net_tap, the same tick"
spec() { echo "--port net_tap0 --vdev net_tap0,iface=rx$1$$ --ip $2 --lcore $3 --no-huge --mem-mb 256 --file-prefix rx$1-$$ --ctl-socket $TMP/$1.ctl $SLOW"; }
UROCE_EMBEDDED="$(spec c 10.98.0.3 0)" timeout 60 ip netns exec "$NS_A" "$PERF" send_lat -p $((BASE + 1)) -n 300 --json \
  > "$TMP/es.json" 2> "$TMP/es.err" & sp=$!
enslave "rxc$$" "$TMP/c.ctl"
UROCE_EMBEDDED="$(spec d 10.98.0.4 1)" timeout 60 ip netns exec "$NS_A" "$PERF" send_lat -p $((BASE + 1)) -n 300 --json 127.0.0.1 \
  > "$TMP/ec.json" 2> "$TMP/ec.err" & cp=$!
enslave "rxd$$" "$TMP/d.ctl"
wait $cp; crc=$?; wait $sp; src=$?
echo "  embedded send_lat: $(py 'x=r["results"][0]; print("%d round trips, %.1f us typical" % (x["iterations"], x["t_typical"]))' "$TMP/ec.json" 2>/dev/null)"
tail -2 "$TMP/ec.err" | sed 's/^/  /'
check "embedded: 300 round trips, none waiting for the tick" \
  "[ $crc -eq 0 ] && [ $src -eq 0 ] && py 'x=r[\"results\"][0]; sys.exit(not (x[\"iterations\"]==300 and x[\"t_typical\"] < 50000))' $TMP/ec.json"

echo "== memif has no RX interrupt: the daemon says so and keeps its tick"
start_daemon "" ma --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock" --ip 10.98.1.1 --lcore 0 --ctl-socket "$TMP/m.ctl"
for i in $(seq 50); do [ -S "$TMP/m.ctl" ] && break; sleep 0.1; done
st=$(ctl "$TMP/m.ctl" status)
check "memif: rx_interrupts false" "[ \$(jget '$st' wait.rx_interrupts) = False ]"
for p in $PIDS; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=""

echo "== a daemon with no sockets at all sleeps when idle (its io_context never runs dry)"
# An io_context with nothing outstanding stops, and then returns from every
# wait at once: such a daemon once spun a whole core while "sleeping".
start_daemon "" mb --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m2.sock" --ip 10.98.1.2 --lcore 0
pid=$LAST_PID; sleep 1.5
hz=$(getconf CLK_TCK); t0=$(awk '{print $14+$15}' "/proc/$pid/stat"); sleep 3; t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
echo "  idle daemon without sockets: $(( (t1 - t0) * 100 / (hz * 3) ))% of a core over 3 s"
check "it used under half a core (a spinning loop uses all of one)" "[ $(( (t1 - t0) * 2 )) -lt $(( hz * 3 )) ]"
finish
