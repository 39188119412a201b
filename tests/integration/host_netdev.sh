#!/bin/bash
# The RoCE address as a host address (drivers/host): each daemon gives the
# kernel a TAP netdev with its port's address, in its own network
# namespace, the two joined by memif. Checked: the netdev has the address,
# the MAC and the MTU, and getifaddrs() lists it; the hosts' TCP and UDP
# reach each other's RoCE address through the daemons (and the kernel
# answers ARP); an unmodified ibv_rc_pingpong uses one address for its TCP
# side channel and for RoCE, as on rxe, and its RoCE frames stay in the
# daemon (the kernel counts no UDP to port 4791); a frame from the kernel
# ends an idle daemon's sleep; a name in use and a bad prefix are refused
# clearly; --no-host-netdev makes none. Datagram rsockets, which need the
# kernel's UDP at the RoCE address: udpong, and Python's UDP sockets through
# librspreload, every byte checked.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
unset LD_LIBRARY_PATH
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of the uroce libibverbs.so.1}
URUN=${UROCE_RUN:?the path of tools/uroce-run}
ADDRS=${HOST_ADDRS:?the path of host_addrs}
need_prog ibv_rc_pingpong ibverbs-utils
need_prog qperf qperf
need_prog fi_info libfabric-bin
need_prog udpong rdmacm-utils
RSPRELOAD=$(ls /usr/lib/*/rsocket/librspreload.so 2>/dev/null | head -1)
[ -n "$RSPRELOAD" ] || { bad "librspreload.so is not installed (package librdmacm1, which tools/setup.sh installs)"; finish; exit 1; }
PY=/usr/bin/python3
ip netns add "$NS_A" && ip netns add "$NS_B" || { bad "namespaces"; finish; exit 1; }
ip -n "$NS_A" link set lo up
ip -n "$NS_B" link set lo up
mkdir -p "$TMP/a" "$TMP/b"
# memif's socket is a file (not abstract: an abstract socket is per namespace);
# its buffers hold a whole 9000-byte frame of the kernel's (DPDK 22.11 memif
# can deliver chained frames more than once: docs/deploy.md).
MEMIF="socket=$TMP/m.sock,socket-abstract=no,bsize=16384"
start_daemon "$NS_A" da --port net_memif0 --vdev "net_memif0,role=server,$MEMIF" --ip 10.98.0.1/24 --link-mtu 9000 \
  --lcore 0 --app-socket "$TMP/a/uroce0.sock" --ctl-socket "$TMP/a.ctl" --host-netdev uroce0
DA=$LAST_PID
wait_sockets "$TMP/a/uroce0.sock" "$TMP/a.ctl" || bad "daemon A is up (gave up after $PROBES looks)"
# B's netdev is named after its application socket (the default).
start_daemon "$NS_B" db --port net_memif0 --vdev "net_memif0,role=client,$MEMIF" --ip 10.98.0.2/24 --link-mtu 9000 \
  --lcore 1 --app-socket "$TMP/b/rocebee.sock" --ctl-socket "$TMP/b.ctl" --host-netdev auto
DB=$LAST_PID
wait_sockets "$TMP/b/rocebee.sock" "$TMP/b.ctl" || bad "daemon B is up (gave up after $PROBES looks)"

echo "== the netdevs"
ip -n "$NS_A" -j addr show uroce0 > "$TMP/a.addr" 2>&1
ip -n "$NS_B" -j addr show rocebee > "$TMP/b.addr" 2>&1
check "A's netdev uroce0 has 10.98.0.1/24" "grep -q '\"local\":\"10.98.0.1\",\"prefixlen\":24' '$TMP/a.addr'"
check "B's netdev is named after its socket (rocebee) and has 10.98.0.2/24" "grep -q '\"local\":\"10.98.0.2\",\"prefixlen\":24' '$TMP/b.addr'"
check "uroce0's MTU is the link's (9000)" "grep -q '\"mtu\":9000' '$TMP/a.addr'"
dmac=$(grep -o 'mac=[0-9a-f:]*' "$TMP/da.err" | head -1 | cut -d= -f2)
check "uroce0's MAC is the port's ($dmac)" "[ -n '$dmac' ] && grep -q '\"address\":\"$dmac\"' '$TMP/a.addr'"
ip netns exec "$NS_A" "$ADDRS" > "$TMP/ifaddrs.out" 2>&1
check "getifaddrs() lists uroce0 with 10.98.0.1" "grep -qx 'uroce0 10.98.0.1' '$TMP/ifaddrs.out'"
st=$(ctl "$TMP/a.ctl" status)
check "the status names the host netdev" "[ \"\$(jget '$st' host_netdev.name)\" = uroce0 ]"

echo "== the hosts' own TCP and UDP over the RoCE addresses"
ip netns exec "$NS_B" $PY - > "$TMP/tcp_srv.out" 2>&1 <<'PY' &
import socket
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind(("10.98.0.2", 7777)); t.listen(1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("10.98.0.2", 7778))
t.settimeout(20); u.settimeout(20)
c, _ = t.accept()
data = b""
while len(data) < 100000:
    d = c.recv(65536)
    if not d: break
    data += d
c.sendall(data[::-1]); c.close()
m, a = u.recvfrom(2000); u.sendto(m.upper(), a)
print("served", len(data))
PY
SRV=$!
wait_listen "$NS_B" "" 7777 || bad "B's TCP server listens"
ip netns exec "$NS_A" $PY - > "$TMP/tcp_cli.out" 2>&1 <<'PY'
import os, socket
blob = os.urandom(100000)
c = socket.create_connection(("10.98.0.2", 7777), timeout=20)
c.sendall(blob); c.shutdown(socket.SHUT_WR)
back = b""
while True:
    d = c.recv(65536)
    if not d: break
    back += d
print("tcp", "same" if back == blob[::-1] else "DIFFERENT", len(back))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(20)
u.sendto(b"hello", ("10.98.0.2", 7778))
print("udp", u.recvfrom(2000)[0].decode())
PY
wait $SRV
check "100000 bytes over TCP from A to B's RoCE address and back, intact" "grep -qx 'tcp same 100000' '$TMP/tcp_cli.out'"
check "a UDP datagram to B's RoCE address (port 7778) is answered" "grep -qx 'udp HELLO' '$TMP/tcp_cli.out'"
check "A's kernel learned B's MAC by ARP through the daemons" "ip -n '$NS_A' neigh show 10.98.0.2 | grep -q lladdr"

echo "== ibv_rc_pingpong: one address for the TCP side channel and for RoCE"
udp_in() { ip netns exec "$NS_B" awk '/^Udp:/ { if (h) { print $2 + $3; exit } h = 1 }' /proc/net/snmp; }  # InDatagrams + NoPorts
udp0=$(udp_in)
st0=$(ctl "$TMP/b.ctl" status)
ip netns exec "$NS_B" "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/b" ibv_rc_pingpong -d rocebee -g 0 -n 1000 > "$TMP/pp_srv.out" 2>&1 &
PP=$!
wait_listen "$NS_B" "" 18515 || bad "the pingpong server listens"
ip netns exec "$NS_A" "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/a" ibv_rc_pingpong -d uroce0 -g 0 -n 1000 10.98.0.2 > "$TMP/pp_cli.out" 2>&1
prc=$?
wait $PP; src=$?
check "ibv_rc_pingpong -g 0 10.98.0.2: both sides end well (client $prc, server $src)" "[ $prc -eq 0 ] && [ $src -eq 0 ] && grep -q '1000 iters' '$TMP/pp_cli.out'"
st1=$(ctl "$TMP/b.ctl" status)
roce=$(( $(jget "$st1" dataplane.rx_roce) - $(jget "$st0" dataplane.rx_roce) ))
tohost=$(( $(jget "$st1" dataplane.rx_to_host) - $(jget "$st0" dataplane.rx_to_host) ))
udp1=$(udp_in)
echo "   B: $roce RoCE frames to the engine, $tohost frames to the kernel, kernel UDP in $((udp1 - udp0))"
check "B's engine got the RoCE frames (at least 2000)" "[ $roce -ge 2000 ]"
check "B's kernel got only the side channel (under 100 frames)" "[ $tohost -lt 100 ] && [ $tohost -gt 0 ]"
check "B's kernel saw no UDP datagram (RoCE stayed in the daemon)" "[ $((udp1 - udp0)) -eq 0 ]"

echo "== qperf -cm1: its TCP side channel's host name is the RoCE address rdma_cm resolves"
# Every RC test one after another in one server (the server ends each on
# SIGALRM, which must interrupt its wait in ibv_get_cq_event).
ip netns exec "$NS_B" timeout 120 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/b" qperf > "$TMP/qperf_srv.out" 2>&1 &
QS=$!
wait_listen "$NS_B" "" 19765 || bad "the qperf server listens"
QTESTS="rc_bw rc_lat rc_rdma_write_lat rc_rdma_write_bw rc_rdma_read_lat rc_rdma_read_bw rc_compare_swap_mr rc_fetch_add_mr rc_bi_bw"
ip netns exec "$NS_A" timeout 100 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/a" qperf -cm1 -t 1 10.98.0.2 $QTESTS > "$TMP/qperf.out" 2>&1
qrc=$?
kill $QS 2>/dev/null; wait $QS 2>/dev/null
cat "$TMP/qperf.out"
nres=$(grep -cE '^ +(latency|bw|msg_rate) += ' "$TMP/qperf.out")
check "qperf -cm1 runs all 9 RC tests (exit $qrc, $nres results)" "[ $qrc -eq 0 ] && [ $nres -eq 9 ]"

echo "== libfabric's verbs provider finds the RC endpoints through getifaddrs()"
ip netns exec "$NS_A" "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/a" fi_info -p verbs -t FI_EP_MSG > "$TMP/fi_info.out" 2>&1
check "fi_info -p verbs -t FI_EP_MSG lists uroce0" "grep -q 'domain: uroce0\$' '$TMP/fi_info.out'"

echo "== datagram rsockets: a kernel UDP socket at the RoCE address, then UD QP to QP"
# rdmacm-utils' udpong: 500 datagrams of 1000 bytes, then the server's
# count of those it received (UD drops what finds the receive queue full),
# blocking calls.
ip netns exec "$NS_A" timeout 60 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/a" udpong -b 10.98.0.1 -T b > "$TMP/udpong_srv.out" 2>&1 &
usp=$!
sleep 0.5
ip netns exec "$NS_B" timeout 60 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/b" udpong -s 10.98.0.1 -C 500 -S 1000 -T b > "$TMP/udpong.out" 2>&1; rc=$?
kill $usp 2> /dev/null; wait $usp 2> /dev/null
sed 's/^/  /' "$TMP/udpong.out" | tail -n 1
got=$(awk '$1 == "custom" && $2 == 1000 {print $3}' "$TMP/udpong.out")
check "udpong: 500 datagrams of 1000 bytes over datagram rsockets, the server counted ${got:-none} (50 or more)" \
  "[ $rc -eq 0 ] && [ -n '$got' ] && [ '${got:-0}' -ge 50 ] 2>/dev/null"
# Its echo mode: each datagram waits for its echo, sent again after an
# rpoll of 1 ms without it. udpong then takes any echo for the message it
# receives into, so an echo later than 1 ms, its resend's echo arriving
# after the next message went out, stalls it for good: on a host whose
# cores are shared that happens now and then, so up to 3 tries of 500
# echoes. (An rpoll whose 1 ms ended anywhere from 0 to 1 ms after it
# began, a deadline in whole ms, stalled it every time.)
echo_tries=0
for t in 1 2 3; do
  echo_tries=$t
  ip netns exec "$NS_A" timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/a" udpong -b 10.98.0.1 -T b > "$TMP/udpong_esrv.out" 2>&1 &
  usp=$!
  sleep 0.5
  ip netns exec "$NS_B" timeout 20 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/b" udpong -s 10.98.0.1 -C 500 -S 1000 -T b -T e > "$TMP/udpong_e.out" 2>&1; erc=$?
  kill $usp 2> /dev/null; wait $usp 2> /dev/null
  [ $erc -eq 0 ] && break
done
sed 's/^/  /' "$TMP/udpong_e.out" | tail -n 1
echoed=$(awk '$1 == "custom" && $2 == 1000 {print $3}' "$TMP/udpong_e.out")
check "udpong echo mode: 500 datagrams of 1000 bytes each echoed (${echoed:-no} transfers counted, 1k expected; try $echo_tries of 3)" \
  "[ $erc -eq 0 ] && [ '${echoed:-}' = 1k ]"
# Python's socket module, unmodified, over rsockets through rdma-core's
# LD_PRELOAD shim (librspreload): 200 datagrams of 1004 to 1203 random
# bytes, each answered reversed (so an error made the same way on each
# side cannot cancel out) and compared byte for byte; and they went QP to
# QP, not through A's kernel.
ip netns exec "$NS_A" timeout 60 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/a" env LD_PRELOAD="$RSPRELOAD" $PY -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("10.98.0.1", 7300))
while True:
    d, a = s.recvfrom(4096); s.sendto(d[::-1], a)' > "$TMP/uecho_srv.out" 2>&1 &
usp=$!
sleep 0.5
st0=$(ctl "$TMP/a.ctl" status)
ip netns exec "$NS_B" timeout 60 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/b" env LD_PRELOAD="$RSPRELOAD" $PY -c '
import os, select, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("10.98.0.1", 7300))
ok = bad = lost = 0
for i in range(200):
    d = i.to_bytes(4, "big") + os.urandom(1000 + i)
    s.send(d)
    if not select.select([s], [], [], 2.0)[0]:
        lost += 1
        continue
    e = s.recv(4096)[::-1]
    while e[:4] != d[:4]:
        e = s.recv(4096)[::-1]
    ok += e == d
    bad += e != d
print("ok", ok, "bad", bad, "lost", lost)' > "$TMP/uecho.out" 2>&1; rc=$?
st1=$(ctl "$TMP/a.ctl" status)
kill $usp 2> /dev/null; wait $usp 2> /dev/null
kern=$(( $(jget "$st1" host_netdev.to_kernel) - $(jget "$st0" host_netdev.to_kernel) ))
echo "  $(tail -n 1 "$TMP/uecho.out"); frames A's daemon gave its kernel meanwhile: $kern"
check "Python's UDP sockets over librspreload and datagram rsockets: 200 datagrams echoed, every byte the same" \
  "[ $rc -eq 0 ] && grep -qx 'ok 200 bad 0 lost 0' '$TMP/uecho.out'"
check "the echo's datagrams went QP to QP: A's kernel got at most 10 frames of the 200 (the first goes by UDP)" "[ $kern -le 10 ]"

echo "== a frame from the kernel wakes an idle daemon"
idle() { [ "$(jget "$(ctl "$TMP/a.ctl" status)" dataplane.idle_sleeps)" -gt "$1" ]; }
s0=$(jget "$(ctl "$TMP/a.ctl" status)" dataplane.idle_sleeps)
probe 100 idle "$((s0 + 50))" || bad "daemon A goes idle"
w0=$(jget "$(ctl "$TMP/a.ctl" status)" wait.host_wakes)
# One datagram to B's discard port per look (one that came just before a
# sleep is read by the last look instead, and wakes nothing).
woke() {
  ip netns exec "$NS_A" $PY -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("10.98.0.2", 9))'
  w1=$(jget "$(ctl "$TMP/a.ctl" status)" wait.host_wakes)
  [ "$w1" -gt "$w0" ]
}
probe 20 woke
check "daemon A's sleep was ended by the host netdev ($w0 -> $w1 wake-ups)" "[ $w1 -gt $w0 ]"

echo "== refusals"
start_daemon "$NS_A" dc --port net_memif1 --vdev "net_memif1,role=server,socket=$TMP/c.sock,socket-abstract=no" --ip 10.98.1.1 \
  --lcore 1 --app-socket "$TMP/a/other.sock" --host-netdev uroce0
wait $LAST_PID; rc=$?
check "a second daemon that asks for uroce0 in the same namespace exits 2 ($rc)" "[ $rc -eq 2 ]"
check "... saying the name is in use" "grep -q 'named uroce0 exists and is in use' '$TMP/dc.err'"
"$UROCED" --port net_memif0 --ip 10.98.0.9/33 > "$TMP/pfx.out" 2>&1; rc=$?
check "--ip 10.98.0.9/33 is refused ($rc)" "[ $rc -eq 2 ] && grep -q 'IPv4 prefix length is 1..32' '$TMP/pfx.out'"
start_daemon "$NS_A" dd --port net_memif1 --vdev "net_memif1,role=server,socket=$TMP/d.sock,socket-abstract=no" --ip 10.98.2.1 \
  --lcore 1 --app-socket "$TMP/a/plain.sock" --ctl-socket "$TMP/d.ctl"
wait_sockets "$TMP/d.ctl" || bad "daemon D is up"
check "--no-host-netdev (the test library's default): no netdev named plain" "! ip -n '$NS_A' link show plain > /dev/null 2>&1"
check "... and the status says none" "[ \"\$(jget \"\$(ctl '$TMP/d.ctl' status)\" host_netdev)\" = None ]"
check "the daemons are still up" "kill -0 $DA && kill -0 $DB"
finish
