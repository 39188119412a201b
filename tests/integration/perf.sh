#!/bin/bash
# uroce-perf and uroce-pingpong between two uroced over memif. Every run goes
# through perftest_peer.py, a scripted peer that checks each message of
# perftest's (and ibv_rc_pingpong's) TCP exchange against the real tools'
# format and order before relaying it.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
PERF=${UROCE_PERF:?path to uroce-perf}
PP=${UROCE_PINGPONG:?path to uroce-pingpong}
PEER="/usr/bin/python3 $(dirname "$0")/perftest_peer.py"
start_daemon "" da --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock" --ip 10.95.0.1 --lcore 0 \
  --app-socket "$TMP/a.app" --ctl-socket "$TMP/a.ctl"
wait_sockets "$TMP/a.app" "$TMP/a.ctl" || bad "daemon A is up (gave up after $PROBES looks)"
start_daemon "" db --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock" --ip 10.95.0.2 --lcore 1 \
  --app-socket "$TMP/b.app" --ctl-socket "$TMP/b.ctl"
wait_sockets "$TMP/a.app" "$TMP/b.app" || bad "both daemons are up (gave up after $PROBES looks)"
BASE=$((21000 + ($$ % 200) * 20))
py() { /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); $1" "$2"; }

# pair TEST NAME PROXY-ARGS -- CLIENT-ARGS: server on A, proxy, client on B (both --json)
pair() {
  local test=$1 name=$2 pargs=$3; shift 3
  local sp=$BASE cp=$((BASE + 1)); BASE=$((BASE + 2))
  timeout 120 $PERF "$test" -d "$TMP/a.app" -p $sp --json "$@" > "$TMP/$name.srv" 2> "$TMP/$name.srv.err" & local s=$!
  wait_listen "" "" $sp || echo "  ($name: the server never listened on TCP port $sp)"
  $PEER proxy "$test" $cp $sp $pargs > "$TMP/$name.peer" 2>&1 & local p=$!
  wait_listen "" "" $cp || echo "  ($name: the peer never listened on TCP port $cp)"
  timeout 120 $PERF "$test" -d "$TMP/b.app" -p $cp --json "$@" 127.0.0.1 > "$TMP/$name.cli" 2> "$TMP/$name.cli.err"
  local crc=$?
  wait $s; local src=$?
  wait $p; local prc=$?
  echo "  $name: client $crc server $src peer $prc; $(tail -1 "$TMP/$name.peer")"
  [ $crc -eq 0 ] && [ $src -eq 0 ] && [ $prc -eq 0 ]
}

echo "== the eight tests, through the scripted perftest peer"
for t in write_bw send_bw read_bw atomic_bw write_lat send_lat read_lat atomic_lat; do
  check "$t: client, server and the format check all pass" "pair $t $t '' -n 300"
  case $t in
    *_bw)
      check "$t: the client moved 300 messages at a positive rate" \
        "py 'x=r[\"results\"][0]; sys.exit(not (x[\"iterations\"]==300 and x[\"bw_average\"]>0 and x[\"msg_rate_mpps\"]>0))' $TMP/$t.cli"
      if [ $t = send_bw ]; then
        check "$t: the server counted 300 receives itself" \
          "py 'x=r[\"results\"][0]; sys.exit(not (x[\"iterations\"]==300 and x[\"bw_average\"]>0))' $TMP/$t.srv"
      else
        check "$t: the server prints the client's report (perftest's report exchange)" \
          "py 'import json; c=json.load(open(\"$TMP/$t.cli\"))[\"results\"][0]; s=r[\"results\"][0]; sys.exit(not (abs(s[\"bw_average\"]-c[\"bw_average\"])<0.01 and s[\"iterations\"]==c[\"iterations\"]))' $TMP/$t.srv"
      fi ;;
    *)
      check "$t: latency columns ordered (min <= typical <= max, p99 <= max)" \
        "py 'x=r[\"results\"][0]; sys.exit(not (0<x[\"t_min\"]<=x[\"t_typical\"]<=x[\"t_max\"] and x[\"p99\"]<=x[\"t_max\"] and x[\"iterations\"]==300))' $TMP/$t.cli" ;;
  esac
done
py 'x=r["results"][0]; print("  write_lat %.1f us typical; " % x["t_typical"])' "$TMP/write_lat.cli"

echo "== four QPs, a timed run, Gb/s, all sizes"
check "write_bw -q 4: the peer sees four QPs' keys in both loops" "pair write_bw q4 '--qps 4' -n 200 -q 4"
check "write_bw -q 4: 4 x 200 messages" "py 'sys.exit(r[\"results\"][0][\"iterations\"]!=800)' $TMP/q4.cli"
check "write_bw -D 2: a timed run counts what it did" "pair write_bw dur '' -D 2"
check "write_bw -D 2: iterations counted, a progress line shown" \
  "py 'sys.exit(r[\"results\"][0][\"iterations\"]<10)' $TMP/dur.cli && grep -q 'progress:' $TMP/dur.cli.err"
timeout 60 $PERF send_bw -d "$TMP/a.app" -p $BASE -n 200 --report_gbits > "$TMP/gb.srv" 2>&1 & s=$!; wait_listen "" "" $BASE || echo "  (nothing listened on TCP port $BASE)"
timeout 60 $PERF send_bw -d "$TMP/b.app" -p $BASE -n 200 --report_gbits 127.0.0.1 > "$TMP/gb.cli" 2>&1; wait $s
BASE=$((BASE + 1))
check "--report_gbits: perftest's Gb/s header" \
  "grep -qxF ' #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]' $TMP/gb.cli"
timeout 60 $PERF read_lat -d "$TMP/a.app" -p $BASE -n 50 > "$TMP/tl.srv" 2>&1 & s=$!; wait_listen "" "" $BASE || echo "  (nothing listened on TCP port $BASE)"
timeout 60 $PERF read_lat -d "$TMP/b.app" -p $BASE -n 50 127.0.0.1 > "$TMP/tl.cli" 2>&1; wait $s
check "text output: perftest's latency header" \
  "grep -qxF ' #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ' $TMP/tl.cli"
BASE=$((BASE + 1))
timeout 120 $PERF write_bw -d "$TMP/a.app" -p $BASE -n 20 -a --json > "$TMP/all.srv" 2>&1 & s=$!; wait_listen "" "" $BASE || echo "  (nothing listened on TCP port $BASE)"
timeout 120 $PERF write_bw -d "$TMP/b.app" -p $BASE -n 20 -a --json 127.0.0.1 > "$TMP/all.cli" 2>&1; wait $s
BASE=$((BASE + 1))
check "write_bw -a: 23 sizes, 2 B to 8 MiB" \
  "py 'x=[y[\"bytes\"] for y in r[\"results\"]]; sys.exit(x!=[2**i for i in range(1,24)])' $TMP/all.cli"

echo "== the newer perftest (6.24: no closing 'done'), and an old one"
check "write_bw against a 6.24 server" "pair write_bw v624 '--as-version 6.24 --no-done' -n 200"
check "send_lat against a 6.24 server" "pair send_lat v624l '--as-version 6.24 --no-done' -n 100"
$PEER old-server $BASE 5.60 > "$TMP/old.peer" 2>&1 & p=$!; wait_listen "" "" $BASE || echo "  (nothing listened on TCP port $BASE)"
timeout 30 $PERF write_bw -d "$TMP/b.app" -p $BASE 127.0.0.1 > "$TMP/old.cli" 2>&1; orc=$?; wait $p; prc=$?
BASE=$((BASE + 1))
check "a peer at perftest 5.60 is refused with a clear error" \
  "[ $orc -eq 1 ] && [ $prc -eq 0 ] && grep -q '5.70 or newer' $TMP/old.cli"

echo "== bad input"
# (into a file: grep -q may leave the pipe before the usage is all written,
# and the tool would die of SIGPIPE instead of exiting 2)
check "unknown test: usage, exit 2" "$PERF write_fast > '$TMP/usage.out' 2>&1; [ \$? -eq 2 ] && grep -q 'unknown test' '$TMP/usage.out'"
check "-s 0: refused" "! $PERF write_bw -s 0 127.0.0.1 2>/dev/null"
check "-m 1000: refused" "$PERF write_bw -m 1000 127.0.0.1 2>&1 | grep -q '256, 512'"
check "no such device: a clear error" "$PERF write_bw -d nosuchdev 127.0.0.1 2>&1 | grep -q 'no device named nosuchdev'"

echo "== uroce-pingpong, through the scripted ibv_rc_pingpong peer, data checked"
for sz in 1 1000 4096; do
  sp=$BASE; cp=$((BASE + 1)); BASE=$((BASE + 2))
  timeout 60 $PP -d "$TMP/a.app" -p $sp -s $sz -n 200 -c -e > "$TMP/pp$sz.srv" 2>&1 & s=$!; wait_listen "" "" $sp || echo "  (nothing listened on TCP port $sp)"
  $PEER pingpong-proxy $cp $sp > "$TMP/pp$sz.peer" 2>&1 & p=$!; wait_listen "" "" $cp || echo "  (nothing listened on TCP port $cp)"
  timeout 60 $PP -d "$TMP/b.app" -p $cp -s $sz -n 200 -c -g 0 127.0.0.1 > "$TMP/pp$sz.cli" 2>&1; crc=$?
  wait $s; src=$?; wait $p; prc=$?
  echo "  $sz B: $(grep usec/iter "$TMP/pp$sz.cli")"
  check "pingpong $sz B: both sides 200 messages, none bad; exchange as rc_pingpong's" \
    "[ $crc -eq 0 ] && [ $src -eq 0 ] && [ $prc -eq 0 ] && grep -q '^200 messages checked, 0 bad' $TMP/pp$sz.cli && grep -q '^200 messages checked, 0 bad' $TMP/pp$sz.srv"
done
echo "== uroce-pingpong: the ACK of the client's last SEND never comes, as when the peer has already left"
# Daemon A drops every ACK of the client's last PSN: its retries run out
# after all 1500 replies have arrived, which is the end of the run, not a
# failure. The PSNs are fixed (--psn), so the rule is in place before the
# run starts (QPN *: the client's QP number is not known yet); the server's
# own PSNs are far from the client's, so the rule can only hit that ACK.
sp=$BASE; BASE=$((BASE + 1))
cpsn=0x100000; last=$(printf '0x%06x' $(( cpsn + 1499 )))
reply=$(ctl "$TMP/a.ctl" "fault tx rule=drop:*:$last:100")
timeout 60 $PP -d "$TMP/a.app" -p $sp -s 64 -n 1500 -c -e --psn 0x200000 > "$TMP/ppl.srv" 2>&1 & s=$!; wait_listen "" "" $sp || echo "  (nothing listened on TCP port $sp)"
timeout 60 $PP -d "$TMP/b.app" -p $sp -s 64 -n 1500 -c -e --psn $cpsn 127.0.0.1 > "$TMP/ppl.cli" 2>&1 & c=$!
wait $c; crc=$?; wait $s; src=$?
qpn=$(sed -n 's/.*local address:.*QPN \(0x[0-9a-f]*\).*/\1/p' "$TMP/ppl.cli")
ftx=$(ctl "$TMP/a.ctl" status | grep -o "\"fault_tx\": {[^}]*"); echo "  $ftx"; hits=$(echo "$ftx" | grep -o "\"rule_hits\": [0-9]*" | awk "{print \$2}")
ctl "$TMP/a.ctl" "fault tx off" > /dev/null
echo "  client QPN $qpn, last PSN $last; ACKs dropped: ${hits:-?}; $(grep 'never acknowledged' "$TMP/ppl.cli" | cut -c1-60)..."
check "pingpong, last ACK lost: the client ends cleanly with all 1500 replies checked, and says why" \
  "echo '$reply' | grep -q '\"ok\": true' && [ $crc -eq 0 ] && [ $src -eq 0 ] && [ \${hits:-0} -ge 2 ] && grep -q '^1500 messages checked, 0 bad' $TMP/ppl.cli && grep -q 'last SEND was never acknowledged' $TMP/ppl.cli"
echo "== write_lat: the ACK of the server's last WRITE is lost once, after the client has finished"
# The client (daemon B) drops its one ACK of the server's last PSN (the
# server's first, fixed by --psn, plus 2999; the rule is set before the run).
# The server retries; the client has left, and its QP's number, in
# quarantine in daemon B, must answer it (the tools no longer linger).
sp=$BASE; BASE=$((BASE + 1))
spsn=0x300000; last=$(printf '0x%06x' $(( spsn + 2999 )))
reply=$(ctl "$TMP/b.ctl" "fault tx rule=drop:*:$last:1")
timeout 60 $PERF write_lat -d "$TMP/a.app" -p $sp -n 3000 --psn $spsn > "$TMP/wl.srv" 2>&1 & s=$!; wait_listen "" "" $sp || echo "  (nothing listened on TCP port $sp)"
timeout 60 $PERF write_lat -d "$TMP/b.app" -p $sp -n 3000 --psn 0x400000 127.0.0.1 > "$TMP/wl.cli" 2>&1 & c=$!
wait $c; crc=$?; wait $s; src=$?
qpn=$(sed -n 's/.*remote address: LID [0-9a-fx]* QPN \(0x[0-9a-f]*\).*/\1/p' "$TMP/wl.cli")
hits=$(ctl "$TMP/b.ctl" status | grep -o '"fault_tx": {[^}]*' | grep -o '"rule_hits": [0-9]*' | awk '{print $2}')
ctl "$TMP/b.ctl" "fault tx off" > /dev/null
echo "  server QPN $qpn, last PSN $last; ACKs dropped: ${hits:-?}; server: $(grep -E '^ [0-9]+ +3000 ' "$TMP/wl.srv" | head -1)"
check "write_lat, last ACK lost: the server's retry is answered, both sides finish 3000 iterations" \
  "echo '$reply' | grep -q '\"ok\": true' && [ $crc -eq 0 ] && [ $src -eq 0 ] && [ \${hits:-0} -eq 1 ] && grep -qE '^ [0-9]+ +3000 ' $TMP/wl.srv"
echo "== write_lat: the peer left before the ACK of our last WRITE, which never comes"
# The other side destroys its QP at once, and its daemon drops
# every ACK of our last PSN, so our last WRITE ends in RETRY_EXC_ERR after
# every WRITE of the peer has arrived (seen against rxe's ib_write_lat at 5%
# loss, both ways). SIDE is the tool whose ACK is lost; its daemon's peer
# (the other daemon) drops the ACKs. The server writes first, so the
# client's last WRITE proves the server's arrived: the server takes that end
# as the end of the run, said on stderr. Nothing follows the client's last
# WRITE, so the client fails and says why; the server's own report of 3000
# iterations is what proves that WRITE arrived.
wl_left() {  # SIDE: srv|cli
  local side=$1 sp=$BASE; BASE=$((BASE + 1))
  # Fixed PSNs (--psn), so the rule is set before the run: the server's
  # from 0x500000, the client's from 0x600000; SIDE's last one's ACKs drop.
  local ctlf=$TMP/b.ctl first=0x500000 pat='remote address'
  [ "$side" = cli ] && { ctlf=$TMP/a.ctl; first=0x600000; pat='local address'; }
  local last; last=$(printf '0x%06x' $(( first + 2999 )))
  local reply; reply=$(ctl "$ctlf" "fault tx rule=drop:*:$last:100")
  timeout 60 $PERF write_lat -d "$TMP/a.app" -p $sp -n 3000 --psn 0x500000 > "$TMP/wll.srv" 2>&1 & local s=$!; wait_listen "" "" $sp || echo "  (nothing listened on TCP port $sp)"
  timeout 60 $PERF write_lat -d "$TMP/b.app" -p $sp -n 3000 --psn 0x600000 127.0.0.1 > "$TMP/wll.cli" 2>&1 & local c=$!
  wait $c; local crc=$?; wait $s; local src=$?
  local qpn; qpn=$(sed -n "s/.*$pat: LID [0-9a-fx]* QPN \(0x[0-9a-f]*\).*/\1/p" "$TMP/wll.cli")
  local hits; hits=$(ctl "$ctlf" status | grep -o '"fault_tx": {[^}]*' | grep -o '"rule_hits": [0-9]*' | awk '{print $2}')
  ctl "$ctlf" "fault tx off" > /dev/null
  echo "  $side: QPN $qpn, last PSN $last; ACKs dropped: ${hits:-?}; $(grep -h 'never acknowledged' "$TMP/wll.$side" | cut -c1-60)..."
  echo "$reply" | grep -q '"ok": true' && [ "${hits:-0}" -ge 1 ] && [ $src -eq 0 ] && grep -qE '^ [0-9]+ +3000 ' "$TMP/wll.srv" &&
    if [ "$side" = srv ]; then
      [ $crc -eq 0 ] && grep -q 'last WRITE was never acknowledged.*the peer finished and left' "$TMP/wll.srv"
    else
      [ $crc -eq 1 ] && grep -q 'last WRITE was never acknowledged.*no proof it arrived' "$TMP/wll.cli"
    fi
}
check "write_lat server, peer gone: the last WRITE's RETRY_EXC_ERR ends the run cleanly, with a note" "wl_left srv"
check "write_lat client, peer gone: the client's last WRITE ends in RETRY_EXC_ERR and the client fails (nothing proves that WRITE arrived); the server reports all 3000" "wl_left cli"

# Waiting on shared cores (abi/spin.h): in a ping-pong (default waiting,
# two daemons and two applications on this host's cores) both ends poll
# for the next message, yielding their cores, instead of sleeping through
# each: B's daemon sleeps, and its application blocks on its completion
# channel (which B's daemon then rings), far less than once a round trip.
# With the 5 us spin alone, both happened about once a round.
echo "== a ping-pong is polled for, not slept through"
# On two shared cores the outcome is bimodal (docs/performance.md, "Waiting
# on two shared cores"): a run that starts while the programs' start-up
# holds a core can settle into sleeping through. Up to three tries, 5 s
# apart (past the daemon's memory of late yields, abi/spin.h); a daemon or
# an application that does not poll for a ping-pong fails every try.
rounds=10000
for try in 1 2 3; do
  st0=$(ctl "$TMP/b.ctl" status)
  sp=$BASE; BASE=$((BASE + 1))
  timeout 120 $PERF send_lat -d "$TMP/a.app" -p $sp -n $rounds > "$TMP/pp.srv" 2>&1 & s=$!; wait_listen "" "" $sp || echo "  (nothing listened on TCP port $sp)"
  timeout 120 $PERF send_lat -d "$TMP/b.app" -p $sp -n $rounds 127.0.0.1 > "$TMP/pp.cli" 2>&1; crc=$?; wait $s; src=$?
  st1=$(ctl "$TMP/b.ctl" status)
  sleeps=$(( $(jget "$st1" dataplane.idle_sleeps) - $(jget "$st0" dataplane.idle_sleeps) ))
  notifies=$(( $(jget "$st1" wait.cq_notifies) - $(jget "$st0" wait.cq_notifies) ))
  late=$(( $(jget "$st1" wait.late_yields) - $(jget "$st0" wait.late_yields) ))
  echo "  try $try, $rounds round trips: B's daemon slept $sleeps times (its yields came back late $late times; learnt gap before $(jget "$st0" wait.gap_us) us, after $(jget "$st1" wait.gap_us) us), B's completion channels were rung $notifies times"
  [ $crc -eq 0 ] && [ $src -eq 0 ] && [ $sleeps -lt $((rounds / 4)) ] && [ $notifies -lt $((rounds / 4)) ] && break
  [ $try -lt 3 ] && sleep 5
done
check "send_lat, $rounds round trips: both pass" "[ $crc -eq 0 ] && [ $src -eq 0 ]"
check "B's daemon slept fewer than once in 4 round trips (try $try of 3)" "[ $sleeps -lt $((rounds / 4)) ]"
check "B's application blocked on its channel fewer than once in 4 round trips (try $try of 3)" "[ $notifies -lt $((rounds / 4)) ]"
finish
