#!/bin/bash
# The Prometheus endpoint (--metrics ADDR:PORT), scraped as Prometheus would,
# after real traffic (ibv_rc_pingpong, unmodified, between two daemons):
# - `promtool check metrics` (Debian's prometheus) finds nothing to say;
# - python3-prometheus-client's parser reads it, and what it reads is what
#   the control socket's status says (the QP totals, the mlx5 names, the
#   tenant's QPs, and per-QP series up to --metrics-qps, the rest counted);
# - HEAD, a wrong path (404), a wrong method (405), garbage (400), a request
#   over 8 KiB and 20 idle connections (past 16, closed at once) leave it
#   serving; a bad --metrics is refused at start with a clear error.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
unset LD_LIBRARY_PATH
need_prog promtool prometheus
need_prog ibv_rc_pingpong ibverbs-utils
/usr/bin/python3 -c 'import prometheus_client' 2> /dev/null || { bad "python3-prometheus-client is not installed (tools/setup.sh installs it)"; finish; exit 1; }
IBV_DIR=${UROCE_IBVERBS_DIR:?the folder of the uroce libibverbs.so.1}
URUN=${UROCE_RUN:?the path of tools/uroce-run}
PORT=19477
mkdir -p "$TMP/run" "$TMP/run_b"

echo "== a bad --metrics is refused"
"$UROCED" --no-huge --port net_null0 --vdev net_null0 --ip 10.96.9.1 --metrics 10.96.9.1 > "$TMP/bad.out" 2>&1; brc=$?
check "--metrics without a port: exit 2, the option named ($(head -c 120 "$TMP/bad.out"))" "[ $brc -eq 2 ] && grep -q -- '--metrics: want ADDR:PORT' '$TMP/bad.out'"
"$UROCED" --no-huge --port net_null0 --vdev net_null0 --ip 10.96.9.1 --metrics 127.0.0.1:0 > "$TMP/bad2.out" 2>&1; brc=$?
check "--metrics with port 0: exit 2" "[ $brc -eq 2 ] && grep -q -- '--metrics: the port must be 1..65535' '$TMP/bad2.out'"

start_daemon "" d --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/m.sock,bsize=8192" --ip 10.96.0.1 --lcore 0 \
  --app-socket "$TMP/run/uroce0.sock" --ctl-socket "$TMP/d.ctl" --metrics "127.0.0.1:$PORT" --metrics-qps 1
DA=$LAST_PID
# B (the memif client) once A (the server) is up.
wait_sockets "$TMP/run/uroce0.sock" "$TMP/d.ctl" || bad "daemon A is up (gave up after $PROBES looks)"
start_daemon "" db --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/m.sock,bsize=8192" --ip 10.96.0.2 --lcore 1 \
  --app-socket "$TMP/run_b/uroce0.sock"
DB=$LAST_PID
wait_sockets "$TMP/run_b/uroce0.sock" || bad "daemon B is up (gave up after $PROBES looks)"
# The memif link up on both sides (the verbs port ACTIVE) before any traffic.
link_up() { timeout 10 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/$1" ibv_devinfo 2> /dev/null | grep -q PORT_ACTIVE; }
probe 200 link_up run && probe 200 link_up run_b || bad "the link is up (gave up after $PROBES looks)"
check "the log gives the metrics URL" "grep -q 'msg=\"metrics\" url=http://127.0.0.1:$PORT/metrics' '$TMP/d.err'"

echo "== traffic: ibv_rc_pingpong, server on A (two QPs: its own and, after, an idle one)"
timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run" ibv_rc_pingpong -d uroce0 -g 0 -n 500 -p 18700 > "$TMP/pps.out" 2>&1 & sp=$!
probe 200 bash -c "ss -Hltn 'sport = :18700' | grep -q ." || bad "the pingpong server listens"
timeout 30 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run_b" ibv_rc_pingpong -d uroce0 -g 0 -n 500 -p 18700 127.0.0.1 > "$TMP/ppc.out" 2>&1; crc=$?
wait $sp; src=$?
[ $crc -eq 0 ] && [ $src -eq 0 ] || tail -n 4 "$TMP/ppc.out" "$TMP/pps.out" | sed 's/^/    /'
check "ibv_rc_pingpong: 500 iterations, both sides exit 0" "[ $crc -eq 0 ] && [ $src -eq 0 ]"
# Two sessions that stay, a QP each (one beyond --metrics-qps 1): two
# ibv_rc_pingpong servers waiting for a client that never comes, their QPs
# in INIT.
timeout 60 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run" ibv_rc_pingpong -d uroce0 -g 0 -n 1 -p 18701 > "$TMP/h1.out" 2>&1 & h1=$!
timeout 60 "$URUN" --lib "$IBV_DIR" --run-dir "$TMP/run" ibv_rc_pingpong -d uroce0 -g 0 -n 1 -p 18702 > "$TMP/h2.out" 2>&1 & h2=$!
probe 200 bash -c "ss -Hltn 'sport = :18701' | grep -q . && ss -Hltn 'sport = :18702' | grep -q ." || bad "two idle servers hold QPs"

echo "== a scrape"
/usr/bin/python3 - "$PORT" "$TMP" <<'PY'
import http.client, sys
port, tmp = int(sys.argv[1]), sys.argv[2]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=5); c.request("GET", "/metrics"); r = c.getresponse()
open(tmp + "/scrape.txt", "wb").write(r.read())
open(tmp + "/scrape.hdr", "w").write("%d %s\n" % (r.status, r.getheader("Content-Type")))
PY
ctl "$TMP/d.ctl" status > "$TMP/status.json"
check "200, text/plain; version=0.0.4" "grep -qx '200 text/plain; version=0.0.4; charset=utf-8' '$TMP/scrape.hdr'"
promtool check metrics < "$TMP/scrape.txt" > "$TMP/promtool.out" 2>&1; prc=$?
sed 's/^/  promtool| /' "$TMP/promtool.out" | head -10
check "promtool check metrics: nothing to say (exit $prc)" "[ $prc -eq 0 ] && [ ! -s '$TMP/promtool.out' ]"
/usr/bin/python3 - "$TMP/scrape.txt" "$TMP/status.json" > "$TMP/parse.out" 2>&1 <<'PY'
import json, sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
st = json.load(open(sys.argv[2]))
def one(name, **labels):
    f = fams[name]
    got = [s.value for s in f.samples if all(s.labels.get(k) == v for k, v in labels.items()) and s.name == f.name + ("_total" if f.type == "counter" else "")]
    assert len(got) == 1, (name, labels, got)
    return got[0]
tot = st["qp_totals"]
ok = []
# Counters that moved only with traffic, which is over: equal to the status read after the scrape.
for c in ("completions", "retransmitted_pkts", "cnp_sent"):
    ok.append(one("uroce_qp_" + c, pipeline="0") == tot[c])
ok.append(tot["completions"] >= 1000)
ok.append(one("uroce_hw_np_cnp_sent", pipeline="0") == tot["cnp_sent"])
ok.append(one("uroce_hw_out_of_sequence", pipeline="0") == tot["out_of_sequence"])
ok.append(one("uroce_port_rx_frames", pipeline="0", port="net_memif0") >= 1000)
ok.append(one("uroce_qps", pipeline="0") == st["pipeline"]["qps"] == 2)
ok.append(one("uroce_tenant_qps", uid="0") == 2 and one("uroce_tenant_sessions", uid="0") == 2)
per_qp = [s for s in fams["uroce_per_qp_state"].samples]
ok.append(len(per_qp) == 1 and per_qp[0].value == 1.0)  # an idle server's QP waits in INIT
ok.append(one("uroce_per_qp_omitted", pipeline="0") == 1)
ok.append("uroce_per_qp_cc_rate_bytes_per_second" in fams and "uroce_per_qp_rtt_p99_seconds" in fams)
print("families", len(fams), "checks", ok)
sys.exit(0 if all(ok) else 1)
PY
prc=$?
sed 's/^/  /' "$TMP/parse.out" | tail -3
check "prometheus_client parses it, and it says what the status says (totals, mlx5 names, the tenant, one QP's series and one omitted)" "[ $prc -eq 0 ]"
# The sample Grafana dashboard asks only for series the daemon exposes.
DASH="$(dirname "$0")/../../tools/grafana/uroce-dashboard.json"
/usr/bin/python3 - "$DASH" "$TMP/scrape.txt" > "$TMP/dash.out" 2>&1 <<'PY'
import json, re, sys
from prometheus_client.parser import text_string_to_metric_families
d = json.load(open(sys.argv[1]))
have = {s.name for f in text_string_to_metric_families(open(sys.argv[2]).read()) for s in f.samples}
exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
used = set(re.findall(r"\buroce_[a-z0-9_]+", " ".join(exprs)))
print("panels", len(d["panels"]), "series", len(used), "unknown", sorted(used - have))
sys.exit(0 if d["panels"] and used and used <= have else 1)
PY
drc=$?
sed 's/^/  /' "$TMP/dash.out" | tail -2
check "tools/grafana/uroce-dashboard.json: every series its panels ask for is in the scrape" "[ $drc -eq 0 ]"

echo "== what it refuses, and it still serves"
/usr/bin/python3 - "$PORT" > "$TMP/bad_req.out" 2>&1 <<'PY'
import socket, sys, time
port = int(sys.argv[1])
def ask(raw):
    s = socket.create_connection(("127.0.0.1", port), timeout=5); s.sendall(raw)
    data = b""
    while True:
        try:
            d = s.recv(65536)
        except socket.timeout:
            break
        if not d: break
        data += d
    s.close()
    return data.split(b"\r\n", 1)[0].decode(errors="replace"), data
print("head", ask(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")[0])
print("path", ask(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")[0])
print("method", ask(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")[0])
print("garbage", ask(b"\x00\x01 not http at all\r\n\r\n")[0])
print("big", ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\n")[0])
idle = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(20)]
time.sleep(0.5)  # well within the 5 s a client gets
closed = 0
for s in idle:
    s.setblocking(False)
    try:
        if s.recv(1) == b"": closed += 1
    except BlockingIOError:
        pass
    except ConnectionResetError:
        closed += 1
print("idle_closed", closed)
for s in idle: s.close()
time.sleep(0.2)
print("after", ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")[0])
PY
sed 's/^/  /' "$TMP/bad_req.out"
check "HEAD: 200" "grep -qx 'head HTTP/1.1 200 OK' '$TMP/bad_req.out'"
check "another path: 404" "grep -qx 'path HTTP/1.1 404 Not Found' '$TMP/bad_req.out'"
check "POST: 405" "grep -qx 'method HTTP/1.1 405 Method Not Allowed' '$TMP/bad_req.out'"
check "garbage: 400" "grep -qx 'garbage HTTP/1.1 400 Bad Request' '$TMP/bad_req.out'"
check "a 20 KB header: 400" "grep -qx 'big HTTP/1.1 400 Bad Request' '$TMP/bad_req.out'"
check "20 idle connections: the 4 past 16 closed at once" "grep -qx 'idle_closed 4' '$TMP/bad_req.out'"
check "then a scrape is served again" "grep -qx 'after HTTP/1.1 200 OK' '$TMP/bad_req.out'"
kill $h1 $h2 2> /dev/null
wait $h1 $h2 2> /dev/null
check "the daemons are still up" "kill -0 $DA && kill -0 $DB"
finish
