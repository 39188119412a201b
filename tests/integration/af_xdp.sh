#!/bin/bash
# The veth test again on net_af_xdp, where the kernel allows AF_XDP sockets.
# Kernels (or sandboxes) that refuse an XDP umem make this test skip, with
# the PMD's reason.
. "$(dirname "$0")/lib.sh"
need_root
make_link
start_daemon "$NS_A" probe --port net_af_xdp0 --vdev "net_af_xdp0,iface=veth0" --ip 10.90.2.1 --duration 1
wait "$LAST_PID"; rc=$?
if [ $rc -ne 0 ]; then
  why=$(grep -hE "umem|xdp|queue setup" "$TMP/probe.err" "$TMP/probe.out" | head -2 | tr '\n' ' ')
  echo "SKIP: net_af_xdp is not usable on this kernel: $why"
  exit 77
fi
start_traffic "$NS_A" srv --port net_af_xdp0 --vdev "net_af_xdp0,iface=veth0" --ip 10.90.2.1 --lcore 0 --role server
sleep 1
start_traffic "$NS_B" cli --port net_af_xdp0 --vdev "net_af_xdp0,iface=veth0" --ip 10.90.2.2 --lcore 1 \
  --role client --peer 10.90.1.1 --messages 2000
cpid=$LAST_PID
wait "$cpid"; crc=$?
wait
echo "  client: $(cat "$TMP/cli.out")"
check "af_xdp: client verified all traffic" "[ $crc -eq 0 ] && grep -q 'uroce-traffic: OK' '$TMP/cli.out'"
check "af_xdp: server verified every SEND" "grep -q ', 0 bad' '$TMP/srv.out'"
finish
