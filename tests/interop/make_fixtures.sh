#!/bin/bash
# Writes pcap-fixtures/rxe/*.pcap: short perftest runs between uroce-perf and
# Linux rxe (in the QEMU guest of ../shared/peers/rxe-vm) with 5% of RoCEv2
# frames dropped on the guest's bridge, captured by uroced (--capture, which
# records exactly what the engine received and sent). A run is kept only if
# it shows loss recovery (a NAK sequence error or a retransmission); else it
# is made again. tests/unit/transport/test_rxe_replay.cc replays them.
#
#   tests/interop/make_fixtures.sh BUILD_DIR pcap-fixtures/rxe      (root)
build=$(realpath "${1:?usage: make_fixtures.sh BUILD_DIR OUTDIR}")
OUT=$(realpath "${2:?usage: make_fixtures.sh BUILD_DIR OUTDIR}")
export UROCED=$build/control/uroced UROCE_PCAP=$build/tools/uroce-pcap UROCE_CTL=$build/tools/uroce-ctl
export UROCE_PERF=$build/tools/perf/uroce-perf UROCE_PINGPONG=$build/tools/perf/uroce-pingpong
export UROCE_RPING=$build/tools/perf/uroce-rping LD_LIBRARY_PATH=$build/stack/verbs
. "$(dirname "$0")/rxe_lib.sh"
mkdir -p "$OUT"
boot
set_loss 5

# one NAME TEST ROLE: one direction of TEST; ROLE is uroce's (requester: our
# uroce-perf is the client; responder: rxe's ib_TEST is the client).
one() {
  local name=$1 t=$2 role=$3 try
  for try in 1 2 3 4; do
    daemon "$name"
    fresh
    if [ "$role" = requester ]; then
      G "timeout 60 ib_$t -d rxe0 -x 1 -n 20 -s 2048 </dev/null >/tmp/f.log 2>&1 &"
      g_tcp 18515 || echo "  $name: ib_$t did not listen in the guest"
      X timeout 90 "$PERF" "$t" -d "$TMP/u.app" -n 20 -s 2048 -u 18 10.77.0.2 > "$TMP/f.out" 2>&1
    else
      X timeout 90 "$PERF" "$t" -d "$TMP/u.app" -n 20 -s 2048 -u 18 > "$TMP/f.out" 2>&1 & local sp=$!
      h_tcp 18515 || echo "  $name: uroce-perf did not listen"
      G "timeout 60 ib_$t -d rxe0 -x 1 -n 20 -s 2048 10.77.0.1 > /tmp/f.log 2>&1"
      wait $sp
    fi
    local rc=$?
    stop_daemon
    "$UROCE_PCAP" --json --quiet "$TMP/$name.pcap" > "$TMP/$name.json" 2>/dev/null
    local ev
    ev=$(/usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sum(q['naks']['psn_seq_error']+q['psn_repeats'] for q in d['qps']))" "$TMP/$name.json")
    if [ $rc -eq 0 ] && [ "${ev:-0}" -gt 0 ]; then
      cp "$TMP/$name.pcap" "$OUT/$name.pcap"
      ok "$name: $(tail -1 < <("$UROCE_PCAP" --quiet "$OUT/$name.pcap")), $ev NAKs + retransmissions (try $try)"
      return
    fi
    echo "  $name: try $try: rc=$rc, loss events ${ev:-0}; again"
  done
  bad "$name: no run with loss recovery in 4 tries"
}

one write_uroce_requester write_bw requester
one write_uroce_responder write_bw responder
one read_uroce_requester read_bw requester
one read_uroce_responder read_bw responder
set_loss 0
finish
