#!/bin/bash
# The veth test again on net_af_xdp, where the kernel allows AF_XDP sockets.
# The one allowed skip: the kernel refuses the XDP umem that uroced's
# mbufs need, seen both in the PMD's own words and in a direct probe of the
# same kernel call. Any other failure to start (a crash, an option error, a
# socket the kernel refuses for another reason) is a failure.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
make_link
start_daemon "$NS_A" probe --port net_af_xdp0 --vdev "net_af_xdp0,iface=veth0" --ip 10.90.2.1 --duration 1
wait "$LAST_PID"; rc=$?
# umem_refused CHUNK: whether the kernel refuses XDP_UMEM_REG for an umem of
# CHUNK-byte unaligned chunks in ordinary (not hugetlb) memory, as DPDK's
# PMD registers its mbuf pool under --no-huge. Prints the errno's name.
umem_refused() { /usr/bin/python3 - "$1" <<'PY'
import ctypes, errno, mmap, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
AF_XDP, SOL_XDP, XDP_UMEM_REG, UNALIGNED = 44, 283, 4, 1
chunk = int(sys.argv[1])
fd = libc.socket(AF_XDP, 3, 0)
if fd < 0:
    print("socket:" + errno.errorcode.get(ctypes.get_errno(), "?")); sys.exit(0)
area = mmap.mmap(-1, chunk * 64)
addr = ctypes.addressof(ctypes.c_char.from_buffer(area))
reg = struct.pack("QQIIII", addr, chunk * 64, chunk, 0, UNALIGNED, 0)
r = libc.setsockopt(fd, SOL_XDP, XDP_UMEM_REG, reg, len(reg))
print("XDP_UMEM_REG:" + errno.errorcode.get(ctypes.get_errno(), "?") if r else "accepted")
sys.exit(0 if r else 1)
PY
}
if [ $rc -ne 0 ]; then
  grep -q "fatal signal" "$TMP/probe.err" && { bad "af_xdp: uroced crashed on an AF_XDP port"; cat "$TMP/probe.err"; finish; exit 1; }
  if grep -q "xdp_umem_configure(): Failed to create umem" "$TMP/probe.err"; then
    chunk=$(( 9216 + 128 + 192 ))  # data room, headroom, struct rte_mbuf and its private area
    big=$(umem_refused $chunk); small=$(umem_refused 4096)
    if [[ $big == XDP_UMEM_REG:* ]] && [ "$small" = accepted ]; then
      skip "net_af_xdp: the kernel refuses an XDP umem of ${chunk}-byte chunks outside hugepages ($big; 4096-byte chunks are accepted), and uroced's 9 KiB mbufs need them under --no-huge"
    fi
    bad "af_xdp: the PMD could not create its umem, but the kernel accepts a probe umem ($big / $small): not the kernel's refusal"
  else
    bad "af_xdp: uroced did not start on net_af_xdp (rc $rc), for a reason other than the kernel's umem refusal"
  fi
  shown "$TMP/probe.err" "$TMP/probe.out"
  finish; exit 1
fi
start_traffic "$NS_A" srv --port net_af_xdp0 --vdev "net_af_xdp0,iface=veth0" --ip 10.90.2.1 --lcore 0 --role server
wait_listen "$NS_A" "$LAST_PID" 18515 || bad "af_xdp: the server listens on TCP 18515 (gave up after $PROBES looks)"
start_traffic "$NS_B" cli --port net_af_xdp0 --vdev "net_af_xdp0,iface=veth0" --ip 10.90.2.2 --lcore 1 \
  --role client --peer 10.90.1.1 --messages 2000
cpid=$LAST_PID
wait "$cpid"; crc=$?
wait
echo "  client: $(cat "$TMP/cli.out")"
check "af_xdp: client verified all traffic" "[ $crc -eq 0 ] && grep -q 'uroce-traffic: OK' '$TMP/cli.out'"
check "af_xdp: server verified every SEND" "grep -q ', 0 bad' '$TMP/srv.out'"
finish
