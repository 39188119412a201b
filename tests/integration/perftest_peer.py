#!/usr/bin/python3
"""A scripted peer that speaks perftest's and ibv_rc_pingpong's out-of-band
TCP exchange exactly as the real tools do (perftest 6.06 in Debian 12,
rdma-core 44's rc_pingpong), written from their documented formats, not
from uroce's code.

    perftest_peer.py proxy TEST LISTEN_PORT SERVER_PORT [--qps N] [--as-version V] [--no-done]
        Sits between a perftest client and a perftest server (both uroce-perf
        here): every message must have the size, format and position the
        real tools use for TEST; it is checked, then forwarded. The RDMA
        traffic itself goes directly between the two. --as-version rewrites
        the server's version string (e.g. 6.24) and --no-done swallows the
        server's closing "done" (perftest 6.24 sends none), to show the
        client copes with the newer perftest.
    perftest_peer.py old-server PORT VERSION
        A perftest server that claims VERSION (e.g. 5.60): the client must refuse.
    perftest_peer.py pingpong-proxy LISTEN_PORT SERVER_PORT
        The same for ibv_rc_pingpong's 52-byte exchange and its "done".

Prints one line per message and "N passed, M failed"; exit 0 only if every
message was right and both sides closed cleanly.
"""
import re
import socket
import struct
import sys

PASS = 0
FAIL = 0


def ok(cond, what):
    global PASS, FAIL
    if cond:
        PASS += 1
    else:
        FAIL += 1
        print("FAIL:", what)
    return cond


def recv_exact(s, n, what):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise EOFError("%s: peer closed after %d of %d bytes" % (what, len(b), n))
        b += chunk
    return b


# perftest's key message with a GID (KEY_PRINT_FMT_GID), 107 characters and a NUL.
KEY_RE = re.compile(rb"^[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{8}:[0-9a-f]{16}:"
                    rb"(?:[0-9a-f]{2}:){16}[0-9a-f]{8}:\x00$")


def check_msg(kind, b, side, keys):
    if kind == "VER":
        v = b.split(b"\0")[0]
        ok(len(b) == 16 and re.match(rb"^\d+\.\d+$", v) and b[len(v):] == b"\0" * (16 - len(v)),
           "%s version: 16 bytes, digits and NUL padding: %r" % (side, b))
        return
    if kind == "SYS":
        (v,) = struct.unpack(">i", b)
        ok(v in (32, 64, 128, 256, 4096, 8192, 16384, 65536), "%s sys data %d: a page or line size" % (side, v))
        return
    if kind == "MTU":
        ok(len(b) == 2 and b[1:] == b"\0" and b[:1] in (b"1", b"2", b"3", b"4", b"5"),
           "%s MTU: a digit 1..5 and NUL: %r" % (side, b))
        return
    if kind.startswith("K"):
        ok(KEY_RE.match(b) is not None, "%s key message in perftest's GID form: %r" % (side, b))
        f = b.split(b":")
        qpn = int(f[2], 16)
        ok(qpn >= 2, "%s key message names a QP (%#x)" % (side, qpn))
        # Every round repeats the same details for the same QP.
        idx = int(kind[1:]) if len(kind) > 1 else 0
        prev = keys[side].setdefault(idx, b)
        ok(prev == b, "%s key message for QP %d unchanged between rounds" % (side, idx))
        return
    if kind == "REP":
        ok(len(b) == 8, "%s report item is 8 bytes" % side)
        return
    if kind == "DONE":
        ok(b == b"done\0", "%s closes with 'done\\0': %r" % (side, b))


def sequence(test, qps):
    """The messages of one run, in order, as the real tools send them (1 QP
    unless qps). 'K<i>' is a key message for QP i, 'RUN' is where the RDMA
    traffic happens."""
    loop = ["K%d" % i for i in range(qps)]
    pre = ["VER", "SYS", "SYS", "MTU"]
    if test in ("write_bw", "read_bw", "atomic_bw"):
        return pre + loop + loop + ["K0", "RUN", "K0"] + ["REP"] * 5 + ["K0", "DONE"]
    if test == "send_bw":
        return pre + loop + ["K0"] + loop + ["K0", "RUN", "K0", "DONE"]
    if test == "send_lat":
        return pre + loop + ["K0"] + loop + ["K0", "RUN", "K0", "DONE"]
    if test == "write_lat":
        return pre + ["K0"] + loop + loop + ["K0", "RUN", "END"]
    if test in ("read_lat", "atomic_lat"):
        return pre + ["K0"] + loop + loop + ["K0", "RUN", "K0", "DONE"]
    raise SystemExit("unknown test " + test)


SIZES = {"VER": 16, "SYS": 4, "MTU": 2, "REP": 8, "DONE": 5}


def accept_one(port, server_port=None, timeout=30):
    """Accepts one client on 127.0.0.1:port; with server_port, also connects
    to the real server there. Returns (client, server or None)."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(1)
    ls.settimeout(60)
    cli, _ = ls.accept()
    ls.close()
    cli.settimeout(timeout)
    srv = None
    if server_port is not None:
        srv = socket.create_connection(("127.0.0.1", server_port), timeout=60)
        srv.settimeout(timeout)
    return cli, srv


def proxy(test, listen_port, server_port, qps, as_version, no_done):
    cli, srv = accept_one(listen_port, server_port, timeout=120)  # a BW server waits out the whole run
    keys = {"client": {}, "server": {}}
    n = 0
    for kind in sequence(test, qps):
        if kind == "RUN":
            print("  -- RDMA traffic --")
            continue
        if kind == "END":
            # write_lat: no closing exchange; both sides just close.
            for s, side in ((cli, "client"), (srv, "server")):
                ok(s.recv(1) == b"", "%s sends nothing after write_lat's last round" % side)
            break
        size = 108 if kind.startswith("K") else SIZES[kind]
        if kind == "DONE":
            # Both write "done\0" and nobody reads it: take each side's as it comes.
            c = recv_exact(cli, size, "client done")
            check_msg(kind, c, "client", keys)
            s = recv_exact(srv, size, "server done")
            check_msg(kind, s, "server", keys)
            if not no_done:
                srv.sendall(c)
                cli.sendall(s)
            n += 2
            continue
        # Symmetric exchange: the client writes first, the server answers.
        c = recv_exact(cli, size, "client " + kind)
        check_msg(kind, c, "client", keys)
        srv.sendall(c)
        s = recv_exact(srv, size, "server " + kind)
        check_msg(kind, s, "server", keys)
        if kind == "VER" and as_version:
            s = as_version.encode().ljust(16, b"\0")
        cli.sendall(s)
        n += 2
        print("  %-4s %3d bytes each way" % (kind, size))
    # Then both close: nothing more may come.
    for s, side in ((cli, "client"), (srv, "server")):
        s.settimeout(10)
        try:
            extra = s.recv(64)
        except ConnectionResetError:
            extra = b""
        ok(extra == b"", "%s sends nothing after the close (got %r)" % (side, extra))
    print("%d messages relayed" % n)


def old_server(port, version):
    c, _ = accept_one(port)
    v = recv_exact(c, 16, "client version")
    check_msg("VER", v, "client", {})
    c.sendall(version.encode().ljust(16, b"\0"))
    # The client must give up now: it closes without sending sys data.
    rest = b""
    try:
        rest = c.recv(16)
    except ConnectionResetError:
        pass
    ok(rest == b"", "client refused a peer at version %s (sent %r)" % (version, rest))


PP_RE = re.compile(rb"^[0-9a-f]{4}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{32}\x00$")


def pingpong_proxy(listen_port, server_port):
    cli, srv = accept_one(listen_port, server_port)
    c = recv_exact(cli, 52, "client address")
    ok(PP_RE.match(c) is not None, "client's 52-byte LID:QPN:PSN:GID: %r" % c)
    srv.sendall(c)
    s = recv_exact(srv, 52, "server address")
    ok(PP_RE.match(s) is not None, "server's 52-byte LID:QPN:PSN:GID: %r" % s)
    cli.sendall(s)
    d = recv_exact(cli, 5, "client done")
    ok(d == b"done\0", "client's 'done\\0' right after the addresses: %r" % d)
    srv.sendall(d)
    for sock, side in ((cli, "client"), (srv, "server")):
        try:
            extra = sock.recv(64)
        except ConnectionResetError:
            extra = b""
        ok(extra == b"", "%s closes with nothing more (got %r)" % (side, extra))
    print("  addresses and done relayed")


def main():
    a = sys.argv[1:]
    try:
        if a and a[0] == "proxy":
            qps = int(a[a.index("--qps") + 1]) if "--qps" in a else 1
            ver = a[a.index("--as-version") + 1] if "--as-version" in a else None
            proxy(a[1], int(a[2]), int(a[3]), qps, ver, "--no-done" in a)
        elif a and a[0] == "old-server":
            old_server(int(a[1]), a[2])
        elif a and a[0] == "pingpong-proxy":
            pingpong_proxy(int(a[1]), int(a[2]))
        else:
            print(__doc__)
            return 2
    except (EOFError, socket.timeout, OSError) as e:
        ok(False, "exchange broke off: %s" % e)
    print("%d passed, %d failed" % (PASS, FAIL))
    return 0 if FAIL == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
