#!/usr/bin/env bash
# The main job: two uroced daemons joined by a virtual link (net_memif,
# shared memory), and applications on each side that reach them the way any
# application does, through liburoce and the shared rings:
#   - uroce-rping (RDMA CM connect, then SEND, RDMA READ and RDMA WRITE each
#     round, every byte of every round validated);
#   - uroce-pingpong (RC SENDs back and forth, every message checked);
#   - uroce-perf write_bw (the rate of 4 KiB WRITEs).
# Then both daemons' counters, and the server's capture decoded by
# uroce-pcap --strict. Runs without hugepages.
#   tools/demo.sh [BUILD_DIR] [MESSAGES] [SIZE]
# BUILD_DIR `installed` (the default when the package's uroce-demo runs it)
# takes the installed programs instead: uroced from sbin, the rest from bin.
set -euo pipefail
build=${1:-}; msgs=${2:-20000}; size=${3:-4096}
[ -n "$build" ] || { [ "$(basename "$0")" = uroce-demo ] && build=installed || build=build; }
if [ "$build" = installed ]; then
  prefix=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
  uroced="$prefix/sbin/uroced"
  rping="$prefix/bin/uroce-rping" pingpong="$prefix/bin/uroce-pingpong" perf="$prefix/bin/uroce-perf"
  pcap="$prefix/bin/uroce-pcap"
else
  uroced="$build/control/uroced"
  rping="$build/tools/perf/uroce-rping" pingpong="$build/tools/perf/uroce-pingpong" perf="$build/tools/perf/uroce-perf"
  pcap="$build/tools/uroce-pcap"
fi
for b in "$uroced" "$rping" "$pingpong" "$perf"; do
  [ -x "$b" ] || { echo "demo: $b not built (tools/setup.sh build) or not installed"; exit 2; }
done
dir=$(mktemp -d /tmp/uroce-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
common=(--no-huge --mem-mb 256 --port net_memif0 --no-host-netdev)  # two daemons in one namespace: no host netdevs
echo "== starting two uroced over net_memif (socket $dir/memif.sock)"
"$uroced" "${common[@]}" --file-prefix demo-a-$$ --lcore 0 --vdev "net_memif0,role=server,socket=$dir/memif.sock,bsize=8192" \
  --ip 10.77.7.1 --app-socket "$dir/a.sock" --ctl-socket "$dir/a.ctl" --capture "$dir/a.pcap" > "$dir/a.out" 2> "$dir/a.log" &
pids+=($!)
sleep 1
"$uroced" "${common[@]}" --file-prefix demo-b-$$ --lcore 1 --vdev "net_memif0,role=client,socket=$dir/memif.sock,bsize=8192" \
  --ip 10.77.7.2 --app-socket "$dir/b.sock" --ctl-socket "$dir/b.ctl" > "$dir/b.out" 2> "$dir/b.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$dir/a.sock" ] && [ -S "$dir/b.sock" ] && break; sleep 0.1; done
[ -S "$dir/a.sock" ] && [ -S "$dir/b.sock" ] || { echo "demo FAILED: the daemons did not start"; tail -3 "$dir"/*.log; exit 1; }
fail=0

pings=$(( msgs / 20 > 0 ? msgs / 20 : 1 ))
echo "== uroce-rping: RDMA CM, then $pings rounds of SEND + RDMA READ + RDMA WRITE of $size bytes, validated"
"$rping" -s -C "$pings" -S "$size" -p 7471 -d "$dir/a.sock" > "$dir/rps.out" 2>&1 & rs=$!
for _ in $(seq 50); do grep -q '^listening' "$dir/rps.out" 2>/dev/null && break; sleep 0.1; done
if timeout 120 "$rping" -c -a 10.77.7.1 -p 7471 -C "$pings" -S "$size" -V -d "$dir/b.sock" > "$dir/rpc.out" 2>&1 &&
   wait $rs && grep -q "^$pings pings, data validated" "$dir/rpc.out"; then
  echo "   client: $(tail -1 "$dir/rpc.out"); server: $(tail -1 "$dir/rps.out")"
else
  echo "   FAILED: client: $(tail -1 "$dir/rpc.out"); server: $(tail -1 "$dir/rps.out")"; fail=1
fi

echo "== uroce-pingpong: $msgs RC SENDs of $size bytes back and forth, every message checked"
"$pingpong" -d "$dir/a.sock" -p 7472 -s "$size" -n "$msgs" -c > "$dir/pps.out" 2>&1 & ps=$!
sleep 0.3
if timeout 120 "$pingpong" -d "$dir/b.sock" -p 7472 -s "$size" -n "$msgs" -c 127.0.0.1 > "$dir/ppc.out" 2>&1 &&
   wait $ps && grep -q "^$msgs messages checked, 0 bad" "$dir/ppc.out" && grep -q "^$msgs messages checked, 0 bad" "$dir/pps.out"; then
  echo "   $(grep -h 'usec/iter' "$dir/ppc.out" | head -1)"
  echo "   client: $(grep 'messages checked' "$dir/ppc.out"); server: $(grep 'messages checked' "$dir/pps.out")"
else
  echo "   FAILED: $(tail -2 "$dir/ppc.out" | tr '\n' ' ') / $(tail -2 "$dir/pps.out" | tr '\n' ' ')"; fail=1
fi

echo "== uroce-perf write_bw: $msgs WRITEs of 4096 bytes"
"$perf" write_bw -d "$dir/a.sock" -p 7473 -s 4096 -n "$msgs" > "$dir/bws.out" 2>&1 & bs=$!
sleep 0.3
if timeout 120 "$perf" write_bw -d "$dir/b.sock" -p 7473 -s 4096 -n "$msgs" 127.0.0.1 > "$dir/bwc.out" 2>&1 && wait $bs; then
  sed -n '/bytes/,$p' "$dir/bwc.out" | head -3 | sed 's/^/   /'
else
  echo "   FAILED: $(tail -2 "$dir/bwc.out" | tr '\n' ' ')"; fail=1
fi

echo "== the daemons' view"
for s in a b; do
  /usr/bin/python3 - "$dir/$s.ctl" "$s" <<'PY' || true
import json, socket, sys
c = socket.socket(socket.AF_UNIX); c.settimeout(5); c.connect(sys.argv[1]); c.sendall(b"status\n")
data = b""
while not data.endswith(b"\n"):
    chunk = c.recv(65536)
    if not chunk: break
    data += chunk
st = json.loads(data)
port, qp = st.get("port", {}), st.get("qp_totals", {})
print(f"   daemon {sys.argv[2]}: {port.get('rx_frames', 0)} frames in, {port.get('tx_frames', 0)} out; "
      f"{qp.get('completions', 0)} completions; {qp.get('retransmitted_pkts', 0)} retransmitted; "
      f"{port.get('bad_wqe', 0)} bad work requests; {port.get('cq_overflows', 0)} CQ overflows")
PY
done
grep -o 'msg="neighbour learned"[^{]*' "$dir/b.log" | head -1 | sed 's/^/   daemon b /' || true
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()
if [ -x "$pcap" ]; then
  echo "== daemon a's capture, decoded by uroce-pcap --strict:"
  "$pcap" --strict --quiet "$dir/a.pcap" | sed 's/^/   /' || fail=1
fi
if [ $fail -ne 0 ]; then echo "demo FAILED"; tail -3 "$dir/a.log" "$dir/b.log"; exit 1; fi
echo "demo OK"
