#!/bin/sh
# Every fixture in pcap-fixtures/ (and rxe/) decodes with uroce-pcap --strict, and tshark
# reads it with no malformed frames.
#   check_fixtures.sh UROCE_PCAP FIXTURE_DIR
set -u
pcap=$1; dir=$2
pass=0; fail=0
# The InfiniBand dissector on RoCEv2's port. Payload heuristics are off: they
# guess at application protocols inside UD payloads and report 1-byte
# payloads as malformed Ethernet or EoIB.
TSHARK_IB="-d udp.port==4791,infiniband --disable-protocol rpcordma --disable-heuristic mellanox_eoib --disable-heuristic eth_over_ib"
for f in "$dir"/*.pcap "$dir"/rxe/*.pcap; do
  [ -e "$f" ] || continue
  if "$pcap" --strict --quiet "$f" >/dev/null; then pass=$((pass+1)); else echo "FAIL: uroce-pcap --strict $f"; fail=$((fail+1)); fi
  # tshark flags UDP checksum 0 over IPv6 as an error; RoCEv2 sends 0 by
  # design (IBTA Annex A17, and rxe does the same), so that one item is allowed.
  bad=$(tshark -r "$f" $TSHARK_IB -Y '_ws.malformed || (_ws.expert.severity >= error && !(_ws.expert.message == "Illegal checksum value (0)"))' 2>/dev/null | wc -l)
  if [ "$bad" -eq 0 ]; then pass=$((pass+1)); else echo "FAIL: tshark finds $bad malformed/error frames in $f"; fail=$((fail+1)); fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
