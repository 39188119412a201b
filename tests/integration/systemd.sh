#!/bin/bash
# uroced under systemd's notification protocol (sd_notify(3)), checked as
# systemd would see it, with no systemd running:
# (1) the units (tools/systemd) pass `systemd-analyze verify`;
# (2) a daemon started with $NOTIFY_SOCKET (a datagram socket this test
#     reads) and $WATCHDOG_USEC (400 ms) says READY=1 first, and only once
#     its application and control sockets exist; then feeds the watchdog
#     (WATCHDOG=1, at half its timeout, while its pipeline turns); and on
#     SIGTERM says STOPPING=1, then exits 0;
# (3) without $WATCHDOG_USEC it still says READY=1, and feeds nothing;
#     with --log-format json every line of its log is a JSON object.
# When the watchdog goes unfed (a pipeline that stops turning) is
# tests/unit/node/test_watchdog.cc's.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
need_prog systemd-analyze systemd
UNITS=${UROCED_UNITS:?the folder of the built units}

echo "== the units"
for u in uroced.service uroced@.service; do
  # ExecStart names the installed uroced: here, the one just built.
  sed -E "s|^(ExecStart(Pre)?)=[^ ]*/uroced |\1=$UROCED |" "$UNITS/$u" > "$TMP/$u"
  check "$u names uroced with its config file, its preflight first" \
    "grep -q '^ExecStartPre=$UROCED --check --config /etc/uroce/' '$TMP/$u' && grep -q '^ExecStart=$UROCED --config /etc/uroce/' '$TMP/$u'"
done
check "both are Type=notify with a watchdog" "[ \$(grep -c -e '^Type=notify' -e '^WatchdogSec=' '$TMP/uroced.service' '$TMP/uroced@.service' | awk -F: '{ s += \$2 } END { print s }') -eq 4 ]"
cp "$TMP/uroced@.service" "$TMP/uroced@port0.service"
(cd "$TMP" && SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no ./uroced.service ./uroced@port0.service) > "$TMP/verify.out" 2>&1; vrc=$?
sed 's/^/  /' "$TMP/verify.out" | head -10
check "systemd-analyze verify: no complaint (exit $vrc)" "[ $vrc -eq 0 ] && ! grep -qiE 'unknown|invalid|ignoring|not executable|failed' '$TMP/verify.out'"
# Not blanket root: its own user, and only the ports' capabilities
# (control/node/privileges.h); tests/integration/unprivileged.sh runs a
# daemon with exactly these.
for u in uroced.service uroced@.service; do
  check "$u runs as User=uroce with ambient CAP_NET_RAW, CAP_NET_ADMIN and CAP_IPC_LOCK, and a bounding set of those alone" \
    "grep -qx 'User=uroce' '$TMP/$u' && grep -qx 'AmbientCapabilities=CAP_NET_RAW CAP_NET_ADMIN CAP_IPC_LOCK' '$TMP/$u' && grep -qx 'CapabilityBoundingSet=CAP_NET_RAW CAP_NET_ADMIN CAP_IPC_LOCK' '$TMP/$u'"
done
# The drop-in for ports that need root (docs/deploy.md) verifies with the unit.
ROOT_CONF=$(dirname "$0")/../../tools/systemd/root.conf
mkdir -p "$TMP/uroced.service.d" && cp "$ROOT_CONF" "$TMP/uroced.service.d/root.conf"
(cd "$TMP" && SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no ./uroced.service) > "$TMP/verify-root.out" 2>&1; vrc=$?
sed 's/^/  /' "$TMP/verify-root.out" | head -5
check "with tools/systemd/root.conf as a drop-in (User=root, every capability) it still verifies (exit $vrc)" \
  "[ $vrc -eq 0 ] && [ ! -s '$TMP/verify-root.out' ] && grep -qx 'User=root' '$ROOT_CONF' && grep -qx 'CapabilityBoundingSet=~' '$ROOT_CONF'"
rm -r "$TMP/uroced.service.d"

# listen OUT: reads the notify socket $TMP/notify.sock into OUT, one line per
# assignment, each with whether both daemon sockets existed when it came,
# until $TMP/done exists.
listen() {
  rm -f "$TMP/done"
  /usr/bin/python3 - "$TMP" "$1" <<'PY' &
import os, socket, sys
tmp, out = sys.argv[1], sys.argv[2]
path = tmp + "/notify.sock"
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(path); s.settimeout(0.1)
with open(out, "w") as f:
    while not os.path.exists(tmp + "/done"):
        try:
            m = s.recv(4096).decode()
        except socket.timeout:
            continue
        up = int(os.path.exists(tmp + "/run/uroce0.sock") and os.path.exists(tmp + "/d.ctl"))
        for line in m.split("\n"):
            if line:
                print(line, "sockets=%d" % up, file=f, flush=True)
PY
  LISTENER=$!
  probe 100 test -S "$TMP/notify.sock" || bad "the notify socket is bound"
}
# daemon NAME [VAR=VALUE...]: one uroced with those variables and $NOTIFY_SOCKET.
daemon() {
  local name=$1; shift
  rm -f "$TMP/run/uroce0.sock" "$TMP/d.ctl"
  mkdir -p "$TMP/run"
  env NOTIFY_SOCKET="$TMP/notify.sock" "$@" "$UROCED" --no-huge --mem-mb 256 --file-prefix "$name-$$" --no-host-netdev \
    --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/$name.memif" --ip 10.96.0.1 --lcore 0 \
    --app-socket "$TMP/run/uroce0.sock" --ctl-socket "$TMP/d.ctl" ${LOGFMT:+--log-format $LOGFMT} > "$TMP/$name.out" 2> "$TMP/$name.err" &
  DPID=$!
}
# finish_daemon: SIGTERM, its exit code in DRC; the listener ends.
finish_daemon() {
  kill -TERM "$DPID"; wait "$DPID"; DRC=$?
  touch "$TMP/done"; wait "$LISTENER"; rm -f "$TMP/notify.sock"
}

echo "== READY, the watchdog, STOPPING (WATCHDOG_USEC=400000)"
listen "$TMP/wd.log"
daemon wd WATCHDOG_USEC=400000
fed() { [ "$(grep -c '^WATCHDOG=1' "$TMP/wd.log" 2>/dev/null)" -ge 5 ]; }
probe 200 fed || bad "the watchdog was fed 5 times (gave up after $PROBES looks)"
finish_daemon
sed 's/^/  /' "$TMP/wd.log" | sort | uniq -c | head -8
check "READY=1 came first, with both sockets already there" "head -1 '$TMP/wd.log' | grep -qx 'READY=1 sockets=1'"
check "its STATUS names the pipeline and the application socket" "grep -q '^STATUS=1 pipeline(s) up; applications on $TMP/run/uroce0.sock sockets=1' '$TMP/wd.log'"
check "WATCHDOG=1 while it ran ($(grep -c '^WATCHDOG=1' "$TMP/wd.log") times)" "fed"
check "STOPPING=1 after them, and nothing after it" "grep -n '' '$TMP/wd.log' | grep -v STATUS | tail -1 | grep -q 'STOPPING=1' && [ \$(grep -c '^STOPPING=1' '$TMP/wd.log') -eq 1 ]"
check "the daemon exited 0 on SIGTERM ($DRC)" "[ $DRC -eq 0 ]"
check "its log names the watchdog and its timeout" "grep -q 'systemd watchdog: fed while every pipeline turns.*timeout_ms=400' '$TMP/wd.err'"
check "no pipeline was found stalled" "! grep -q 'made no pass' '$TMP/wd.err'"

echo "== without a watchdog, logging JSON (--log-format json)"
listen "$TMP/nowd.log"
LOGFMT=json daemon nowd
probe 200 grep -q '^READY=1' "$TMP/nowd.log" || bad "READY=1 came (gave up after $PROBES looks)"
# The control socket answers: the daemon has run its loop since READY.
ctl "$TMP/d.ctl" status > /dev/null; ctl "$TMP/d.ctl" status > /dev/null
finish_daemon
check "READY=1, then STOPPING=1, and no WATCHDOG=1" "grep -q '^READY=1 sockets=1' '$TMP/nowd.log' && grep -q '^STOPPING=1' '$TMP/nowd.log' && ! grep -q WATCHDOG '$TMP/nowd.log'"
check "the daemon exited 0 ($DRC)" "[ $DRC -eq 0 ]"
# Every line of its log is one JSON object with ts, level and msg; DPDK's
# own lines too (source dpdk), as journald and log shippers take them.
/usr/bin/python3 - "$TMP/nowd.err" > "$TMP/json.out" 2>&1 <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
objs = [json.loads(l) for l in lines]
assert all({"ts", "level", "msg"} <= set(o) for o in objs), "a line without ts, level or msg"
assert all(o["level"] in ("debug", "info", "warn", "error") for o in objs)
started = [o for o in objs if o["msg"] == "uroced started"]
assert started and started[0]["port"] == "net_memif0" and started[0]["lcore"] == "0", started
assert any(o.get("source") == "dpdk" for o in objs), "no DPDK line"
print("json lines", len(objs))
PY
jrc=$?
sed 's/^/  /' "$TMP/json.out" | tail -2
check "every log line is a JSON object (ts, level, msg, the fields; DPDK's lines too)" "[ $jrc -eq 0 ]"
finish
