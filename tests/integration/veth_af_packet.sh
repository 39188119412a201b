#!/bin/bash
# Two uroced on net_af_packet in two namespaces joined by veth through a
# bridge: verified RC SEND/WRITE/READ/ATOMIC; then again with 2% of RoCE
# frames dropped by nftables plus the daemons' own reorder/dup/corrupt
# injection; the captures must pass uroce-pcap --strict and tshark. Last,
# SEND/WRITE traffic under the same 2% loss, go-back-N and then selective
# repeat (IRN-style, both daemons set to it): selective repeat recovers
# with fewer retransmitted bytes.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
need_prog tshark tshark
make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"
# tsh PCAP FILTER: how many frames of PCAP match FILTER, by tshark with the
# RoCEv2 decode; prints "failed" (and tshark's error) when tshark exits
# non-zero or reads no frame at all, so a check on the number cannot pass.
TSHARK=${TSHARK:-tshark}
TSH_IB="-d udp.port==4791,infiniband --disable-protocol rpcordma --disable-heuristic mellanox_eoib --disable-heuristic eth_over_ib"
tsh() {
  local all n
  all=$("$TSHARK" -r "$1" $TSH_IB -T fields -e frame.number 2> "$TMP/tshark.err" | wc -l; exit "${PIPESTATUS[0]}") &&
    [ "$all" -gt 0 ] &&
    n=$("$TSHARK" -r "$1" $TSH_IB -Y "$2" -T fields -e frame.number 2>> "$TMP/tshark.err" | wc -l; exit "${PIPESTATUS[0]}") &&
    { echo "$n"; return 0; }
  echo "failed"; grep -v 'Running as user' "$TMP/tshark.err" | head -2 | sed 's/^/  tshark: /' >&2; return 1
}
run_pair() {  # tag messages size extra-args-for-both...
  local tag=$1 msgs=$2 size=$3; shift 3
  start_traffic "$NS_A" "srv-$tag" --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 \
    --role server --size "$size" --capture "$TMP/srv-$tag.pcap" --ctl-socket "$TMP/srv-$tag.ctl" "$@"
  wait_listen "$NS_A" "$LAST_PID" 18515 || bad "$tag: the server listens on TCP 18515 (gave up after $PROBES looks)"
  start_traffic "$NS_B" "cli-$tag" --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
    --role client --peer 10.90.1.1 --messages "$msgs" --size "$size" --capture "$TMP/cli-$tag.pcap" "$@"
  local cpid=$(echo $PIDS | awk '{print $NF}')
  local spid=$(echo $PIDS | awk '{print $(NF-1)}')
  wait "$cpid"; local crc=$?
  wait "$spid"; local src=$?
  echo "  client: $(cat "$TMP/cli-$tag.out")"
  echo "  server: $(cat "$TMP/srv-$tag.out")"
  check "$tag: client verified all traffic (rc=$crc)" "[ $crc -eq 0 ] && grep -q 'uroce-traffic: OK' '$TMP/cli-$tag.out'"
  check "$tag: server verified every SEND (rc=$src)" "[ $src -eq 0 ] && grep -q ', 0 bad' '$TMP/srv-$tag.out'"
  if [ -n "$UROCE_PCAP" ]; then
    check "$tag: uroce-pcap --strict reads the client capture" "'$UROCE_PCAP' --strict --quiet '$TMP/cli-$tag.pcap' > /dev/null"
    check "$tag: uroce-pcap --strict reads the server capture" "'$UROCE_PCAP' --strict --quiet '$TMP/srv-$tag.pcap' > /dev/null"
  fi
  local bad_frames
  bad_frames=$(tsh "$TMP/cli-$tag.pcap" '_ws.malformed || _ws.expert.severity >= error')
  check "$tag: tshark reads the capture and finds no malformed frames ($bad_frames)" "[ '$bad_frames' = 0 ]"
}

echo "== clean link, MTU 1024"
run_pair clean 2000 4096
echo "== clean link, MTU 4096"
run_pair mtu4096 1000 16384 --mtu 4096
echo "== 2% RoCE loss on the link, plus reordering and duplication injected by the daemons"
drop_roce 2
# timeout 14 (67 ms), not 10 (4 ms): on two loaded cores a daemon can wait
# longer than 8 x 4 ms for its turn, and the client then gave up with
# RETRY_EXC_ERR (gbn or sr, in 2 of 3 runs at a load of 6-7).
run_pair lossy 2000 4096 --timeout 14 --fault-rx reorder=0.02,dup=0.02
dropped=$(dropped_by_nft)
echo "  nftables dropped $dropped RoCE frames"
check "lossy: nftables really dropped frames" "[ ${dropped:-0} -gt 0 ]"
check "lossy: the client retransmitted" "grep -q 'verified, [1-9][0-9]* retransmissions' '$TMP/cli-lossy.out'"
if [ -n "$UROCE_PCAP" ]; then
  naks=$("$UROCE_PCAP" --json "$TMP/srv-lossy.pcap" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(q["naks"]["psn_seq_error"] for q in d["qps"]))')
  check "lossy: the server's capture shows sequence NAKs ($naks)" "[ ${naks:-0} -gt 0 ]"
fi
echo "== 2% RoCE loss, SENDs of 64 KiB: go-back-N, then selective repeat"
retx_bytes() { sed -n 's/.* retransmissions (\([0-9]*\) bytes).*/\1/p' "$TMP/cli-$1.out"; }
run_pair gbn 600 65536 --timeout 14 --ops send --depth 8
run_pair sr 600 65536 --timeout 14 --ops send --depth 8 --selective-repeat
gbn=$(retx_bytes gbn); sr=$(retx_bytes sr)
echo "  retransmitted bytes: go-back-N $gbn, selective repeat $sr"
check "sr: selective repeat recovered with fewer retransmitted bytes than go-back-N" \
  "[ -n '$sr' ] && [ -n '$gbn' ] && [ ${sr:-0} -gt 0 ] && [ ${sr:-0} -lt ${gbn:-0} ]"
srf=$(tsh "$TMP/cli-sr.pcap" 'infiniband.bth.opcode >= 0xe0')
check "sr: its frames are uroce's selective-repeat opcodes ($srf in the capture)" "[ '$srf' != failed ] && [ ${srf:-0} -gt 100 ]"
no_loss
finish
