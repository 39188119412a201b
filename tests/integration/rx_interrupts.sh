#!/bin/bash
# RX interrupts: on a PMD that has them (net_tap), an idle loop blocks until
# a frame comes instead of waking on the poll tick. Two uroced on tap
# devices, bridged by the kernel in one namespace, with a poll tick of half a
# second: round trips complete at once only if frames end the daemons'
# sleeps. "At once" is a ratio to a control in the same run, the same pair
# busy-polling: a round trip that waited for the tick is thousands of times
# slower. The same with the node embedded in each uroce-perf. memif has no
# RX interrupt, and says so; and a daemon with nothing to wait on but its
# timer sleeps: it takes a small fraction of what a busy loop pinned beside
# it takes.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
. "$(dirname "$0")/cpu_share.sh"
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

# tap_pair TAG PORT IDLE-OPTIONS...: two uroced on net_tap (A 10.98.0.1,
# B 10.98.0.2, their taps bridged), then 300 send_lat round trips between
# them through liburoce; results in $TMP/TAG-*.json, A's status in $ST.
tap_pair() {
  local tag=$1 port=$2; shift 2
  start_daemon "$NS_A" "$tag-a" --port net_tap0 --vdev "net_tap0,iface=${tag}a$$" --ip 10.98.0.1 --lcore 0 \
    --app-socket "$TMP/$tag-a.app" --ctl-socket "$TMP/$tag-a.ctl" "$@"
  start_daemon "$NS_A" "$tag-b" --port net_tap0 --vdev "net_tap0,iface=${tag}b$$" --ip 10.98.0.2 --lcore 1 \
    --app-socket "$TMP/$tag-b.app" --ctl-socket "$TMP/$tag-b.ctl" "$@"
  enslave "${tag}a$$" "$TMP/$tag-a.ctl"; enslave "${tag}b$$" "$TMP/$tag-b.ctl"
  wait_sockets "$TMP/$tag-a.app" "$TMP/$tag-b.app" || bad "$tag: both application sockets are there (gave up after $PROBES looks)"
  timeout 60 ip netns exec "$NS_A" "$PERF" send_lat -d "$TMP/$tag-a.app" -p "$port" -n 300 --json > "$TMP/$tag-s.json" 2> "$TMP/$tag-s.err" & sp=$!
  wait_listen "$NS_A" "" "$port" || bad "$tag: the send_lat server listens (gave up after $PROBES looks)"
  timeout 60 ip netns exec "$NS_A" "$PERF" send_lat -d "$TMP/$tag-b.app" -p "$port" -n 300 --json 127.0.0.1 > "$TMP/$tag-c.json" 2> "$TMP/$tag-c.err"; crc=$?
  wait $sp; src=$?
  ST=$(ctl "$TMP/$tag-a.ctl" status)
  for p in $PIDS; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=""
}
typical() { py 'x=r["results"][0]; print("%d %.0f" % (x["iterations"], x["t_typical"]))' "$1" 2>/dev/null; }

# The control, on this machine under its load of the moment: the same pair
# busy-polling (--idle-max-us 0), which waits for no wake-up at all.
echo "== control: two uroced on net_tap, busy-polling"
tap_pair ctl $BASE --idle-max-us 0
read -r ctl_n ctl_t <<< "$(typical "$TMP/ctl-c.json")"
echo "  send_lat: ${ctl_n:-?} round trips, ${ctl_t:-?} us typical"
check "control: 300 round trips" "[ $crc -eq 0 ] && [ $src -eq 0 ] && [ '${ctl_n:-0}' = 300 ]"

echo "== two uroced on net_tap, a poll tick of 0.5 s"
tap_pair slow $((BASE + 2)) $SLOW
st=$ST
grep -o 'rx_interrupts=[a-z]*' "$TMP/slow-a.err" | head -1 | sed 's/^/  daemon A: /'
check "net_tap: the daemon blocks on the port's RX interrupt" "[ \$(jget '$st' wait.rx_interrupts) = True ]"
read -r slow_n slow_t <<< "$(typical "$TMP/slow-c.json")"
wakes=$(jget "$st" wait.rx_wakes 2>/dev/null)
echo "  send_lat: ${slow_n:-?} round trips, ${slow_t:-?} us typical; A woke on RX ${wakes:-?} times"
# A round trip that waited for the tick takes 0.5 s, thousands of times the
# control's; one woken by its frame costs a few wake-ups more than it.
check "send_lat: 300 round trips through two sleeping daemons, typically within 50 x the control's (none waiting for the 0.5 s tick)" \
  "[ $crc -eq 0 ] && [ $src -eq 0 ] && [ '${slow_n:-0}' = 300 ] && [ ${slow_t:-999999999} -lt \$((50 * ${ctl_t:-0})) ]"
check "daemon A's sleeps were ended by frames" "[ ${wakes:-0} -gt 0 ]"

echo "== embedded nodes on net_tap, the same tick"
spec() { echo "--port net_tap0 --vdev net_tap0,iface=rx$1$$ --ip $2 --lcore $3 --no-huge --mem-mb 256 --file-prefix rx$1-$$ --ctl-socket $TMP/$1.ctl $SLOW"; }
UROCE_EMBEDDED="$(spec c 10.98.0.3 0)" timeout 60 ip netns exec "$NS_A" "$PERF" send_lat -p $((BASE + 1)) -n 300 --json \
  > "$TMP/es.json" 2> "$TMP/es.err" & sp=$!
enslave "rxc$$" "$TMP/c.ctl"
wait_listen "$NS_A" "" $((BASE + 1)) || bad "embedded: the send_lat server listens (gave up after $PROBES looks)"
UROCE_EMBEDDED="$(spec d 10.98.0.4 1)" timeout 60 ip netns exec "$NS_A" "$PERF" send_lat -p $((BASE + 1)) -n 300 --json 127.0.0.1 \
  > "$TMP/ec.json" 2> "$TMP/ec.err" & cp=$!
enslave "rxd$$" "$TMP/d.ctl"
wait $cp; crc=$?; wait $sp; src=$?
echo "  embedded send_lat: $(py 'x=r["results"][0]; print("%d round trips, %.1f us typical" % (x["iterations"], x["t_typical"]))' "$TMP/ec.json" 2>/dev/null)"
tail -2 "$TMP/ec.err" | sed 's/^/  /'
read -r emb_n emb_t <<< "$(typical "$TMP/ec.json")"
check "embedded: 300 round trips, typically within 50 x the control's (none waiting for the tick)" \
  "[ $crc -eq 0 ] && [ $src -eq 0 ] && [ '${emb_n:-0}' = 300 ] && [ ${emb_t:-999999999} -lt \$((50 * ${ctl_t:-0})) ]"

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
pid=$LAST_PID
wait_line "$TMP/mb.err" 'msg="uroced started"' || bad "the daemon started (gave up after $PROBES looks)"
sleep 1.5  # past its spin and warm-up: fully idle
# Beside a busy loop pinned to its CPU, over the same 3 s: a daemon that
# spins takes about what the loop takes (however loaded the machine), a
# sleeping one a small fraction.
read -r dticks bticks cpus <<< "$(cpu_vs_busy $pid 3)"
echo "  idle daemon without sockets: $dticks CPU ticks over 3 s; a busy loop beside it on CPU $cpus: $bticks"
check "it used under a fifth of what a busy loop beside it used (a spinning loop takes as much as the loop)" "sleeps_beside $dticks $bticks"
kill -TERM $pid; looks=0
while kill -0 $pid 2>/dev/null && [ $looks -lt 600 ]; do looks=$((looks + 1)); sleep 0.05; done
kill -0 $pid 2>/dev/null && kill -9 $pid
wait $pid; rc=$?
check "its loop was alive all along: it stopped on SIGTERM by itself, exit 0 (looked $looks times)" "[ $rc -eq 0 ] && grep -q 'uroced stopped' '$TMP/mb.err'"
finish
