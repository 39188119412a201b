#!/bin/bash
# A real distributed runtime on uroce: Debian's UCX (ucx-utils) and Open
# MPI over it, unmodified, through uroce's libibverbs.so.1 and
# librdmacm.so.1 (tools/uroce-run --ucx). Two uroced on net_af_packet in
# two network namespaces joined by veth (the RoCE traffic crosses between
# them); the programs reach their daemons through the application sockets.
#   ucx_info -d lists uroce0 with rc_verbs and ud_verbs;
#   ucx_perftest (tag latency and bandwidth over rc_verbs, latency over
#   ud_verbs) between the two daemons;
#   mpirun: a two-rank MPI program (mpi_ring) with the UCX PML, every byte
#   of every message checked, and the traffic seen in the daemons' counters.
. "$(dirname "$0")/lib.sh"
need_root
unset LD_LIBRARY_PATH  # uroced's EAL needs the system's libibverbs
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of the uroce libibverbs.so.1}
URUN=${UROCE_RUN:?the path of tools/uroce-run}
RING=${MPI_RING:-}
for t in ucx_info ucx_perftest; do
  command -v $t > /dev/null || { echo "SKIP: $t is not installed (ucx-utils)"; exit 77; }
done
make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"
mkdir -p "$TMP/run_a" "$TMP/run_b"
start_daemon "$NS_A" da --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 \
  --app-socket "$TMP/run_a/uroce0.sock" --ctl-socket "$TMP/a.ctl"
DA=$LAST_PID
start_daemon "$NS_B" db --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
  --app-socket "$TMP/run_b/uroce0.sock"
DB=$LAST_PID
for i in $(seq 50); do [ -S "$TMP/run_a/uroce0.sock" ] && [ -S "$TMP/run_b/uroce0.sock" ] && [ -S "$TMP/a.ctl" ] && break; sleep 0.1; done
ua() { "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" "$@"; }
ub() { "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_b" "$@"; }
sent() { ctl "$TMP/a.ctl" status | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["qp_totals"]["sent_pkts"])'; }

echo "== ucx_info -d"
timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" --ucx ucx_info -d > "$TMP/info.out" 2>&1; rc=$?
grep -E 'Transport: (rc|ud)_verbs' -A1 "$TMP/info.out" | sed 's/^/  /'
check "ucx_info -d lists uroce0:1 with rc_verbs and ud_verbs" \
  "[ $rc -eq 0 ] && grep -A1 'Transport: rc_verbs' '$TMP/info.out' | grep -q 'Device: uroce0:1' && grep -A1 'Transport: ud_verbs' '$TMP/info.out' | grep -q 'Device: uroce0:1'"
timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" ucx_info -d > "$TMP/info-plain.out" 2>&1
check "without --ucx, UCX 1.13 skips uroce0 (no /dev/infiniband node): the reason uroce-run --ucx exists" \
  "! grep -q 'Device: uroce0' '$TMP/info-plain.out'"

echo "== ucx_perftest between the daemons (in two namespaces)"
port=13400
uperf() {  # tag tls test-args...
  local tag=$1 tls=$2; shift 2
  port=$((port + 1))
  timeout 60 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" --ucx env UCX_TLS=$tls UCX_NET_DEVICES=uroce0:1 \
    stdbuf -oL ucx_perftest -p $port "$@" > "$TMP/ups-$tag.out" 2>&1 & local sp=$!
  sleep 1
  timeout 60 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_b" --ucx env UCX_TLS=$tls UCX_NET_DEVICES=uroce0:1 \
    stdbuf -oL ucx_perftest -p $port "$@" 127.0.0.1 > "$TMP/upc-$tag.out" 2>&1; local crc=$?
  wait $sp; local src=$?
  local fin=$(grep '^Final:' "$TMP/upc-$tag.out" | tr -s ' ')
  echo "  $tag ($tls): client exit $crc, server exit $src; $fin"
  [ $crc -eq 0 ] && [ $src -eq 0 ] || tail -n 5 "$TMP/upc-$tag.out" "$TMP/ups-$tag.out" | sed 's/^/    /'
  check "ucx_perftest $tag over $tls" "[ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n '$fin' ]"
}
before=$(sent)
uperf tag_lat rc_verbs,ud_verbs -t tag_lat -n 2000
uperf tag_bw-64k rc_verbs,ud_verbs -t tag_bw -n 500 -s 65536
uperf ud_lat ud_verbs -t tag_lat -n 2000
after=$(sent)
echo "  daemon A sent $((after - before)) packets for them"
check "the UCX traffic went through daemon A" "[ $((after - before)) -gt 4000 ]"

echo "== Open MPI over UCX: two ranks, one on each daemon"
if [ -n "$RING" ] && [ -x "$RING" ] && command -v mpirun > /dev/null; then
  before=$(sent)
  timeout 120 mpirun --allow-run-as-root --oversubscribe --mca pml ucx --mca btl self --mca osc ^ucx \
    -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=uroce0:1 \
    -np 1 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" --ucx "$RING" 10 : \
    -np 1 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_b" --ucx "$RING" 10 > "$TMP/mpi.out" 2>&1; rc=$?
  after=$(sent)
  grep '^rank' "$TMP/mpi.out" | sed 's/^/  /'
  [ $rc -eq 0 ] || tail -n 8 "$TMP/mpi.out" | sed 's/^/    /'
  check "mpirun: both ranks sent and received every message, every byte, and the Allreduce" \
    "[ $rc -eq 0 ] && grep -q 'rank 0: [1-9][0-9]* passed, 0 failed' '$TMP/mpi.out' && grep -q 'rank 1: [1-9][0-9]* passed, 0 failed' '$TMP/mpi.out'"
  echo "  daemon A sent $((after - before)) packets for it"
  check "the MPI traffic went through uroce (daemon A's counters)" "[ $((after - before)) -gt 2000 ]"
else
  echo "  (Open MPI or mpi_ring not built: skipped)"
fi
check "the daemons are still up" "kill -0 $DA && kill -0 $DB"
finish
