# Sourced by rxe.sh and make_fixtures.sh: the rxe guest, a uroced on its
# bridge, and one function per pairing (each runs both directions).
#
# UROCE_INTEROP_ONLY="rping write_bw ..." runs only the named pairings
# (pingpong, rping, a perftest name, or stock: the stock binaries through
# uroce-run), for chasing one failure.
. "$(dirname "${BASH_SOURCE[0]}")/../integration/lib.sh"
need_root
# meson puts the drop-in libraries' folders on LD_LIBRARY_PATH (the test
# depends on them); uroced's EAL needs the system's libibverbs, and the
# stock binaries get uroce's from uroce-run.
unset LD_LIBRARY_PATH
PEER=${UROCE_RXE_PEER:-$(dirname "${BASH_SOURCE[0]}")/../../../shared/peers/rxe-vm}
PERF=${UROCE_PERF:?}
URUN=${UROCE_RUN:?the path of tools/uroce-run}
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of the uroce libibverbs.so.1}
PP=${UROCE_PINGPONG:?}
RPING=${UROCE_RPING:?}
NSX=rxepeer
G() { "$PEER/run-peer.sh" exec 1 "$1"; }  # a command in the guest
# Nothing left over from the previous pairing may hold a port or a QP.
fresh() { G 'killall -q rping udaddy ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_send_lat ib_read_lat ib_atomic_lat 2>/dev/null; true' > /dev/null; }

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

want() { [ -z "${UROCE_INTEROP_ONLY:-}" ] || [[ " $UROCE_INTEROP_ONLY " == *" $1 "* ]]; }
# check_show MSG COND SHOW: check, and on failure print what SHOW prints (both sides' last lines)
check_show() { if eval "$2"; then ok "$1"; else bad "$1 ($2)"; eval "$3" 2>&1 | sed 's/^/    /'; fi; }

# pingpong TAG SIZE ITERS EXTRA: both directions, our side checks every message
pingpong() {
  local tag=$1 sz=$2 n=$3 ex=${4:-}
  want pingpong || return 0
  fresh
  G "timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz $ex </dev/null >/tmp/pp.log 2>&1 &"
  sleep 1
  X timeout 150 "$PP" -d "$TMP/u.app" -n "$n" -s "$sz" -c $ex 10.77.0.2 > "$TMP/pp.out" 2>&1
  check_show "$tag: ibv_rc_pingpong server (rxe) <- uroce-pingpong client, $sz B x $n, every message right" \
    "grep -q '^$n messages checked, 0 bad' $TMP/pp.out && sleep 1 && G 'cat /tmp/pp.log' | grep -q '^$n iters'" \
    "tail -3 $TMP/pp.out; G 'tail -3 /tmp/pp.log'"
  X timeout 150 "$PP" -d "$TMP/u.app" -n "$n" -s "$sz" -c $ex > "$TMP/pps.out" 2>&1 & local sp=$!
  sleep 0.5
  G "timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz $ex 10.77.0.1 > /tmp/ppc.log 2>&1; echo rc=\$?" > "$TMP/ppc.rc"
  wait $sp
  check_show "$tag: uroce-pingpong server <- ibv_rc_pingpong client (rxe), $sz B x $n, every message right" \
    "grep -q rc=0 $TMP/ppc.rc && grep -q '^$n messages checked, 0 bad' $TMP/pps.out" \
    "tail -3 $TMP/pps.out; G 'tail -3 /tmp/ppc.log'"
}

# perftest TAG TEST ITERS EXTRA: rxe's ib_TEST against uroce-perf TEST, both directions
perftest() {
  local tag=$1 t=$2 n=$3 ex=${4:-}
  want "$t" || return 0
  fresh
  G "timeout 120 ib_$t -d rxe0 -x 1 -n $n $ex </dev/null >/tmp/pt.log 2>&1 &"
  sleep 1.5
  # -u 18 (1.07 s ACK timeout): the TCG guest can stall for a good part of a second.
  X timeout 150 "$PERF" "$t" -d "$TMP/u.app" -n "$n" -u 18 $ex --json 10.77.0.2 > "$TMP/pt.json" 2> "$TMP/pt.err"
  local rc=$?
  # read_lat and atomic_lat servers print no result line: they must just not complain.
  local srv_ok="G 'cat /tmp/pt.log' | grep -qE '^ [0-9]+ +$n '"
  case $t in read_lat|atomic_lat) srv_ok="! G 'cat /tmp/pt.log' | grep -qiE 'error|fail|couldn'" ;; esac
  check_show "$tag: ib_$t server (rxe) <- uroce-perf client, $n iterations" \
    "[ $rc -eq 0 ] && /usr/bin/python3 -c 'import json; r=json.load(open(\"$TMP/pt.json\"))[\"results\"][0]; assert r[\"iterations\"]==$n' && sleep 1 && $srv_ok" \
    "tail -3 $TMP/pt.err"
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
  want rping || return 0
  fresh
  G "timeout 120 rping -s -a 10.77.0.2 -C $n -V </dev/null >/tmp/rp.log 2>&1 &"
  sleep 2
  X timeout 150 "$RPING" -c -a 10.77.0.2 -C "$n" -V -d "$TMP/u.app" > "$TMP/rp.out" 2>&1
  check_show "$tag: rping server (rxe) <- uroce-rping client over RDMA CM, $n pings validated" \
    "grep -q '^$n pings, data validated' $TMP/rp.out" "tail -3 $TMP/rp.out"
  fresh
  X timeout 150 "$RPING" -s -C "$n" -d "$TMP/u.app" > "$TMP/rps.out" 2>&1 & local sp=$!
  # rping's client does not retry a refused connect: start it once we listen.
  for i in $(seq 100); do grep -q '^listening' "$TMP/rps.out" && break; sleep 0.1; done
  G "timeout 120 rping -c -a 10.77.0.10 -C $n -V > /tmp/rpc.log 2>&1; echo rc=\$?" > "$TMP/rpc.rc"
  wait $sp
  check_show "$tag: uroce-rping server <- rping -V client (rxe) over RDMA CM, $n pings" \
    "grep -q rc=0 $TMP/rpc.rc && grep -q '^$n pings' $TMP/rps.out" "tail -3 $TMP/rps.out; G 'tail -3 /tmp/rpc.log'"
}

# The same stock binaries on both sides (Debian's, unmodified): uroce's
# through tools/uroce-run on its drop-in libibverbs.so.1 and
# librdmacm.so.1, in the namespace (their TCP exchange reaches the guest).
# The daemon's socket as device uroce0: a run folder holding uroce0.sock.
URUN_X() {
  mkdir -p "$TMP/run" && ln -sf "$TMP/u.app" "$TMP/run/uroce0.sock"
  X timeout 150 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run" "$@"
}

# stock_pingpong TAG SIZE ITERS: ibv_rc_pingpong --chk both ways
stock_pingpong() {
  local tag=$1 sz=$2 n=$3
  want stock || return 0
  fresh
  G "timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz -c </dev/null >/tmp/sp.log 2>&1 &"
  sleep 1
  URUN_X ibv_rc_pingpong -d uroce0 -g 0 -n "$n" -s "$sz" -c 10.77.0.2 > "$TMP/sp.out" 2>&1
  check_show "$tag: ibv_rc_pingpong server (rxe) <- ibv_rc_pingpong client (uroce), $sz B x $n, --chk" \
    "grep -q '$n iters in' $TMP/sp.out && sleep 1 && G 'cat /tmp/sp.log' | grep -q '$n iters in'" \
    "tail -3 $TMP/sp.out; G 'tail -3 /tmp/sp.log'"
  URUN_X ibv_rc_pingpong -d uroce0 -g 0 -n "$n" -s "$sz" -c > "$TMP/sps.out" 2>&1 & local sp=$!
  sleep 0.7
  G "timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz -c 10.77.0.1 > /tmp/spc.log 2>&1; echo rc=\$?" > "$TMP/spc.rc"
  wait $sp
  check_show "$tag: ibv_rc_pingpong server (uroce) <- ibv_rc_pingpong client (rxe), $sz B x $n, --chk" \
    "grep -q rc=0 $TMP/spc.rc && grep -q '$n iters in' $TMP/sps.out" "tail -3 $TMP/sps.out; G 'tail -3 /tmp/spc.log'"
}

# stock_perftest TAG TEST ITERS: Debian's ib_TEST on both sides, both ways.
# perftest takes the peer's outstanding-read count as its own QP's
# max_rd_atomic: rxe offers 128, uroce 16 (as a ConnectX-4 does), so READ
# and atomic tests say -o 16 on both sides, as they would between rxe and
# such a NIC.
stock_perftest() {  # TAG TEST ITERS [EXTRA for both sides]
  local tag=$1 t=$2 n=$3 ex=${4:-}
  case $t in read_*|atomic_*) ex="$ex -o 16" ;; esac
  want stock || want "stock_$t" || return 0
  fresh
  G "timeout 120 ib_$t -d rxe0 -x 1 -n $n $ex </dev/null >/tmp/st.log 2>&1 &"
  sleep 1.5
  URUN_X ib_$t -d uroce0 -x 0 -n "$n" $ex 10.77.0.2 > "$TMP/st.out" 2>&1; local rc=$?
  check_show "$tag: ib_$t server (rxe) <- ib_$t client (uroce, stock perftest), $n iterations" \
    "[ $rc -eq 0 ] && grep -qE '^ +[0-9]+ +$n ' $TMP/st.out" "shown $TMP/st.out; G 'tail -6 /tmp/st.log'"
  fresh
  URUN_X ib_$t -d uroce0 -x 0 -n "$n" $ex > "$TMP/sts.out" 2>&1 & local sp=$!
  sleep 1
  # perftest's exchange is TCP: to the host's kernel address, not uroced's.
  G "timeout 120 ib_$t -d rxe0 -x 1 -n $n $ex 10.77.0.1 > /tmp/stc.log 2>&1; echo rc=\$?" > "$TMP/stc.rc"
  wait $sp; rc=$?
  # A latency test has no closing exchange: the server's last WRITE or
  # SEND is the last message, and the client leaves once it has arrived.
  # If that message's ACK is lost, our retries meet a QP that rxe has
  # destroyed, and perftest ends in RETRY_EXC_ERR on its last completion
  # (scnt=N, ccnt=N-1) and exits 1. The client's N iterations prove that
  # message arrived, so that end (and no other) is a pass, with a note
  # (docs/interop.md; about one run in twenty at 5% loss).
  if [ $rc -ne 0 ] && [[ $t == *_lat ]] && grep -q 'Failed status 12:' $TMP/sts.out &&
     grep -qx "scnt=$n, ccnt=$((n - 1))" $TMP/sts.out; then
    echo "  note: $tag: ib_$t server (uroce): its last message lost its ACK after rxe's client had left (RETRY_EXC_ERR at scnt=$n, ccnt=$((n - 1)))"
    rc=0
  fi
  check_show "$tag: ib_$t server (uroce, stock perftest) <- ib_$t client (rxe), $n iterations" \
    "[ $rc -eq 0 ] && grep -q rc=0 $TMP/stc.rc && G 'cat /tmp/stc.log' | grep -qE '^ +[0-9]+ +$n '" \
    "shown $TMP/sts.out; G 'tail -3 /tmp/stc.log'"
}

# stock_rping TAG COUNT: Debian's rping -V on both sides, over RDMA CM, both ways
stock_rping() {
  local tag=$1 n=$2
  want stock || return 0
  fresh
  G "timeout 120 rping -s -a 10.77.0.2 -C $n -V </dev/null >/tmp/srp.log 2>&1 &"
  sleep 2
  URUN_X rping -c -a 10.77.0.2 -C "$n" -V > "$TMP/srp.out" 2>&1; local rc=$?
  check_show "$tag: rping server (rxe) <- rping -V client (uroce, librdmacm drop-in), $n pings" \
    "[ $rc -eq 0 ] && ! grep -qi mismatch $TMP/srp.out" "tail -3 $TMP/srp.out; G 'tail -3 /tmp/srp.log'"
  fresh
  URUN_X rping -s -a 10.77.0.10 -C "$n" -V > "$TMP/srps.out" 2>&1 & local sp=$!
  sleep 1.5
  G "timeout 120 rping -c -a 10.77.0.10 -C $n -V > /tmp/srpc.log 2>&1; echo rc=\$?" > "$TMP/srpc.rc"
  wait $sp; rc=$?
  check_show "$tag: rping server (uroce, librdmacm drop-in) <- rping -V client (rxe), $n pings" \
    "[ $rc -eq 0 ] && grep -q rc=0 $TMP/srpc.rc && ! grep -qi mismatch $TMP/srps.out" \
    "tail -3 $TMP/srps.out; G 'tail -3 /tmp/srpc.log'"
}

# stock_udaddy TAG: Debian's udaddy on both sides, UD through rdma_cm
# (SIDR), 10 datagrams each way, both ways
stock_udaddy() {
  local tag=$1
  want udaddy || return 0
  fresh
  G "timeout 60 udaddy -C 10 -S 500 </dev/null >/tmp/sud.log 2>&1 &"
  sleep 2
  URUN_X udaddy -s 10.77.0.2 -C 10 -S 500 > "$TMP/sud.out" 2>&1; local rc=$?
  check_show "$tag: udaddy server (rxe) <- udaddy client (uroce, librdmacm drop-in), SIDR and 10 datagrams each way" \
    "[ $rc -eq 0 ] && grep -q 'data transfers complete' $TMP/sud.out" "tail -3 $TMP/sud.out; G 'tail -3 /tmp/sud.log'"
  fresh
  URUN_X udaddy -C 10 -S 500 > "$TMP/suds.out" 2>&1 & local sp=$!
  sleep 1.5
  G "timeout 60 udaddy -s 10.77.0.10 -C 10 -S 500 > /tmp/sudc.log 2>&1; echo rc=\$?" > "$TMP/sudc.rc"
  wait $sp; rc=$?
  check_show "$tag: udaddy server (uroce, librdmacm drop-in) <- udaddy client (rxe), SIDR and 10 datagrams each way" \
    "[ $rc -eq 0 ] && grep -q rc=0 $TMP/sudc.rc && grep -q 'data transfers complete' $TMP/suds.out" \
    "tail -3 $TMP/suds.out; G 'tail -3 /tmp/sudc.log'"
}

strict() {  # TAG: the capture decodes, every ICRC is right
  "$UROCE_PCAP" --strict --quiet "$TMP/$1.pcap" > "$TMP/$1.strict" 2>&1
  local rc=$?
  check "$1: uroce-pcap --strict passes on the capture ($(tail -1 "$TMP/$1.strict"))" "[ $rc -eq 0 ]"
}

# loss_evidence TAG: from uroce-pcap's per-QP summary of the capture, NAK
# sequence errors and retransmissions (repeated PSNs) in both directions, and
# no RNR NAKs (every receiver here posts its receives ahead).
loss_evidence() {
  local f="$TMP/$1.pcap"
  [ -z "${UROCE_INTEROP_ONLY:-}" ] || return 0
  "$UROCE_PCAP" --json --quiet "$f" > "$TMP/$1.json" 2>/dev/null
  /usr/bin/python3 - "$TMP/$1.json" > "$TMP/$1.sum" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for who, dst in (("uroce", "10.77.0.2"), ("rxe", "10.77.0.10")):
    q = [x for x in d["qps"] if x["dst"] == dst]
    print(who, sum(x["naks"]["psn_seq_error"] for x in q), sum(x["psn_repeats"] for x in q),
          sum(x["rnr_naks"] for x in q), sum(x["acks"] for x in q))
PY
  local u r
  u=($(grep '^uroce' "$TMP/$1.sum")) r=($(grep '^rxe' "$TMP/$1.sum"))
  echo "  $1: sent by uroce: ${u[1]} NAK seq, ${u[2]} retransmitted, ${u[3]} RNR NAK, ${u[4]} ACKs; by rxe: ${r[1]} NAK seq, ${r[2]} retransmitted, ${r[3]} RNR NAK, ${r[4]} ACKs"
  check "$1: both sides sent NAK sequence errors and retransmitted (go-back-N interoperating)" \
    "[ ${u[1]:-0} -gt 0 ] && [ ${r[1]:-0} -gt 0 ] && [ ${u[2]:-0} -gt 0 ] && [ ${r[2]:-0} -gt 0 ]"
  check "$1: no RNR NAKs either way (receives are always posted ahead)" "[ ${u[3]:-1} -eq 0 ] && [ ${r[3]:-1} -eq 0 ]"
}

# set_loss PCT: the guest's bridge drops PCT% of RoCEv2 frames, both ways (0: none)
set_loss() {
  ip netns exec $NSX nft delete table bridge uroce_loss 2>/dev/null
  [ "$1" -gt 0 ] || return 0
  ip netns exec $NSX nft -f - <<EOF
table bridge uroce_loss {
  chain lossy {
    type filter hook forward priority 0; policy accept;
    udp dport 4791 numgen random mod 100 < $1 counter drop
  }
}
EOF
}
dropped() { ip netns exec $NSX nft list table bridge uroce_loss | grep -o 'packets [0-9]*'; }
