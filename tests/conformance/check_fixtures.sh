#!/bin/sh
# Every fixture in pcap-fixtures/ (and rxe/) decodes with uroce-pcap --strict, and tshark
# reads it with no malformed frames. tshark's exit status is checked, and it
# must read as many frames as uroce-pcap does: a tshark that cannot run, or
# reads nothing, fails.
#   check_fixtures.sh UROCE_PCAP FIXTURE_DIR      ($TSHARK names another tshark)
set -u
pcap=$1; dir=$2
pass=0; fail=0
err=$(mktemp); trap 'rm -f "$err"' EXIT
# The InfiniBand dissector on RoCEv2's port. Payload heuristics are off: they
# guess at application protocols inside UD payloads and report 1-byte
# payloads as malformed Ethernet or EoIB.
TSHARK=${TSHARK:-tshark}
TSHARK_IB="-d udp.port==4791,infiniband --disable-protocol rpcordma --disable-heuristic mellanox_eoib --disable-heuristic eth_over_ib"
for f in "$dir"/*.pcap "$dir"/rxe/*.pcap; do
  [ -e "$f" ] || continue
  if "$pcap" --strict --quiet "$f" >/dev/null; then pass=$((pass+1)); else echo "FAIL: uroce-pcap --strict $f"; fail=$((fail+1)); fi
  # tshark flags UDP checksum 0 over IPv6 as an error; RoCEv2 sends 0 by
  # design (IBTA Annex A17, and rxe does the same), so that one item is allowed.
  all=$("$TSHARK" -r "$f" $TSHARK_IB -T fields -e frame.number 2>"$err") && all=$(printf '%s' "$all" | grep -c .) &&
    bad=$("$TSHARK" -r "$f" $TSHARK_IB -T fields -e frame.number \
      -Y '_ws.malformed || (_ws.expert.severity >= error && !(_ws.expert.message == "Illegal checksum value (0)"))' 2>>"$err") ||
    { echo "FAIL: tshark did not run on $f: $(grep -v 'Running as user' "$err" | head -1)"; fail=$((fail+1)); continue; }
  bad=$(printf '%s' "$bad" | grep -c .)
  want=$("$pcap" --json --quiet "$f" 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["frames"])' 2>/dev/null)
  if [ "$all" -eq 0 ] || { [ -n "$want" ] && [ "$all" -ne "$want" ]; }; then
    echo "FAIL: tshark read $all frames of $f (uroce-pcap: ${want:-?})"; fail=$((fail+1))
  elif [ "$bad" -eq 0 ]; then pass=$((pass+1)); else echo "FAIL: tshark finds $bad malformed/error frames in $f"; fail=$((fail+1)); fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
