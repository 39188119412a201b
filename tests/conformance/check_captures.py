#!/usr/bin/python3
"""Oracle (c): uroce-pcap against tshark on every real capture.

    /usr/bin/python3 check_captures.py [--exclude-dir NAME]... UROCE_PCAP_BINARY CAPTURES_DIR

For every *.pcap / *.pcapng under CAPTURES_DIR (recursively, except in
subdirectories named by --exclude-dir NAME; the files are read in place,
never copied):

  UROCE_PCAP_BINARY --json --strict FILE            (must exit 0)
  tshark -r FILE -d udp.port==4791,infiniband --disable-protocol rpcordma
         --disable-protocol tftp -o udp.ignore_ipv6_zero_checksum:TRUE
         --disable-heuristic eth_over_ib ... (oracle_common.DECODE_ARGS)
         -T fields -E separator=/t -E occurrence=f -e frame.number -e ...

`--disable-protocol tftp`: Huawei HiNIC uses its QPN as UDP source port (69
and 72); tshark tries the lower port first, so without this it dissects
those frames as TFTP, not InfiniBand.

Checked, per file:
  (i)   the frames tshark sees as Ethernet/[VLAN]/IP/UDP with destination
        port 4791 are exactly uroce's `frames` (same frame numbers), each with
        status "ok" and icrc_ok true; `totals` agrees with the counts;
  (ii)  for each such frame, uroce's decoded fields equal tshark's: src, dst,
        ipver, vlan, dscp, ecn, sport, opcode, se, migreq, fecn, becn,
        ackreq, pkey, destqp, psn, padcnt, payload_len (from tshark's UDP
        length and the IBTA header lengths), icrc, and the fields of every
        extension header tshark dissects (tshark 4.0 leaves the headers after
        the BTH of some opcodes undissected; those are listed, not hidden);
  (iii) the per-QP summary `qps`, recomputed here from tshark's fields with
        the IBTA opcode list in ib_opcodes.py (uroce-pcap is run without
        --mtu, so the PSN after a READ request is unknown and the next
        request is not judged), and the order of `qps`.

Exit status is non-zero on any failure. The last line is "N passed, M failed".
"""

import collections
import ipaddress
import json
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # do not leave __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ib_opcodes as ib  # noqa: E402
import oracle_common as oc  # noqa: E402
from oracle_common import EXT, EXT_KEYS, FIELDS, p_bytes, p_int  # noqa: E402

TSHARK_ARGS = oc.DECODE_ARGS + ["--disable-protocol", "tftp"]
UDP_RE = re.compile(r"^eth:ethertype:(?:vlan:ethertype:)*(ip|ipv6)(?::ipv6\.[\w.]+)*:udp(?::|$)")

QP_FIELDS = ["packets", "payload_bytes", "messages", "psn_gaps", "psn_repeats", "acks", "rnr_naks", "cnps",
             "ecn_ce"]
PSN_MASK = 0xFFFFFF


def ip_of(s):
    try:
        return ipaddress.ip_address(s)
    except (ValueError, TypeError):
        return None


class Frame:
    """One RoCEv2 frame as tshark dissected it."""

    def __init__(self, v, m):
        self.v = v
        self.num = int(v["frame.number"])
        self.ipver = 4 if m.group(1) == "ip" else 6
        pre = "ip." if self.ipver == 4 else "ipv6."
        self.src = ip_of(v[pre + "src"])
        self.dst = ip_of(v[pre + "dst"])
        if self.ipver == 4:
            self.dscp, self.ecn = p_int(v["ip.dsfield.dscp"]), p_int(v["ip.dsfield.ecn"])
        else:
            self.dscp, self.ecn = p_int(v["ipv6.tclass.dscp"]), p_int(v["ipv6.tclass.ecn"])
        if v["vlan.id"]:
            self.vlan = (p_int(v["vlan.priority"]) << 13) | (p_int(v["vlan.dei"]) << 12) | p_int(v["vlan.id"])
        else:
            self.vlan = -1
        self.sport = p_int(v["udp.srcport"])
        self.udp_len = p_int(v["udp.length"])
        self.ib = v["infiniband.bth.opcode"] != ""
        self.opcode = p_int(v["infiniband.bth.opcode"])
        self.op = ib.OPCODES.get(self.opcode) if self.ib else None
        self.psn = p_int(v["infiniband.bth.psn"])
        self.destqp = p_int(v["infiniband.bth.destqp"])
        self.padcnt = p_int(v["infiniband.bth.padcnt"])
        self.syndrome = p_int(v["infiniband.aeth.syndrome"])
        self.ext_dissected = self.ib and v["infiniband.vendor"] == ""

    def payload_len(self):
        return ib.payload_len(self.op, self.udp_len, self.padcnt)

    def fields(self):
        """(key, value, tshark field) for everything tshark decoded."""
        v = self.v
        b4 = p_bytes(v["infiniband.reserved"])
        out = [
            ("src", self.src, "ip.src/ipv6.src"), ("dst", self.dst, "ip.dst/ipv6.dst"),
            ("ipver", self.ipver, "frame.protocols"), ("vlan", self.vlan, "vlan.priority/dei/id"),
            ("dscp", self.dscp, "dsfield.dscp"), ("ecn", self.ecn, "dsfield.ecn"),
            ("sport", self.sport, "udp.srcport"),
            ("opcode", self.opcode, "infiniband.bth.opcode"),
            ("se", p_int(v["infiniband.bth.se"]), "infiniband.bth.se"),
            ("migreq", p_int(v["infiniband.bth.m"]), "infiniband.bth.m"),
            ("padcnt", self.padcnt, "infiniband.bth.padcnt"),
            ("pkey", p_int(v["infiniband.bth.p_key"]), "infiniband.bth.p_key"),
            ("fecn", None if b4 is None else b4 >> 7, "infiniband.reserved bit 7"),
            ("becn", None if b4 is None else (b4 >> 6) & 1, "infiniband.reserved bit 6"),
            ("destqp", self.destqp, "infiniband.bth.destqp"),
            ("ackreq", p_int(v["infiniband.bth.a"]), "infiniband.bth.a"),
            ("psn", self.psn, "infiniband.bth.psn"),
        ]
        if self.op is not None:
            out.append(("payload_len", self.payload_len(), "udp.length - headers - pad - ICRC"))
        return out


def summarize(frames):
    """The per-QP summary of the README contract, from tshark's fields."""
    qps = {}
    for f in frames:
        key = (f.dst, f.destqp)
        q = qps.get(key)
        if q is None:
            q = qps[key] = {k: 0 for k in QP_FIELDS}
            q["naks"] = collections.Counter()
            q["_expect"] = None
        op = f.op
        q["packets"] += 1
        q["payload_bytes"] += f.payload_len()
        if f.ecn == 3:
            q["ecn_ce"] += 1
        if op.kind == ib.CNP:
            q["cnps"] += 1
        if op.is_request:
            if op.ends_message:
                q["messages"] += 1
            exp = q["_expect"]
            if exp is not None:
                d = (f.psn - exp) & PSN_MASK
                if d != 0 and d < 0x800000:
                    q["psn_gaps"] += 1
                elif d != 0:
                    q["psn_repeats"] += 1
            # No --mtu: the number of READ response packets is unknown.
            q["_expect"] = None if op.read_request else (f.psn + 1) & PSN_MASK
        if op.has("AETH") and f.syndrome is not None:
            cls = ib.aeth_class(f.syndrome)
            if cls == ib.AETH_ACK:
                q["acks"] += 1
            elif cls == ib.AETH_RNR_NAK:
                q["rnr_naks"] += 1
            elif cls == ib.AETH_NAK:
                q["naks"][ib.NAK_CODES.get(f.syndrome & 0x1F, "reserved")] += 1
    for q in qps.values():
        del q["_expect"]
    return qps


def check_file(t, binary, path, skipped):
    before = (t.passed, t.failed)
    name = path

    # --- uroce-pcap
    r = subprocess.run([binary, "--json", "--strict", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    if not t.ok(r.returncode == 0, "%s: uroce-pcap --json --strict exited %d: %s"
                % (name, r.returncode, r.stderr.strip()[:500])):
        return
    try:
        ours = json.loads(r.stdout)
    except ValueError as e:
        t.ok(False, "%s: uroce-pcap printed invalid JSON: %s" % (name, e))
        return
    t.passed += 1

    # --- tshark
    rows = oc.tshark_fields(path, TSHARK_ARGS)
    nframes = len(rows)
    theirs = {}
    for row in rows:
        if not t.ok(len(row) == len(FIELDS), "%s: tshark printed %d columns, expected %d"
                    % (name, len(row), len(FIELDS))):
            continue
        v = dict(zip(FIELDS, row))
        m = UDP_RE.match(v["frame.protocols"])
        if m and p_int(v["udp.dstport"]) == 4791:
            theirs[int(v["frame.number"])] = Frame(v, m)

    # --- (i) the same RoCE frames
    our_frames = {}
    for fr in ours.get("frames", []):
        n = fr.get("frame")
        t.ok(n not in our_frames, "%s: frame %r listed twice by uroce-pcap" % (name, n))
        our_frames[n] = fr
    for n in sorted(set(theirs) | set(our_frames)):
        t.ok(n in theirs, lambda: "%s frame %s: uroce-pcap lists it (opcode %s) but tshark sees no UDP/4791 frame"
             % (name, n, our_frames[n].get("opcode")))
        t.ok(n in our_frames, lambda: "%s frame %d: tshark sees RoCEv2 (%s) but uroce-pcap does not list it"
             % (name, n, theirs[n].v["frame.protocols"]))
    totals = ours.get("totals", {})
    nbad_status = sum(1 for f in our_frames.values() if f.get("status") != "ok")
    nbad_icrc = sum(1 for f in our_frames.values() if f.get("icrc_ok") is not True)
    for key, want in (("frames", nframes), ("roce", len(theirs)), ("non_roce", nframes - len(theirs)),
                      ("malformed", nbad_status), ("bad_icrc", nbad_icrc)):
        t.ok(totals.get(key) == want, "%s: totals.%s is %r, expected %d" % (name, key, totals.get(key), want))

    # --- (ii) per-frame fields
    good = []
    for n in sorted(theirs):
        tf = theirs[n]
        where = "%s frame %d" % (name, n)
        if not t.ok(tf.ib, "%s: tshark did not dissect InfiniBand on this UDP/4791 frame (protocols %s)"
                    % (where, tf.v["frame.protocols"])):
            continue
        if not t.ok(tf.op is not None, "%s: opcode %s is not in the IBTA opcode list" % (where, tf.opcode)):
            continue
        of = our_frames.get(n)
        if of is None:
            continue
        opname = "0x%02x %s" % (tf.opcode, tf.op.name)
        st_ok = t.ok(of.get("status") == "ok", "%s (%s): uroce-pcap status %r" % (where, opname, of.get("status")))
        icrc_ok = t.ok(of.get("icrc_ok") is True, "%s (%s): uroce-pcap icrc_ok %r" % (where, opname,
                                                                                     of.get("icrc_ok")))
        if st_ok and icrc_ok:
            good.append(tf)
        if not st_ok:
            continue

        def cmp(key, val, fld):
            got = of.get(key)
            if key in ("src", "dst"):
                got = ip_of(got)
            t.ok(got == val, lambda: "%s (%s): %s: uroce-pcap %r, tshark %s %r" % (where, opname, key,
                                                                                 of.get(key), fld, val))

        for key, val, fld in tf.fields():
            cmp(key, val, fld)
        v = tf.v
        if not tf.ext_dissected:
            skipped[tf.opcode] += 1
            continue
        seen = set()
        for presence, hname, flds in EXT:
            present = v[presence] != ""
            if present:
                for key, fld, parse in flds:
                    seen.add(key)
                    cmp(key, parse(v[fld]), fld)
            t.ok(present == tf.op.has(hname), "%s (%s): tshark %s %s; the IBTA list says %s"
                 % (where, opname, "dissected" if present else "found no", hname,
                    "it has one" if tf.op.has(hname) else "it has none"))
        for key in sorted((EXT_KEYS & set(of)) - seen):
            t.ok(False, "%s (%s): uroce-pcap reports %s but tshark dissected no header carrying it"
                 % (where, opname, key))
        crc = p_int(v["infiniband.invariant.crc"])
        if t.ok(crc is not None, "%s (%s): tshark shows no Invariant CRC" % (where, opname)):
            cmp("icrc", int.from_bytes(crc.to_bytes(4, "big"), "little"), "infiniband.invariant.crc (byte-swapped)")

    # --- (iii) per-QP summary
    want = summarize(good)
    got = {}
    keys_in_order = []
    for q in ours.get("qps", []):
        k = (ip_of(q.get("dst")), q.get("destqp"))
        t.ok(k not in got, "%s: qps lists %s QP %r twice" % (name, q.get("dst"), q.get("destqp")))
        got[k] = q
        keys_in_order.append(k)

    def fmt(k):
        return "%s QP 0x%06x" % (k[0], k[1]) if isinstance(k[1], int) else "%s QP %r" % k

    for k in sorted(set(want) | set(got), key=lambda k: (k[0].version if k[0] else 0, int(k[0]) if k[0] else 0,
                                                        k[1] if isinstance(k[1], int) else -1)):
        if not t.ok(k in got, "%s: %s: in tshark's frames (%d packets) but not in uroce-pcap's qps"
                    % (name, fmt(k), want[k]["packets"] if k in want else 0)):
            continue
        if not t.ok(k in want, "%s: %s: in uroce-pcap's qps but tshark has no good frame for it" % (name, fmt(k))):
            continue
        w, g = want[k], got[k]
        for fld in QP_FIELDS:
            t.ok(g.get(fld) == w[fld], "%s: %s: %s: uroce-pcap %r, computed from tshark %d"
                 % (name, fmt(k), fld, g.get(fld), w[fld]))
        gn = g.get("naks")
        if not t.ok(isinstance(gn, dict), "%s: %s: naks is %r, not an object" % (name, fmt(k), gn)):
            continue
        for code in sorted(set(ib.NAK_CODES.values()) | set(gn) | set(w["naks"])):
            t.ok(gn.get(code, 0) == w["naks"].get(code, 0), "%s: %s: naks.%s: uroce-pcap %r, computed from tshark %d"
                 % (name, fmt(k), code, gn.get(code), w["naks"].get(code, 0)))
    order_key = [(k[0].version, int(k[0]), k[1]) if k[0] is not None and isinstance(k[1], int) else None
                 for k in keys_in_order]
    t.ok(None not in order_key and order_key == sorted(order_key),
         "%s: qps is not sorted by (destination IP, DestQP): %s" % (name, [fmt(k) for k in keys_in_order][:8]))

    dp, df = t.passed - before[0], t.failed - before[1]
    print("%s: %d frames, RoCEv2 %d (tshark) / %d (uroce-pcap), %d QPs: %d passed, %d failed"
          % (name, nframes, len(theirs), len(our_frames), len(want), dp, df))


def main(args, t):
    binary, root = args.binary, args.captures_dir
    if not t.ok(os.access(binary, os.X_OK), "%s is not an executable" % binary):
        return
    files = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in args.exclude_dir]
        for n in names:
            if n.endswith(".pcap") or n.endswith(".pcapng"):
                files.append(os.path.join(dirpath, n))
    files.sort()
    print("using %s; %d capture files under %s" % (oc.tshark_version(), len(files), root))
    if not t.ok(files, "no *.pcap / *.pcapng under %s" % root):
        return
    skipped = collections.Counter()
    for path in files:
        try:
            check_file(t, binary, path, skipped)
        except Exception as e:  # one unreadable file must not hide the others
            import traceback
            traceback.print_exc()
            t.ok(False, "%s: aborted: %s: %s" % (path, type(e).__name__, e))
    oc.print_skipped(oc.tshark_version(), skipped)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="uroce-pcap against tshark on real captures")
    ap.add_argument("binary", metavar="UROCE_PCAP_BINARY")
    ap.add_argument("captures_dir", metavar="CAPTURES_DIR")
    ap.add_argument("--exclude-dir", action="append", default=[], metavar="NAME",
                    help="do not descend into subdirectories with this name (e.g. 'bad' for pcap-fixtures)")
    parsed = ap.parse_args()
    oc.run(main, parsed)
