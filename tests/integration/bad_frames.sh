#!/bin/bash
# Bad frames on the wire (truncated, bad ICRC, unknown QP), plus ARP and ICMP
# echo, sent by scapy from the other namespace: the RoCE ones are dropped and
# counted, ARP and ping are answered, the daemon keeps running.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"
start_daemon "$NS_A" dut --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --ctl-socket "$TMP/dut.ctl" > /dev/null
# Its port is up (the log says so before the control socket answers).
up() { [ -S "$TMP/dut.ctl" ] && ctl "$TMP/dut.ctl" status > /dev/null 2>&1; }
probe 400 up || bad "the daemon answers on its control socket (gave up after $PROBES looks)"
mac=$(ip -n "$NS_A" -br link show veth0 | awk '{print $3}')
ip netns exec "$NS_B" /usr/bin/python3 - "$mac" > "$TMP/scapy.out" 2>&1 <<'PY'
import sys
from scapy.all import Ether, IP, UDP, ARP, ICMP, Raw, sendp, srp1, conf, get_if_hwaddr
from scapy.contrib.roce import BTH
conf.verb = 0
mac = sys.argv[1]
me = get_if_hwaddr("veth0")  # explicit: scapy would take lo's all-zero MAC, which bridges drop
base = Ether(dst=mac, src=me) / IP(src="10.90.2.2", dst="10.90.2.1") / UDP(sport=49152, dport=4791)
good = base / BTH(opcode=0x04, dqpn=0x11, psn=1, ackreq=1) / Raw(b"x" * 16)
good_bytes = bytes(good)
frames = []
# RDMA WRITE_ONLY whose RETH is cut short: IP and UDP lengths are consistent
# (a bridge with br_netfilter drops IP-inconsistent frames before they arrive),
# the RoCE headers are not: BTH + 8 of the RETH's 16 bytes + a 4-byte "ICRC".
bth = bytes(BTH(opcode=0x0a, dqpn=0x11, psn=1, icrc=0))[:12]
frames.append(bytes(base / Raw(bth + bytes(8) + bytes(4))))
frames.append(bytes(base / BTH(opcode=0x04, dqpn=0x11, psn=1, icrc=0xdeadbeef) / Raw(b"y" * 16)))  # bad ICRC
frames.append(bytes(base / BTH(opcode=0x04, dqpn=0xabcdef, psn=1) / Raw(b"z" * 16)))  # valid, unknown QP
frames.append(bytes(Ether(dst=mac, src=me) / IP(src="10.90.2.2", dst="10.90.2.1") / UDP(dport=53) / Raw(b"dns?")))  # not RoCE
for f in frames:
    sendp(Ether(f), iface="veth0")
arp = srp1(Ether(dst="ff:ff:ff:ff:ff:ff", src=me) / ARP(op=1, hwsrc=me, psrc="10.90.2.2", pdst="10.90.2.1"), iface="veth0", timeout=2)
print("arp-reply", arp is not None and arp[ARP].hwsrc == mac)
pong = srp1(Ether(dst=mac, src=me) / IP(src="10.90.2.2", dst="10.90.2.1") / ICMP(id=7, seq=1) / Raw(b"ping"), iface="veth0", timeout=2)
print("icmp-reply", pong is not None and pong.haslayer(ICMP) and pong[ICMP].type == 0)
PY

# Every frame scapy sent has been taken in once the daemon has counted the
# last of them, the ICMP echo it answered.
st=""
counted() { st=$(ctl "$TMP/dut.ctl" status); [ "$(jget "$st" dataplane.rx_icmp_echo 2>/dev/null)" -ge 1 ] 2>/dev/null; }
probe 400 counted || echo "  no ICMP echo counted after $PROBES looks"
for k in port.rx_malformed port.rx_icrc_err port.rx_unknown_qp dataplane.rx_other dataplane.rx_arp_nd dataplane.rx_icmp_echo; do
  eval "v_${k//./_}=$(jget "$st" $k)"
done
echo "  malformed=$v_port_rx_malformed icrc=$v_port_rx_icrc_err unknown_qp=$v_port_rx_unknown_qp other=$v_dataplane_rx_other arp=$v_dataplane_rx_arp_nd icmp=$v_dataplane_rx_icmp_echo"
check "the truncated frame was dropped and counted" "[ $v_port_rx_malformed -ge 1 ]"
check "the bad-ICRC frame was dropped and counted" "[ $v_port_rx_icrc_err -ge 1 ]"
check "the unknown-QP frame was dropped and counted" "[ $v_port_rx_unknown_qp -ge 1 ]"
check "the non-RoCE UDP frame was dropped and counted" "[ $v_dataplane_rx_other -ge 1 ]"
check "ARP was answered (scapy saw the reply)" "grep -q 'arp-reply True' '$TMP/scapy.out'"
check "ICMP echo was answered (scapy saw the reply)" "grep -q 'icmp-reply True' '$TMP/scapy.out'"
check "ICMP echo was counted" "[ $v_dataplane_rx_icmp_echo -ge 1 ]"
check "the daemon is still running" "kill -0 $(echo $PIDS | awk '{print $1}')"
finish
