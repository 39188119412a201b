#!/bin/bash
# uroced as the units run it: not root, its own user (here nobody, 65534),
# holding exactly the capabilities the units grant (their AmbientCapabilities=
# and CapabilityBoundingSet=, read from the built uroced.service):
#   - two daemons on af_packet ports over a veth pair, one with its host
#     netdev (a TAP carrying the RoCE address), run Debian's unmodified
#     ibv_rc_pingpong between them, every buffer checked (--chk);
#   - a memif pair whose server takes hugepages (from memfd: uroced passes
#     --in-memory when not root, since a hugetlbfs mount's files are root's);
#   - the application socket (mode 0660) is open to members of the daemon's
#     group and refused to other users;
#   - without those capabilities the same af_packet daemon stops at once,
#     naming what it lacks, and uroced --check says so with the fix.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
need_prog setpriv util-linux
need_prog ibv_rc_pingpong ibverbs-utils
IBV_DIR=${UROCE_IBVERBS_DIR:?the drop-in libibverbs folder}
URUN=${UROCE_RUN:?path to tools/uroce-run}
UNIT=${UROCED_UNITS:?the folder of the built units}/uroced.service
unset LD_LIBRARY_PATH  # meson's: the drop-in; uroced's EAL needs the system's libibverbs

# The unit's capabilities, as setpriv takes them (CAP_NET_RAW -> +net_raw).
unit_caps() { sed -n "s/^$1=//p" "$UNIT" | tr ' ' '\n' | sed 's/^CAP_//' | tr 'A-Z' 'a-z' | sed 's/^/+/' | paste -sd, -; }
AMBIENT=$(unit_caps AmbientCapabilities)
BOUNDING=$(unit_caps CapabilityBoundingSet)
echo "  the unit grants: ambient $AMBIENT, bounding $BOUNDING"
[ -n "$AMBIENT" ] && [ -n "$BOUNDING" ] || { bad "the unit names its capabilities"; finish; exit 1; }
# The mask /proc/PID/status shows for them (CAP_NET_ADMIN 12, NET_RAW 13, IPC_LOCK 14).
EXPECT_CAPS=$(/usr/bin/python3 -c '
import sys
bits = {"net_admin": 12, "net_raw": 13, "ipc_lock": 14}
print("%016x" % sum(1 << bits[c.lstrip("+")] for c in sys.argv[1].split(",")))' "$AMBIENT")
# as_daemon CAPS: the setpriv words that start a command as uid/gid 65534
# with CAPS ambient (and nothing more possible: the bounding set, no new
# privileges), as systemd starts the unit.
as_daemon() {
  echo setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs --bounding-set=-all,$BOUNDING \
    --inh-caps=-all${1:+,$1} ${1:+--ambient-caps=$1}
}
chmod 755 "$TMP"
NP=$TMP/np
mkdir -p "$NP/a" "$NP/b" "$NP/ha" "$NP/hb"
chown -R 65534:65534 "$NP"
# daemon NS NAME CAPS ARGS...: uroced as the unit runs it, in NS ("" = here),
# its runtime directory its own (DPDK's files); LAST_PID.
daemon() {
  local ns=$1 name=$2 caps=$3; shift 3
  local in=(); [ -n "$ns" ] && in=(ip netns exec "$ns")
  XDG_RUNTIME_DIR=$NP "${in[@]}" $(as_daemon "$caps") "$UROCED" --file-prefix "$name-$$" "$@" > "$TMP/$name.out" 2> "$TMP/$name.err" &
  LAST_PID=$!
  PIDS="$PIDS $LAST_PID"
}
status_of() { sed -n "s/^$2:[[:space:]]*//p" "/proc/$1/status" | awk '{print $1}'; }
# The daemon itself (setpriv execs it: the same PID), by its file prefix.
pid_of() { pgrep -f -- "--file-prefix $1-$$" | head -1; }
pp() {  # NAME SRV_NS SRV_RUN CLI_NS CLI_RUN PEER: Debian's ibv_rc_pingpong, every buffer checked
  local name=$1 sns=$2 srun=$3 cns=$4 crun=$5 peer=$6
  ip netns exec "$sns" timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$srun" ibv_rc_pingpong -g 0 -n 500 -s 4096 --chk \
    > "$TMP/$name-s.out" 2>&1 &
  local sp=$!
  probe 400 listening "$sns" "" 18515 || true
  ip netns exec "$cns" timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$crun" ibv_rc_pingpong -g 0 -n 500 -s 4096 --chk "$peer" \
    > "$TMP/$name-c.out" 2>&1
  local crc=$?
  wait "$sp"; local src=$?
  shown "$TMP/$name-c.out" | tail -2
  [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q '500 iters' "$TMP/$name-c.out" && grep -q '500 iters' "$TMP/$name-s.out"
}

echo "== af_packet over a veth pair, as uid 65534 with the unit's capabilities; A with its host netdev"
make_link
daemon "$NS_A" pa "$AMBIENT" --no-huge --mem-mb 256 --port net_af_packet0 --vdev net_af_packet0,iface=veth0 \
  --ip 10.92.0.1 --lcore 0 --app-socket "$NP/a/uroce0.sock" --ctl-socket "$NP/a.ctl" --host-netdev ura
daemon "$NS_B" pb "$AMBIENT" --no-huge --mem-mb 256 --port net_af_packet0 --vdev net_af_packet0,iface=veth0 \
  --ip 10.92.0.2 --lcore 1 --app-socket "$NP/b/uroce0.sock" --no-host-netdev
wait_sockets "$NP/a/uroce0.sock" "$NP/b/uroce0.sock" || bad "both daemons' application sockets appear (gave up after $PROBES looks)"
for d in pa pb; do
  p=$(pid_of $d)
  check "$d runs as uid 65534 with effective capabilities exactly the unit's ($(status_of "$p" CapEff) = $EXPECT_CAPS)" \
    "[ -n '$p' ] && [ \"\$(status_of $p Uid)\" = 65534 ] && [ \"\$(status_of $p CapEff)\" = $EXPECT_CAPS ]"
done
check "pa logs that it runs unprivileged, and which capabilities it holds" \
  "grep -q 'unprivileged.*uid=65534 capabilities=\"CAP_NET_RAW, CAP_NET_ADMIN, CAP_IPC_LOCK\"' '$TMP/pa.err'"
ip -n "$NS_A" -4 addr show ura 2> /dev/null | sed -n 's/^ *inet /  ura: /p'
check "A's host netdev (a TAP, made with CAP_NET_ADMIN) carries the RoCE address" \
  "ip -n '$NS_A' -4 addr show ura | grep -q 'inet 10.92.0.1/'"
if pp afp "$NS_A" "$NP/a" "$NS_B" "$NP/b" 10.90.1.1; then
  ok "ibv_rc_pingpong between the unprivileged daemons: 500 round trips of 4 KiB, every buffer checked"
else
  bad "ibv_rc_pingpong between the unprivileged daemons"
fi

echo "== the application socket: open to the daemon's group (0660), refused to other users"
ls -l "$NP/a/uroce0.sock" | awk '{print "  " $1, $3, $4}'
run_as() { local who=$1; shift; ip netns exec "$NS_A" setpriv $who "$URUN" --lib "$IBV_DIR" --run-dir "$NP/a" "$@"; }
run_as "--reuid=65533 --regid=65533 --groups=65534" ibv_devinfo > "$TMP/member.out" 2>&1; mrc=$?
run_as "--reuid=65533 --regid=65533 --clear-groups" ibv_devinfo > "$TMP/other.out" 2>&1; orc=$?
sed 's/^/  member: /' "$TMP/member.out" | grep -E 'hca_id|state' | head -2
sed 's/^/  other: /' "$TMP/other.out" | head -2
check "a user in the daemon's group sees uroce0" "[ $mrc -eq 0 ] && grep -q 'hca_id:.*uroce0' '$TMP/member.out'"
check "a user outside it does not" "! grep -q 'hca_id:.*uroce0' '$TMP/other.out'"

echo "== without the capabilities"
daemon "$NS_A" nocap "" --no-huge --mem-mb 256 --port net_af_packet0 --vdev net_af_packet0,iface=veth0 \
  --ip 10.92.0.3 --lcore 0 --app-socket "$NP/a/nocap.sock" --no-host-netdev
NOCAP=$LAST_PID
probe 200 eval "! kill -0 $NOCAP 2> /dev/null" || bad "the daemon without capabilities stops by itself"
wait "$NOCAP"; nrc=$?
sed 's/^/  /' "$TMP/nocap.err" | tail -1
check "it exits non-zero ($nrc), naming the port, what it needs and what this process lacks" \
  "[ $nrc -ne 0 ] && grep -q 'port net_af_packet0 needs CAP_NET_RAW, CAP_NET_ADMIN; this process (uid 65534, capabilities: none) lacks CAP_NET_RAW, CAP_NET_ADMIN' '$TMP/nocap.err'"
ip netns exec "$NS_A" $(as_daemon "") "$UROCED" --check --no-huge --port net_af_packet0 --vdev net_af_packet0,iface=veth0 --ip 10.92.0.3 \
  --app-socket "$NP/a/x.sock" --host-netdev urx > "$TMP/check-nocap.out" 2>&1
grep privileges "$TMP/check-nocap.out" | sed 's/^/  /'
check "uroced --check fails the port's and the host netdev's privileges, with the fix" \
  "grep -q '^FAIL privileges of port net_af_packet0: needs CAP_NET_RAW, CAP_NET_ADMIN;.*fix: grant' '$TMP/check-nocap.out' && grep -q '^FAIL privileges of host netdev urx: needs CAP_NET_ADMIN' '$TMP/check-nocap.out'"
ip netns exec "$NS_A" $(as_daemon "$AMBIENT") "$UROCED" --check --no-huge --port net_af_packet0 --vdev net_af_packet0,iface=veth0 --ip 10.92.0.3 \
  --app-socket "$NP/a/x.sock" --host-netdev urx > "$TMP/check-caps.out" 2>&1
check "with the unit's capabilities both are ok" \
  "[ \$(grep -c '^ok   privileges of' '$TMP/check-caps.out') -eq 2 ]"

for p in $PIDS; do kill "$p" 2> /dev/null; done
wait 2> /dev/null
PIDS=

echo "== memif with hugepages, as uid 65534"
HP=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
free_pages() { awk '/^HugePages_Free/ {print $2}' /proc/meminfo; }
hp_before=$(cat $HP)
# 384 MiB of 2 MiB pages free for the server; given back at the end.
if [ "$(free_pages)" -lt 192 ]; then
  echo $((hp_before + 192 - $(free_pages))) > $HP
  trap 'echo '"$hp_before"' > '"$HP"'; cleanup' EXIT
fi
echo "  hugepages free: $(free_pages) of $(cat $HP)"
check "192 hugepages (2 MiB) are free for it" "[ $(free_pages) -ge 192 ]"
before=$(free_pages)
daemon "" ha "$AMBIENT" --port net_memif0 --vdev "net_memif0,role=server,socket=$NP/ha/m.sock,bsize=8192" \
  --ip 10.96.0.1 --lcore 0 --app-socket "$NP/ha/uroce0.sock" --no-host-netdev
wait_sockets "$NP/ha/uroce0.sock" || bad "the memif server's socket appears (gave up after $PROBES looks)"
daemon "" hb "$AMBIENT" --no-huge --mem-mb 256 --port net_memif0 --vdev "net_memif0,role=client,socket=$NP/ha/m.sock,bsize=8192" \
  --ip 10.96.0.2 --lcore 1 --app-socket "$NP/hb/uroce0.sock" --no-host-netdev
wait_sockets "$NP/hb/uroce0.sock" || bad "the memif client's socket appears (gave up after $PROBES looks)"
during=$(free_pages)
echo "  hugepages free before the server: $before, while it runs: $during"
check "the unprivileged server holds hugepages ($((before - during)) of 2 MiB)" "[ $during -lt $before ]"
if (timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$NP/ha" ibv_rc_pingpong -g 0 -n 500 -s 4096 --chk > "$TMP/hp-s.out" 2>&1 &
    sp=$!; probe 400 listening "" "" 18515;
    timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$NP/hb" ibv_rc_pingpong -g 0 -n 500 -s 4096 --chk 127.0.0.1 > "$TMP/hp-c.out" 2>&1 \
      && wait "$sp"); then
  ok "ibv_rc_pingpong over the memif pair: 500 round trips of 4 KiB, every buffer checked"
else
  shown "$TMP/hp-c.out" "$TMP/hp-s.out"
  bad "ibv_rc_pingpong over the memif pair"
fi
finish
