#!/bin/bash
# Daemon-to-daemon figures over virtual links, with the raw PMD ceiling on
# the same vdevs in the same run:
#   uroce: message rate (64-byte SENDs) and goodput (64 KiB SENDs, MTU 4096),
#          two uroced over net_memif and over veth/net_af_packet;
#   ceiling: dpdk-testpmd txonly -> rxonly on the same vdev pair.
# Needs root (namespaces). Prints a table.
#   tools/bench/daemon_bench.sh [BUILD_DIR]
set -u
build=${1:-build}
export UROCED=$(realpath "$build/control/uroced") UROCE_PCAP=$(realpath "$build/tools/uroce-pcap")
. "$(dirname "$0")/../../tests/integration/lib.sh"
need_root
make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"
declare -A R

app() {  # link msgs size mtu -> prints "msg/s MB/s"
  local link=$1 msgs=$2 size=$3 mtu=$4 sv cv
  if [ "$link" = memif ]; then
    rm -f "$TMP/m.sock"
    start_daemon "" bsrv --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock" --ip 10.91.0.1 --lcore 0 \
      --app server --app-size "$size" --app-ops send --app-depth 64 --mtu "$mtu" --idle-max-us 0
    sleep 1
    start_daemon "" bcli --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock" --ip 10.91.0.2 --lcore 1 \
      --app client --app-peer 127.0.0.1 --app-messages "$msgs" --app-size "$size" --app-ops send --app-depth 64 --mtu "$mtu" --idle-max-us 0
  else
    start_daemon "$NS_A" bsrv --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 \
      --app server --app-size "$size" --app-ops send --app-depth 64 --mtu "$mtu" --idle-max-us 0
    sleep 1
    start_daemon "$NS_B" bcli --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
      --app client --app-peer 10.90.1.1 --app-messages "$msgs" --app-size "$size" --app-ops send --app-depth 64 --mtu "$mtu" --idle-max-us 0
  fi
  wait $LAST_PID
  wait
  sed -n 's/.* s, \([0-9.e+]*\) MB\/s, \([0-9.e+]*\) msg\/s.*/\2 \1/p' "$TMP/bcli.out"
}

testpmd() {  # link pktsize -> prints rx pps
  # (af_packet with 9216-byte frames needs mbufs whose data room holds a whole frame)
  local link=$1 size=$2 tx rx
  local common="--no-huge -m 1024 --log-level=lib.eal:error"
  if [ "$link" = memif ]; then
    rm -f "$TMP/t.sock"
    timeout 12 dpdk-testpmd $common -l 0,1 --file-prefix tpa-$$ --no-pci --vdev "net_memif0,role=server,socket=$TMP/t.sock" -- \
      --forward-mode=rxonly --auto-start --stats-period 1 --total-num-mbufs=32768 --rxd=2048 --txd=2048 > "$TMP/tp-rx.out" 2>&1 &
    sleep 1.5
    timeout 9 dpdk-testpmd $common -l 1,0 --file-prefix tpb-$$ --no-pci --vdev "net_memif0,role=client,socket=$TMP/t.sock" -- \
      --forward-mode=txonly --txpkts="$size" --auto-start --stats-period 1 --total-num-mbufs=32768 --rxd=2048 --txd=2048 --burst=64 > "$TMP/tp-tx.out" 2>&1 &
  else
    ip netns exec "$NS_A" timeout 12 dpdk-testpmd $common -l 0,1 --file-prefix tpa-$$ --no-pci --vdev "net_af_packet0,$AFP" -- \
      --forward-mode=rxonly --auto-start --stats-period 1 --total-num-mbufs=16384 --rxd=512 --txd=512 --mbuf-size=9472 > "$TMP/tp-rx.out" 2>&1 &
    sleep 1.5
    ip netns exec "$NS_B" timeout 9 dpdk-testpmd $common -l 1,0 --file-prefix tpb-$$ --no-pci --vdev "net_af_packet0,$AFP" -- \
      --forward-mode=txonly --txpkts="$size" --auto-start --stats-period 1 --total-num-mbufs=16384 --rxd=512 --txd=512 --burst=64 --mbuf-size=9472 > "$TMP/tp-tx.out" 2>&1 &
  fi
  wait
  # The best steady 2-second Rx-pps the receiver saw.
  grep -o 'Rx-pps: *[0-9]*' "$TMP/tp-rx.out" | awk '{print $2}' | sort -n | tail -1
}

for link in memif veth; do
  read -r r64 m64 <<< "$(app $link 200000 64 1024)"
  read -r r64k m64k <<< "$(app $link 4000 65536 4096)"
  t64=$(testpmd $link 64)
  t4k=$(testpmd $link 4096)
  R[$link]="$r64 $m64k $t64 $t4k"
  printf '%-6s uroce 64B SEND: %10.0f msg/s | uroce 64KiB SEND goodput: %8.1f MB/s (%.2f Gb/s) | testpmd 64B: %9s pps | testpmd 4KiB: %9s pps (%.2f Gb/s)\n' \
    "$link" "${r64:-0}" "${m64k:-0}" "$(echo "${m64k:-0} * 8 / 1000" | bc -l)" "${t64:-?}" "${t4k:-?}" "$(echo "${t4k:-0} * 4096 * 8 / 1000000000" | bc -l)"
done
finish_ok=1
