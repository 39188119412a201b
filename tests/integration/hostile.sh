#!/bin/bash
# A hostile local application and a careless operator, against the memif
# daemon pair (the rows of the hardening issue that are fixed): each asserts
# a clear error or a counted refusal, and afterwards the daemon is alive and
# a well-behaved application still passes every operation with its bytes
# checked.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
. "$(dirname "$0")/cpu_share.sh"
need_root
APP=${APP_PAIR:?path to app_pair}
ME="--port net_memif0 --no-huge --mem-mb 256"

echo "== operator input: config files, numbers and the socket mode (rows 8, 13)"
mkdir -p "$TMP/conf.d"
run_bad() {  # NAME EXPECTED-TEXT ARGS...: exits 2 within 5 s, saying EXPECTED-TEXT
  local name=$1 want=$2; shift 2
  timeout 5 "$UROCED" "$@" > "$TMP/$name.out" 2>&1; local rc=$?
  echo "  $name: exit $rc: $(head -c 120 "$TMP/$name.out" | head -1)"
  [ $rc -eq 2 ] && grep -q -- "$want" "$TMP/$name.out"
}
check "--config /dev/zero: refused at once, not read forever" "run_bad zero 'not a regular file' --config /dev/zero"
check "--config DIRECTORY: refused, not taken as empty" "run_bad dir 'not a regular file' --config $TMP/conf.d"
check "--config missing: a clear error" "run_bad missing 'cannot read config file' --config $TMP/nope.conf"
head -c 2000000 /dev/zero | tr '\0' '#' > "$TMP/big.conf"
check "--config over 1 MiB: refused" "run_bad big 'over 1048576 bytes' --config $TMP/big.conf"
check "--duration -5: refused" "run_bad dneg '--duration must be' $ME --ip 10.98.0.1 --duration -5"
check "--duration nan: refused" "run_bad dnan '--duration must be' $ME --ip 10.98.0.1 --duration nan"
check "--app-socket-mode 0999: not octal, refused" "run_bad m9 'must be octal' $ME --ip 10.98.0.1 --app-socket-mode 0999"
check "--app-socket-mode 4777: no setuid bits, refused" "run_bad m4 'must be octal' $ME --ip 10.98.0.1 --app-socket-mode 4777"
check "an option named %original_token%: refused at once (Boost would loop on it; found by fuzzing)" \
  "run_bad pct 'holds a %name% token' $ME --ip 10.98.0.1 '--%original_token%'"
printf 'port = net_memif0\n%%original_token%% = 1\n' > "$TMP/pct.conf"
check "a config file with a %name% token: refused at once" "run_bad pctc 'holds a %name% token' --config $TMP/pct.conf"
check "--app-socket-group with no such group: refused" \
  "run_bad grp 'no group named' $ME --ip 10.98.0.1 --app-socket-group no-such-group-$$"

start_daemon "" da --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.98.0.1 --lcore 0 \
  --app-socket "$TMP/a.app" --ctl-socket "$TMP/a.ctl" --app-socket-mode 0600 --app-socket-group root
A_PID=$LAST_PID
# The memif client connects once: the server must be up first (its
# application socket comes after its port; memif's own socket is abstract).
wait_sockets "$TMP/a.app" || bad "daemon A is up (gave up after $PROBES looks)"
start_daemon "" db --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.98.0.2 --lcore 1 \
  --app-socket "$TMP/b.app" --ctl-socket "$TMP/b.ctl"
wait_sockets "$TMP/a.app" "$TMP/b.app" || bad "both application sockets are there (gave up after $PROBES looks)"
echo "  application socket: $(stat -c '%a %G' "$TMP/a.app")"
check "--app-socket-mode 0600 is octal: the socket is 600 (not 1130), owned by the group given" \
  "[ \"\$(stat -c '%a %G' '$TMP/a.app')\" = '600 root' ]"

echo "== the control socket (rows 11, 12)"
rss() { awk '/VmRSS/ {print $2}' "/proc/$A_PID/status"; }
r0=$(rss)
long=$(/usr/bin/python3 - "$TMP/a.ctl" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
try:
    chunk = b"x" * 65536
    for _ in range(3200):  # 200 MiB, no newline: the daemon cuts it off long before
        s.sendall(chunk)
except OSError:
    pass
data = b""
try:
    while True:
        c = s.recv(65536)
        if not c: break
        data += c
except OSError:
    pass
print(data.decode(errors="replace").strip())
PY
)
r1=$(rss)
echo "  reply to a 200 MiB line: $long; RSS $r0 -> $r1 kB"
check "a control line over 4 KiB: refused with a JSON error, connection closed, memory flat" \
  "echo '$long' | /usr/bin/python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); sys.exit(not (d[\"ok\"] is False and \"longer than 4096\" in d[\"error\"]))' && [ $((r1 - r0)) -lt 20000 ]"
/usr/bin/python3 - "$TMP/a.ctl" > "$TMP/weird.json" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
s.sendall(b'he"llo\\wor\x01ld\xff\n'); data = b""
while not data.endswith(b"\n"):
    c = s.recv(65536)
    if not c: break
    data += c
sys.stdout.write(data.decode(errors="replace"))
PY
echo "  reply to a command with a quote, a backslash and control bytes: $(cat "$TMP/weird.json")"
check "a command with \" and \\: the reply is valid JSON that names it" \
  "/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d[\"ok\"] is False and chr(34) + \"llo\" + chr(92) + \"wor\" in d[\"error\"]))' '$TMP/weird.json'"
check "status is valid JSON and shows the control-line limit" \
  "[ \$(jget \"\$(ctl $TMP/a.ctl status)\" limits.control_line_bytes) = 4096 ]"

echo "== shared memory, channels and descriptors (rows 1-6)"
"$APP" seams "$TMP/a.app" "$A_PID" > "$TMP/seams.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/seams.out" | grep -v '^  [0-9]* passed' | head -12
check "seams: rings sealed, MRs only on sealed memfds that hold them, a pipe refused as a channel, descriptors closed" \
  "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/seams.out'"

echo "== a flood of RTRs to an address nobody answers for (row 7)"
n0=$(jget "$(ctl "$TMP/a.ctl" status)" dataplane.neigh_requests)
"$APP" rtrflood "$TMP/a.app" 500 > "$TMP/rtr.out" 2>&1; rc=$?
n1=$(jget "$(ctl "$TMP/a.ctl" status)" dataplane.neigh_requests)
sed 's/^/  /' "$TMP/rtr.out" | grep -v '^  [0-9]* passed' | head -5
echo "  ARP requests sent for them: $((n1 - n0))"
check "rtrflood: bounded parking, every request answered" \
  "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/rtr.out'"
check "rtrflood: one resolution per destination on a backoff (<= 8 ARPs in ~3 s, not one per request)" \
  "[ $((n1 - n0)) -ge 1 ] && [ $((n1 - n0)) -le 8 ]"

# app_mode MODE: runs `app_pair MODE` against both daemons, shows its failures
# and its last line, and checks that every one of its checks passed.
app_mode() {
  local mode=$1 what=$2
  "$APP" "$mode" "$TMP/a.app" "$TMP/b.app" > "$TMP/$mode.out" 2>&1; local rc=$?
  grep FAIL "$TMP/$mode.out" | head -5 | sed 's/^/  /'; tail -n 1 "$TMP/$mode.out" | sed 's/^/  /'
  check "$mode: $what" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/$mode.out'"
}

echo "== hostile rings: malformed, rewritten and out-of-range entries and indices in a session's own rings"
w0=$(jget "$(ctl "$TMP/a.ctl" status)" port.bad_wqe)
f0=$(jget "$(ctl "$TMP/a.ctl" status)" intake.foreign)
app_mode rings "only the hostile session's QP suffers; the victim pair checks every byte throughout"
w1=$(jget "$(ctl "$TMP/a.ctl" status)" port.bad_wqe)
f1=$(jget "$(ctl "$TMP/a.ctl" status)" intake.foreign)
echo "  work requests refused as malformed: $((w1 - w0)); work-ring names that were not the session's: $((f1 - f0))"
check "rings: the malformed entries are counted (port.bad_wqe)" "[ $((w1 - w0)) -ge 1 ]"
check "rings: names of other sessions' QPs in a work ring are ignored and counted (intake.foreign)" "[ $((f1 - f0)) -ge 1 ]"
check "daemon A is alive after the hostile rings" "kill -0 $A_PID"

echo "== CQ overflow: an async event, its QP to ERR, counted"
o0=$(jget "$(ctl "$TMP/a.ctl" status)" port.cq_overflows)
app_mode cqoverflow "IBV_EVENT_CQ_ERR and IBV_EVENT_QP_FATAL reach the owner, the QP is in ERR, its other QP works"
o1=$(jget "$(ctl "$TMP/a.ctl" status)" port.cq_overflows)
d1=$(jget "$(ctl "$TMP/a.ctl" status)" port.cqe_dropped)
echo "  CQs overflowed: $((o1 - o0)); completions dropped in all: $d1"
check "cqoverflow: counted (port.cq_overflows +1, port.cqe_dropped > 0)" "[ $((o1 - o0)) -eq 1 ] && [ ${d1:-0} -ge 1 ]"

echo "== silent connections: out of descriptors, the daemon sheds and pauses, never spins; silence times out (row 10)"
# flood SOCK N SECS: N connections that never say hello, held SECS seconds;
# prints how many connected. `flood_as UID ...` does it as another uid.
FLOOD_PY='
import socket, sys, time
path, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX); s.setblocking(False)
    try: s.connect(path)
    except OSError: pass
    socks.append(s)
print(len(socks), flush=True)
time.sleep(secs)'
flood() { /usr/bin/python3 -c "$FLOOD_PY" "$@"; }
flood_as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups /usr/bin/python3 -c "$FLOOD_PY" "$@"; }
CS=/tmp/uroce-hostile-$$.app  # outside $TMP (0700): another uid connects to it below
prlimit --nofile=256:256 "$UROCED" --no-huge --mem-mb 256 --file-prefix dc-$$ --port net_memif0 \
  --vdev "net_memif0,role=server,socket=$TMP/mc.sock" --ip 10.98.0.3 --lcore 0 --app-socket "$CS" --app-socket-mode 0666 \
  --ctl-socket "$TMP/c.ctl" --max-unhelloed 1000 --max-unhelloed-per-uid 1000 --hello-timeout-ms 1000 > "$TMP/dc.out" 2> "$TMP/dc.err" &
C_PID=$!; PIDS="$PIDS $C_PID"
wait_sockets "$CS" "$TMP/c.ctl" || bad "daemon C's sockets are there (gave up after $PROBES looks)"
flood "$CS" 600 3 > "$TMP/flood.out" & fp=$!
wait_line "$TMP/flood.out" '^[0-9]+$' || bad "the flood connected (gave up after $PROBES looks)"
# The daemon's CPU beside a busy loop pinned to its CPUs, while the flood
# holds it at EMFILE: a daemon that spins there takes about what the loop
# takes, however loaded the machine; one that pauses takes a fraction.
read -r dticks bticks cpus <<< "$(cpu_vs_busy $C_PID 1)"
wait $fp
# The silent connections time out after 1 s: wait until they are counted.
st=""
timed_out() { st=$(ctl "$TMP/c.ctl" status); [ "$(jget "$st" limits.refused.hello_timeouts 2>/dev/null)" -gt 0 ] 2>/dev/null; }
probe 400 timed_out || echo "  no hello timeout counted after $PROBES looks"
emfile=$(jget "$st" limits.refused.emfile_drops 2>/dev/null); hto=$(jget "$st" limits.refused.hello_timeouts 2>/dev/null)
echo "  600 silent connections at a 256-descriptor limit: over 1 s the daemon used $dticks CPU ticks, a busy loop beside it on CPU $cpus $bticks; accept errors $(jget "$st" limits.refused.accept_errors), dropped at EMFILE $emfile, hello timeouts $hto"
check "row 10: out of descriptors, the daemon does not spin (under a fifth of a busy loop's CPU beside it: $dticks vs $bticks ticks)" \
  "sleeps_beside $dticks $bticks"
check "row 10: connections shed at EMFILE, silent ones closed after the hello timeout, all counted (the daemon kept working)" \
  "[ ${emfile:-0} -gt 0 ] && [ ${hto:-0} -gt 0 ]"
check "row 10: afterwards the control socket answers and the daemon is alive" "[ -n '$st' ] && kill -0 $C_PID"
kill $C_PID; wait $C_PID 2>/dev/null

echo "== sessions and QPs per uid (row 9), and connections awaiting hello capped"
"$UROCED" --no-huge --mem-mb 256 --file-prefix dd-$$ --port net_memif0 \
  --vdev "net_memif0,role=server,socket=$TMP/md.sock" --ip 10.98.0.4 --lcore 0 --app-socket "$CS" --app-socket-mode 0666 \
  --ctl-socket "$TMP/d.ctl" --max-qps 32 --max-qps-per-uid 40 --max-sessions-per-uid 3 --max-unhelloed 16 \
  --max-unhelloed-per-uid 4 --hello-timeout-ms 3000 > "$TMP/dd.out" 2> "$TMP/dd.err" &
D_PID=$!; PIDS="$PIDS $D_PID"
wait_sockets "$CS" "$TMP/d.ctl" || bad "daemon D's sockets are there (gave up after $PROBES looks)"
"$APP" qpcap "$CS" 5 > "$TMP/qpcap.out" 2>&1
sed 's/^/  root: /' "$TMP/qpcap.out"
check "row 9: one uid gets 40 QPs over its sessions (32 in one), then a clear refusal naming the uid" \
  "grep -q '^total 40 QPs' '$TMP/qpcap.out' && grep -q '^session 0: 32 QPs (too many QPs for this session)' '$TMP/qpcap.out' && grep -q 'too many QPs for uid 0' '$TMP/qpcap.out'"
check "row 9: its fourth and fifth sessions are refused at hello" "[ \$(grep -c 'open: too many sessions for uid 0' '$TMP/qpcap.out') -eq 2 ]"
setpriv --reuid=65534 --regid=65534 --clear-groups "$APP" qpcap "$CS" 1 > "$TMP/qpcap2.out" 2>&1
sed 's/^/  nobody: /' "$TMP/qpcap2.out"
check "row 9: another uid still gets its QPs" "grep -q '^session 0: 32 QPs' '$TMP/qpcap2.out'"
# One uid's silent connections (nobody's: 40, held) fill its own share of
# the connections awaiting hello (4), never the others': root opens a
# session meanwhile. Then five uids at once reach the bound in all (16).
flood_as 65534 "$CS" 40 2.5 > "$TMP/nobody-flood.out" 2>&1 &
fl=$!
probe 200 grep -q 40 "$TMP/nobody-flood.out"
"$APP" qpcap "$CS" 1 > "$TMP/qpcap3.out" 2>&1
sed 's/^/  root, while nobody holds 40 silent connections: /' "$TMP/qpcap3.out" | head -2
wait $fl
st=$(ctl "$TMP/d.ctl" status)
check "a uid's silent connections beyond 4 are closed at once and counted, and root still opens its session meanwhile" \
  "grep -q '^session 0: [0-9]* QPs' '$TMP/qpcap3.out' && [ \$(jget '$st' limits.refused.unhelloed_per_uid) -ge 36 ]"
fls=""
for u in 65530 65531 65532 65533 65534; do flood_as $u "$CS" 4 1 > /dev/null & fls="$fls $!"; done
wait $fls
st=$(ctl "$TMP/d.ctl" status)
echo "  refused: $(echo "$st" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["limits"]["refused"])')"
check "connections awaiting hello beyond 16 in all (five uids, four each) are closed at once, and counted" "[ \$(jget '$st' limits.refused.unhelloed) -ge 4 ]"
check "the refusals are counted per kind" \
  "[ \$(jget '$st' limits.refused.qps_per_uid) -ge 1 ] && [ \$(jget '$st' limits.refused.sessions_per_uid) -eq 2 ]"
"$UROCE_CTL" --socket "$TMP/d.ctl" status | grep -A1 '^limits:' | sed 's/^/  /'
check "uroce-ctl status shows the limits and the refusals" \
  "'$UROCE_CTL' --socket '$TMP/d.ctl' status | grep -q '^limits: sessions 256 (3 per uid), QPs 32 per session and 40 per uid'"
kill $D_PID; wait $D_PID 2>/dev/null; rm -f "$CS"

echo "== afterwards: the daemon is alive and a well-behaved application passes every operation"
check "daemon A is alive" "kill -0 $A_PID"
"$APP" ops "$TMP/a.app" "$TMP/b.app" > "$TMP/ops.out" 2>&1; rc=$?
tail -n 1 "$TMP/ops.out" | sed 's/^/  /'
check "ops: every operation, every byte checked" "[ $rc -eq 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' '$TMP/ops.out'"
finish
