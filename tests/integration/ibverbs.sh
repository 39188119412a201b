#!/bin/bash
# Unmodified verbs programs on uroce: Debian's own ibv_devices, ibv_devinfo
# and ibv_rc_pingpong (ibverbs-utils, linked BIND_NOW against
# libibverbs.so.1) with uroce's libibverbs.so.1 first on LD_LIBRARY_PATH,
# against uroced daemons whose application sockets are in UROCE_RUN_DIR:
# the device queries, and RC pingpong between two daemons over memif with
# every received buffer checked, in event and polling modes. Also: the
# library exports every public symbol of Debian's libibverbs.so.1 with its
# exact version, and what it cannot do yet (UD) is refused cleanly.
. "$(dirname "$0")/lib.sh"
need_root
# uroced's EAL loads DPDK's mlx5 plugin, which needs the system's
# libibverbs: only the verbs programs get uroce's.
unset LD_LIBRARY_PATH
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of the uroce libibverbs.so.1}
SYSLIB=$(ls /usr/lib/*/libibverbs.so.1 2>/dev/null | head -1)
for t in ibv_devices ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong; do
  command -v $t > /dev/null || { echo "SKIP: $t is not installed (ibverbs-utils)"; exit 77; }
done

echo "== the symbols: every public one of $SYSLIB, same version"
/usr/bin/python3 - "$SYSLIB" "$IBV_DIR/libibverbs.so.1" > "$TMP/syms.out" <<'PY'
import subprocess, sys
def syms(p):
    out = subprocess.run(["objdump", "-T", p], capture_output=True, text=True).stdout
    return {(l.split()[-1], l.split()[-2]) for l in out.splitlines()
            if "IBVERBS" in l and (" DF " in l or " DO " in l)}
system, ours = syms(sys.argv[1]), syms(sys.argv[2])
public = {s for s in system if "PRIVATE" not in s[1]}
print(len(public), len(public - ours), " ".join("%s@%s" % s for s in sorted(public - ours)))
PY
missing=$(cat "$TMP/syms.out")
echo "  public symbols, missing, which: $missing"
check "every public symbol is there with its version" "[ \"\$(echo '$missing' | awk '{print \$2}')\" = 0 ] && [ \"\$(echo '$missing' | awk '{print \$1}')\" -gt 100 ]"
check "ibv_query_gid_type@IBVERBS_PRIVATE_34 too (ibv_devinfo needs it)" \
  "objdump -T '$IBV_DIR/libibverbs.so.1' | grep -q 'IBVERBS_PRIVATE_34 ibv_query_gid_type'"

echo "== no uroce device: an empty list, not an error"
mkdir -p "$TMP/run"
UROCE_RUN_DIR="$TMP/run" LD_LIBRARY_PATH="$IBV_DIR" ibv_devices > "$TMP/none.out" 2>&1; rc=$?
check "ibv_devices with no device: exit 0, none listed" "[ $rc -eq 0 ] && ! grep -q uroce '$TMP/none.out'"

# Two daemons over memif, each with its application socket in its own run
# folder: the verbs programs on each side see one device, uroce0.
mkdir -p "$TMP/run_b"
start_daemon "" d --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.96.0.1 --lcore 0 \
  --app-socket "$TMP/run/uroce0.sock" --ctl-socket "$TMP/d.ctl"
DA=$LAST_PID
for i in $(seq 50); do [ -S "$TMP/run/uroce0.sock" ] && [ -S "$TMP/d.ctl" ] && break; sleep 0.1; done
start_daemon "" db --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.96.0.2 --lcore 1 \
  --app-socket "$TMP/run_b/uroce0.sock"
DB=$LAST_PID
for i in $(seq 50); do [ -S "$TMP/run_b/uroce0.sock" ] && break; sleep 0.1; done
run() { UROCE_RUN_DIR="$TMP/run" LD_LIBRARY_PATH="$IBV_DIR" timeout 20 "$@"; }

echo "== ibv_devices"
run ibv_devices > "$TMP/devices.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/devices.out"
check "ibv_devices lists uroce0 with a GUID made from the port MAC (EUI-64)" \
  "[ $rc -eq 0 ] && grep -qE '^\s+uroce0\s+[0-9a-f]{6}fffe[0-9a-f]{6}$' '$TMP/devices.out'"

echo "== ibv_devinfo -v"
run ibv_devinfo -v > "$TMP/devinfo.out" 2>&1; rc=$?
grep -E 'hca_id|transport|vendor_id|state|link_layer|active_mtu|GID' "$TMP/devinfo.out" | sed 's/^/  /'
check "ibv_devinfo runs (exit 0)" "[ $rc -eq 0 ]"
check "a CA on the IB transport, vendor 0xffffff (as rxe)" \
  "grep -qE 'transport:\s+InfiniBand \(0\)' '$TMP/devinfo.out' && grep -qE 'vendor_id:\s+0xffffff' '$TMP/devinfo.out'"
check "port 1 active, Ethernet link layer" \
  "grep -qE 'state:\s+PORT_ACTIVE \(4\)' '$TMP/devinfo.out' && grep -qE 'link_layer:\s+Ethernet' '$TMP/devinfo.out'"
check "GID 0 is the port's address as a RoCE v2 GID" "grep -qE 'GID\[ *0\]:\s+::ffff:10.96.0.1, RoCE v2' '$TMP/devinfo.out'"

echo "== ibv_rc_pingpong between the two daemons: RC SENDs, every buffer checked (--chk)"
pingpong() {  # tag args...
  local tag=$1; shift
  UROCE_RUN_DIR="$TMP/run" LD_LIBRARY_PATH="$IBV_DIR" timeout 60 ibv_rc_pingpong -d uroce0 -g 0 -p 18600 -c "$@" \
    > "$TMP/pps-$tag.out" 2>&1 & local sp=$!
  sleep 0.5
  UROCE_RUN_DIR="$TMP/run_b" LD_LIBRARY_PATH="$IBV_DIR" timeout 60 ibv_rc_pingpong -d uroce0 -g 0 -p 18600 -c "$@" 127.0.0.1 \
    > "$TMP/ppc-$tag.out" 2>&1; local crc=$?
  wait $sp; local src=$?
  echo "  $tag: client exit $crc: $(grep -h 'iters in' "$TMP/ppc-$tag.out"); server exit $src"
  check "ibv_rc_pingpong $tag: both sides ran every iteration, buffers valid" \
    "[ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q 'iters in' '$TMP/ppc-$tag.out' && grep -q 'iters in' '$TMP/pps-$tag.out'"
}
pingpong events-4096 -e -n 500 -s 4096
pingpong events-64 -e -n 1000 -s 64
pingpong poll-1000 -n 300 -s 1000

echo "== perftest, unmodified (libmlx5.so.1 and libefa.so.1 are uroce's refusing stand-ins): the eight tests"
if command -v ib_write_bw > /dev/null; then
  port=18700
  for t in ib_write_bw ib_send_bw ib_read_bw ib_atomic_bw ib_write_lat ib_send_lat ib_read_lat ib_atomic_lat; do
    port=$((port + 1))
    ev=-e; case $t in ib_write_*) ev="" ;; esac  # perftest has no events for WRITE
    UROCE_RUN_DIR="$TMP/run" LD_LIBRARY_PATH="$IBV_DIR" timeout 60 $t -d uroce0 -x 0 -n 200 -p $port $ev \
      > "$TMP/pts-$t.out" 2>&1 & sp=$!
    sleep 0.7
    UROCE_RUN_DIR="$TMP/run_b" LD_LIBRARY_PATH="$IBV_DIR" timeout 60 $t -d uroce0 -x 0 -n 200 -p $port $ev 127.0.0.1 \
      > "$TMP/ptc-$t.out" 2>&1; crc=$?
    wait $sp; src=$?
    row=$(grep -E '^ +[0-9]+ +200 ' "$TMP/ptc-$t.out" | head -1 | tr -s ' ')
    echo "  $t: client exit $crc, server exit $src:$row"
    check "perftest $t runs unmodified on uroce, both sides" \
      "[ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n '$row' ] && grep -q 'Transport type : IB' '$TMP/ptc-$t.out'"
  done
else
  echo "  (perftest not installed: skipped)"
fi

echo "== what is not built yet is refused cleanly"
run ibv_ud_pingpong -d uroce0 -g 0 -n 1 > "$TMP/ud.out" 2>&1; rc=$?
echo "  ibv_ud_pingpong exit $rc: $(tr '\n' ' ' < "$TMP/ud.out")"
check "ibv_ud_pingpong (UD QPs, not yet) loads and fails cleanly, not by a signal" \
  "[ $rc -ne 0 ] && [ $rc -lt 128 ] && ! grep -q 'symbol lookup error\|version .* not found' '$TMP/ud.out'"
check "the daemons are still up" "kill -0 $DA && kill -0 $DB"
finish
