#!/bin/bash
# Tenants that cannot hurt each other (one uroced, Debian's perftest
# unmodified through the drop-in, a victim as root and a hostile uid 65534):
#   - a flood of connections on the application socket, and of requests on
#     the control socket, never keeps the victim from opening a session, and
#     the victim's round trips during each flood stay near its round trips
#     without one in the same run (the rounds' median 99.9th percentile
#     within three times, the longest within eight times);
#   - a uid's control requests past its rate (10 a second) wait their
#     turn, answered and counted;
#   - the transmit share: with both bulk, the victim's one QP gets about
#     half the wire against the flooder's 64 QPs, where as one uid (the
#     control, same run) it gets a 64th.
# The flooders run SCHED_IDLE: the kernel's share of the CPU is the
# operator's to set (cgroups); what is measured is uroced's.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
need_prog ib_send_lat perftest
unset LD_LIBRARY_PATH  # meson puts the drop-in's folder there; uroced's EAL needs the system's libibverbs
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of uroce libibverbs.so.1}
URUN=${UROCE_RUN:?the path of tools/uroce-run}
chmod 0755 "$TMP"  # uid 65534 reaches the sockets in it
APP="$TMP/uroce0.sock"
start_daemon "" ta --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.94.0.1 --lcore 0 \
  --app-socket "$APP" --app-socket-mode 0666 --ctl-socket "$TMP/a.ctl"
wait_sockets "$APP" "$TMP/a.ctl" || bad "the daemon is up (gave up after $PROBES looks)"
start_daemon "" tb --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.94.0.2 --lcore 1 \
  --app-socket "$TMP/b.sock"  # the link's other end; the traffic is looped back in the first daemon
wait_sockets "$TMP/b.sock" || bad "the peer daemon is up (gave up after $PROBES looks)"
chmod 0666 "$TMP/a.ctl"  # a careless operator: any uid may connect to the control socket
AS_NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"

# perf PORT OUT WHO TEST ARGS...: a perftest server and client (as WHO: ""
# for root) on CPU 1; sets PT_SERVER and PT_CLIENT.
perf() {
  local port=$1 out=$2 who=$3; shift 3
  taskset -c 1 $who env HOME=/ "$URUN" --lib "$IBV_DIR" --socket "$APP" "$@" -d uroce0 -x 0 -p "$port" > "$out.s" 2>&1 &
  PT_SERVER=$!
  wait_listen "" "" "$port" || echo "  ($1: the server never listened on $port)"
  taskset -c 1 $who env HOME=/ "$URUN" --lib "$IBV_DIR" --socket "$APP" "$@" -d uroce0 -x 0 -p "$port" 127.0.0.1 > "$out.c" 2>&1 &
  PT_CLIENT=$!
}
# stall PORT OUT: the victim's ib_send_lat (64 B, events); prints its
# longest round trip and its 99.9th percentile (t_max, us), or nothing.
stall() {
  perf "$1" "$2" "" ib_send_lat -s 64 -n 5000 -e
  wait $PT_CLIENT $PT_SERVER
  awk '$1 == 64 && $2 == 5000 {print $4, $9}' "$2.c"
}

# The floods, as uid 65534, SCHED_IDLE, on the daemon's CPU, until killed.
FLOOD_APP='
import socket, sys
while True:  # connect, say nothing, hang up; and hold up to 100 silent ones
    held = []
    for _ in range(100):
        s = socket.socket(socket.AF_UNIX)
        try: s.connect(sys.argv[1]); held.append(s)
        except OSError: s.close()
    for s in held: s.close()'
FLOOD_CTL='
import socket, sys
def conn():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    try: s.connect(sys.argv[1]); return s
    except OSError: s.close()
silent = [conn() for _ in range(4)]  # held silent, under the 8 one uid may hold
n = 0
while True:  # status requests back to back (past 10 they wait their turn); every 5th, 6 more at once, past the bound
    s = conn()
    if s:
        try: s.sendall(b"status\n"); s.recv(1 << 20)
        except OSError: pass
        s.close()
    n += 1
    if n % 5 == 0:  # 4 held + 6 > 8
        for x in [conn() for _ in range(6)]:
            if x: x.close()'
port=19600
rounds=6
declare -A MAX P999 FAILED
# Six rounds: the rounds' 99.9th percentiles without a flood range over
# 2x on this VM (130 to 223 us in one run), a flood's rounds more, so the
# median of four was not steady enough for a bound of three times.
# One round's extreme on two shared cores is the scheduler's, not uroced's
# (a quiet round has reached 4.6 ms, ten times its neighbours; floods
# that only cost the kernel's time move the 99.9th percentile up to 1.9
# times): the checks compare the rounds' median 99.9th percentile within
# three times, and the longest round trip within eight. A daemon that
# spends 1 ms on each of the flooder's connections moved the median
# 99.9th percentile 11.7 times (160 to 1868 us); one that waits on a
# flooder stalls for seconds.
# The whole measurement takes up to three tries: the bounds hold on this
# VM in most runs, but a run's medians still swing (docs/performance.md,
# "Waiting on two shared cores"); a daemon that lets a flood stall its
# tenants fails every try.
median() { echo "$@" | tr ' ' '\n' | sort -g | awk 'NF {v[n++] = $1} END {if (n) print (n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2)}'; }
worst() { echo "$@" | tr ' ' '\n' | sort -g | tail -n 1; }
# within A B K: B is at most K times A.
within() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" -v k="$3" 'BEGIN {exit !(b <= k * a)}'; }
declare -A MED TOP
for try in 1 2 3; do
  MAX=(); P999=(); FAILED=()
  for r in $(seq 1 $rounds); do
    for kind in none app ctl; do
      fp=""
      case $kind in
        app) taskset -c 0 chrt -i 0 $AS_NOBODY /usr/bin/python3 -c "$FLOOD_APP" "$APP" > /dev/null 2>&1 & fp=$! ;;
        ctl) taskset -c 0 chrt -i 0 $AS_NOBODY /usr/bin/python3 -c "$FLOOD_CTL" "$TMP/a.ctl" > /dev/null 2>&1 & fp=$! ;;
      esac
      [ -n "$fp" ] && PIDS="$PIDS $fp" && sleep 1
      # The victim opens a session while the flood runs (ibv_devinfo), then
      # measures its stalls.
      timeout 20 taskset -c 1 "$URUN" --lib "$IBV_DIR" --socket "$APP" ibv_devinfo -d uroce0 > "$TMP/devinfo-$kind-$r.out" 2>&1
      dev_rc=$?
      port=$((port + 1))
      m=$(stall $port "$TMP/lat-$kind-$r")
      [ -n "$fp" ] && kill $fp 2> /dev/null && wait $fp 2> /dev/null
      echo "  round $r, flood $kind: the victim's session opened (ibv_devinfo exit $dev_rc); longest round trip ${m%% *} us, 99.9th percentile ${m##* } us"
      [ $dev_rc -eq 0 ] && grep -q "PORT_ACTIVE" "$TMP/devinfo-$kind-$r.out" || FAILED[$kind]=1
      if [ -z "$m" ]; then FAILED[$kind]=1; tail -n 3 "$TMP/lat-$kind-$r.c"; continue; fi
      MAX[$kind]="${MAX[$kind]:-} ${m%% *}"
      P999[$kind]="${P999[$kind]:-} ${m##* }"
    done
  done
  for kind in none app ctl; do MED[$kind]=$(median ${P999[$kind]:-}); TOP[$kind]=$(worst ${MAX[$kind]:-}); done
  echo "  try $try, over $rounds rounds, median 99.9th percentile / longest round trip: no flood ${MED[none]}/${TOP[none]} us, application-socket flood ${MED[app]}/${TOP[app]} us, control-socket flood ${MED[ctl]}/${TOP[ctl]} us"
  [ -n "${FAILED[none]:-}${FAILED[app]:-}${FAILED[ctl]:-}" ] && break  # not a matter of timing: no retry
  within "${MED[none]}" "${MED[app]}" 3 && within "${MED[none]}" "${MED[ctl]}" 3 &&
    within "${TOP[none]}" "${TOP[app]}" 8 && within "${TOP[none]}" "${TOP[ctl]}" 8 && break
done
st=$(ctl "$TMP/a.ctl" status)
echo "  refused: $(echo "$st" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["limits"]["refused"])')"
check "the victim opens a session during every flood, and its traffic runs" \
  "[ -z '${FAILED[none]:-}${FAILED[app]:-}${FAILED[ctl]:-}' ]"
for kind in app ctl; do
  name=$([ $kind = app ] && echo application || echo control)
  check "$name-socket flood: the victim's median 99.9th percentile is at most three times its median without a flood (${MED[$kind]} vs ${MED[none]} us; try $try of 3)" \
    "within '${MED[none]}' '${MED[$kind]}' 3"
  check "$name-socket flood: the victim's longest round trip is at most eight times its longest without a flood (${TOP[$kind]} vs ${TOP[none]} us; try $try of 3)" \
    "within '${TOP[none]}' '${TOP[$kind]}' 8"
done
check "the control socket's per-uid bound refused the flood's extra connections, counted" \
  "[ \$(jget '$st' limits.refused.control_conns) -gt 0 ]"
# A uid's requests past its rate (10 a second, 10 at once) wait their turn:
# 25 back to back, as uid 65534, are all answered, and at least 10 waited.
ASK25='
import json, socket, sys
n = 0
for _ in range(25):
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1]); s.sendall(b"status\n")
    d = b""
    while not d.endswith(b"\n"):
        x = s.recv(1 << 20)
        if not x: break
        d += x
    s.close()
    n += "pipeline" in json.loads(d)
print(n)'
sleep 2  # the flood's bucket refills
d0=$(jget "$(ctl "$TMP/a.ctl" status)" limits.delayed.control_requests)
answered=$($AS_NOBODY /usr/bin/python3 -c "$ASK25" "$TMP/a.ctl" 2>&1)
d1=$(jget "$(ctl "$TMP/a.ctl" status)" limits.delayed.control_requests)
echo "  uid 65534, 25 status requests back to back: $answered answered, $((d1 - d0)) waited for the uid's rate (the floods': $d0)"
check "a uid's control requests past its rate wait their turn, all answered, counted" \
  "[ '$answered' = 25 ] && [ $((d1 - d0)) -ge 10 ] && [ $((d1 - d0)) -le 15 ] && [ $d0 -gt 0 ]"

echo "== the transmit share: the victim's ib_write_bw (1 QP) beside the flooder's (64 QPs), both bulk"
tx() {  # tx STATUS UID: wire bytes uid UID sent while the share was metered
  echo "$1" | /usr/bin/python3 -c '
import json, sys
t = [x for x in json.load(sys.stdin)["limits"]["tx_share"]["tenants"] if x["uid"] == int(sys.argv[1])]
print(t[0]["tx_bytes"] if t else 0)' "$2"
}
# share WHO: the victim's share of the two tenants' bytes over 3 s (as
# another uid, from the daemon's counts; as root, from perftest's figures).
share() {
  port=$((port + 2))
  perf $port "$TMP/bf" "$1" ib_write_bw -s 65536 -q 64 -D 8
  local fc=$PT_CLIENT fs=$PT_SERVER
  perf $((port + 1)) "$TMP/bv" "" ib_write_bw -s 65536 -D 6
  local vc=$PT_CLIENT vs=$PT_SERVER s0 s1
  sleep 2.5
  s0=$(ctl "$TMP/a.ctl" status)
  sleep 3
  s1=$(ctl "$TMP/a.ctl" status)
  wait $vc $vs $fc $fs
  if [ -n "$1" ]; then
    local v=$(($(tx "$s1" 0) - $(tx "$s0" 0))) f=$(($(tx "$s1" 65534) - $(tx "$s0" 65534)))
    awk -v v=$v -v f=$f 'BEGIN {if (v + f > 0) printf "%.3f\n", v / (v + f)}'
  else
    local v f
    v=$(awk '$1 == 65536 {print $4}' "$TMP/bv.c"); f=$(awk '$1 == 65536 {print $4}' "$TMP/bf.c")
    [ -n "$v" ] && [ -n "$f" ] && awk -v v="$v" -v f="$f" 'BEGIN {printf "%.3f\n", v / (v + f)}'
  fi
  grep -h "Completion with error" "$TMP"/b[fv].[cs] | head -3 | sed 's/^/    /' >&2
}
other=$(share "$AS_NOBODY")
same=$(share "")
echo "  the victim's share: ${other:-?} against uid 65534, ${same:-?} against its own uid's 64 QPs (the control)"
check "the victim keeps half the wire against another uid's 64 QPs (0.45 or more), where as one uid it gets under 0.1" \
  "[ -n '$other' ] && [ -n '$same' ] && awk 'BEGIN {exit !($other >= 0.45 && $same < 0.1)}'"
check "the daemon is alive" "kill -0 ${PIDS%% *} 2>/dev/null || ctl '$TMP/a.ctl' status > /dev/null"
finish
