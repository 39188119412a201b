#!/bin/bash
# Live interop: uroce against Linux rxe in a QEMU guest (../shared/peers/rxe-vm),
# both directions, at MTU 1024 and 4096, then with 1% and 5% of RoCEv2 frames
# dropped on the guest's bridge (nftables) plus reordering and duplication
# from uroced's fault injector. Every run is captured; the captures must pass
# uroce-pcap --strict and show both sides' go-back-N at work under loss.
#
# Skips (exit 77) with the reason when the guest cannot be built or booted.
. "$(dirname "$0")/../integration/lib.sh"
need_root
PEER=${UROCE_RXE_PEER:-$(dirname "$0")/../../../shared/peers/rxe-vm}
PERF=${UROCE_PERF:?}
PP=${UROCE_PINGPONG:?}
RPING=${UROCE_RPING:?}
NSX=rxepeer
G() { "$PEER/run-peer.sh" exec 1 "$1"; }  # a command in the guest
# Nothing left over from the previous pairing may hold a port or a QP.
fresh() { G 'killall -q rping ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_send_lat ib_read_lat ib_atomic_lat 2>/dev/null; true' > /dev/null; }

skip() { echo "SKIP: $*"; exit 77; }
[ -x "$PEER/make-peer.sh" ] || skip "no rxe peer at $PEER (../shared/peers/rxe-vm)"
command -v qemu-system-x86_64 > /dev/null || skip "qemu-system-x86_64 is not installed (tools/setup.sh installs qemu-system-x86)"
cache=${UROCE_RXE_PEER_DIR:-/var/cache/uroce-rxe-peer}
if [ ! -f "$cache/vmlinuz" ]; then
  echo "== building the rxe guest (cached in $cache)"
  "$PEER/make-peer.sh" > "$TMP/make-peer.log" 2>&1 || { tail -5 "$TMP/make-peer.log"; skip "make-peer.sh could not build the guest"; }
fi

interop_cleanup() {
  ip netns exec $NSX nft delete table bridge uroce_loss 2>/dev/null
  ip -n $NSX link del uv0 2>/dev/null
  "$PEER/run-peer.sh" down > /dev/null 2>&1
}
trap 'interop_cleanup; cleanup' EXIT

boot() {  # [EXTRA_APPEND]
  "$PEER/run-peer.sh" down > /dev/null 2>&1
  EXTRA_APPEND="${1:-}" "$PEER/run-peer.sh" up 1 > "$TMP/up.log" 2>&1 || { cat "$TMP/up.log"; skip "the rxe guest did not boot"; }
  grep READY "$TMP/up.log" | sed 's/^/  /'
  ip -n $NSX link set tap1 mtu 9000
  ip -n $NSX link add uv0 type veth peer name uv1
  ip -n $NSX link set uv1 master br0
  for l in uv0 uv1; do ip -n $NSX link set $l mtu 9000 up; done
}

DPID=""
daemon() {  # TAG [uroced flags]: uroced on the bridge, 10.77.0.10, capturing
  local tag=$1; shift
  rm -f "$TMP/u.app"
  start_daemon $NSX "u-$tag" --port net_af_packet0 --vdev "net_af_packet0,iface=uv0,framesz=9216,blocksz=36864,framecnt=512" \
    --ip 10.77.0.10 --lcore 0 --app-socket "$TMP/u.app" --ctl-socket "$TMP/u.ctl" --capture "$TMP/$tag.pcap" "$@"
  DPID=$LAST_PID
  for i in $(seq 50); do [ -S "$TMP/u.app" ] && break; sleep 0.1; done
}
stop_daemon() {
  kill "$DPID" 2>/dev/null
  while kill -0 "$DPID" 2>/dev/null; do sleep 0.1; done
}
X() { ip netns exec $NSX "$@"; }  # our tools run in the namespace (TCP to the guest)

# pingpong TAG SIZE ITERS EXTRA: both directions, our side checks every message
pingpong() {
  local tag=$1 sz=$2 n=$3 ex=${4:-}
  fresh
  G "timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz $ex </dev/null >/tmp/pp.log 2>&1 &"
  sleep 1
  X timeout 150 "$PP" -d "$TMP/u.app" -n "$n" -s "$sz" -c $ex 10.77.0.2 > "$TMP/pp.out" 2>&1
  check "$tag: ibv_rc_pingpong server (rxe) <- uroce-pingpong client, $sz B x $n, every message right" \
    "grep -q '^$n messages checked, 0 bad' $TMP/pp.out && sleep 1 && G 'cat /tmp/pp.log' | grep -q '^$n iters'"
  X timeout 150 "$PP" -d "$TMP/u.app" -n "$n" -s "$sz" -c $ex > "$TMP/pps.out" 2>&1 & local sp=$!
  sleep 0.5
  G "timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz $ex 10.77.0.1 > /tmp/ppc.log 2>&1; echo rc=\$?" > "$TMP/ppc.rc"
  wait $sp
  check "$tag: uroce-pingpong server <- ibv_rc_pingpong client (rxe), $sz B x $n, every message right" \
    "grep -q rc=0 $TMP/ppc.rc && grep -q '^$n messages checked, 0 bad' $TMP/pps.out"
}

# perftest TAG TEST ITERS EXTRA: rxe's ib_TEST against uroce-perf TEST, both directions
perftest() {
  local tag=$1 t=$2 n=$3 ex=${4:-}
  fresh
  G "timeout 120 ib_$t -d rxe0 -x 1 -n $n $ex </dev/null >/tmp/pt.log 2>&1 &"
  sleep 1.5
  # -u 18 (1.07 s ACK timeout): the TCG guest can stall for a good part of a second.
  X timeout 150 "$PERF" "$t" -d "$TMP/u.app" -n "$n" -u 18 $ex --json 10.77.0.2 > "$TMP/pt.json" 2> "$TMP/pt.err"
  local rc=$?
  # read_lat and atomic_lat servers print no result line: they must just not complain.
  local srv_ok="G 'cat /tmp/pt.log' | grep -qE '^ [0-9]+ +$n '"
  case $t in read_lat|atomic_lat) srv_ok="! G 'cat /tmp/pt.log' | grep -qiE 'error|fail|couldn'" ;; esac
  check "$tag: ib_$t server (rxe) <- uroce-perf client, $n iterations" \
    "[ $rc -eq 0 ] && /usr/bin/python3 -c 'import json; r=json.load(open(\"$TMP/pt.json\"))[\"results\"][0]; assert r[\"iterations\"]==$n' && sleep 1 && $srv_ok"
  [ $rc -eq 0 ] || tail -3 "$TMP/pt.err" | sed 's/^/    /'
  X timeout 150 "$PERF" "$t" -d "$TMP/u.app" -n "$n" -u 18 $ex --json > "$TMP/pts.json" 2> "$TMP/pts.err" & local sp=$!
  sleep 0.5
  G "timeout 120 ib_$t -d rxe0 -x 1 -n $n $ex 10.77.0.1 > /tmp/ptc.log 2>&1; echo rc=\$?" > "$TMP/ptc.rc"
  wait $sp
  rc=$?
  check "$tag: uroce-perf server <- ib_$t client (rxe), $n iterations" \
    "[ $rc -eq 0 ] && grep -q rc=0 $TMP/ptc.rc && G 'cat /tmp/ptc.log' | grep -qE '^ [0-9]+ +$n '"
}

# rping TAG COUNT: RDMA CM both directions, data validated by rping -V
rping() {
  local tag=$1 n=$2
  fresh
  G "timeout 120 rping -s -a 10.77.0.2 -C $n -V </dev/null >/tmp/rp.log 2>&1 &"
  sleep 2
  X timeout 150 "$RPING" -c -a 10.77.0.2 -C "$n" -V -d "$TMP/u.app" > "$TMP/rp.out" 2>&1
  check "$tag: rping server (rxe) <- uroce-rping client over RDMA CM, $n pings validated" \
    "grep -q '^$n pings, data validated' $TMP/rp.out"
  grep -q "^$n pings, data validated" "$TMP/rp.out" || tail -3 "$TMP/rp.out" | sed 's/^/    /'
  fresh
  X timeout 150 "$RPING" -s -C "$n" -d "$TMP/u.app" > "$TMP/rps.out" 2>&1 & local sp=$!
  # rping's client does not retry a refused connect: start it once we listen.
  for i in $(seq 100); do grep -q '^listening' "$TMP/rps.out" && break; sleep 0.1; done
  G "timeout 120 rping -c -a 10.77.0.10 -C $n -V > /tmp/rpc.log 2>&1; echo rc=\$?" > "$TMP/rpc.rc"
  wait $sp
  check "$tag: uroce-rping server <- rping -V client (rxe) over RDMA CM, $n pings" \
    "grep -q rc=0 $TMP/rpc.rc && grep -q '^$n pings' $TMP/rps.out"
  grep -q "^$n pings" "$TMP/rps.out" || { tail -3 "$TMP/rps.out"; G 'tail -3 /tmp/rpc.log'; } | sed 's/^/    /'
}

strict() {  # TAG: the capture decodes, every ICRC is right
  "$UROCE_PCAP" --strict --quiet "$TMP/$1.pcap" > "$TMP/$1.strict" 2>&1
  local rc=$?
  check "$1: uroce-pcap --strict passes on the capture ($(tail -1 "$TMP/$1.strict"))" "[ $rc -eq 0 ]"
}

# naks TAG: NAK sequence errors and retransmissions in both directions
loss_evidence() {
  local f="$TMP/$1.pcap" ours theirs
  ours=$(tshark -r "$f" -d udp.port==4791,infiniband --disable-protocol rpcordma -Y 'ip.src==10.77.0.10 && infiniband.aeth.syndrome >= 96 && infiniband.aeth.syndrome < 128' 2>/dev/null | wc -l)
  theirs=$(tshark -r "$f" -d udp.port==4791,infiniband --disable-protocol rpcordma -Y 'ip.src==10.77.0.2 && infiniband.aeth.syndrome >= 96 && infiniband.aeth.syndrome < 128' 2>/dev/null | wc -l)
  echo "  $1: NAK sequence errors sent by uroce: $ours, by rxe: $theirs"
  check "$1: both sides sent NAK sequence errors and recovered (go-back-N interoperating)" "[ $ours -gt 0 ] && [ $theirs -gt 0 ]"
}

echo "== MTU 1024 (rxe's default)"
boot
daemon m1024
for sz in 1 1000 4096; do pingpong "mtu1024" $sz 50; done
for t in write_bw read_bw send_bw atomic_bw; do perftest "mtu1024" $t 100; done
for t in write_lat send_lat read_lat atomic_lat; do perftest "mtu1024" $t 100; done
rping "mtu1024" 5
stop_daemon
strict m1024

for pct in 1 5; do
  echo "== $pct% of RoCEv2 frames dropped on the guest's bridge, plus uroced reordering and duplicating"
  ip netns exec $NSX nft delete table bridge uroce_loss 2>/dev/null
  ip netns exec $NSX nft -f - <<EOF
table bridge uroce_loss {
  chain lossy {
    type filter hook forward priority 0; policy accept;
    udp dport 4791 numgen random mod 100 < $pct counter drop
  }
}
EOF
  daemon "loss$pct" --fault-rx "reorder=0.01,dup=0.01"
  pingpong "loss$pct" 4096 40
  perftest "loss$pct" write_bw 20
  perftest "loss$pct" read_bw 20
  perftest "loss$pct" send_bw 20
  perftest "loss$pct" send_lat 50
  rping "loss$pct" 3
  stop_daemon
  echo "  frames dropped by nftables: $(ip netns exec $NSX nft list table bridge uroce_loss | grep -o 'packets [0-9]*')"
  strict "loss$pct"
  loss_evidence "loss$pct"
done
ip netns exec $NSX nft delete table bridge uroce_loss

echo "== MTU 4096 on both sides (guest booted with peer.mtu=4200)"
boot "peer.mtu=4200"
daemon m4096
check "mtu4096: the guest's port is at 4096" "G 'ibv_devinfo' | grep -q 'active_mtu:.*4096'"
pingpong "mtu4096" 4096 30 "-m 4096"
perftest "mtu4096" write_bw 50 "-m 4096"
perftest "mtu4096" send_lat 50 "-m 4096 -s 4096"
stop_daemon
strict m4096
finish
