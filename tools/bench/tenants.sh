#!/bin/bash
# Tenant isolation, with Debian's perftest unmodified through the drop-in,
# in one run (docs/performance.md, "Tenants"):
#   latency: a victim (uid 0) runs ib_send_lat -s 64, alone and then beside
#     a flooder (uid 65534) running ib_write_bw -s 64 on 64 QPs, alternately;
#     its p99 and max half round trip in each;
#   bulk: the victim's ib_write_bw (1 QP, 64 KiB) beside the flooder's
#     (64 QPs, 64 KiB), with the flooder as another uid (the transmit share
#     splits the wire) and, as the control, as the same uid (no share).
# One daemon carries both tenants, its QPs connected to its own address
# (loopback); it runs on CPU 0, the applications on CPU 1. The flooder's
# processes run SCHED_IDLE in the latency part, so what the victim measures
# is the daemon's share, not the kernel's CPU scheduler on 2 cores.
#   tools/bench/tenants.sh [BUILD_DIR] [ROUNDS]
set -u
build=${1:-build}
rounds=${2:-3}
export UROCED=$(realpath "$build/control/uroced")
IBV_DIR=$(realpath "$build/stack/ibverbs")
URUN=$(realpath "$(dirname "$0")/../uroce-run")
. "$(dirname "$0")/../../tests/integration/lib.sh"
. "$(dirname "$0")/../../tests/integration/ready.sh"
need_root
chmod 0755 "$TMP"
APP="$TMP/uroce0.sock"  # the device is named after its socket: uroce0
start_daemon "" td --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.95.0.1 --lcore 0 \
  --app-socket "$APP" --app-socket-mode 0666 --ctl-socket "$TMP/d.ctl" ${UROCE_TENANTS_ARGS:-}
wait_sockets "$APP" || { echo "the daemon did not start"; exit 1; }
start_daemon "" tp --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.95.0.2 --lcore 1 \
  --app-socket "$TMP/p.app"  # the link's other end, idle: loopback traffic turns around in the first daemon
wait_sockets "$TMP/p.app" || { echo "the peer daemon did not start"; exit 1; }
sleep 1

# pt AS SCHED PORT OUT TEST ARGS...: a perftest server and client, as uid
# AS (0 or 65534), under SCHED (e.g. "chrt -i 0" or ""), on CPU 1.
pt() {
  local as=$1 sched=$2 port=$3 out=$4 t=$5; shift 5
  local who=""
  [ "$as" != 0 ] && who="setpriv --reuid=$as --regid=$as --clear-groups"
  taskset -c 1 $sched $who env HOME=/ "$URUN" --lib "$IBV_DIR" --socket "$APP" $t -d uroce0 -x 0 -p "$port" "$@" \
    > "$out.s" 2>&1 &
  local sp=$!
  wait_listen "" "" "$port" || echo "  ($t: the server never listened on $port)"
  taskset -c 1 $sched $who env HOME=/ "$URUN" --lib "$IBV_DIR" --socket "$APP" $t -d uroce0 -x 0 -p "$port" "$@" 127.0.0.1 \
    > "$out.c" 2>&1 &
  PT_CLIENT=$!
  PT_SERVER=$sp
}

# lat PORT OUT: the victim's ib_send_lat (events), prints "p99 max typical".
lat() {
  pt 0 "" "$1" "$2" ib_send_lat -s 64 -n 20000 -e
  wait $PT_CLIENT $PT_SERVER
  awk '$1 == 64 && $2 == 20000 {print $8, $4, $5}' "$2.c"
}

echo "== latency: victim ib_send_lat -s 64 (uid 0), flood ib_write_bw -s 64 -q 64 (uid 65534, SCHED_IDLE)"
port=19000
declare -a OFF ON
for r in $(seq 1 "$rounds"); do
  port=$((port + 1))
  read -r p99 mx ty <<< "$(lat $port "$TMP/off$r")"
  OFF+=("$p99 $mx $ty")
  pt 65534 "chrt -i 0" $((port += 1)) "$TMP/flood$r" ib_write_bw -s 64 -q 64 -D 30 -l 16
  fc=$PT_CLIENT fs=$PT_SERVER
  sleep 3  # the flood is running
  port=$((port + 1))
  read -r p99f mxf tyf <<< "$(lat $port "$TMP/on$r")"
  ON+=("$p99f $mxf $tyf")
  kill $fc $fs 2>/dev/null; wait $fc $fs 2>/dev/null
  echo "  round $r: alone p99 $p99 us (max $mx, typical $ty); beside the flood p99 $p99f us (max $mxf, typical $tyf)"
  sleep 1
done
st=$(ctl "$TMP/d.ctl" status)
echo "  the flooder's share: $(echo "$st" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["limits"]["tx_share"]["tenants"])')"

# tx UID: wire bytes uid UID's QPs have sent (the daemon's own count, while
# two tenants hold QPs).
tx() {
  ctl "$TMP/d.ctl" status | /usr/bin/python3 -c '
import json, sys
t = [x for x in json.load(sys.stdin)["limits"]["tx_share"]["tenants"] if x["uid"] == int(sys.argv[1])]
print(t[0]["tx_bytes"] if t else 0)' "$1"
}
# bulk AS PORT OUT: the flooder's ib_write_bw -s 65536 -q 64 (as uid AS)
# and the victim's (uid 0, 1 QP) together; prints "victim flooder" in MB/s
# over the same 4 s in the middle, from the daemon's counters (as uid 0 the
# flooder is the victim's tenant, and the split is read from perftest).
bulk() {
  pt "$1" "" "$2" "$3.f" ib_write_bw -s 65536 -q 64 -D 12
  local fc=$PT_CLIENT fs=$PT_SERVER
  pt 0 "" $(($2 + 1)) "$3.v" ib_write_bw -s 65536 -D 10
  local vc=$PT_CLIENT vs=$PT_SERVER
  local v0 f0 v1 f1 out
  sleep 3
  v0=$(tx 0); f0=$(tx "$1")
  sleep 4
  v1=$(tx 0); f1=$(tx "$1")
  wait $vc $vs $fc $fs
  if [ "$1" != 0 ]; then
    out="$(((v1 - v0) / 4000000)) $(((f1 - f0) / 4000000))"
  else
    out="$(awk '$1 == 65536 {print $4}' "$3.v.c") $(awk '$1 == 65536 {print $4}' "$3.f.c")"
  fi
  grep -h "Completion with error\|Failed" "$3".*.c "$3".*.s >&2
  echo "$out"
}
echo "== bulk: victim ib_write_bw -s 65536 (1 QP) beside the flooder's (64 QPs), MB/s"
port=$((port + 2))
read -r v2 f2 <<< "$(bulk 65534 $port "$TMP/bulk-other")"
echo "  flooder as another uid (its own share), wire MB/s over 4 s: victim $v2, flooder $f2"
port=$((port + 2))
read -r v1 f1 <<< "$(bulk 0 $port "$TMP/bulk-same")"
echo "  flooder as the same uid (control: one share, QPs take turns), perftest MB/s: victim $v1, flooder $f1"

/usr/bin/python3 - "${OFF[@]}" -- "${ON[@]}" "$v2" "$f2" "$v1" "$f1" <<'PY'
import sys
a = sys.argv[1:]
k = a.index("--")
off = [list(map(float, x.split())) for x in a[:k]]
rest = a[k + 1:]
on = [list(map(float, x.split())) for x in rest[:len(off)]]
v2, f2, v1, f1 = map(float, rest[len(off):])
med = lambda xs: sorted(xs)[len(xs) // 2]
print("| victim, 64 B send_lat, us (%d rounds, each alone then beside the flood) | alone, median (range) | beside the flood, median (range) | ratio of medians | ratio in each round | goal |" % len(off))
print("|---|---|---|---|---|---|")
for i, name in ((0, "p99"), (2, "typical"), (1, "max")):
    a_, b_ = [r[i] for r in off], [r[i] for r in on]
    print("| %s | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.2f | %s | %s |" % (
        name, med(a_), min(a_), max(a_), med(b_), min(b_), max(b_), med(b_) / med(a_),
        ", ".join("%.2f" % (y / x) for x, y in zip(a_, b_)), "<= 1.10" if i == 0 else ""))
print()
print("| bulk, 64 KiB WRITEs | victim's share | goal |")
print("|---|---|---|")
print("| flooder another uid (its own share) | %.3f (%.0f of %.0f MB/s on the wire) | >= 0.5 |" % (v2 / (v2 + f2), v2, v2 + f2))
print("| flooder the same uid (control: no share between them) | %.3f (%.0f of %.0f MB/s, perftest) | |" % (v1 / (v1 + f1), v1, v1 + f1))
PY
finish_ok=1
