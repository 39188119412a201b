# Shared by the bench scripts (sourced after tests/integration/lib.sh).
# net_af_packet on veth0, with frames that hold a 4 KiB RoCE packet.
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"

# testpmd LINK FRAME_BYTES [SECONDS]: dpdk-testpmd txonly -> rxonly on the
# same vdev pair uroce uses (memif, or af_packet across the veth); prints the
# best steady Rx-pps the receiver saw.
testpmd() {
  local link=$1 size=$2 secs=${3:-8}
  local common="--no-huge -m 1024 --log-level=lib.eal:error"
  # (af_packet with 9216-byte frames needs mbufs whose data room holds a whole frame)
  if [ "$link" = memif ]; then
    rm -f "$TMP/t.sock"
    timeout $((secs + 3)) dpdk-testpmd $common -l 0,1 --file-prefix tpa-$$ --no-pci --vdev "net_memif0,role=server,socket=$TMP/t.sock,bsize=8192" -- \
      --forward-mode=rxonly --auto-start --stats-period 1 --total-num-mbufs=32768 --rxd=2048 --txd=2048 > "$TMP/tp-rx.out" 2>&1 &
    sleep 1.5
    timeout "$secs" dpdk-testpmd $common -l 1,0 --file-prefix tpb-$$ --no-pci --vdev "net_memif0,role=client,socket=$TMP/t.sock,bsize=8192" -- \
      --forward-mode=txonly --txpkts="$size" --auto-start --stats-period 1 --total-num-mbufs=32768 --rxd=2048 --txd=2048 --burst=64 > "$TMP/tp-tx.out" 2>&1 &
  else
    ip netns exec "$NS_A" timeout $((secs + 3)) dpdk-testpmd $common -l 0,1 --file-prefix tpa-$$ --no-pci --vdev "net_af_packet0,$AFP" -- \
      --forward-mode=rxonly --auto-start --stats-period 1 --total-num-mbufs=16384 --rxd=512 --txd=512 --mbuf-size=9472 > "$TMP/tp-rx.out" 2>&1 &
    sleep 1.5
    ip netns exec "$NS_B" timeout "$secs" dpdk-testpmd $common -l 1,0 --file-prefix tpb-$$ --no-pci --vdev "net_af_packet0,$AFP" -- \
      --forward-mode=txonly --txpkts="$size" --auto-start --stats-period 1 --total-num-mbufs=16384 --rxd=512 --txd=512 --burst=64 --mbuf-size=9472 > "$TMP/tp-tx.out" 2>&1 &
  fi
  wait_testpmd
  grep -o 'Rx-pps: *[0-9]*' "$TMP/tp-rx.out" | awk '{print $2}' | sort -n | tail -1
}

# Waits for the two testpmd processes only (daemons may be running too).
wait_testpmd() {
  local p
  for p in $(pgrep -f "file-prefix tp[ab]-$$"); do
    while kill -0 "$p" 2>/dev/null; do sleep 0.2; done
  done
}
