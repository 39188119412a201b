#!/bin/bash
# Embedded mode: the engine, pipeline and port inside the application
# (liburoce's plugin), driven by its own calls. Two embedded processes over
# memif run the perftest matrix, batched posts, loss recovery and the RDMA
# CM; an embedded application against a daemon runs app_pair's op matrix,
# completion channels, SRQs and CM. Unmodified programs (ibv_rc_pingpong,
# rping, perftest) run embedded through uroce-run and the drop-in
# libraries. Bad specs are refused with a reason.
. "$(dirname "$0")/lib.sh"
need_root
# tools/setup.sh installs these: a missing one fails.
need_prog ibv_rc_pingpong ibverbs-utils
need_prog rping rdmacm-utils
need_prog ib_write_bw perftest
UROCE_RUN=${UROCE_RUN:?the path of tools/uroce-run}
# meson puts the drop-in libraries' folders on LD_LIBRARY_PATH (this test
# depends on them): the nodes' DPDK needs the system's libibverbs, and the
# stock programs get uroce's from uroce-run.
unset LD_LIBRARY_PATH
PERF=${UROCE_PERF:?path to uroce-perf}
RPING=${UROCE_RPING:?path to uroce-rping}
APP=${APP_PAIR:?path to app_pair}
BASE=$((25000 + ($$ % 200) * 20))
py() { /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); $1" "$2"; }
# The two nodes: A is memif's server, B its client. EXTRA_A/EXTRA_B add options.
spec() {  # spec a|b EXTRA
  local role=server ip=10.97.0.1 lc=0
  [ "$1" = b ] && role=client ip=10.97.0.2 lc=1
  echo "--port net_memif0 --vdev net_memif0,role=$role,socket=$TMP/m.sock,bsize=8192 --ip $ip --lcore $lc" \
       "--no-huge --mem-mb 256 --file-prefix emb$1-$$ ${2:-}"
}
# status_at_exit FILE: the node's closing status line (--log-level info) as JSON
status_at_exit() { sed -n 's/.*msg="uroce embedded node stopped" status=//p' "$1" | tail -1; }

# pair TEST NAME "EXTRA_A" "EXTRA_B" ARGS...: uroce-perf server embedded as A, client embedded as B
pair() {
  local test=$1 name=$2 ea=$3 eb=$4; shift 4
  local port=$BASE; BASE=$((BASE + 1))
  rm -f "$TMP/m.sock"
  UROCE_EMBEDDED="$(spec a "$ea")" timeout 120 "$PERF" "$test" -p $port --json "$@" > "$TMP/$name.srv" 2> "$TMP/$name.srv.err" & local s=$!
  for i in $(seq 50); do [ -S "$TMP/m.sock" ] && break; sleep 0.1; done
  UROCE_EMBEDDED="$(spec b "$eb")" timeout 120 "$PERF" "$test" -p $port --json "$@" 127.0.0.1 > "$TMP/$name.cli" 2> "$TMP/$name.cli.err"
  local crc=$?
  wait $s; local src=$?
  echo "  $name: client $crc server $src"
  [ $crc -eq 0 ] && [ $src -eq 0 ] || { tail -n 3 "$TMP/$name.cli.err" "$TMP/$name.srv.err" | sed 's/^/    /'; false; }
}

echo "== the eight perftest tests, two embedded processes over memif"
for t in write_bw send_bw read_bw atomic_bw write_lat send_lat read_lat atomic_lat; do
  check "$t: embedded client and server both pass" "pair $t $t '' '' -n 300"
  case $t in
    *_bw) check "$t: 300 messages at a positive rate" \
            "py 'x=r[\"results\"][0]; sys.exit(not (x[\"iterations\"]==300 and x[\"msg_rate_mpps\"]>0))' $TMP/$t.cli" ;;
    *) check "$t: 300 round trips, latency columns ordered" \
         "py 'x=r[\"results\"][0]; sys.exit(not (x[\"iterations\"]==300 and 0<x[\"t_min\"]<=x[\"t_typical\"]<=x[\"t_max\"]))' $TMP/$t.cli" ;;
  esac
done
py 'x=r["results"][0]; print("  send_lat %.2f us typical (embedded, 2 B)" % x["t_typical"])' "$TMP/send_lat.cli"

echo "== posts in batches (manual progress): a burst of posts is one pass, not one a post"
check "write_bw of 3000 64-byte messages: both pass" "pair write_bw batch '' '--log-level info' -n 3000 -s 64"
st=$(status_at_exit "$TMP/batch.cli.err")
names=$(jget "$st" intake.names 2>/dev/null)
echo "  B's intake took its QP's name ${names:-?} times for 3000 posts (a pass a post: once a post)"
check "B's intake was named at most once in 4 posts" "[ -n '$st' ] && [ '${names:-0}' -gt 0 ] && [ '${names:-0}' -le 750 ]"

echo "== loss recovery: 5% of frames dropped on receive at both nodes"
for t in write_bw send_bw read_bw; do
  check "$t under 5% loss: both pass" "pair $t loss_$t '--fault-rx drop=0.05 --log-level info' '--fault-rx drop=0.05 --log-level info' -n 2000 -s 4096"
  st=$(status_at_exit "$TMP/loss_$t.cli.err")
  check "$t under 5% loss: B's node dropped frames and recovered by go-back-N" \
    "[ -n '$st' ] && [ \$(jget '$st' fault_rx.dropped) -gt 0 ] && [ \$(jget '$st' qp_totals.retransmitted_pkts) -gt 0 ]"
  echo "  $t: B dropped $(jget "$st" fault_rx.dropped 2>/dev/null), retransmitted $(jget "$st" qp_totals.retransmitted_pkts 2>/dev/null)"
done

echo "== RDMA CM: uroce-rping between two embedded processes, 30 pings validated, frames reordered"
rm -f "$TMP/m.sock"
UROCE_EMBEDDED="$(spec a '--fault-rx reorder=0.3,reorder_us=3000 --log-level info')" timeout 120 "$RPING" -s -C 30 -p 7302 > "$TMP/rps.out" 2> "$TMP/rps.err" & sp=$!
for i in $(seq 50); do grep -q '^listening' "$TMP/rps.out" && break; sleep 0.1; done
UROCE_EMBEDDED="$(spec b)" timeout 120 "$RPING" -c -a 10.97.0.1 -p 7302 -C 30 -V > "$TMP/rpc.out" 2> "$TMP/rpc.err"; rc=$?
wait $sp; src=$?
st=$(status_at_exit "$TMP/rps.err")
echo "  client: $(tail -n 1 "$TMP/rpc.out"); server: $(tail -n 1 "$TMP/rps.out"); A reordered $(jget "$st" fault_rx.reordered 2>/dev/null)"
check "rping: 30 pings validated, 30 served, with frames reordered, through the CM on both nodes" \
  "[ $rc -eq 0 ] && [ $src -eq 0 ] && grep -q '^30 pings, data validated' '$TMP/rpc.out' && grep -q '^30 pings' '$TMP/rps.out' && [ \$(jget '$st' fault_rx.reordered) -gt 0 ] && [ \$(jget '$st' cm.established) -ge 1 ]"

echo "== an embedded application against a daemon: app_pair's op matrix, channels, SRQ, CM"
rm -f "$TMP/m.sock"
start_daemon "" db --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.97.0.2 --lcore 1 \
  --app-socket "$TMP/b.app" --ctl-socket "$TMP/b.ctl"
for i in $(seq 50); do [ -S "$TMP/b.app" ] && break; sleep 0.1; done
EA="embedded:--port net_memif0 --vdev net_memif0,role=client,socket=$TMP/m.sock,bsize=8192 --ip 10.97.0.1 --lcore 0 --no-huge --mem-mb 256 --file-prefix embe-$$ --ctl-socket $TMP/e.ctl"
for m in ops events srq cm; do
  timeout 120 "$APP" $m "$EA" "$TMP/b.app" > "$TMP/$m.out" 2>&1; rc=$?
  grep FAIL "$TMP/$m.out" | head -5 | sed 's/^/  /'; echo "  $m: $(tail -n 1 "$TMP/$m.out")"
  check "$m: all checks pass, A embedded and B on uroced" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/$m.out'"
done

echo "== fork() in an embedded application: the child leaves the parent's node alone"
EF="embedded:--port net_memif0 --vdev net_memif0,role=client,socket=$TMP/m.sock,bsize=8192 --ip 10.97.0.1 --lcore 0 --no-huge --mem-mb 256 --file-prefix embf-$$"
timeout 60 "$APP" fork "$EF" > "$TMP/fork.out" 2>&1; rc=$?
grep -E 'FAIL|child:|parent:' "$TMP/fork.out" | head -5 | sed 's/^/  /'
check "fork: the parent's requests succeed while the child turns nothing" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/fork.out'"

echo "== the control socket of an embedded node: status while it runs; stop refused"
"$APP" hold "$EA" 3 > "$TMP/hold.out" 2>&1 & hp=$!
for i in $(seq 50); do grep -q qpn "$TMP/hold.out" && break; sleep 0.1; done
st=$(ctl "$TMP/e.ctl" status); stp=$(ctl "$TMP/e.ctl" stop)
wait $hp; hrc=$?
check "uroce-ctl status: one session with its QP, in the application's own process" \
  "echo '$st' | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); l=d[\"session_list\"]; sys.exit(not (d[\"sessions\"]==1 and l[0][\"pid\"]==$hp and len(l[0][\"qpns\"])==1))'"
check "stop is refused: an embedded node stops with its application" "echo '$stp' | grep -q 'stops when its application closes'"
check "the holding application ran to its end" "[ $hrc -eq 0 ]"

echo "== unmodified programs in embedded mode, through uroce-run (no daemon between two of them)"
URUN() { timeout 60 "$UROCE_RUN" --lib "$UROCE_IBVERBS_DIR" "$@"; }
# stock_pair TAG READY server-cmd... -- client-cmd...: the server embedded
# as A (control socket es.ctl), the client as B once the server is ready,
# which is never a fixed sleep. READY tcp:PORT: the server listens on TCP
# PORT (looked at up to 400 times, 0.05 s apart). READY cm: an rdma_cm
# server shows no sign that it listens, so the client's connect is the
# probe: a client that failed because A refused its connect (a REJ counted,
# nothing established: nobody listened yet) runs again, at most 100 times,
# and the log says how often.
stock_pair() {
  local tag=$1 ready=$2; shift 2
  local scmd=() ccmd=()
  while [ "$1" != "--" ]; do scmd+=("$1"); shift; done
  shift; ccmd=("$@")
  # Their own memif socket: daemon B still serves m.sock.
  rm -f "$TMP/s.sock" "$TMP/es.ctl"
  UROCE_EMBEDDED="$(spec a "--ctl-socket $TMP/es.ctl" | sed "s#$TMP/m.sock#$TMP/s.sock#")" URUN "${scmd[@]}" > "$TMP/es-$tag.out" 2>&1 & local sp=$!
  local i up=0
  for i in $(seq 400); do
    case $ready in
      tcp:*) ss -Hltn "sport = :${ready#tcp:}" | grep -q . && up=1 ;;
      cm) [ -S "$TMP/es.ctl" ] && up=1 ;;
    esac
    [ $up -eq 1 ] && break
    kill -0 $sp 2> /dev/null || break
    sleep 0.05
  done
  [ $up -eq 1 ] || echo "  ($tag: the server never got ready ($ready))"
  local tries=0 before after
  while :; do
    [ "$ready" = cm ] && before=$(cm_state "$TMP/es.ctl")
    UROCE_EMBEDDED="$(spec b | sed "s#$TMP/m.sock#$TMP/s.sock#")" URUN "${ccmd[@]}" > "$TMP/ec-$tag.out" 2>&1; ST_C=$?
    [ "$ready" = cm ] && [ $ST_C -ne 0 ] && kill -0 $sp 2> /dev/null && [ $tries -lt 100 ] || break
    after=$(cm_state "$TMP/es.ctl")
    [ "${after% *}" -gt "${before% *}" ] && [ "${after#* }" -eq "${before#* }" ] || break
    tries=$((tries + 1))
    sleep 0.05
  done
  [ $tries -eq 0 ] || echo "  ($tag: the server did not listen yet: $tries connect(s) refused, run again)"
  wait $sp; ST_S=$?
  echo "  $tag: client exit $ST_C, server exit $ST_S"
  [ $ST_C -eq 0 ] && [ $ST_S -eq 0 ] && ! bad_data "$TMP/ec-$tag.out" "$TMP/es-$tag.out" > /dev/null ||
    tail -n 4 "$TMP/ec-$tag.out" "$TMP/es-$tag.out" | sed 's/^/    /'
}
port=$BASE; BASE=$((BASE + 2))
# ibv_rc_pingpong --chk checks one byte per page, on the server only, and
# prints "invalid data in page N" but exits 0 (docs/verbs.md): the check
# fails on that line, on either side.
stock_pair pingpong tcp:$port ibv_rc_pingpong -d embedded -g 0 -n 500 -s 4096 -c -p $port -- \
  ibv_rc_pingpong -d embedded -g 0 -n 500 -s 4096 -c -p $port 127.0.0.1
check "ibv_rc_pingpong --chk between two embedded processes (their own nodes, no daemon): every iteration, no invalid data" \
  "[ $ST_C -eq 0 ] && [ $ST_S -eq 0 ] && grep -q '500 iters in' '$TMP/ec-pingpong.out' && grep -q '500 iters in' '$TMP/es-pingpong.out' && ! bad_data '$TMP/ec-pingpong.out' '$TMP/es-pingpong.out' > /dev/null"
stock_pair rping cm rping -s -a 10.97.0.1 -p $((port + 1)) -V -C 50 -S 4000 -- rping -c -a 10.97.0.1 -p $((port + 1)) -V -C 50 -S 4000
check "rping -V between two embedded processes (the CM on both nodes, through librdmacm), every byte checked" \
  "[ $ST_C -eq 0 ] && [ $ST_S -eq 0 ] && ! bad_data '$TMP/ec-rping.out' '$TMP/es-rping.out' > /dev/null"
# perftest wants an active port when it starts: the embedded process is
# the server (its node brings daemon B's memif link up as it starts),
# and the client on daemon B comes once it listens. The link comes up a
# moment after the process starts, so a server that found its port still
# down (and gave up) is started again, a few times, until one listens:
# no fixed sleep to lose on a loaded machine.
mkdir -p "$TMP/run_b" && ln -sf "$TMP/b.app" "$TMP/run_b/uroce0.sock"
pw_port=$((port + 2))
listening() { ss -ltnH "sport = :$pw_port" | grep -q .; }
for try in 1 2 3 4 5; do
  UROCE_EMBEDDED="${EA#embedded:}" URUN ib_write_bw -d embedded -x 0 -n 500 -p $pw_port > "$TMP/pw-s.out" 2>&1 & sp=$!
  for _ in $(seq 200); do
    listening && break
    kill -0 $sp 2>/dev/null || break
    sleep 0.1
  done
  listening && break
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  echo "  (the ib_write_bw server did not listen, try $try: $(grep -v '^$' "$TMP/pw-s.out" | tail -n 1))"
done
timeout 60 "$UROCE_RUN" --lib "$UROCE_IBVERBS_DIR" --run-dir "$TMP/run_b" ib_write_bw -d uroce0 -x 0 -n 500 -p $((port + 2)) \
  127.0.0.1 > "$TMP/pw-c.out" 2>&1; crc=$?
wait $sp; src=$?
row=$(grep -E '^ +[0-9]+ +500 ' "$TMP/pw-c.out" | head -1 | tr -s ' ')
echo "  ib_write_bw, daemon B's client -> an embedded server: client exit $crc, server exit $src:$row"
[ $crc -eq 0 ] && [ $src -eq 0 ] || shown "$TMP/pw-c.out" "$TMP/pw-s.out" | sed 's/^/    /'
check "ib_write_bw between an embedded process and a daemon, both through the drop-in" \
  "[ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n '$row' ]"

echo "== bad specs are refused with a reason, not a crash"
UROCE_EMBEDDED="--port net_memif0 --bogus" "$PERF" send_lat -p $BASE 127.0.0.1 > "$TMP/bad1.out" 2>&1; rc1=$?
UROCE_EMBEDDED="$(spec a '--duration 5')" "$PERF" send_lat -p $BASE 127.0.0.1 > "$TMP/bad2.out" 2>&1; rc2=$?
UROCE_EMBEDDED="--ip 10.97.0.9" "$PERF" send_lat -p $BASE 127.0.0.1 > "$TMP/bad3.out" 2>&1; rc3=$?
UROCE_EMBEDDED_PLUGIN=/nonexistent.so UROCE_EMBEDDED="$(spec a)" "$PERF" send_lat -p $BASE 127.0.0.1 > "$TMP/bad4.out" 2>&1; rc4=$?
UROCE_EMBEDDED='--port net_memif0 --ip 10.97.0.9 \3' "$PERF" send_lat -p $BASE 127.0.0.1 > "$TMP/bad5.out" 2>&1; rc5=$?
for f in bad1 bad2 bad3 bad4 bad5; do echo "  $f: $(grep -v '^$' "$TMP/$f.out" | tail -1)"; done
check "an unknown option: refused, named" "[ $rc1 -ne 0 ] && [ $rc1 -lt 128 ] && grep -q 'bogus' '$TMP/bad1.out'"
check "--duration in embedded mode: refused" "[ $rc2 -ne 0 ] && [ $rc2 -lt 128 ] && grep -q 'no place in embedded mode' '$TMP/bad2.out'"
check "no --port: refused" "[ $rc3 -ne 0 ] && [ $rc3 -lt 128 ] && grep -q -- '--port is required' '$TMP/bad3.out'"
check "a missing plugin: refused, named" "[ $rc4 -ne 0 ] && [ $rc4 -lt 128 ] && grep -q 'nonexistent.so' '$TMP/bad4.out'"
check "a spec with a bad escape: refused, not thrown at the application (found by fuzzing)" \
  "[ $rc5 -ne 0 ] && [ $rc5 -lt 128 ] && grep -q 'cannot split the options' '$TMP/bad5.out'"
UROCE_EMBEDDED="$(spec b)" "$APP" devices 1 > "$TMP/dev.out" 2>&1; rc=$?
check "\$UROCE_EMBEDDED lists one device, embedded, and it opens" "[ $rc -eq 0 ] && grep -q '^device embedded ' '$TMP/dev.out'"
echo "== the node's life: shared by two contexts, kept after the last close (an open finds it), stopped at exit"
before=$(ls -d /tmp/uroce-embedded-* 2>/dev/null | sort | tr '\n' ' ')
"$APP" reopen "embedded:$(spec b)" > "$TMP/reopen.out" 2>&1; rc=$?
after=$(ls -d /tmp/uroce-embedded-* 2>/dev/null | sort | tr '\n' ' ')
grep FAIL "$TMP/reopen.out" | sed 's/^/  /'
check "reopen: all checks pass" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/reopen.out'"
check "the private socket directory is removed with the node (at exit)" "[ '$before' = '$after' ]"
finish
