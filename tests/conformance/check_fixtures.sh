#!/bin/sh
# Every fixture in pcap-fixtures/ decodes with uroce-pcap --strict, and tshark
# reads it with no malformed frames.
#   check_fixtures.sh UROCE_PCAP FIXTURE_DIR
set -u
pcap=$1; dir=$2
pass=0; fail=0
for f in "$dir"/*.pcap; do
  [ -e "$f" ] || continue
  if "$pcap" --strict --quiet "$f" >/dev/null; then pass=$((pass+1)); else echo "FAIL: uroce-pcap --strict $f"; fail=$((fail+1)); fi
  bad=$(tshark -r "$f" -d udp.port==4791,infiniband --disable-protocol rpcordma -Y '_ws.malformed || _ws.expert.severity >= error' 2>&1 | wc -l)
  if [ "$bad" -eq 0 ]; then pass=$((pass+1)); else echo "FAIL: tshark finds $bad malformed/error frames in $f"; fail=$((fail+1)); fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
