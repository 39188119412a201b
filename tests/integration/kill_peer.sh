#!/bin/bash
# One side killed in the middle of a transfer: the other side's WRs complete
# with RETRY_EXC_ERR after exactly the retries it was configured for, and
# nothing hangs. The bound is a count, not a time: the client's retransmit
# timer may expire retry_cnt + 1 times after the kill (retry_cnt retries,
# then the error), whatever the machine's load makes of the milliseconds.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
make_link
AFP="iface=veth0,framesz=9216,blocksz=36864,framecnt=512"
RETRY=3
# timeout 14: 4.096 us * 2^14 = 67 ms, long enough that a loaded machine
# does not fire it while the server is alive.
start_traffic "$NS_A" srv --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.1 --lcore 0 --role server --timeout 14 --retry-cnt $RETRY
spid=$LAST_PID
wait_listen "$NS_A" "$spid" 18515 || bad "the server listens on TCP 18515 (gave up after $PROBES looks)"
start_traffic "$NS_B" cli --port net_af_packet0 --vdev "net_af_packet0,$AFP" --ip 10.90.2.2 --lcore 1 \
  --role client --peer 10.90.1.1 --messages 100000000 --size 4096 --timeout 14 --retry-cnt $RETRY --ctl-socket "$TMP/cli.ctl"
cpid=$LAST_PID
# cli_qp COUNTER: the client's QP counter total, read live ("" when it cannot answer)
cli_qp() { jget "$(ctl "$TMP/cli.ctl" status 2>/dev/null)" "qp_totals.$1" 2>/dev/null; }
moving() { [ -S "$TMP/cli.ctl" ] && [ "$(cli_qp completions)" -ge 1000 ] 2>/dev/null; }
probe 400 moving || bad "the client completed 1000 messages before the kill (gave up after $PROBES looks)"
t0=$(cli_qp timeouts)
kill -9 "$spid"
# Watch the client's timer until the client exits. A client that keeps
# retrying past its configured count is stopped once its timer has expired
# twice as often as allowed; one whose timer stopped and that never exits
# is stopped after 600 looks.
allowed=$((RETRY + 1)) looks=0 endless=0
while kill -0 "$cpid" 2>/dev/null && [ $looks -lt 600 ]; do
  looks=$((looks + 1))
  t=$(cli_qp timeouts)
  if [ -n "$t" ] && [ $((t - ${t0:-0})) -gt $((2 * allowed)) ]; then endless=1; break; fi
  sleep 0.05
done
kill -0 "$cpid" 2>/dev/null && { kill -9 "$cpid"; echo "  client still up after $looks looks: killed"; }
wait "$cpid"; crc=$?
grep -o 'msg="[^"]*"' "$TMP/cli.err" | tail -3 | sed 's/^/  client log: /'
# The final count from the status the client printed as it stopped; the
# last one read live if it had to be killed.
t1=$(grep -o 'status=.*' "$TMP/cli.err" | tail -1 | sed 's/^status=//')
t1=$(jget "$t1" qp_totals.timeouts 2>/dev/null || echo "${t:-}")
echo "  client: $(head -1 "$TMP/cli.out")"
echo "  client exited rc=$crc; its retransmit timer expired ${t0:-?} times before the kill and ${t1:-?} in all"
check "the client was mid-transfer when the server died" "grep -q 'after [1-9][0-9]* messages' '$TMP/cli.out'"
check "the client's outstanding work failed with RETRY_EXC_ERR" "grep -q RETRY_EXC_ERR '$TMP/cli.out'"
check "the client exited non-zero, by itself" "[ $crc -ne 0 ] && [ $crc -lt 128 ] && [ $endless -eq 0 ]"
check "it gave up after retry_cnt + 1 = $allowed timer expiries since the kill, no more (got $((${t1:-0} - ${t0:-0})))" \
  "[ -n '$t0' ] && [ -n '$t1' ] && [ $((${t1:-0} - ${t0:-0})) -eq $allowed ]"
finish
