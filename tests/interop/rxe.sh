#!/bin/bash
# Live interop: uroce against Linux rxe in a QEMU guest (../shared/peers/rxe-vm),
# both directions, uroce's own tools and (at MTU 1024 and at 1% loss) the same
# stock Debian binaries on both sides, uroce's through uroce-run,
# at MTU 1024 and 4096, then with 1% and 5% of RoCEv2 frames
# dropped on the guest's bridge (nftables) plus reordering and duplication
# from uroced's fault injector. Every run is captured; the captures must pass
# uroce-pcap --strict and show both sides' go-back-N at work under loss.
#
# Skips (exit 77) only where QEMU cannot run at all ("SKIP: interop: QEMU
# cannot run here: ..."); a missing QEMU, a guest that cannot be built or
# does not boot (at the start or for the MTU 4096 stage) is a failure, and
# no skip comes after a failed check. The RETRY_EXC_ERR end-of-run rules
# (rxe_lib.sh) are checked against each stage's capture and counted in the
# summary line before the totals.
. "$(dirname "$0")/rxe_lib.sh"

echo "== MTU 1024 (rxe's default)"
boot
daemon m1024
for sz in 1 1000 4096; do pingpong "mtu1024" $sz 50; done
for t in write_bw read_bw send_bw atomic_bw; do perftest "mtu1024" $t 100; done
for t in write_lat send_lat read_lat atomic_lat; do perftest "mtu1024" $t 100; done
rping "mtu1024" 5
echo "  -- the same stock binaries on both sides (uroce's through uroce-run)"
stock_pingpong "mtu1024" 4096 20
for t in write_bw read_bw send_lat write_lat; do stock_perftest "mtu1024" $t 50; done
stock_rping "mtu1024" 5
stock_udaddy "mtu1024"
stock_rstream "mtu1024"
stop_daemon
settle_rules m1024
strict m1024

for pct in 1 5; do
  echo "== $pct% of RoCEv2 frames dropped on the guest's bridge, plus uroced reordering and duplicating"
  set_loss $pct
  daemon "loss$pct" --fault-rx "reorder=0.01,dup=0.01"
  for sz in 1 1000 4096; do pingpong "loss$pct" $sz 20; done
  for t in write_bw read_bw send_bw atomic_bw; do perftest "loss$pct" $t 20; done
  perftest "loss$pct" write_lat 30
  perftest "loss$pct" send_lat 30
  rping "loss$pct" 3
  # The stock binaries under loss: perftest with -u 18 on both sides, as
  # uroce-perf runs (a 1.07 s ACK timeout: the TCG guest can stall for a
  # good part of a second, beyond 7 retries of the default 67 ms).
  # ibv_rc_pingpong has no such option, so it runs at MTU 1024 only.
  if [ "$pct" = 1 ]; then
    stock_perftest "loss$pct" write_bw 20 "-u 18"
    stock_perftest "loss$pct" send_lat 20 "-u 18"
    stock_perftest "loss$pct" read_bw 20 "-u 18"
    stock_perftest "loss$pct" write_lat 20 "-u 18"
    stock_rping "loss$pct" 3
  fi
  stop_daemon
  echo "  frames dropped by nftables: $(dropped)"
  settle_rules "loss$pct"
  strict "loss$pct"
  loss_evidence "loss$pct"
done
set_loss 0

echo "== MTU 4096 on both sides (guest booted with peer.mtu=4200)"
boot "peer.mtu=4200"
daemon m4096
check "mtu4096: the guest's port is at 4096" "G 'ibv_devinfo' | grep -q 'active_mtu:.*4096'"
for sz in 1 1000 4096; do pingpong "mtu4096" $sz 20 "-m 4096"; done
for t in write_bw read_bw send_bw atomic_bw; do perftest "mtu4096" $t 30 "-m 4096"; done
perftest "mtu4096" write_lat 30 "-m 4096 -s 4096"
perftest "mtu4096" send_lat 30 "-m 4096 -s 4096"
rping "mtu4096" 3
stop_daemon
settle_rules m4096
strict m4096
rules_summary
finish
