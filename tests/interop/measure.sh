#!/bin/bash
# Latency and bandwidth in the rxe guest setup, same bridge, same run:
# rxe <-> rxe (two guests), uroce <-> rxe, uroce <-> uroce (two uroced on the
# bridge). perftest's ib_send_lat (2 B) and ib_write_bw (64 KiB) against
# uroce-perf's same tests. A measurement, not a test: prints a table.
#   tests/interop/measure.sh BUILD_DIR          (root)
set -u
build=$(realpath "${1:-build}")
export UROCED=$build/control/uroced UROCE_PCAP=$build/tools/uroce-pcap
. "$(dirname "$0")/../integration/lib.sh"
need_root
PEER=$(realpath "$(dirname "$0")/../../../shared/peers/rxe-vm")
PERF=$build/tools/perf/uroce-perf
NSX=rxepeer
N_LAT=${N_LAT:-300}
N_BW=${N_BW:-200}
trap 'ip -n $NSX link del uv0 2>/dev/null; ip -n $NSX link del uv2 2>/dev/null; "$PEER/run-peer.sh" down >/dev/null 2>&1; cleanup' EXIT
[ -f "${UROCE_RXE_PEER_DIR:-/var/cache/uroce-rxe-peer}/vmlinuz" ] || "$PEER/make-peer.sh" > "$TMP/mk.log" 2>&1
"$PEER/run-peer.sh" down > /dev/null 2>&1
"$PEER/run-peer.sh" up 2 | sed 's/^/  /'
for v in 0 2; do
  ip -n $NSX link add uv$v type veth peer name uv$((v + 1))
  ip -n $NSX link set uv$((v + 1)) master br0
  ip -n $NSX link set uv$v up; ip -n $NSX link set uv$((v + 1)) up
done
start_daemon $NSX ua --port net_af_packet0 --vdev "net_af_packet0,iface=uv0,framesz=9216,blocksz=36864,framecnt=512" \
  --ip 10.77.0.10 --lcore 0 --app-socket "$TMP/a.app"
start_daemon $NSX ub --port net_af_packet0 --vdev "net_af_packet0,iface=uv2,framesz=9216,blocksz=36864,framecnt=512" \
  --ip 10.77.0.11 --lcore 1 --app-socket "$TMP/b.app"
sleep 2
G() { "$PEER/run-peer.sh" exec "$1" "$2"; }
lat_of() { awk '/^ [0-9]+ +[0-9]+ +[0-9.]+/ {print $5; exit}'; }   # t_typical
bw_of() { awk '/^ [0-9]+ +[0-9]+ +[0-9.]+/ {print $4; exit}'; }    # BW average MB/s

# rxe <-> rxe
G 2 "ib_send_lat -d rxe0 -x 1 -n $N_LAT </dev/null >/tmp/l.log 2>&1 &"; sleep 1.5
rr_lat=$(G 1 "ib_send_lat -d rxe0 -x 1 -n $N_LAT 10.77.0.3" | lat_of)
G 2 "ib_write_bw -d rxe0 -x 1 -n $N_BW </dev/null >/tmp/b.log 2>&1 &"; sleep 1.5
rr_bw=$(G 1 "ib_write_bw -d rxe0 -x 1 -n $N_BW 10.77.0.3" | bw_of)
# uroce <-> rxe (uroce client)
G 1 "ib_send_lat -d rxe0 -x 1 -n $N_LAT </dev/null >/tmp/l.log 2>&1 &"; sleep 1.5
ur_lat=$(ip netns exec $NSX "$PERF" send_lat -d "$TMP/a.app" -n $N_LAT 10.77.0.2 | lat_of)
G 1 "ib_write_bw -d rxe0 -x 1 -n $N_BW </dev/null >/tmp/b.log 2>&1 &"; sleep 1.5
ur_bw=$(ip netns exec $NSX "$PERF" write_bw -d "$TMP/a.app" -n $N_BW 10.77.0.2 | bw_of)
# uroce <-> uroce, same bridge
ip netns exec $NSX "$PERF" send_lat -d "$TMP/b.app" -n $N_LAT -p 18600 > /dev/null 2>&1 & sleep 0.5
uu_lat=$(ip netns exec $NSX "$PERF" send_lat -d "$TMP/a.app" -n $N_LAT -p 18600 127.0.0.1 | lat_of); wait $!
ip netns exec $NSX "$PERF" write_bw -d "$TMP/b.app" -n $N_BW -p 18601 > /dev/null 2>&1 & sleep 0.5
uu_bw=$(ip netns exec $NSX "$PERF" write_bw -d "$TMP/a.app" -n $N_BW -p 18601 127.0.0.1 | bw_of); wait $!
echo
echo "| pairing | ib_send_lat 2 B, t_typical (us) | ib_write_bw 64 KiB, average (MB/s) |"
echo "|---|---|---|"
echo "| rxe <-> rxe (two TCG guests) | ${rr_lat:-?} | ${rr_bw:-?} |"
echo "| uroce <-> rxe | ${ur_lat:-?} | ${ur_bw:-?} |"
echo "| uroce <-> uroce (two uroced on the same bridge) | ${uu_lat:-?} | ${uu_bw:-?} |"
