#!/bin/bash
# Daemon-to-daemon figures over virtual links, with the raw PMD ceiling on
# the same vdevs in the same run:
#   uroce: message rate (64-byte SENDs) and goodput (64 KiB SENDs, MTU 4096),
#          two uroce-traffic processes (a node each, traffic on the engine
#          directly, no liburoce hop) over net_memif and over veth/net_af_packet;
#   ceiling: dpdk-testpmd txonly -> rxonly on the same vdev pair.
# Needs root (namespaces). Prints a table.
#   tools/bench/daemon_bench.sh [BUILD_DIR]
set -u
build=${1:-build}
export UROCED=$(realpath "$build/control/uroced") UROCE_PCAP=$(realpath "$build/tools/uroce-pcap")
export UROCE_TRAFFIC=$(realpath "$build/tools/traffic/uroce-traffic")
. "$(dirname "$0")/../../tests/integration/lib.sh"
need_root
make_link
. "$(dirname "$0")/bench_lib.sh"
declare -A R

app() {  # link msgs size mtu -> prints "msg/s MB/s"
  local link=$1 msgs=$2 size=$3 mtu=$4 sv cv
  if [ "$link" = memif ]; then
    rm -f "$TMP/m.sock"
    start_traffic "" bsrv --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.91.0.1 --lcore 0 \
      --role server --size "$size" --ops send --depth 64 --mtu "$mtu" --idle-max-us 0
    sleep 1
    start_traffic "" bcli --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.91.0.2 --lcore 1 \
      --role client --peer 127.0.0.1 --messages "$msgs" --size "$size" --ops send --depth 64 --mtu "$mtu" --idle-max-us 0
  else
    start_traffic "$NS_A" bsrv --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 \
      --role server --size "$size" --ops send --depth 64 --mtu "$mtu" --idle-max-us 0
    sleep 1
    start_traffic "$NS_B" bcli --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
      --role client --peer 10.90.1.1 --messages "$msgs" --size "$size" --ops send --depth 64 --mtu "$mtu" --idle-max-us 0
  fi
  wait $LAST_PID
  wait
  sed -n 's/.* s, \([0-9.e+]*\) MB\/s, \([0-9.e+]*\) msg\/s.*/\2 \1/p' "$TMP/bcli.out"
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
