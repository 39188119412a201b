#!/bin/bash
# uroced --check, the preflight: a host set up right passes every check
# (exit 0), and each check fails on a host broken its way, with a fix, and
# exit 1: hugepages (none mounted, too few free), a PCI port (absent, no
# driver, a kernel driver, vfio-pci without an IOMMU), an af_packet port
# (no interface, down, MTU below --link-mtu), lcores, the socket paths (no
# folder, a file in the way, another daemon listening), the host netdev
# (the name taken, no /dev/net/tun) and another daemon on the DPDK file
# prefix. Hosts of kernel files are made under $TMP and given with
# --check-root; the rest is this host's own.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
mkdir -p "$TMP/run"
BARE=(--port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock" --ip 10.95.0.1 --lcore 0)
BASE=("${BARE[@]}" --app-socket "$TMP/run/ckdev.sock" --ctl-socket "$TMP/ck.ctl")
# chk NAME ARGS...: uroced --check with ARGS, its output in $TMP/NAME.out, exit code in CRC.
chk() { local name=$1; shift; "$UROCED" --check "$@" > "$TMP/$name.out" 2>&1; CRC=$?; }
# has NAME LINE-REGEX: the output has the line.
has() { grep -qE "$2" "$TMP/$1.out"; }

echo "== a host set up right"
chk good "${BASE[@]}" --no-huge --file-prefix "ck-$$"
sed 's/^/  /' "$TMP/good.out"
check "every check passes, exit 0" "[ $CRC -eq 0 ] && has good '^every check passed$' && ! has good '^FAIL'"
check "it names the host netdev it would make (ckdev)" "has good '^ok   host netdev ckdev: '"

echo "== hugepages"
H=$TMP/hroot; mkdir -p "$H/sys/kernel/mm/hugepages/hugepages-2048kB" "$H/proc"
echo 10 > "$H/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"
: > "$H/proc/mounts"
chk h1 "${BASE[@]}" --mem-mb 256 --no-host-netdev --check-root "$H"
check "no hugetlbfs mounted: FAIL, exit 1" "[ $CRC -eq 1 ] && has h1 '^FAIL hugepages: no hugetlbfs is mounted; fix: mount -t hugetlbfs'"
echo "nodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0" > "$H/proc/mounts"
chk h2 "${BASE[@]}" --mem-mb 256 --no-host-netdev --check-root "$H"
check "20 MiB free for --mem-mb 256: FAIL with the pages to add" "has h2 '^FAIL hugepages: 20 MiB of hugepages free, --mem-mb asks 256; fix: echo 129 > '"
echo 200 > "$H/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"
chk h3 "${BASE[@]}" --mem-mb 256 --no-host-netdev --check-root "$H"
check "400 MiB free: ok" "has h3 '^ok   hugepages: 400 MiB free'"

echo "== a PCI port"
P=$TMP/proot; D=$P/sys/bus/pci/devices/0000:3b:00.0
mkdir -p "$D" "$P/sys/bus/pci/drivers/ixgbe" "$P/sys/bus/pci/drivers/vfio-pci" "$P/sys/kernel/iommu_groups/12" "$P/sys/module/vfio/parameters"
PCI=(--port 0000:3b:00.0 --ip 10.95.0.1 --lcore 0 --no-huge --no-host-netdev --check-root "$P")
chk p0 --port 0000:5e:00.1 --ip 10.95.0.1 --lcore 0 --no-huge --no-host-netdev --check-root "$P"
check "a device that is not there: FAIL" "[ $CRC -eq 1 ] && has p0 '^FAIL port 0000:5e:00.1: no PCI device 0000:5e:00.1; fix: '"
chk p1 "${PCI[@]}"
check "bound to no driver: FAIL, bind vfio-pci" "has p1 '^FAIL port 0000:3b:00.0: bound to no driver; fix: dpdk-devbind.py -b vfio-pci 0000:3b:00.0'"
ln -s ../../../../bus/pci/drivers/ixgbe "$D/driver"
chk p2 "${PCI[@]}"
check "a kernel driver (ixgbe): FAIL" "has p2 '^FAIL port 0000:3b:00.0: bound to ixgbe, a kernel driver DPDK cannot use'"
rm "$D/driver"; ln -s ../../../../bus/pci/drivers/vfio-pci "$D/driver"
echo N > "$P/sys/module/vfio/parameters/enable_unsafe_noiommu_mode"
chk p3 "${PCI[@]}"
check "vfio-pci without an IOMMU group: FAIL, turn the IOMMU on" "has p3 '^FAIL port 0000:3b:00.0: vfio-pci without an IOMMU group.*intel_iommu=on'"
ln -s ../../../../kernel/iommu_groups/12 "$D/iommu_group"
chk p4 "${PCI[@]}"
check "vfio-pci in IOMMU group 12: ok, exit 0" "[ $CRC -eq 0 ] && has p4 '^ok   port 0000:3b:00.0: vfio-pci, IOMMU group 12'"

echo "== an af_packet port"
AFP=(--port net_af_packet0 --ip 10.95.0.1 --lcore 0 --no-huge --no-host-netdev --link-mtu 9000)
chk a1 "${AFP[@]}" --vdev net_af_packet0,iface=cknosuch0
check "no such interface: FAIL" "[ $CRC -eq 1 ] && has a1 '^FAIL port net_af_packet0: no network interface cknosuch0'"
ip link add ckveth0 type veth peer name ckveth1 || bad "a veth pair"
chk a2 "${AFP[@]}" --vdev net_af_packet0,iface=ckveth0
check "an interface that is down: FAIL, ip link set up" "has a2 '^FAIL port net_af_packet0: ckveth0 is down; fix: ip link set ckveth0 up'"
ip link set ckveth1 up; ip link set ckveth0 up
probe 100 grep -qx up /sys/class/net/ckveth0/operstate || bad "ckveth0 comes up"
chk a3 "${AFP[@]}" --vdev net_af_packet0,iface=ckveth0
check "MTU 1500 under --link-mtu 9000: FAIL" "has a3 '^FAIL port net_af_packet0: ckveth0.s MTU is 1500, --link-mtu is 9000; fix: ip link set ckveth0 mtu 9000'"
ip link set ckveth0 mtu 9000
chk a4 "${AFP[@]}" --vdev net_af_packet0,iface=ckveth0
check "up at MTU 9000: ok" "[ $CRC -eq 0 ] && has a4 '^ok   port net_af_packet0: ckveth0 up, MTU 9000'"
ip link del ckveth0

echo "== lcores"
chk l1 --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock" --ip 10.95.0.1 --lcore 64 --no-huge --no-host-netdev
check "an lcore this process cannot run on: FAIL, with the ones it can" "[ $CRC -eq 1 ] && has l1 '^FAIL lcores: lcore 64 is not among this process.s CPUs \\(.*\\); fix: choose --lcore among '"

echo "== socket paths"
chk s1 --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock" --ip 10.95.0.1 --lcore 0 --no-huge --no-host-netdev \
  --app-socket "$TMP/nosuch/uroce0.sock"
check "a folder that is not there: FAIL, mkdir" "[ $CRC -eq 1 ] && has s1 '^FAIL --app-socket $TMP/nosuch/uroce0.sock: its folder $TMP/nosuch is not writable.*fix: mkdir -p $TMP/nosuch'"
echo plain > "$TMP/run/file.sock"
chk s2 "${BARE[@]}" --no-huge --no-host-netdev --ctl-socket "$TMP/run/file.sock"
check "a file in the way: FAIL" "has s2 '^FAIL --ctl-socket $TMP/run/file.sock: a file that is not a socket is there'"
/usr/bin/python3 -c "
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind('$TMP/run/live.sock'); s.listen(1); time.sleep(30)" & LIVE=$!
probe 100 test -S "$TMP/run/live.sock" || bad "a listener"
chk s3 "${BARE[@]}" --no-huge --no-host-netdev --app-socket "$TMP/run/live.sock"
check "a socket another process listens on: FAIL" "has s3 '^FAIL --app-socket $TMP/run/live.sock: another process listens on it'"
kill $LIVE; wait $LIVE 2> /dev/null
chk s4 "${BARE[@]}" --no-huge --no-host-netdev --app-socket "$TMP/run/live.sock"
check "the same socket left by a process that ended: ok (replaced at start)" "has s4 '^ok   --app-socket $TMP/run/live.sock: a stale socket'"

echo "== the host netdev"
chk n1 "${BASE[@]}" --no-huge --host-netdev lo
check "a name an interface has: FAIL" "[ $CRC -eq 1 ] && has n1 '^FAIL host netdev lo: an interface of that name already exists'"
mkdir -p "$TMP/nroot"
chk n2 "${BASE[@]}" --no-huge --check-root "$TMP/nroot"
check "no /dev/net/tun: FAIL, modprobe tun" "has n2 '^FAIL host netdev ckdev: /dev/net/tun cannot be opened.*fix: modprobe tun'"

echo "== another daemon on the same DPDK file prefix"
start_daemon "" other --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/o.sock" --ip 10.95.0.9 --lcore 1 \
  --ctl-socket "$TMP/o.ctl"
OTHER=$LAST_PID
wait_sockets "$TMP/o.ctl" || bad "the other daemon is up (gave up after $PROBES looks)"
chk d1 "${BASE[@]}" --no-huge --no-host-netdev --file-prefix "other-$$"
check "its file prefix held by a live process: FAIL, naming it" "[ $CRC -eq 1 ] && has d1 '^FAIL DPDK --file-prefix other-$$: process [0-9]+ runs with it'"
kill -TERM $OTHER; wait $OTHER
chk d2 "${BASE[@]}" --no-huge --no-host-netdev --file-prefix "other-$$"
check "once it has ended: ok" "[ $CRC -eq 0 ] && has d2 '^ok   DPDK --file-prefix other-$$: '"
finish
