#!/bin/bash
# The Debian package, as an operator gets it: built from a clean copy of the
# tree with Debian's own tools (tools/build-deb.sh: dpkg-buildpackage and
# debhelper), installed on this machine with dpkg, checked for what it puts
# where, the demo run from the installed files only (uroce-demo: the
# installed uroced and programs, no build tree), an unmodified verbs program
# run through the installed uroce-run, and then purged, leaving nothing.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
need_prog dpkg-buildpackage dpkg-dev
need_prog dh debhelper
need_prog help2man help2man
need_prog ibv_devices ibverbs-utils
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIBDIR=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)
unset LD_LIBRARY_PATH

# A package left by an earlier run that failed midway goes first; and
# whatever happens here, this run's goes at the end.
purge() { dpkg --purge uroce > "$TMP/purge.out" 2>&1; }
if dpkg-query -W -f='${Status}' uroce 2>/dev/null | grep -q installed; then
  echo "  (uroce was installed already: purged first)"
  purge
fi
# The system account a purge leaves (as Debian leaves them) goes too, so
# that this run sees the package make it.
userdel uroce 2> /dev/null
trap 'purge; cleanup' EXIT

echo "== tools/build-deb.sh"
"$ROOT/tools/build-deb.sh" "$TMP/deb" > "$TMP/build.out" 2>&1; rc=$?
deb=$(ls "$TMP"/deb/uroce_*.deb 2>/dev/null | head -1)
sed 's/^/  /' "$TMP/build.out" | tail -4
check "tools/build-deb.sh built uroce's .deb with dpkg-buildpackage" "[ $rc -eq 0 ] && [ -n '$deb' ]"
[ -n "$deb" ] || { finish; exit 1; }

echo "== what it carries"
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' > "$TMP/files"
dpkg-deb -I "$deb" conffiles > "$TMP/conffiles" 2>&1
has() { grep -qx "$1" "$TMP/files"; }
for f in /usr/sbin/uroced /usr/bin/uroce-ctl /usr/bin/uroce-run /usr/bin/uroce-demo /usr/bin/uroce-perf \
         /usr/bin/uroce-pingpong /usr/bin/uroce-rping /usr/bin/uroce-pcap "$LIBDIR/liburoce.so" \
         "$LIBDIR/pkgconfig/liburoce.pc" /usr/include/uroce/uroce_verbs.h "$LIBDIR/uroce/libibverbs.so.1" \
         "$LIBDIR/uroce/librdmacm.so.1" /etc/uroce/uroced.conf /usr/lib/systemd/system/uroced.service \
         /usr/lib/systemd/system/uroced@.service /usr/share/man/man8/uroced.8.gz /usr/share/man/man1/uroce-ctl.1.gz \
         /usr/share/man/man1/uroce-run.1.gz /usr/share/uroce/grafana/uroce-dashboard.json; do
  has "$f" || { echo "  missing: $f"; missing=1; }
done
# The guides, uncompressed: the units' Documentation= names deploy.md.
for f in deploy.md verbs.md README.md; do
  has "/usr/share/doc/uroce/$f" || { echo "  missing: /usr/share/doc/uroce/$f"; missing=1; }
done
check "the package has the daemon in sbin, the programs in bin, liburoce with its header and .pc, the drop-ins in $LIBDIR/uroce, the config, both units, man pages, the Grafana dashboard and the guides" \
  "[ -z '${missing:-}' ]"
check "the drop-in libibverbs and librdmacm never go over the system's (nothing of uroce's named lib{ibverbs,rdmacm} outside $LIBDIR/uroce)" \
  "! grep -E '/lib(ibverbs|rdmacm)\\.so' '$TMP/files' | grep -qv '^$LIBDIR/uroce/'"
check "no test program is packaged" "! grep -qE '/(verbs_rules|verbs_loopback|app_pair|unit_[a-z]*)\$' '$TMP/files'"
check "/etc/uroce/uroced.conf is a conffile" "grep -qx /etc/uroce/uroced.conf '$TMP/conffiles'"

echo "== dpkg -i"
dpkg -i "$deb" > "$TMP/install.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/install.out" | tail -3
check "dpkg -i installs it (its dependencies are there) and dpkg -V finds every file as shipped" \
  "[ $rc -eq 0 ] && dpkg-query -W -f='\${Status}' uroce | grep -q 'install ok installed' && dpkg -V uroce"
dpkg -L uroce > "$TMP/installed"
check "the unit is installed but neither enabled nor started (no port is configured yet)" \
  "[ -f /usr/lib/systemd/system/uroced.service ] && [ ! -e /etc/systemd/system/multi-user.target.wants/uroced.service ] && ! pgrep -x uroced > /dev/null"
(cd /usr/lib/systemd/system && SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no ./uroced.service) > "$TMP/verify.out" 2>&1; vrc=$?
sed 's/^/  /' "$TMP/verify.out" | head -5
check "systemd-analyze verify passes on the installed unit (its ExecStart is the installed /usr/sbin/uroced)" \
  "[ $vrc -eq 0 ] && grep -q '^ExecStart=/usr/sbin/uroced --config /etc/uroce/uroced.conf' /usr/lib/systemd/system/uroced.service"
check "man uroced and man uroce-run show each program's options" \
  "zcat /usr/share/man/man8/uroced.8.gz | grep -q 'app\\\\-socket' && zcat /usr/share/man/man1/uroce-run.1.gz | grep -q 'run\\\\-dir'"
check "the installed uroced --check reads the default config (which names no port yet) and says so" \
  "! /usr/sbin/uroced --check --config /etc/uroce/uroced.conf > '$TMP/check.out' 2>&1 && grep -qi 'port' '$TMP/check.out'"
cat > "$TMP/app.c" <<'C'
#include <uroce/uroce_verbs.h>
#include <stdio.h>
int main(void) {
  int n = 0;
  struct uroce_device** d = uroce_get_device_list(&n);
  uroce_free_device_list(d);
  printf("devices: %d\n", n);
  return 0;
}
C
cc -o "$TMP/app" "$TMP/app.c" $(pkg-config --cflags --libs liburoce) > "$TMP/cc.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/cc.out" | head -3
check "a C program builds against the installed liburoce with pkg-config, and runs" \
  "[ $rc -eq 0 ] && UROCE_RUN_DIR=$TMP '$TMP/app' | grep -q '^devices: 0'"

echo "== uroce-demo (the installed files only)"
(cd "$TMP" && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$TMP" /usr/bin/uroce-demo installed 2000 4096) > "$TMP/demo.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/demo.out" | tail -6
check "uroce-demo ran two installed daemons and every program, every byte checked" "[ $rc -eq 0 ] && tail -1 '$TMP/demo.out' | grep -qx 'demo OK'"

echo "== the installed uroced as its unit runs it (its User= and AmbientCapabilities=); the installed uroce-run with Debian's ibv_devinfo"
UNIT=/usr/lib/systemd/system/uroced.service
uuser=$(sed -n 's/^User=//p' "$UNIT")
ucaps=$(sed -n 's/^AmbientCapabilities=//p' "$UNIT" | tr ' ' '\n' | sed 's/^CAP_//' | tr 'A-Z' 'a-z' | sed 's/^/+/' | paste -sd, -)
uid=$(id -u "$uuser" 2> /dev/null)
# As the unit: its runtime directory is the user's ($XDG_RUNTIME_DIR, for DPDK's files).
check "the package made the unit's user ($uuser, uid ${uid:-none}) and its group, a system account (systemd-sysusers)" \
  "[ -n '$uuser' ] && [ '$uuser' != root ] && [ -n '$uid' ] && [ '$uid' -lt 1000 ] && getent group '$uuser' > /dev/null"
chmod 755 "$TMP"
mkdir -p "$TMP/run"
chown "$uuser:" "$TMP/run"
XDG_RUNTIME_DIR=$TMP/run setpriv --reuid="$uuser" --regid="$uuser" --init-groups --no-new-privs --bounding-set=-all,$ucaps --inh-caps=-all,$ucaps \
  --ambient-caps=$ucaps /usr/sbin/uroced --no-huge --mem-mb 256 --file-prefix "inst-$$" --no-host-netdev --port net_memif0 \
  --vdev "net_memif0,role=server,socket=$TMP/run/m.sock" --ip 10.96.0.1 --lcore 0 --app-socket "$TMP/run/uroce0.sock" \
  --ctl-socket "$TMP/run/inst.ctl" > "$TMP/inst.out" 2> "$TMP/inst.err" &
PIDS="$PIDS $!"
wait_sockets "$TMP/run/uroce0.sock"
check "it runs as $uuser" "[ \"\$(ps -o user= -p $! 2> /dev/null)\" = '$uuser' ]"
env -i PATH=/usr/bin:/bin /usr/bin/uroce-run --run-dir "$TMP/run" ibv_devinfo > "$TMP/devinfo.out" 2>&1; rc=$?
sed 's/^/  /' "$TMP/devinfo.out" | grep -E 'hca_id|transport|state' | head -4
check "the installed uroce-run finds its private libibverbs.so.1 by itself, and ibv_devinfo sees uroce0" \
  "[ $rc -eq 0 ] && grep -q 'hca_id:.*uroce0' '$TMP/devinfo.out'"
check "without uroce-run, the same ibv_devinfo sees no uroce device (the system's libibverbs is untouched)" \
  "! env -i PATH=/usr/bin:/bin UROCE_RUN_DIR='$TMP/run' ibv_devinfo 2>&1 | grep -q uroce0"
for p in $PIDS; do kill "$p" 2> /dev/null; done
wait 2> /dev/null

echo "== dpkg --purge"
purge; rc=$?
left=$(while read -r f; do [ -f "$f" ] || [ -L "$f" ] && echo "$f"; done < "$TMP/installed")
[ -z "$left" ] || echo "$left" | sed 's/^/  left: /' | head -5
check "dpkg --purge removes it: not installed, none of its files left, /etc/uroce gone" \
  "[ $rc -eq 0 ] && ! dpkg-query -W -f='\${Status}' uroce 2>/dev/null | grep -q 'ok installed' && [ -z '$left' ] && [ ! -e /etc/uroce ]"

finish
