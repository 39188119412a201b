# Sourced by rxe.sh and make_fixtures.sh: the rxe guest, a uroced on its
# bridge, and one function per pairing (each runs both directions).
#
# UROCE_INTEROP_ONLY="rping write_bw ..." runs only the named pairings
# (pingpong, rping, udaddy, a perftest name, or stock: the stock binaries
# through uroce-run), for chasing one failure.
. "$(dirname "${BASH_SOURCE[0]}")/../integration/lib.sh"
need_root
# meson puts the drop-in libraries' folders on LD_LIBRARY_PATH (the test
# depends on them); uroced's EAL needs the system's libibverbs, and the
# stock binaries get uroce's from uroce-run.
unset LD_LIBRARY_PATH
PEER=${UROCE_RXE_PEER:-$(dirname "${BASH_SOURCE[0]}")/../../../shared/peers/rxe-vm}
PERF=${UROCE_PERF:?}
URUN=${UROCE_RUN:?the path of tools/uroce-run}
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of the uroce libibverbs.so.1}
PP=${UROCE_PINGPONG:?}
RPING=${UROCE_RPING:?}
NSX=rxepeer
G() { "$PEER/run-peer.sh" exec 1 "$1"; }  # a command in the guest
# GT SECONDS PROG ARGS: a guest program under timeout, its stdout line
# buffered (the guest has no stdbuf; boot copies in the host's libstdbuf,
# which is what stdbuf preloads), so what it printed survives a timeout.
GT="env LD_PRELOAD=/tmp/libstdbuf.so _STDBUF_O=L timeout"
GUEST_PROGS="rping udaddy rstream ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_send_lat ib_read_lat ib_atomic_lat"
# Nothing left over from the previous pairing may hold a port or a QP: each
# is killed, and waited for (at most 5 s).
fresh() {
  G "killall -q $GUEST_PROGS 2>/dev/null; for i in \$(seq 50); do pidof $GUEST_PROGS > /dev/null || break; usleep 100000; done" > /dev/null
}
# gcat FILE OUT: a guest file into OUT; false when it could not be read
# (G's status is its connection's, so an unread file must not look empty).
gcat() { G "cat $1 && printf '\\n#END-OF-FILE\\n'" > "$2"; grep -qx '#END-OF-FILE' "$2"; }
# gdone PROG: PROG has ended in the guest (its output is then complete);
# polled in the guest, at most 10 s.
gdone() { G "for i in \$(seq 100); do pidof $1 > /dev/null || { echo ENDED; break; }; usleep 100000; done" | grep -q ENDED; }

# Readiness probes, each bounded in count (150 polls, 15 s): a client
# starts once its server is ready, not after a fixed sleep.
# g_tcp PORT: a guest server listens on TCP PORT (perftest's and
# ibv_rc_pingpong's exchange).
g_tcp() { G "for i in \$(seq 150); do ss -ltn | grep -q ':$1 ' && { echo READY; break; }; usleep 100000; done" | grep -q READY; }
# g_cm PS: a guest rping (PS TCP) or udaddy (PS UDP) listens on RDMA CM port 7174.
g_cm() { G "for i in \$(seq 150); do rdma res show cm_id | grep 'state LISTEN ps $1 ' | grep -q ':${2:-7174} ' && { echo READY; break; }; usleep 100000; done" | grep -q READY; }
# h_tcp PORT: one of our servers listens on TCP PORT in the namespace.
h_tcp() { local i; for i in $(seq 150); do [ -n "$(X ss -Hltn "sport = :$1")" ] && return 0; sleep 0.1; done; return 1; }
# h_line FILE REGEX: one of our servers printed REGEX (uroce-rping's
# "listening", stock rping's debug "rdma_listen", udaddy's "starting server").
h_line() { local i; for i in $(seq 150); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
# A stock RDMA CM server on uroce says nothing once it listens (rping -d
# prints "rdma_listen" just before), so its rxe client may still come a
# moment early: uroce's CM agent then refuses the REQ as no listener's
# (REJ reason 8, invalid service ID; udaddy's SIDR answer "no service",
# UNREACHABLE error 1), and the client tries again, at most 5 times.
# retry_cm PATTERN: the guest loop around one client command.
retry_cm() { echo "for try in 1 2 3 4 5; do $2; rc=\$?; grep -q '$1' $3 || break; usleep 300000; done; echo rc=\$rc tries=\$try"; }

boot() {  # [EXTRA_APPEND]
  "$PEER/run-peer.sh" down > /dev/null 2>&1
  EXTRA_APPEND="${1:-}" "$PEER/run-peer.sh" up 1 > "$TMP/up.log" 2>&1 || { cat "$TMP/up.log"; give_up "the rxe guest booted${1:+ with $1}"; }
  grep READY "$TMP/up.log" | sed 's/^/  /'
  # Under TCG the guest's vCPU is a host thread that competes with all else
  # the host runs (a parallel build, say): its threads get nice -10, so the
  # peer is starved less often (its stalls lengthen retries, and perftest's
  # clock calibration fails on them).
  local pid t
  pid=$(cat "${RUN_DIR:-/run/uroce-rxe-peer}/vm1.pid" 2>/dev/null) &&
    for t in /proc/$pid/task/*; do renice -n -10 -p "${t##*/}" > /dev/null 2>&1; done
  G "echo $(base64 -w0 /usr/libexec/coreutils/libstdbuf.so) | base64 -d > /tmp/libstdbuf.so" > /dev/null
  G "$GT 5 ss -V 2>&1" > "$TMP/gt.out"
  grep -q '^ss utility' "$TMP/gt.out" && ! grep -q 'preload' "$TMP/gt.out" || give_up "the guest runs programs with the host's libstdbuf.so preloaded ($(cat "$TMP/gt.out"))"
  ip -n $NSX link set tap1 mtu 9000
  ip -n $NSX link add uv0 type veth peer name uv1
  ip -n $NSX link set uv1 master br0
  for l in uv0 uv1; do ip -n $NSX link set $l mtu 9000 up; done
}

DPID=""
daemon() {  # TAG [uroced flags]: uroced on the bridge, 10.77.0.10, capturing
  local tag=$1; shift
  rm -f "$TMP/u.app"
  start_daemon $NSX "u-$tag" --port net_af_packet0 --vdev "net_af_packet0,iface=uv0,framesz=9216,blocksz=36864,framecnt=512" \
    --ip 10.77.0.10 --lcore 0 --app-socket "$TMP/u.app" --ctl-socket "$TMP/u.ctl" --capture "$TMP/$tag.pcap" "$@"
  DPID=$LAST_PID
  for i in $(seq 50); do [ -S "$TMP/u.app" ] && break; sleep 0.1; done
}
stop_daemon() {
  kill "$DPID" 2>/dev/null
  while kill -0 "$DPID" 2>/dev/null; do sleep 0.1; done
}
X() { ip netns exec $NSX "$@"; }  # our tools run in the namespace (TCP to the guest)

want() { [ -z "${UROCE_INTEROP_ONLY:-}" ] || [[ " $UROCE_INTEROP_ONLY " == *" $1 "* ]]; }
# check_show MSG COND SHOW: check, and on failure print what SHOW prints (both sides' last lines)
check_show() { if eval "$2"; then ok "$1"; else bad "$1 ($2)"; eval "$3" 2>&1 | sed 's/^/    /'; fi; }

# ------------------------------------------------------------------------
# The RETRY_EXC_ERR end-of-run rules. A latency run has no closing
# exchange (ib_write_lat, uroce-perf write_lat, ibv_rc_pingpong,
# uroce-pingpong): when the ACK of the run's last message is lost, its
# sender's retries may meet a QP the peer has already destroyed (rxe
# answers nothing for it), and its last completion is RETRY_EXC_ERR
# although the message arrived. That end passes only when all of these hold:
#  - the stage drops frames (loss1, loss5); at mtu1024 and mtu4096 nothing
#    is dropped, so no ACK can have been lost and the rule never applies;
#  - the message's arrival is proven: by the peer's data where the
#    protocol gives that proof (the uroce-perf write_lat server, the
#    uroce-pingpong client; the tool then ends cleanly and says so on
#    stderr), else by the rxe peer's own report of all N iterations (the
#    tool fails; the script weighs that report);
#  - the stage's capture (what uroced received and sent) shows uroce sending
#    that last PSN more than once and no ACK or NAK for it ever reaching
#    uroce: a uroce that ignored the ACK would not pass. The capture is
#    complete once the stage's daemon has stopped: settle_rules checks it.
# Each firing is counted and listed by rules_summary at the end.
RULES=()        # TAG|NAME|OUR_QPN|PEER_QPN|LAST_PSN, for settle_rules
RULE_FIRED=0
RULE_WHERE=""
lossy() { [[ $1 == loss* ]]; }
# end_rule TAG NAME OUR_QPN PEER_QPN LAST_PSN: the rule takes this end; false
# (and a failed check) outside the lossy stages or without the QP and PSN.
end_rule() {
  if ! lossy "$1"; then bad "$2: RETRY_EXC_ERR at the end of a run at $1, where no frame is dropped"; return 1; fi
  if [ -z "$3" ] || [ -z "$4" ] || [ -z "$5" ]; then bad "$2: RETRY_EXC_ERR end, but no QPN and PSN to look for in the capture"; return 1; fi
  RULES+=("$1|$2|$3|$4|$5")
  echo "  note: $2: RETRY_EXC_ERR on the last message (QPN $3, PSN $5) after the peer left; the $1 capture must show that no ACK for it reached uroce"
}
# tool_end FILE: "OUR_QPN PEER_QPN LAST_PSN" from uroce-perf's or uroce-pingpong's line about its last message
tool_end() { sed -n 's/.*never acknowledged.*(QPN \(0x[0-9a-f]*\) PSN \(0x[0-9a-f]*\) to QPN \(0x[0-9a-f]*\)).*/\1 \3 \2/p' "$1" | head -1; }
# stock_end FILE N: the same from perftest's address lines (one packet per message)
stock_end() {
  local q p r
  read -r q p < <(sed -n 's/.*local address: LID [0-9a-fx]* QPN \(0x[0-9a-f]*\) PSN \(0x[0-9a-f]*\).*/\1 \2/p' "$1" | head -1)
  r=$(sed -n 's/.*remote address: LID [0-9a-fx]* QPN \(0x[0-9a-f]*\) PSN.*/\1/p' "$1" | head -1)
  [ -n "$q" ] && [ -n "$r" ] && printf '%s %s 0x%06x\n' "$q" "$r" $(( (p + $2 - 1) & 0xffffff ))
}
settle_rules() {  # TAG: after stop_daemon
  local r t name q pq psn left=() ev sent answered
  for r in "${RULES[@]}"; do
    IFS='|' read -r t name q pq psn <<< "$r"
    if [ "$t" != "$1" ]; then left+=("$r"); continue; fi
    [ -f "$TMP/$t.frames.json" ] || "$UROCE_PCAP" --json --quiet "$TMP/$t.pcap" > "$TMP/$t.frames.json" 2> /dev/null
    ev=$(/usr/bin/python3 - "$TMP/$t.frames.json" "$q" "$pq" "$psn" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ours, theirs, psn = (int(v, 0) for v in sys.argv[2:5])
fr = [f for f in d["frames"] if f.get("icrc_ok") and f.get("psn") == psn]
# requests: RC opcodes without an AETH (SEND, WRITE, READ request, atomics)
sent = sum(1 for f in fr if f["src"] == "10.77.0.10" and f["destqp"] == theirs and "aeth_syndrome" not in f
           and f["opcode"] < 0x20 and f["opcode"] not in range(0x0d, 0x13))
answered = sum(1 for f in fr if f["src"] == "10.77.0.2" and f["destqp"] == ours and "aeth_syndrome" in f)
print(sent, answered)
PY
)
    read -r sent answered <<< "$ev"
    if [ "${sent:-0}" -gt 1 ] && [ "${answered:-1}" -eq 0 ]; then
      ok "$name: the capture shows the end-of-run rule's case: PSN $psn sent $sent times, no ACK or NAK for it reached uroce"
      RULE_FIRED=$((RULE_FIRED + 1))
      RULE_WHERE="$RULE_WHERE; $name"
    else
      bad "$name: the end-of-run rule's evidence is not in the capture: PSN $psn from QPN $q sent ${sent:-?} times (needs 2 or more), ACKs or NAKs for it received ${answered:-?} (needs 0)"
    fi
  done
  RULES=("${left[@]}")
}
rules_summary() {
  [ ${#RULES[@]} -eq 0 ] || bad "end-of-run rules never checked against a capture: ${RULES[*]}"
  echo "RETRY_EXC_ERR end-of-run rule fired $RULE_FIRED times${RULE_WHERE:+:${RULE_WHERE#;}}"
  echo "perftest clock-calibration reruns: ${CALIB_RERUNS:-0}${CALIB_WHERE:+:${CALIB_WHERE#;}}"
  echo "rping 44 exit races taken (uroce-rping server <- rxe's rping client): ${RPING_RACES:-0}"
}

# The rxe peer is part of this project's test setup: a missing QEMU
# (tools/setup.sh installs it), a missing peer, a failed guest build or a
# guest that does not boot are failures. The one skip is a host where QEMU
# cannot start at all (no KVM is fine: the guest runs under TCG).
need_prog qemu-system-x86_64 qemu-system-x86
need_prog busybox busybox-static  # run-peer.sh talks to the guest through it
need_prog cpio cpio; need_prog zstd zstd  # make-peer.sh
qemu_says=$(echo quit | timeout 60 qemu-system-x86_64 -M none -accel tcg -nodefaults -display none -monitor stdio 2>&1) ||
  skip "interop: QEMU cannot run here: $(echo "$qemu_says" | grep -o 'qemu-system-x86_64: .*' | tail -1)"
give_up() { bad "$1"; rules_summary; finish; exit 1; }
[ -x "$PEER/make-peer.sh" ] || give_up "no rxe peer at $PEER (../shared/peers/rxe-vm)"
cache=${UROCE_RXE_PEER_DIR:-/var/cache/uroce-rxe-peer}
if [ ! -f "$cache/vmlinuz" ]; then
  echo "== building the rxe guest (cached in $cache)"
  "$PEER/make-peer.sh" > "$TMP/make-peer.log" 2>&1 || { tail -5 "$TMP/make-peer.log"; give_up "make-peer.sh built the rxe guest"; }
fi

interop_cleanup() {
  ip netns exec $NSX nft delete table bridge uroce_loss 2>/dev/null
  ip -n $NSX link del uv0 2>/dev/null
  "$PEER/run-peer.sh" down > /dev/null 2>&1
}
trap 'interop_cleanup; cleanup' EXIT

# perftest reports in units of its time stamp counter, which it calibrates
# against gettimeofday over a few milliseconds and refuses ("Correlation
# coefficient r^2: ... < 0.9", "Can't produce a report", exit 1) when the
# samples disagree: the TCG guest's vCPU, preempted on a loaded host, does
# that now and then, after the data phase. Such a run says nothing of
# either side's RoCE: the pairing (that direction) is run again, at most
# twice, and every rerun is counted in the summary.
CALIB_RERUNS=0
CALIB_WHERE=""
calib_rerun() {  # NAME TRY FILE...: true (and counted) when this try is to be run again
  local name=$1 try=$2; shift 2
  grep -qF 'Correlation coefficient r^2' "$@" 2>/dev/null || return 1
  if [ "$try" -ge 3 ]; then echo "  note: $name: perftest's clock calibration failed on the third try too"; return 1; fi
  CALIB_RERUNS=$((CALIB_RERUNS + 1))
  CALIB_WHERE="$CALIB_WHERE; $name"
  echo "  note: $name: a perftest could not calibrate its clock ($(grep -hF 'Correlation coefficient r^2' "$@" | head -1)): run again"
  return 0
}

# ------------------------------------------------------------------------
# pingpong TAG SIZE ITERS EXTRA: both directions, our side checks every message
pingpong() {
  local tag=$1 sz=$2 n=$3 ex=${4:-}
  want pingpong || return 0
  local name ready end rc
  fresh
  G "$GT 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz $ex </dev/null >/tmp/pp.log 2>&1 &"
  name="$tag: ibv_rc_pingpong server (rxe) <- uroce-pingpong client, $sz B x $n, every message right"
  if g_tcp 18515; then
    X timeout 150 "$PP" -d "$TMP/u.app" -n "$n" -s "$sz" -c $ex 10.77.0.2 > "$TMP/pp.out" 2>&1
    gdone ibv_rc_pingpong; gcat /tmp/pp.log "$TMP/pp.log"
    check_show "$name" "grep -q '^$n messages checked, 0 bad' $TMP/pp.out && grep -q '^$n iters' $TMP/pp.log" \
      "tail -3 $TMP/pp.out; tail -4 $TMP/pp.log"
    # The client's last SEND after the server's last reply: the tool took
    # that end (the reply proves the SEND arrived); the capture must agree.
    if grep -q 'never acknowledged.*the peer finished and left' "$TMP/pp.out"; then
      end_rule "$tag" "$name" $(tool_end "$TMP/pp.out")
    fi
  else
    bad "$name (ibv_rc_pingpong never listened in the guest)"
  fi
  fresh
  name="$tag: uroce-pingpong server <- ibv_rc_pingpong client (rxe), $sz B x $n, every message right"
  X timeout 150 "$PP" -d "$TMP/u.app" -n "$n" -s "$sz" -c $ex > "$TMP/pps.out" 2>&1 & local sp=$!
  if h_tcp 18515; then ready=1; else ready=0; fi
  [ $ready = 1 ] && G "$GT 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz $ex 10.77.0.1 > /tmp/ppc.log 2>&1; echo rc=\$?" > "$TMP/ppc.rc"
  wait $sp; rc=$?
  gcat /tmp/ppc.log "$TMP/ppc.log"
  # The server's last SEND is the run's last message; nothing from the
  # client follows it, so the tool fails when it loses its ACK. It passes
  # here only under the end-of-run rule: rxe's client reports all N, and
  # the capture is checked.
  end=0
  if [ $rc -ne 0 ] && [ $ready = 1 ] && grep -q 'last SEND was never acknowledged.*no proof it arrived' "$TMP/pps.out" &&
     grep -q '^rc=0' "$TMP/ppc.rc" && grep -q "^$n iters" "$TMP/ppc.log" && grep -q "^$n messages checked, 0 bad" "$TMP/pps.out" &&
     end_rule "$tag" "$name" $(tool_end "$TMP/pps.out"); then
    end=1
  fi
  # (and the server must never take that end itself: it has no proof)
  check_show "$name" "[ $ready = 1 ] && { [ $end = 1 ] || { [ $rc -eq 0 ] && grep -q '^$n messages checked, 0 bad' $TMP/pps.out; }; } && grep -q '^rc=0' $TMP/ppc.rc && grep -q '^$n iters' $TMP/ppc.log && ! grep -q 'the peer finished and left' $TMP/pps.out" \
    "tail -3 $TMP/pps.out; tail -4 $TMP/ppc.log"
}

# perftest TAG TEST ITERS EXTRA: rxe's ib_TEST against uroce-perf TEST, both directions
perftest() {
  local tag=$1 t=$2 n=$3 ex=${4:-}
  want "$t" || return 0
  local name rc ready try
  name="$tag: ib_$t server (rxe) <- uroce-perf client, $n iterations"
  for try in 1 2 3; do
    fresh
    G "$GT 120 ib_$t -d rxe0 -x 1 -n $n $ex </dev/null >/tmp/pt.log 2>&1 &"
    if ! g_tcp 18515; then bad "$name (ib_$t never listened in the guest)"; break; fi
    # -u 18 (1.07 s ACK timeout): the TCG guest can stall for a good part of a second.
    X timeout 150 "$PERF" "$t" -d "$TMP/u.app" -n "$n" -u 18 $ex --json 10.77.0.2 > "$TMP/pt.json" 2> "$TMP/pt.err"
    rc=$?
    gdone "ib_$t"; gcat /tmp/pt.log "$TMP/pt.log"
    calib_rerun "$name" $try "$TMP/pt.log" && continue
    # rxe's server reports the run (read_lat and atomic_lat servers print
    # no result line: they must have connected and not complained).
    local srv_ok="grep -qE '^ [0-9]+ +$n ' $TMP/pt.log"
    case $t in read_lat|atomic_lat) srv_ok="grep -q 'remote address' $TMP/pt.log && ! grep -qiE 'error|fail|couldn' $TMP/pt.log" ;; esac
    local cli_ok="[ $rc -eq 0 ] && /usr/bin/python3 -c 'import json; r=json.load(open(\"$TMP/pt.json\"))[\"results\"][0]; assert r[\"iterations\"]==$n'"
    # write_lat: the client's last WRITE is the run's last message; the tool
    # fails when it loses its ACK (nothing from the server follows it), and
    # the end-of-run rule weighs rxe's report of all N.
    if [ $rc -ne 0 ] && [ "$t" = write_lat ] && grep -q 'last WRITE was never acknowledged.*no proof it arrived' "$TMP/pt.err" &&
       eval "$srv_ok" && end_rule "$tag" "$name" $(tool_end "$TMP/pt.err"); then
      cli_ok=true
    fi
    # (and the client must never take that end itself: it has no proof)
    check_show "$name" "$cli_ok && $srv_ok && ! grep -q 'the peer finished and left' $TMP/pt.err" "shown $TMP/pt.err; tail -4 $TMP/pt.log"
    break
  done
  name="$tag: uroce-perf server <- ib_$t client (rxe), $n iterations"
  for try in 1 2 3; do
    fresh
    X timeout 150 "$PERF" "$t" -d "$TMP/u.app" -n "$n" -u 18 $ex --json > "$TMP/pts.json" 2> "$TMP/pts.err" & local sp=$!
    if h_tcp 18515; then ready=1; else ready=0; fi
    [ $ready = 1 ] && G "$GT 120 ib_$t -d rxe0 -x 1 -n $n $ex 10.77.0.1 > /tmp/ptc.log 2>&1; echo rc=\$?" > "$TMP/ptc.rc"
    wait $sp; rc=$?
    gcat /tmp/ptc.log "$TMP/ptc.log"
    calib_rerun "$name" $try "$TMP/ptc.log" && continue
    check_show "$name" "[ $ready = 1 ] && [ $rc -eq 0 ] && grep -q '^rc=0' $TMP/ptc.rc && grep -qE '^ [0-9]+ +$n ' $TMP/ptc.log" \
      "shown $TMP/pts.err; tail -4 $TMP/ptc.log"
    # The server's last WRITE lost its ACK after rxe's client had written its
    # last: the tool took that end (that WRITE proves ours arrived).
    if grep -q 'never acknowledged.*the peer finished and left' "$TMP/pts.err"; then
      end_rule "$tag" "$name" $(tool_end "$TMP/pts.err")
    fi
    break
  done
}

# rping TAG COUNT: RDMA CM both directions, data validated by rping -V
rping() {
  local tag=$1 n=$2
  want rping || return 0
  local name
  fresh
  G "$GT 120 rping -s -a 10.77.0.2 -C $n -V -v </dev/null >/tmp/rp.log 2>&1 &"
  name="$tag: rping server (rxe) <- uroce-rping client over RDMA CM, $n pings validated"
  if g_cm TCP; then
    X timeout 150 "$RPING" -c -a 10.77.0.2 -C "$n" -V -d "$TMP/u.app" > "$TMP/rp.out" 2>&1
    check_show "$name" "grep -q '^$n pings, data validated' $TMP/rp.out" "tail -3 $TMP/rp.out; G 'tail -3 /tmp/rp.log'"
  else
    bad "$name (rping never listened in the guest)"
  fi
  fresh
  name="$tag: uroce-rping server <- rping -V client (rxe) over RDMA CM, $n pings"
  X timeout 150 "$RPING" -s -C "$n" -d "$TMP/u.app" > "$TMP/rps.out" 2>&1 & local sp=$!
  # rping's client does not retry a refused connect: start it once we listen.
  if h_line "$TMP/rps.out" '^listening'; then
    G "$GT 120 rping -c -a 10.77.0.10 -C $n -V -v > /tmp/rpc.log 2>&1; echo rc=\$?" > "$TMP/rpc.rc"
  else
    echo "rc=never-started" > "$TMP/rpc.rc"
  fi
  wait $sp
  gcat /tmp/rpc.log "$TMP/rpc.log"
  local cli_ok="grep -q '^rc=0' $TMP/rpc.rc"
  rping_exit_race "$name" "$n" "$TMP/rpc.rc" "$TMP/rpc.log" && cli_ok=true
  check_show "$name" "$cli_ok && grep -q '^$n pings' $TMP/rps.out" "tail -3 $TMP/rps.out; tail -4 $TMP/rpc.log"
}
# rping_exit_race NAME N RC LOG: Debian 12's rping (rdma-core 44) has a race
# at exit: its CM thread, woken by a DISCONNECTED event while main tears
# down, reads the event channel main has just destroyed, says
# "rdma_get_cm_event: Bad file descriptor" and exits 255 (later rping
# stops the thread through an eventfd first). uroce-rping's server
# disconnects once it has its N pings, so its DREQ can reach rxe's client
# just then; rping's own server never disconnects first. That exit, and no
# other, passes when the client's log shows all N pings validated (-V
# compares each before -v prints it), the disconnect, and that line last;
# each time is counted in the summary.
RPING_RACES=0
rping_exit_race() {
  local name=$1 n=$2 rc=$3 log=$4
  grep -q '^rc=255' "$rc" && ! grep -qi mismatch "$log" && grep -q "^ping data: rdma-ping-$((n - 1)): " "$log" &&
    [ "$(grep -c '^ping data: rdma-ping-' "$log")" -eq "$n" ] && grep -q '^client DISCONNECT EVENT' "$log" &&
    [ "$(grep -v '^#END-OF-FILE$' "$log" | grep -v '^$' | tail -1)" = "rdma_get_cm_event: Bad file descriptor" ] || return 1
  RPING_RACES=$((RPING_RACES + 1))
  echo "  note: $name: rxe's rping client ended in rping 44's exit race (all $n pings validated, then \"rdma_get_cm_event: Bad file descriptor\", exit 255)"
}

# The same stock binaries on both sides (Debian's, unmodified): uroce's
# through tools/uroce-run on its drop-in libibverbs.so.1 and
# librdmacm.so.1, in the namespace (their TCP exchange reaches the guest),
# their stdout line buffered (stdbuf), so a timeout keeps what they said.
# The daemon's socket as device uroce0: a run folder holding uroce0.sock.
URUN_X() {
  mkdir -p "$TMP/run" && ln -sf "$TMP/u.app" "$TMP/run/uroce0.sock"
  X timeout 150 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run" stdbuf -oL "$@"
}

# stock_pingpong TAG SIZE ITERS: ibv_rc_pingpong --chk both ways. --chk
# makes the server compare received data (one byte per page) and print
# "invalid data" on a mismatch, still exiting 0: either side's output
# holding that line fails the check.
stock_pingpong() {
  local tag=$1 sz=$2 n=$3
  want stock || return 0
  local name ready
  fresh
  G "$GT 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz -c </dev/null >/tmp/sp.log 2>&1 &"
  name="$tag: ibv_rc_pingpong server (rxe) <- ibv_rc_pingpong client (uroce), $sz B x $n, --chk"
  if g_tcp 18515; then
    URUN_X ibv_rc_pingpong -d uroce0 -g 0 -n "$n" -s "$sz" -c 10.77.0.2 > "$TMP/sp.out" 2>&1
    gdone ibv_rc_pingpong; gcat /tmp/sp.log "$TMP/sp.log"
    check_show "$name" \
      "grep -q '$n iters in' $TMP/sp.out && grep -q '$n iters in' $TMP/sp.log && ! grep -qi 'invalid data' $TMP/sp.out $TMP/sp.log" \
      "tail -3 $TMP/sp.out; tail -4 $TMP/sp.log"
  else
    bad "$name (ibv_rc_pingpong never listened in the guest)"
  fi
  fresh
  name="$tag: ibv_rc_pingpong server (uroce) <- ibv_rc_pingpong client (rxe), $sz B x $n, --chk"
  URUN_X ibv_rc_pingpong -d uroce0 -g 0 -n "$n" -s "$sz" -c > "$TMP/sps.out" 2>&1 & local sp=$!
  if h_tcp 18515; then ready=1; else ready=0; fi
  [ $ready = 1 ] && G "$GT 120 ibv_rc_pingpong -d rxe0 -g 1 -n $n -s $sz -c 10.77.0.1 > /tmp/spc.log 2>&1; echo rc=\$?" > "$TMP/spc.rc"
  wait $sp
  gcat /tmp/spc.log "$TMP/spc.log"
  check_show "$name" \
    "[ $ready = 1 ] && grep -q '^rc=0' $TMP/spc.rc && grep -q '$n iters in' $TMP/sps.out && grep -q '$n iters in' $TMP/spc.log && ! grep -qi 'invalid data' $TMP/sps.out $TMP/spc.log" \
    "tail -3 $TMP/sps.out; tail -4 $TMP/spc.log"
}

# stock_perftest TAG TEST ITERS: Debian's ib_TEST on both sides, both ways.
# perftest takes the peer's outstanding-read count as its own QP's
# max_rd_atomic: rxe offers 128, uroce 16 (as a ConnectX-4 does), so READ
# and atomic tests say -o 16 on both sides, as they would between rxe and
# such a NIC.
stock_perftest() {  # TAG TEST ITERS [EXTRA for both sides]
  local tag=$1 t=$2 n=$3 ex=${4:-}
  case $t in read_*|atomic_*) ex="$ex -o 16" ;; esac
  want stock || want "stock_$t" || return 0
  local name rc ready end try
  name="$tag: ib_$t server (rxe) <- ib_$t client (uroce, stock perftest), $n iterations"
  for try in 1 2 3; do
    fresh
    G "$GT 120 ib_$t -d rxe0 -x 1 -n $n $ex </dev/null >/tmp/st.log 2>&1 &"
    if ! g_tcp 18515; then bad "$name (ib_$t never listened in the guest)"; break; fi
    URUN_X ib_$t -d uroce0 -x 0 -n "$n" $ex 10.77.0.2 > "$TMP/st.out" 2>&1; rc=$?
    gdone "ib_$t"; gcat /tmp/st.log "$TMP/st.log"
    calib_rerun "$name" $try "$TMP/st.log" "$TMP/st.out" && continue
    end=0
    stock_lat_end "$tag" "$name" "$t" "$n" $rc "$TMP/st.out" "$TMP/st.log" && end=1
    check_show "$name" "{ [ $end = 1 ] || { [ $rc -eq 0 ] && grep -qE '^ +[0-9]+ +$n ' $TMP/st.out; }; }" \
      "shown $TMP/st.out; tail -6 $TMP/st.log"
    break
  done
  name="$tag: ib_$t server (uroce, stock perftest) <- ib_$t client (rxe), $n iterations"
  for try in 1 2 3; do
    fresh
    URUN_X ib_$t -d uroce0 -x 0 -n "$n" $ex > "$TMP/sts.out" 2>&1 & local sp=$!
    if h_tcp 18515; then ready=1; else ready=0; fi
    # perftest's exchange is TCP: to the host's kernel address, not uroced's.
    [ $ready = 1 ] && G "$GT 120 ib_$t -d rxe0 -x 1 -n $n $ex 10.77.0.1 > /tmp/stc.log 2>&1; echo rc=\$?" > "$TMP/stc.rc"
    wait $sp; rc=$?
    gcat /tmp/stc.log "$TMP/stc.log"
    calib_rerun "$name" $try "$TMP/stc.log" "$TMP/sts.out" && continue
    end=0
    grep -q '^rc=0' "$TMP/stc.rc" && stock_lat_end "$tag" "$name" "$t" "$n" $rc "$TMP/sts.out" "$TMP/stc.log" && end=1
    check_show "$name" \
      "[ $ready = 1 ] && { [ $end = 1 ] || [ $rc -eq 0 ]; } && grep -q '^rc=0' $TMP/stc.rc && grep -qE '^ +[0-9]+ +$n ' $TMP/stc.log" \
      "shown $TMP/sts.out; tail -4 $TMP/stc.log"
    break
  done
}
# stock_lat_end TAG NAME TEST N RC OUT PEERLOG: ib_write_lat has no closing
# exchange, so its last WRITE may lose its ACK after rxe's side, having
# seen it, has left; our perftest then ends in RETRY_EXC_ERR on its last
# completion (status 12, scnt=N, ccnt=N-1) and exits 1. With rxe's own
# report of all N iterations, that end (and no other) goes to the
# end-of-run rule. (ib_send_lat closes with a TCP exchange, so its peer
# stays until every completion is in: the rule never applies to it.)
stock_lat_end() {
  local tag=$1 name=$2 t=$3 n=$4 rc=$5 out=$6 peer=$7
  [ "$rc" -ne 0 ] && [ "$t" = write_lat ] && grep -q 'Failed status 12:' "$out" && grep -qx "scnt=$n, ccnt=$((n - 1))" "$out" &&
    grep -qE "^ +[0-9]+ +$n " "$peer" && end_rule "$tag" "$name" $(stock_end "$out" "$n")
}

# stock_rping TAG COUNT: Debian's rping -V on both sides, over RDMA CM, both
# ways (-v -d: every step is logged, line buffered, so a hang shows where).
stock_rping() {
  local tag=$1 n=$2
  want stock || return 0
  local name rc ready
  fresh
  G "$GT 120 rping -s -a 10.77.0.2 -C $n -V -v -d </dev/null >/tmp/srp.log 2>&1 &"
  name="$tag: rping server (rxe) <- rping -V client (uroce, librdmacm drop-in), $n pings"
  if g_cm TCP; then
    URUN_X rping -c -a 10.77.0.2 -C "$n" -V -v -d > "$TMP/srp.out" 2>&1; rc=$?
    check_show "$name" "[ $rc -eq 0 ] && [ \$(grep -c '^ping data: ' $TMP/srp.out) -eq $n ] && ! grep -qi mismatch $TMP/srp.out" \
      "tail -4 $TMP/srp.out; G 'tail -4 /tmp/srp.log'"
  else
    bad "$name (rping never listened in the guest)"
  fi
  fresh
  name="$tag: rping server (uroce, librdmacm drop-in) <- rping -V client (rxe), $n pings"
  URUN_X rping -s -a 10.77.0.10 -C "$n" -V -v -d > "$TMP/srps.out" 2>&1 & local sp=$!
  if h_line "$TMP/srps.out" '^rdma_listen'; then ready=1; else ready=0; fi
  [ $ready = 1 ] && G "$(retry_cm 'REJECTED, error 8' "$GT 120 rping -c -a 10.77.0.10 -C $n -V -v -d > /tmp/srpc.log 2>&1" /tmp/srpc.log)" > "$TMP/srpc.rc"
  wait $sp; rc=$?
  check_show "$name" \
    "[ $ready = 1 ] && [ $rc -eq 0 ] && grep -q '^rc=0' $TMP/srpc.rc && [ \$(grep -c '^server ping data: ' $TMP/srps.out) -eq $n ] && ! grep -qi mismatch $TMP/srps.out" \
    "cat $TMP/srpc.rc; tail -4 $TMP/srps.out; G 'tail -4 /tmp/srpc.log'"
}

# stock_udaddy TAG: Debian's udaddy on both sides, UD through rdma_cm
# (SIDR), 10 datagrams each way, both ways
stock_udaddy() {
  local tag=$1
  want udaddy || return 0
  local name rc ready
  fresh
  G "$GT 60 udaddy -C 10 -S 500 </dev/null >/tmp/sud.log 2>&1 &"
  name="$tag: udaddy server (rxe) <- udaddy client (uroce, librdmacm drop-in), SIDR and 10 datagrams each way"
  if g_cm UDP; then
    URUN_X udaddy -s 10.77.0.2 -C 10 -S 500 > "$TMP/sud.out" 2>&1; rc=$?
    check_show "$name" "[ $rc -eq 0 ] && grep -q 'data transfers complete' $TMP/sud.out" "tail -3 $TMP/sud.out; G 'tail -3 /tmp/sud.log'"
  else
    bad "$name (udaddy never listened in the guest)"
  fi
  fresh
  name="$tag: udaddy server (uroce, librdmacm drop-in) <- udaddy client (rxe), SIDR and 10 datagrams each way"
  URUN_X udaddy -C 10 -S 500 > "$TMP/suds.out" 2>&1 & local sp=$!
  if h_line "$TMP/suds.out" 'starting server'; then ready=1; else ready=0; fi
  [ $ready = 1 ] && G "$(retry_cm 'UNREACHABLE, error: 1$' "$GT 60 udaddy -s 10.77.0.10 -C 10 -S 500 > /tmp/sudc.log 2>&1" /tmp/sudc.log)" > "$TMP/sudc.rc"
  wait $sp; rc=$?
  check_show "$name" \
    "[ $ready = 1 ] && [ $rc -eq 0 ] && grep -q '^rc=0' $TMP/sudc.rc && grep -q 'data transfers complete' $TMP/suds.out" \
    "cat $TMP/sudc.rc; tail -3 $TMP/suds.out; G 'tail -3 /tmp/sudc.log'"
}

# stock_rstream TAG: rdmacm-utils' rstream on both sides: rsockets' own
# protocol (RC, RDMA WRITE WITH IMMEDIATE, credits through the target
# list) between uroce's librdmacm and rdma-core's, 20 transfers of 64 KiB
# each way, every byte checked (-T v), both ways. rstream's server says
# nothing before it is done: its rxe client tries again when refused.
stock_rstream() {
  local tag=$1
  want rstream || return 0
  local name rc
  fresh
  G "$GT 120 rstream -b 10.77.0.2 -S 65536 -C 20 -T v </dev/null >/tmp/srs.log 2>&1 &"
  name="$tag: rstream server (rxe) <- rstream -T v client (uroce, rsockets of the librdmacm drop-in), 20 transfers of 64 KiB each way"
  if g_cm TCP 7471; then
    URUN_X rstream -s 10.77.0.2 -S 65536 -C 20 -T v > "$TMP/srs.out" 2>&1; rc=$?
    check_show "$name" "[ $rc -eq 0 ] && grep -q '^custom ' $TMP/srs.out" "tail -4 $TMP/srs.out; G 'tail -4 /tmp/srs.log'"
  else
    bad "$name (rstream never listened in the guest)"
  fi
  fresh
  name="$tag: rstream server (uroce, rsockets of the librdmacm drop-in) <- rstream -T v client (rxe), 20 transfers of 64 KiB each way"
  URUN_X rstream -b 10.77.0.10 -S 65536 -C 20 -T v > "$TMP/srss.out" 2>&1 & local sp=$!
  G "$(retry_cm 'rconnect' "$GT 120 rstream -s 10.77.0.10 -S 65536 -C 20 -T v > /tmp/srsc.log 2>&1" /tmp/srsc.log)" > "$TMP/srsc.rc"
  wait $sp; rc=$?
  check_show "$name" \
    "[ $rc -eq 0 ] && grep -q '^rc=0' $TMP/srsc.rc && grep -q '^custom ' $TMP/srss.out" \
    "cat $TMP/srsc.rc; tail -4 $TMP/srss.out; G 'tail -4 /tmp/srsc.log'"
}

strict() {  # TAG: the capture decodes, every ICRC is right
  "$UROCE_PCAP" --strict --quiet "$TMP/$1.pcap" > "$TMP/$1.strict" 2>&1
  local rc=$?
  check "$1: uroce-pcap --strict passes on the capture ($(tail -1 "$TMP/$1.strict"))" "[ $rc -eq 0 ]"
}

# loss_evidence TAG: from uroce-pcap's per-QP summary of the capture, NAK
# sequence errors and retransmissions (repeated PSNs) in both directions, and
# no RNR NAKs (every receiver here posts its receives ahead).
loss_evidence() {
  local f="$TMP/$1.pcap"
  [ -z "${UROCE_INTEROP_ONLY:-}" ] || return 0
  "$UROCE_PCAP" --json --quiet "$f" > "$TMP/$1.json" 2>/dev/null
  /usr/bin/python3 - "$TMP/$1.json" > "$TMP/$1.sum" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for who, dst in (("uroce", "10.77.0.2"), ("rxe", "10.77.0.10")):
    q = [x for x in d["qps"] if x["dst"] == dst]
    print(who, sum(x["naks"]["psn_seq_error"] for x in q), sum(x["psn_repeats"] for x in q),
          sum(x["rnr_naks"] for x in q), sum(x["acks"] for x in q))
PY
  local u r
  u=($(grep '^uroce' "$TMP/$1.sum")) r=($(grep '^rxe' "$TMP/$1.sum"))
  echo "  $1: sent by uroce: ${u[1]} NAK seq, ${u[2]} retransmitted, ${u[3]} RNR NAK, ${u[4]} ACKs; by rxe: ${r[1]} NAK seq, ${r[2]} retransmitted, ${r[3]} RNR NAK, ${r[4]} ACKs"
  check "$1: both sides sent NAK sequence errors and retransmitted (go-back-N interoperating)" \
    "[ ${u[1]:-0} -gt 0 ] && [ ${r[1]:-0} -gt 0 ] && [ ${u[2]:-0} -gt 0 ] && [ ${r[2]:-0} -gt 0 ]"
  check "$1: no RNR NAKs either way (receives are always posted ahead)" "[ ${u[3]:-1} -eq 0 ] && [ ${r[3]:-1} -eq 0 ]"
}

# set_loss PCT: the guest's bridge drops PCT% of RoCEv2 frames, both ways (0:
# none), CM MADs included, except the guest's DREQs. Linux sends a DREQ
# once when its application destroys the connection right after
# rdma_disconnect (rping's client does): destroying the ID cancels the
# DREQ's retransmission. Lost, it leaves the stock rping server (which ends
# only on the DISCONNECTED event) waiting for good, on rxe as on uroce; that
# tests nothing of uroce's. uroce resends its own DREQs after its
# application has gone, so those are dropped like the rest.
set_loss() {
  ip netns exec $NSX nft delete table bridge uroce_loss 2>/dev/null
  [ "$1" -gt 0 ] || return 0
  ip netns exec $NSX nft -f - <<EOF
table bridge uroce_loss {
  chain lossy {
    type filter hook forward priority 0; policy accept;
    ip saddr 10.77.0.2 udp dport 4791 @th,104,24 1 @th,352,16 0x0015 counter accept
    udp dport 4791 numgen random mod 100 < $1 counter drop
  }
}
EOF
}
dropped() { ip netns exec $NSX nft list table bridge uroce_loss | grep -o 'packets [0-9]* bytes [0-9]* drop' | grep -o 'packets [0-9]*'; }
