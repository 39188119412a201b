#!/bin/bash
# A real distributed runtime on uroce: Debian's UCX (ucx-utils) and Open
# MPI over it, unmodified, through uroce's libibverbs.so.1 and
# librdmacm.so.1 (tools/uroce-run --ucx). Two uroced on net_af_packet in
# two network namespaces joined by veth (the RoCE traffic crosses between
# them); the programs reach their daemons through the application sockets.
#   dpkg -V: the UCX and Open MPI packages are as Debian shipped them, and
#   the programs and plugin folders run are theirs;
#   ucx_info -d lists uroce0 with rc_verbs and ud_verbs;
#   ucx_perftest: tag latency and 64 KiB bandwidth over rc_verbs, latency
#   over ud_verbs;
#   ucx_check: UCX's tag API over rc_verbs, every byte of every message
#   checked (ucx_perftest checks no data), 1 byte to 4 MiB, twice: through
#   worker addresses, and client-server through UCX's rdmacm connection
#   manager with UCX_TLS=rc_verbs alone;
# Through worker addresses, UCX_TLS=rc_verbs alone cannot connect in UCX
# 1.13 ("no auxiliary transport": it wires up RC endpoints over a
# connectionless transport), so those runs allow ud_verbs too, and the
# per-QP check below is what shows that RC carried the data.
#   mpirun: a two-rank MPI program (mpi_ring) with the UCX PML, every byte
#   of every message checked.
# Each run is held (qp_hold.c, or the program's own -H / MPI_RING_HOLD)
# after its traffic and before its QPs go, and daemon A's per-QP status must
# then show QPs of the expected type (RC; UD for the ud_verbs run) that
# carried at least the run's known minimum of packets and 90% of all the
# packets daemon A's QPs counted during the run.
. "$(dirname "$0")/lib.sh"
need_root
unset LD_LIBRARY_PATH  # uroced's EAL needs the system's libibverbs
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of the uroce libibverbs.so.1}
URUN=${UROCE_RUN:?the path of tools/uroce-run}
QP_HOLD=${QP_HOLD:?the path of libqp_hold.so}
need_prog ucx_info ucx-utils
need_prog ucx_perftest ucx-utils
need_prog mpirun openmpi-bin
[ -x "${MPI_RING:-}" ] || bad "mpi_ring is not built: meson found no MPI for C (libopenmpi-dev, which tools/setup.sh installs)"
[ -x "${UCX_CHECK:-}" ] || bad "ucx_check is not built: meson found no ucx.pc (libucx-dev, which tools/setup.sh installs)"

echo "== the UCX and Open MPI packages are Debian's, unmodified"
# Every file, configuration files included: /etc/openmpi's MCA defaults
# steer what mpirun does as much as a library does.
debian_unmodified ucx-utils libucx0 openmpi-bin openmpi-common libopenmpi3 libpmix2
owner() { dpkg -S "$(readlink -f "$(command -v "$1")")" 2>/dev/null | cut -d: -f1; }
check "ucx_info and ucx_perftest are ucx-utils', mpirun is openmpi-bin's" \
  "[ '$(owner ucx_info)' = ucx-utils ] && [ '$(owner ucx_perftest)' = ucx-utils ] && [ '$(owner mpirun)' = openmpi-bin ]"
# UCX and Open MPI load every plugin in their folders: each file there
# belongs to a package (libucx-dev adds the .so links to UCX's), and those
# packages verify too.
FOLDERS="$(dpkg -L libucx0 | grep -m1 '/ucx$') $(dpkg -L libopenmpi3 | grep -m1 '/openmpi3$')"
find $FOLDERS -type f -o -type l | sort > "$TMP/plugins"
xargs -r dpkg -S < "$TMP/plugins" > "$TMP/owners" 2> "$TMP/unowned"; rc=$?
sed 's/^/  /' "$TMP/unowned"
owners=$(cut -d: -f1 "$TMP/owners" | tr , '\n' | sort -u | tr '\n' ' ')
dpkg -V $owners > "$TMP/dpkg-v2.out" 2>&1; rc2=$?
sed 's/^/  /' "$TMP/dpkg-v2.out"
check "the $(wc -l < "$TMP/plugins") files in $FOLDERS all belong to packages ($owners), which verify" \
  "[ -n '$FOLDERS' ] && [ $rc -eq 0 ] && [ ! -s '$TMP/unowned' ] && [ -n '$owners' ] && [ $rc2 -eq 0 ] && [ ! -s '$TMP/dpkg-v2.out' ]"

make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"
mkdir -p "$TMP/run_a" "$TMP/run_b"
start_daemon "$NS_A" da --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 \
  --app-socket "$TMP/run_a/uroce0.sock" --ctl-socket "$TMP/a.ctl"
DA=$LAST_PID
start_daemon "$NS_B" db --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
  --app-socket "$TMP/run_b/uroce0.sock"
DB=$LAST_PID
# wait_for COND: a readiness probe, at most 600 tries 0.1 s apart.
wait_for() { local i; for i in $(seq 600); do eval "$1" && return 0; sleep 0.1; done; return 1; }
wait_for "[ -S '$TMP/run_a/uroce0.sock' ] && [ -S '$TMP/run_b/uroce0.sock' ] && [ -S '$TMP/a.ctl' ]"
up="[ -S '$TMP/run_a/uroce0.sock' ] && [ -S '$TMP/run_b/uroce0.sock' ] && [ -S '$TMP/a.ctl' ]"
check "both daemons are up, with their sockets" "$up"
eval "$up" || { finish; exit 1; }
listening() { ss -Hltn "sport = :$1" | grep -q .; }
# pkts: packets sent and received by all of daemon A's QPs so far
# (qp_totals keeps the counts of destroyed QPs).
pkts() { ctl "$TMP/a.ctl" status | /usr/bin/python3 -c 'import json,sys; t=json.load(sys.stdin)["qp_totals"]; print(t["sent_pkts"] + t["rcvd_pkts"])'; }
# snapshots DIR PID: while PID runs, each time one of its processes stops
# in DIR (held.ID, from qp_hold, ucx_check -H or MPI_RING_HOLD), appends
# daemon A's status to DIR/status and lets it go on (release.ID). Returns
# 1 if no process ever stopped there. At most 50 stops, each waited for by
# a bounded probe.
pending() { local f; for f in "$1"/held.*; do [ -e "$f" ] && [ ! -e "$1/release.${f##*/held.}" ] && return 0; done; return 1; }
snapshots() {
  local dir=$1 pid=$2 n=0 f id
  for _ in $(seq 50); do
    wait_for "pending '$dir' || ! kill -0 $pid 2> /dev/null" || true
    pending "$dir" || break
    for f in "$dir"/held.*; do
      id=${f##*/held.}
      [ -e "$dir/release.$id" ] && continue
      ctl "$TMP/a.ctl" status >> "$dir/status"
      touch "$dir/release.$id"
      n=$((n + 1))
    done
  done
  [ $n -gt 0 ]
}
# qp_use FILE BASE TYPE: of the statuses in FILE, the one whose live QPs of
# TYPE carried the most packets: "RC_QPS RC_PKTS UD_QPS UD_PKTS RUN_PKTS",
# daemon A's live QPs of each type that carried packets, their packets
# (sent and received), and all its QPs' packets since BASE.
qp_use() { /usr/bin/python3 -c '
import json, sys
best = None
for line in open(sys.argv[1]):
    d = json.loads(line); t = d["qp_totals"]
    use = {"RC": [0, 0], "UC": [0, 0], "UD": [0, 0]}
    for q in d["qp_list"]:
        p = q["sent_pkts"] + q["rcvd_pkts"]
        if p:
            use[q["type"]][0] += 1
            use[q["type"]][1] += p
    row = (use["RC"][0], use["RC"][1], use["UD"][0], use["UD"][1], t["sent_pkts"] + t["rcvd_pkts"] - int(sys.argv[2]))
    if best is None or use[sys.argv[3]][1] > best[1 if sys.argv[3] == "RC" else 3]:
        best = row
print(*(best or (0, 0, 0, 0, 0)))' "$1" "$2" "$3"; }
# qp_check NAME TYPE MIN FILE BASE: daemon A's QPs of TYPE carried the run.
qp_check() {
  local name=$1 type=$2 min=$3 rcq rcp udq udp run
  touch "$4"
  read -r rcq rcp udq udp run <<< "$(qp_use "$4" "$5" "$type")"
  echo "  daemon A's QPs with traffic, before the program's QPs went: $rcq RC ($rcp packets), $udq UD ($udp packets); $run packets on all its QPs during the run"
  if [ "$type" = RC ]; then
    check "$name: RC QPs carried the traffic (at least $min packets and 90% of the run's)" \
      "[ $rcq -ge 1 ] && [ $rcp -ge $min ] && [ $((rcp * 10)) -ge $((run * 9)) ]"
  else
    check "$name: a UD QP carried the traffic (at least $min packets and 90% of the run's), no RC QP" \
      "[ $udq -ge 1 ] && [ $rcq -eq 0 ] && [ $udp -ge $min ] && [ $((udp * 10)) -ge $((run * 9)) ]"
  fi
}

echo "== ucx_info -d"
timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" --ucx ucx_info -d > "$TMP/info.out" 2>&1; rc=$?
grep -E 'Transport: (rc|ud)_verbs' -A1 "$TMP/info.out" | sed 's/^/  /'
check "ucx_info -d lists uroce0:1 with rc_verbs and ud_verbs" \
  "[ $rc -eq 0 ] && grep -A1 'Transport: rc_verbs' '$TMP/info.out' | grep -q 'Device: uroce0:1' && grep -A1 'Transport: ud_verbs' '$TMP/info.out' | grep -q 'Device: uroce0:1'"
timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" ucx_info -d > "$TMP/info-plain.out" 2>&1
check "without --ucx, UCX 1.13 skips uroce0 (no /dev/infiniband node): the reason uroce-run --ucx exists" \
  "! grep -q 'Device: uroce0' '$TMP/info-plain.out'"

port=13400

echo "== ucx_perftest between the daemons (in two namespaces)"
# uperf NAME UCX_TLS QP_TYPE MIN_PKTS ARGS...: the server on daemon A, held
# by qp_hold in its first ibv_destroy_qp of a QP_TYPE QP.
uperf() {
  local name=$1 tls=$2 type=$3 min=$4 dir=$TMP/hold-$1 base st crc src sp cp fin
  shift 4
  port=$((port + 1))
  mkdir -p "$dir"
  base=$(pkts)
  LD_PRELOAD=$QP_HOLD UROCE_HOLD_DIR=$dir UROCE_HOLD_QP_TYPE=$type timeout 120 \
    "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" --ucx env UCX_TLS=$tls UCX_NET_DEVICES=uroce0:1 \
    stdbuf -oL ucx_perftest -p $port "$@" > "$TMP/ups-$name.out" 2>&1 & sp=$!
  wait_for "listening $port || ! kill -0 $sp 2> /dev/null"
  timeout 120 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_b" --ucx env UCX_TLS=$tls UCX_NET_DEVICES=uroce0:1 \
    stdbuf -oL ucx_perftest -p $port "$@" 127.0.0.1 > "$TMP/upc-$name.out" 2>&1 & cp=$!
  snapshots "$dir" $sp; local h=$?
  wait $cp; crc=$?
  wait $sp; src=$?
  fin=$(grep '^Final:' "$TMP/upc-$name.out" | tr -s ' ')
  echo "  $name (UCX_TLS=$tls): client exit $crc, server exit $src; $fin"
  [ $crc -eq 0 ] && [ $src -eq 0 ] || shown "$TMP/upc-$name.out" "$TMP/ups-$name.out" | sed 's/^/    /'
  check "ucx_perftest $name over $tls" "[ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n '$fin' ]"
  check "$name: the server stopped in its destroys of $type QPs (qp_hold)" "[ $h -eq 0 ]"
  qp_check "$name" "$type" "$min" "$dir/status" "$base"
}
# The minimum of packets on daemon A's QPs (the server's): for latency, one
# message each way per iteration; for 64 KiB bandwidth, 16 packets of
# 4096 bytes per message received.
uperf tag_lat rc_verbs,ud_verbs RC 4000 -t tag_lat -n 2000
uperf tag_bw-64k rc_verbs,ud_verbs RC 8000 -t tag_bw -n 500 -s 65536
uperf ud_lat ud_verbs UD 4000 -t tag_lat -n 2000

# ucheck NAME UCX_TLS [VAR=VALUE...] [-a IP]: ucx_check between the daemons
# (server on daemon A, held by -H), every byte checked, and RC carrying it.
ucheck() {
  local name=$1 tls=$2 dir=$TMP/hold-$1 base h crc src sp cp envs=()
  shift 2
  while [ $# -gt 0 ] && [[ $1 == *=* ]]; do envs+=("$1"); shift; done
  port=$((port + 2))
  mkdir -p "$dir"
  base=$(pkts)
  timeout 120 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" --ucx env UCX_TLS=$tls UCX_NET_DEVICES=uroce0:1 "${envs[@]}" "$UCX_CHECK" -p $port -n 3 -H "$dir" "$@" > "$TMP/ucs-$name.out" 2>&1 & sp=$!
  wait_for "listening $port || ! kill -0 $sp 2> /dev/null"
  timeout 120 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_b" --ucx env UCX_TLS=$tls UCX_NET_DEVICES=uroce0:1 "${envs[@]}" "$UCX_CHECK" -p $port -n 3 "$@" 127.0.0.1 > "$TMP/ucc-$name.out" 2>&1 & cp=$!
  snapshots "$dir" $sp; h=$?
  wait $cp; crc=$?
  wait $sp; src=$?
  grep -h 'passed' "$TMP/ucs-$name.out" "$TMP/ucc-$name.out" | sed 's/^/  /'
  [ $crc -eq 0 ] && [ $src -eq 0 ] || shown "$TMP/ucc-$name.out" "$TMP/ucs-$name.out" | sed 's/^/    /'
  # 3 rounds of 10 sizes, each way: 30 messages checked on each side.
  check "$name (UCX_TLS=$tls): both sides received 30 messages, every byte right" \
    "[ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q '^ucx_check server: 30 passed, 0 failed' '$TMP/ucs-$name.out' && grep -q '^ucx_check client: 30 passed, 0 failed' '$TMP/ucc-$name.out'"
  check "$name: the server held itself before its QPs went" "[ $h -eq 0 ]"
  # Each side receives 3 x (4 MiB + 1 MiB + 256 KiB + ...) > 15 MiB: 3,900 packets of 4096 bytes.
  qp_check "$name" RC 3900 "$dir/status" "$base"
}
echo "== ucx_check: UCX's tag API over rc_verbs, every byte checked"
# Through worker addresses (as ucx_perftest and Open MPI connect): UCX
# wires RC up over ud_verbs.
ucheck ucx_check rc_verbs,ud_verbs
# Client-server, through UCX's rdmacm connection manager and uroce's
# librdmacm (daemon A's address): rc_verbs and nothing else. UCX tries
# its connection managers in UCX_SOCKADDR_TLS_PRIORITY's order and fails if
# the first cannot listen: the TCP one cannot (daemon A's address lives in
# its namespace), so rdmacm alone.
ucheck ucx_check_cm rc_verbs UCX_SOCKADDR_TLS_PRIORITY=rdmacm -a 10.90.2.1

echo "== Open MPI over UCX: two ranks, one on each daemon"
if [ -x "${MPI_RING:-}" ]; then
  dir=$TMP/hold-mpi
  mkdir -p "$dir"
  base=$(pkts)
  timeout 120 mpirun --allow-run-as-root --oversubscribe --mca pml ucx --mca btl self --mca osc ^ucx \
    -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=uroce0:1 \
    -np 1 env MPI_RING_HOLD="$dir" "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_a" --ucx "$MPI_RING" 10 : \
    -np 1 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_b" --ucx "$MPI_RING" 10 > "$TMP/mpi.out" 2>&1 & mp=$!
  snapshots "$dir" $mp; h=$?
  wait $mp; rc=$?
  grep '^rank' "$TMP/mpi.out" | sed 's/^/  /'
  [ $rc -eq 0 ] || tail -n 8 "$TMP/mpi.out" | sed 's/^/    /'
  check "mpirun: both ranks sent and received every message, every byte, and the Allreduce" \
    "[ $rc -eq 0 ] && grep -q 'rank 0: 71 passed, 0 failed' '$TMP/mpi.out' && grep -q 'rank 1: 71 passed, 0 failed' '$TMP/mpi.out'"
  check "mpirun: rank 0 held itself before MPI_Finalize" "[ $h -eq 0 ]"
  # Rank 0 receives 10 x 1 MiB and more: 2,560 packets of 4096 bytes.
  qp_check mpi_ring RC 2560 "$dir/status" "$base"
fi
check "the daemons are still up" "kill -0 $DA && kill -0 $DB"
finish
