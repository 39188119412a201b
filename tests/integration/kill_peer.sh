#!/bin/bash
# One side killed in the middle of a transfer: the other side's WRs complete
# with RETRY_EXC_ERR within the configured timeout, and nothing hangs.
. "$(dirname "$0")/lib.sh"
need_root
make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"
# timeout 12: 4.096 us * 2^12 = 16.8 ms; retry_cnt 3: fails after ~4 timeouts (67 ms), well under 2 s.
start_traffic "$NS_A" srv --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 --role server --timeout 12 --retry-cnt 3
spid=$LAST_PID
sleep 1
start=$(date +%s%N)
start_traffic "$NS_B" cli --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
  --role client --peer 10.90.1.1 --messages 100000000 --size 4096 --timeout 12 --retry-cnt 3
cpid=$LAST_PID
sleep 1.5
kill -9 "$spid"
killed=$(date +%s%N)
wait "$cpid"; crc=$?
ended=$(date +%s%N)
grep -o 'msg="[^"]*"' "$TMP/cli.err" | tail -3 | sed 's/^/  client log: /'
ms=$(( (ended - killed) / 1000000 ))
echo "  client: $(head -1 "$TMP/cli.out")"
echo "  client exited rc=$crc ${ms} ms after the server was killed"
check "the client was mid-transfer when the server died" "grep -q 'after [1-9][0-9]* messages' '$TMP/cli.out'"
check "the client's outstanding work failed with RETRY_EXC_ERR" "grep -q RETRY_EXC_ERR '$TMP/cli.out'"
check "the client exited non-zero" "[ $crc -ne 0 ]"
check "within 2 s of the kill (configured: ~4 x 16.8 ms)" "[ $ms -lt 2000 ]"
finish
