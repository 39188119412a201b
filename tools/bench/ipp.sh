#!/bin/sh
# Instructions per packet on the requester and responder paths, by callgrind
# (instruction counts are stable on a noisy machine, unlike timings).
#   tools/bench/ipp.sh [BUILD_DIR] [MESSAGES]
# It runs the workload as it is; with A's QP paced (at 1 Pb/s, so the pacer
# holds nothing back): the difference is the pacer's cost; and with A's QP
# under each congestion control (dcqcn, swift): the cost of its hooks, on
# the requester (TX, RTT probe) and the completer (ACK, RTT sample).
# Last, qp_scale's workload at 1 and at 10,000 QPs (qp_scale_ipp, two run
# lengths each, so setup cancels out): the instructions a message, whose
# ratio bounds what qp_scale's 10,000-QP rate could be if memory cost nothing.
set -eu
build=${1:-build}; n=${2:-20000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$build/tools/bench/engine_ipp" "$n" > "$out/stdout" 2>/dev/null
valgrind --tool=callgrind --callgrind-out-file="$out/cg.paced" "$build/tools/bench/engine_ipp" "$n" 1000000000000000 \
  > "$out/stdout.paced" 2>/dev/null
for cc in dcqcn swift; do
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.$cc" "$build/tools/bench/engine_ipp" "$n" 0 $cc > /dev/null 2>&1
  callgrind_annotate --inclusive=yes "$out/cg.$cc" > "$out/ann.$cc" 2>/dev/null
done
pkts=$(sed -n 's/.*request packets sent by A: \([0-9]*\),.*/\1/p' "$out/stdout")
callgrind_annotate --inclusive=yes "$out/cg" > "$out/ann" 2>/dev/null
callgrind_annotate --inclusive=yes "$out/cg.paced" > "$out/ann.paced" 2>/dev/null
cost() { grep -E "$1" "${2:-$out/ann}" | head -1 | awk '{gsub(",","",$1); print $1}'; }
req=$(cost 'Engine::send_next_packet')
req_paced=$(cost 'Engine::send_next_packet' "$out/ann.paced")
rsp=$(cost 'Engine::on_request\(')
cmp=$(cost 'Engine::on_response\(')
rx=$(cost 'Engine::rx\(')
parse=$(cost 'parse_frame')
echo "messages: $((2 * n)) (8-byte WRITE and SEND), request packets: $pkts"
icrc=$(cost 'HeaderTemplate::icrc')
echo "requester (send_next_packet, incl. build + ICRC): $((req / pkts)) instructions/packet"
echo "requester without the ICRC (HeaderTemplate::icrc): $(((req - ${icrc:-0}) / pkts)) instructions/packet (the ICRC: $((${icrc:-0} / pkts)))"
echo "requester, paced (the pacer's cost):              $((req_paced / pkts)) instructions/packet (+$(((req_paced - req) / pkts)))"
for cc in dcqcn swift; do
  r=$(cost 'Engine::send_next_packet' "$out/ann.$cc"); c=$(cost 'Engine::on_response\(' "$out/ann.$cc")
  echo "with $cc: requester $((r / pkts)) (+$(((r - req) / pkts))), completer $((c / pkts)) (+$(((c - cmp) / pkts))) instructions/packet"
done
echo "responder (on_request, after parsing):            $((rsp / pkts)) instructions/packet"
echo "completer (on_response, per request packet):      $((cmp / pkts)) instructions/packet"
echo "receive path (rx incl. parse + ICRC check), all frames both sides: $rx instructions total"
echo "parse_frame total: $parse instructions"
ipm() {  # QPS: marginal instructions a message of qp_scale's workload
  local a b ma mb
  for r in 200 600; do
    valgrind --tool=callgrind --callgrind-out-file="$out/qs.$1.$r" "$build/tools/bench/qp_scale_ipp" "$1" $r > "$out/qs.$1.$r.out" 2>/dev/null
  done
  a=$(callgrind_annotate "$out/qs.$1.200" | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
  b=$(callgrind_annotate "$out/qs.$1.600" | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
  ma=$(sed -n 's/^messages: //p' "$out/qs.$1.200.out"); mb=$(sed -n 's/^messages: //p' "$out/qs.$1.600.out")
  echo $(((b - a) / (mb - ma)))
}
one=$(ipm 1); many=$(ipm 10000)
echo "qp_scale's workload, instructions a message (both engines and the wire): 1 QP $one, 10,000 QPs $many;"
echo "  so 10,000 QPs could run at most at $((100 * one / many))% of the 1-QP rate if memory cost nothing"
