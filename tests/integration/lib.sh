# Shared helpers for the integration tests: network namespaces joined by a
# veth pair, daemons started and stopped, results counted. Sourced, not run.
set -u
UROCED=${UROCED:?path to uroced}
UROCE_PCAP=${UROCE_PCAP:-}
PASS=0
FAIL=0
TMP=$(mktemp -d /tmp/uroce-it.XXXXXX)
NS_A=uroce-a-$$
NS_B=uroce-b-$$
PIDS=""

ok() { PASS=$((PASS+1)); echo "ok: $*"; }
bad() { FAIL=$((FAIL+1)); echo "FAIL: $*"; }
# shown FILE...: a program's errors (perftest writes them at once, ahead
# of its buffered report, so a tail alone misses them), then its last lines.
shown() { local f; for f in "$@"; do echo "==> $f"; grep -iE 'error|fail|couldn|unable|scnt=' "$f"; grep -v '^ *-*$' "$f" | tail -n 4; done; }
check() { if eval "$2"; then ok "$1"; else bad "$1 ($2)"; fi; }
# skip REASON: this script cannot run here (exit 77, which meson counts as
# skipped and tools/setup.sh checks against its allow-list). A script that
# has already failed a check exits 1 instead: a skip never hides a failure.
skip() {
  if [ "$FAIL" -gt 0 ]; then
    echo "FAIL: cannot go on ($*), after $FAIL failed check(s)"
    echo "$PASS passed, $FAIL failed"
    exit 1
  fi
  echo "SKIP: $*"; exit 77
}
# debian_unmodified PKG...: the packages are installed and every file of
# theirs (configuration files included) is as Debian shipped it.
debian_unmodified() {
  dpkg -V "$@" > "$TMP/dpkg-v.out" 2>&1
  local rc=$?
  sed 's/^/  /' "$TMP/dpkg-v.out"
  check "dpkg -V $*: all installed, no file differs from Debian's" "[ $rc -eq 0 ] && [ ! -s '$TMP/dpkg-v.out' ]"
}
# need_prog PROG PACKAGE: a program that tools/setup.sh installs must be
# there; its absence is a broken setup, a failure, never a skip.
need_prog() { command -v "$1" > /dev/null || { bad "$1 is not installed (package $2, which tools/setup.sh installs)"; finish; exit 1; }; }

need_root() {
  if [ "$(id -u)" -ne 0 ] || ! ip netns add uroce-probe-$$ 2>/dev/null; then
    skip "needs root and network namespaces"
  fi
  ip netns del uroce-probe-$$
}

cleanup() {
  for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  # A daemon that crashed left its backtrace in its .err file: show it.
  for f in "$TMP"/*.err; do
    [ -f "$f" ] && grep -q "fatal signal" "$f" && { echo "== $(basename "$f"):"; grep -A40 "fatal signal" "$f"; }
  done
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  ip netns del "$NS_S" 2>/dev/null
  if [ -n "${UROCE_KEEP_TMP:-}" ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

# Hosts A and B, each with veth0, joined through a bridge in a third
# "switch" namespace where loss is injected (AF_PACKET sees frames before a
# host's own netdev ingress hook, so drops must happen on the way). Kernel
# addresses 10.90.1.1/2 carry the TCP exchange; MTU 9000 fits 4 KiB RoCE frames.
NS_S=uroce-s-$$
make_link() {
  ip netns add "$NS_A"; ip netns add "$NS_B"; ip netns add "$NS_S"
  ip -n "$NS_S" link add br0 type bridge
  ip -n "$NS_S" link set br0 mtu 9000 up
  for h in a b; do
    ns=$NS_A; [ $h = b ] && ns=$NS_B
    ip link add u$h-$$ type veth peer name s$h-$$
    ip link set u$h-$$ netns "$ns"; ip link set s$h-$$ netns "$NS_S"
    ip -n "$ns" link set u$h-$$ name veth0 mtu 9000 up
    ip -n "$NS_S" link set s$h-$$ name p$h mtu 9000 master br0 up
    ip -n "$ns" link set lo up
  done
  ip -n "$NS_A" addr add 10.90.1.1/24 dev veth0
  ip -n "$NS_B" addr add 10.90.1.2/24 dev veth0
}

# drop_roce PERCENT: drop that share of RoCEv2 frames crossing the switch.
drop_roce() {
  ip netns exec "$NS_S" nft -f - <<NFT
table bridge uroce_loss {
  chain forward {
    type filter hook forward priority 0; policy accept;
    udp dport 4791 numgen random mod 100 < $1 counter drop
  }
}
NFT
}
dropped_by_nft() { ip netns exec "$NS_S" nft list table bridge uroce_loss 2>/dev/null | sed -n 's/.*counter packets \([0-9]*\).*/\1/p' | head -1; }
no_loss() { ip netns exec "$NS_S" nft delete table bridge uroce_loss 2>/dev/null; true; }

# start_daemon NS NAME ARGS... : runs uroced in NS ("" = here), output in
# $TMP/NAME.{out,err}; sets LAST_PID (call it directly, not in $(...)).
# start_traffic NS NAME ARGS... : the same for uroce-traffic (a node with
# verified RC traffic as its stage: --role server|client, --peer, ...).
start_daemon() { start_node "$UROCED" "$@"; }
start_traffic() { start_node "${UROCE_TRAFFIC:?path to uroce-traffic}" "$@"; }
# Daemons here run without a host netdev (several share a namespace and
# would want the same name) unless the test names one (--host-netdev).
start_node() {
  local bin=$1 ns=$2 name=$3 host=--no-host-netdev; shift 3
  case " $* " in *" --host-netdev "*) host= ;; esac
  if [ -n "$ns" ]; then
    ip netns exec "$ns" "$bin" --no-huge --mem-mb 256 --file-prefix "$name-$$" $host "$@" > "$TMP/$name.out" 2> "$TMP/$name.err" &
  else
    "$bin" --no-huge --mem-mb 256 --file-prefix "$name-$$" $host "$@" > "$TMP/$name.out" 2> "$TMP/$name.err" &
  fi
  LAST_PID=$!
  PIDS="$PIDS $LAST_PID"
}

# ctl SOCKET LINE: one request on a daemon's control socket
ctl() { /usr/bin/python3 - "$1" "$2" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode()); data = b""
while not data.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk: break
    data += chunk
text = data.decode(errors="replace").strip()
try:  # uroced answers compact JSON; the checks read it with Python's spacing
    import json
    print(json.dumps(json.loads(text)))
except ValueError:
    print(text)
PY
}
# jget JSON PATH: a field from a status reply, e.g. jget "$st" port.rx_icrc_err
jget() { /usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1]); 
for k in sys.argv[2].split("."): d=d[k]
print(d)' "$1" "$2"; }

# bad_data FILE...: a line where a program says its data check failed.
# ibv_*_pingpong --chk prints "invalid data in page N" and still exits 0;
# rping -V prints a "mismatch".
bad_data() { grep -hiE 'invalid data|mismatch' "$@"; }
# cm_state CTL: a node's CM counts, "REJECTS_SENT ESTABLISHED".
cm_state() {
  ctl "$1" status | /usr/bin/python3 -c 'import json,sys; c=json.load(sys.stdin)["cm"]; print(c["rejects_sent"], c["established"])'
}

finish() {
  echo "$PASS passed, $FAIL failed"
  [ "$FAIL" -eq 0 ] && [ "$PASS" -gt 0 ]
}
