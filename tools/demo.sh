#!/usr/bin/env bash
# The main job: two uroced daemons joined by a virtual link (net_memif, shared
# memory) run real RC traffic, SEND, WRITE, READ and ATOMIC, with every byte
# verified, and print a summary. Runs without hugepages.
#   tools/demo.sh [BUILD_DIR] [MESSAGES] [SIZE]
set -euo pipefail
build=${1:-build}; msgs=${2:-20000}; size=${3:-4096}
uroced="$build/control/uroced"
[ -x "$uroced" ] || { echo "demo: $uroced not built (tools/setup.sh build)"; exit 2; }
dir=$(mktemp -d /tmp/uroce-demo.XXXXXX)
cleanup() { [ -n "${spid:-}" ] && kill "$spid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
common=(--no-huge --mem-mb 256 --port net_memif0 --app-size "$size")
echo "== starting two uroced over net_memif (socket $dir/memif.sock)"
"$uroced" "${common[@]}" --file-prefix demo-srv-$$ --lcore 0 --vdev "net_memif0,role=server,socket=$dir/memif.sock" \
  --ip 10.77.7.1 --app server --capture "$dir/server.pcap" > "$dir/server.out" 2> "$dir/server.log" &
spid=$!
sleep 1
echo "== client: $msgs RC messages of $size bytes (SEND, WRITE + read-back, READ, ATOMIC), every byte verified"
set +e
"$uroced" "${common[@]}" --file-prefix demo-cli-$$ --lcore 1 --vdev "net_memif0,role=client,socket=$dir/memif.sock" \
  --ip 10.77.7.2 --app client --app-peer 127.0.0.1 --app-messages "$msgs" > "$dir/client.out" 2> "$dir/client.log"
rc=$?
wait "$spid"; src=$?
set -e
spid=""
echo "   $(cat "$dir/client.out")"
echo "   $(cat "$dir/server.out")"
grep -o 'msg="neighbour learned"[^{]*' "$dir/client.log" | head -1 | sed 's/^/   client /'
if [ -x "$build/tools/uroce-pcap" ]; then
  echo "== the server's capture, decoded by uroce-pcap --strict:"
  "$build/tools/uroce-pcap" --strict --quiet "$dir/server.pcap" | sed 's/^/   /'
fi
if [ $rc -ne 0 ] || [ $src -ne 0 ]; then echo "demo FAILED (client rc=$rc, server rc=$src)"; tail -5 "$dir/client.log"; exit 1; fi
echo "demo OK"
