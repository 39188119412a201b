#!/bin/bash
# libfabric over uroce: Debian's libfabric (its verbs provider, and ofi_rxm's
# reliable datagram endpoints over it) and Open MPI over libfabric, all
# unmodified, on the drop-in libibverbs and librdmacm.
#   fi_info: the verbs provider lists uroce0, for FI_EP_MSG and, through
#     ofi_rxm, for FI_EP_RDM.
#   fi_pingpong -e msg, then -e rdm (verbs;ofi_rxm): every size, the data
#     checked (-c). The server gives libfabric no address: its verbs
#     provider binds "localhost" through rdma_cm, which binds no device
#     (as the kernel's rdma_cm does), and then listens on the addresses
#     getifaddrs() gives the device's netdev (the host netdevs below).
#   mpirun with the cm PML and the ofi MTL over verbs;ofi_rxm: mpi_ring's
#     two ranks, every byte of every message checked.
# Each run must move packets through daemon A's QPs.
#
# Both daemons run in one namespace, each with its host netdev (uroce0 at
# 10.98.0.1, uroce1 at 10.98.0.2), joined by memif; every program runs in
# that namespace, so mpirun's own TCP and libfabric's address lookups see
# both addresses, and each process reaches its daemon by its run folder.
# ofi_rxm sizes its completion queues by the job's size: 256 processes by
# default, which asks for more CQ entries than a device has (rxe's max_cqe
# is 32767, uroce's 65536); FI_UNIVERSE_SIZE=16 is what one sets on rxe too.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
unset LD_LIBRARY_PATH  # uroced's EAL needs the system's libibverbs
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of the uroce libibverbs.so.1}
URUN=${UROCE_RUN:?the path of tools/uroce-run}
need_prog fi_info libfabric-bin
need_prog fi_pingpong libfabric-bin
need_prog mpirun openmpi-bin
[ -x "${MPI_RING:-}" ] || bad "mpi_ring is not built: meson found no MPI for C (libopenmpi-dev, which tools/setup.sh installs)"

echo "== libfabric and Open MPI are Debian's, unmodified"
debian_unmodified libfabric1 libfabric-bin openmpi-bin libopenmpi3

ip netns add "$NS_A"
ip -n "$NS_A" link set lo up
mkdir -p "$TMP/a" "$TMP/b"
MEMIF="socket=$TMP/m.sock,socket-abstract=no,bsize=16384"
start_daemon "$NS_A" da --port net_memif0 --vdev "net_memif0,role=server,$MEMIF" --ip 10.98.0.1/24 --link-mtu 9000 \
  --lcore 0 --app-socket "$TMP/a/uroce0.sock" --ctl-socket "$TMP/a.ctl" --host-netdev uroce0
wait_sockets "$TMP/a/uroce0.sock" "$TMP/a.ctl"
start_daemon "$NS_A" db --port net_memif0 --vdev "net_memif0,role=client,$MEMIF" --ip 10.98.0.2/24 --link-mtu 9000 \
  --lcore 1 --app-socket "$TMP/b/uroce0.sock" --ctl-socket "$TMP/b.ctl" --host-netdev uroce1
up="wait_sockets '$TMP/a/uroce0.sock' '$TMP/b/uroce0.sock' && ip -n '$NS_A' -br addr | grep -q '10.98.0.2/24'"
check "both daemons are up, their host netdevs carry 10.98.0.1 and 10.98.0.2" "$up"
eval "$up" || { finish; exit 1; }
# Each daemon hands ARP to its kernel netdev, and here one kernel has both
# addresses: it answers an ARP request from its own other address only
# with accept_local (and no reverse-path filter).
for i in all uroce0 uroce1; do
  ip netns exec "$NS_A" sysctl -qw net.ipv4.conf.$i.accept_local=1 net.ipv4.conf.$i.rp_filter=0
done

# on SIDE CMD...: CMD in the namespace, on daemon SIDE's device (a or b).
on() { local side=$1; shift; ip netns exec "$NS_A" env FI_UNIVERSE_SIZE=16 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/$side" "$@"; }
# pkts: packets sent and received by all of daemon A's QPs so far.
pkts() { ctl "$TMP/a.ctl" status | /usr/bin/python3 -c 'import json,sys; t=json.load(sys.stdin)["qp_totals"]; print(t["sent_pkts"] + t["rcvd_pkts"])'; }

echo "== fi_info -p verbs"
on a timeout 30 fi_info -p verbs > "$TMP/info-msg.out" 2>&1; rc1=$?
on a timeout 30 fi_info -p "verbs;ofi_rxm" -t FI_EP_RDM > "$TMP/info-rdm.out" 2>&1; rc2=$?
grep -E 'domain:|type:' "$TMP/info-msg.out" "$TMP/info-rdm.out" | sort -u | sed 's/^/  /'
check "fi_info: the verbs provider has domain uroce0 with FI_EP_MSG" \
  "[ $rc1 -eq 0 ] && grep -A3 'domain: uroce0$' '$TMP/info-msg.out' | grep -q FI_EP_MSG"
check "fi_info: verbs;ofi_rxm has domain uroce0 with FI_EP_RDM" \
  "[ $rc2 -eq 0 ] && grep -q 'domain: uroce0$' '$TMP/info-rdm.out' && grep -q 'FI_EP_RDM' '$TMP/info-rdm.out'"

# pingpong NAME EP PROV PORT: fi_pingpong's server on b, client on a.
pingpong() {
  local name=$1 ep=$2 prov=$3 port=$4 base sp crc src
  base=$(pkts)
  on b timeout 120 fi_pingpong -p "$prov" -e "$ep" -B "$port" -I 100 -S all -c > "$TMP/$name.srv" 2>&1 & sp=$!
  if ! probe 600 listening "$NS_A" "" "$port"; then
    bad "$name: fi_pingpong's server never listened on TCP $port"; kill $sp 2> /dev/null; wait $sp; return
  fi
  on a timeout 120 fi_pingpong -p "$prov" -e "$ep" -P "$port" -I 100 -S all -c 10.98.0.2 > "$TMP/$name.cli" 2>&1; crc=$?
  wait $sp; src=$?
  grep -E '^bytes|^(64|4k|1m) ' "$TMP/$name.cli" | sed 's/^/  /'
  [ $crc -eq 0 ] && [ $src -eq 0 ] || shown "$TMP/$name.srv" "$TMP/$name.cli"
  local moved=$(( $(pkts) - base ))
  check "fi_pingpong -e $ep -p '$prov': both sides finished every size with the data checked" \
    "[ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q '^1m ' '$TMP/$name.cli' && ! grep -qi 'error' '$TMP/$name.cli' '$TMP/$name.srv'"
  check "fi_pingpong -e $ep: daemon A's QPs carried it ($moved packets, at least 2000)" "[ $moved -ge 2000 ]"
}
echo "== fi_pingpong, FI_EP_MSG over verbs"
pingpong msg msg verbs 47601
echo "== fi_pingpong, FI_EP_RDM over verbs;ofi_rxm"
pingpong rdm rdm "verbs;ofi_rxm" 47602

echo "== mpirun: Open MPI's ofi MTL over verbs;ofi_rxm"
base=$(pkts)
# -x applies to one app context only: each rank's environment is set by `in`.
timeout 180 ip netns exec "$NS_A" mpirun --allow-run-as-root --oversubscribe --mca pml cm --mca mtl ofi \
  --mca mtl_ofi_provider_include "verbs;ofi_rxm" --mca btl self \
  -np 1 env FI_UNIVERSE_SIZE=16 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/a" "$MPI_RING" 10 : \
  -np 1 env FI_UNIVERSE_SIZE=16 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/b" "$MPI_RING" 10 > "$TMP/mpi.out" 2>&1; rc=$?
moved=$(( $(pkts) - base ))
grep '^rank' "$TMP/mpi.out" | sed 's/^/  /'
[ $rc -eq 0 ] || tail -n 12 "$TMP/mpi.out" | sed 's/^/    /'
check "mpirun (pml cm, mtl ofi, verbs;ofi_rxm): both ranks sent and received every message, every byte, and the Allreduce" \
  "[ $rc -eq 0 ] && grep -q 'rank 0: 71 passed, 0 failed' '$TMP/mpi.out' && grep -q 'rank 1: 71 passed, 0 failed' '$TMP/mpi.out'"
check "mpirun: daemon A's QPs carried it ($moved packets, at least 2560: rank 0 takes in 10 MiB)" "[ $moved -ge 2560 ]"

finish
