#!/usr/bin/python3
"""Oracle (b): tshark's InfiniBand dissector against what gen_frames built.

    /usr/bin/python3 check_tshark.py DIR

Reads DIR/frames.pcap and DIR/frames.jsonl (see README.md for the format).

Pass 1 (fields), one tshark run over the whole file:
    tshark -r DIR/frames.pcap -d udp.port==4791,infiniband
           --disable-protocol rpcordma -o udp.ignore_ipv6_zero_checksum:TRUE
           --disable-heuristic eth_over_ib --disable-heuristic mellanox_eoib ...
           -T fields -E separator=/t -E occurrence=f -e frame.number -e ...
Every frame must be dissected as eth[:vlan]:ip|ipv6:udp:infiniband, and every
field tshark dissects is compared with the jsonl line of that frame: VLAN TCI,
DSCP, ECN, UDP source port, all BTH fields (FECN/BECN come from the BTH
reserved byte, `infiniband.reserved`), every extension header, the payload
length (from tshark's udp.length and the IBTA header lengths in
ib_opcodes.py) and the ICRC (tshark shows the wire bytes big-endian).

Pass 2 (errors), same decode options:
    tshark ... -Y "_ws.malformed || _ws.expert.severity >= 6291456"
           -T fields -E occurrence=a -e frame.number -e _ws.malformed
           -e _ws.expert.severity -e _ws.expert.message
A frame with _ws.malformed or an expert item of severity Error (8388608,
0x00800000) fails; Warnings (6291456) are only listed.

`-o udp.ignore_ipv6_zero_checksum:TRUE`: RoCEv2 sends UDP checksum 0 (IBTA
Annex A17, and RFC 6935/6936's tunnel exemption for IPv6); without this preference tshark
reports every IPv6 RoCEv2 frame as an Error "Illegal checksum value (0)".

`--disable-heuristic ...` (PAYLOAD_HEURISTICS in oracle_common.py): tshark's guesses at
upper-layer protocols inside the random payloads are off; they otherwise hide
the ICRC field or flag the guessed protocol as malformed.

tshark 4.0 only dissects the BTH of opcodes it does not know (it shows the
rest as "Unknown/Vendor Specific Data", `infiniband.vendor`): for those
frames the BTH fields are still compared, the extension headers, payload
length and ICRC are not, and the script prints which opcodes were affected.
XRC is one of them: tshark names its opcodes but dissects nothing after the
BTH, so an XRC request's XRCETH (the first four bytes after the BTH, IBTA
9.3.5.5) is read from those bytes and compared.

Exit status is non-zero on any failure. The last line is "N passed, M failed".
"""

import collections
import json
import os
import re
import sys

sys.dont_write_bytecode = True  # do not leave __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ib_opcodes as ib  # noqa: E402
import oracle_common as oc  # noqa: E402
from oracle_common import EXT, EXT_KEYS, FIELDS, p_bytes, p_int  # noqa: E402

PI_WARN = 0x00600000
PI_ERROR = 0x00800000
AGG = "\x1f"  # aggregator for multi-occurrence fields in pass 2

PROTO_RE = re.compile(r"^eth:ethertype:(?:vlan:ethertype:)*(ip|ipv6):udp:infiniband(?::|$)")


def check_errors(t, pcap, nframes):
    out = oc.run_tshark(["-r", pcap] + oc.DECODE_ARGS + [
        "-Y", "_ws.malformed || _ws.expert.severity >= %d" % PI_WARN,
        "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=" + AGG,
        "-e", "frame.number", "-e", "_ws.malformed", "-e", "_ws.expert.severity", "-e", "_ws.expert.message"])
    errors = {}
    warnings = collections.Counter()
    for line in out.splitlines():
        if not line.strip():
            continue
        cols = line.split("\t")
        cols += [""] * (4 - len(cols))
        num = int(cols[0])
        sev = [int(x) for x in cols[2].split(AGG) if x]
        msgs = [x for x in cols[3].split(AGG)]
        malformed = cols[1] != ""
        err_msgs = [m for s, m in zip(sev, msgs) if s >= PI_ERROR]
        if malformed or err_msgs:
            errors[num] = "; ".join(err_msgs) or "malformed"
        for s, m in zip(sev, msgs):
            if PI_WARN <= s < PI_ERROR:
                warnings[m] += 1
    for num in range(1, nframes + 1):
        t.ok(num not in errors, lambda: "frame %d (i=%d): tshark reports malformed/expert error: %s"
             % (num, num - 1, errors[num]))
    extra = [n for n in errors if n > nframes]
    t.ok(not extra, lambda: "tshark reports errors on frames beyond the jsonl: %s" % extra[:10])
    for m, c in warnings.most_common(10):
        print("NOTE: tshark expert warning on %d frame(s): %s" % (c, m))


def main(argv, t):
    d = argv[1]
    pcap = os.path.join(d, "frames.pcap")
    jsonl = os.path.join(d, "frames.jsonl")
    with open(jsonl) as f:
        specs = [json.loads(line) for line in f if line.strip()]
    version = oc.tshark_version()
    print("using %s" % version)

    rows = oc.tshark_fields(pcap)
    t.ok(len(rows) == len(specs), "tshark sees %d frames in %s, %s has %d lines"
         % (len(rows), pcap, jsonl, len(specs)))

    not_dissected = collections.Counter()   # opcode -> frames whose ext headers tshark left undissected
    vendor = collections.Counter()          # manufacturer-specific opcode -> frames (BTH compared only)
    compared = collections.Counter()        # field -> comparisons made
    for row in rows:
        if len(row) != len(FIELDS):
            t.ok(False, "tshark printed %d columns, expected %d: %r" % (len(row), len(FIELDS), row[:3]))
            continue
        v = dict(zip(FIELDS, row))
        num = int(v["frame.number"])
        i = num - 1
        where = "frame %d (i=%d)" % (num, i)
        if i >= len(specs):
            t.ok(False, "%s: no jsonl line" % where)
            continue
        s = specs[i]
        t.ok(s.get("i") == i, "%s: jsonl line has i=%r" % (where, s.get("i")))

        def cmp(key, tval, field):
            compared[key] += 1
            t.ok(s.get(key) == tval, lambda: "%s opcode %s: %s: jsonl %r, tshark %s %r"
                 % (where, opname, key, s.get(key), field, tval))

        opname = "0x%02x" % s["opcode"] if isinstance(s.get("opcode"), int) else repr(s.get("opcode"))
        m = PROTO_RE.match(v["frame.protocols"])
        if not t.ok(m is not None, "%s: tshark did not dissect InfiniBand over UDP (protocols %s)"
                    % (where, v["frame.protocols"])):
            continue
        cmp("ipver", 4 if m.group(1) == "ip" else 6, "frame.protocols")
        if v["vlan.id"]:
            tci = (p_int(v["vlan.priority"]) << 13) | (p_int(v["vlan.dei"]) << 12) | p_int(v["vlan.id"])
        else:
            tci = -1
        cmp("vlan", tci, "vlan.priority/dei/id")
        if m.group(1) == "ip":
            cmp("dscp", p_int(v["ip.dsfield.dscp"]), "ip.dsfield.dscp")
            cmp("ecn", p_int(v["ip.dsfield.ecn"]), "ip.dsfield.ecn")
        else:
            cmp("dscp", p_int(v["ipv6.tclass.dscp"]), "ipv6.tclass.dscp")
            cmp("ecn", p_int(v["ipv6.tclass.ecn"]), "ipv6.tclass.ecn")
        cmp("sport", p_int(v["udp.srcport"]), "udp.srcport")
        compared["dport"] += 1
        t.ok(p_int(v["udp.dstport"]) == 4791, "%s: udp.dstport %s" % (where, v["udp.dstport"]))

        # BTH
        opcode = p_int(v["infiniband.bth.opcode"])
        cmp("opcode", opcode, "infiniband.bth.opcode")
        cmp("se", p_int(v["infiniband.bth.se"]), "infiniband.bth.se")
        cmp("migreq", p_int(v["infiniband.bth.m"]), "infiniband.bth.m")
        cmp("padcnt", p_int(v["infiniband.bth.padcnt"]), "infiniband.bth.padcnt")
        compared["tver"] += 1
        t.ok(p_int(v["infiniband.bth.tver"]) == 0, "%s: BTH TVer %s, expected 0" % (where, v["infiniband.bth.tver"]))
        cmp("pkey", p_int(v["infiniband.bth.p_key"]), "infiniband.bth.p_key")
        b4 = p_bytes(v["infiniband.reserved"])
        cmp("fecn", None if b4 is None else b4 >> 7, "infiniband.reserved (BTH byte 4) bit 7")
        cmp("becn", None if b4 is None else (b4 >> 6) & 1, "infiniband.reserved (BTH byte 4) bit 6")
        cmp("destqp", p_int(v["infiniband.bth.destqp"]), "infiniband.bth.destqp")
        cmp("ackreq", p_int(v["infiniband.bth.a"]), "infiniband.bth.a")
        cmp("psn", p_int(v["infiniband.bth.psn"]), "infiniband.bth.psn")

        if opcode is not None and opcode >= 0xE0:
            # IBTA's manufacturer-specific range: uroce's own selective-repeat
            # opcodes. The BTH is compared above; what follows it is uroce's,
            # which no independent dissector knows.
            vendor[opcode] += 1
            continue
        op = ib.OPCODES.get(opcode)
        if not t.ok(op is not None, "%s: opcode %s is not in the IBTA opcode list" % (where, opcode)):
            continue
        opname = "0x%02x %s" % (opcode, op.name)

        # Payload length from tshark's UDP length and the IBTA header lengths.
        ulen, pad = p_int(v["udp.length"]), p_int(v["infiniband.bth.padcnt"])
        cmp("payload_len", ib.payload_len(op, ulen, pad), "udp.length - headers - pad - ICRC")

        if v["infiniband.vendor"]:
            # tshark did not dissect past the BTH. It still shows the bytes
            # after it (infiniband.vendor): where IBTA puts an XRCETH first
            # (every XRC request), its reserved byte and XRC SRQ number are
            # compared there.
            if op.has("XRCETH"):
                raw = v["infiniband.vendor"].replace(":", "")
                srqn = int(raw[2:8], 16) if len(raw) >= 8 else None
                cmp("xrc_srqn", srqn, "infiniband.vendor bytes 1-3 (XRCETH)")
                t.ok(raw[:2] == "00", "%s opcode %s: XRCETH reserved byte %r" % (where, opname, raw[:2]))
            elif "xrc_srqn" in s:
                t.ok(False, "%s opcode %s: jsonl has xrc_srqn, IBTA gives it no XRCETH" % (where, opname))
            not_dissected[opcode] += 1
            continue

        # Extension headers: every header tshark found must be in the jsonl
        # with equal values, and every header in the jsonl must be found.
        seen_keys = set()
        for presence, hname, fields in EXT:
            present = v[presence] != ""
            for key, fld, parse in fields:
                if present:
                    seen_keys.add(key)
                    cmp(key, parse(v[fld]), fld)
            compared["hdr:" + hname] += 1
            t.ok(present == op.has(hname), "%s: tshark %s %s; the IBTA list says %s"
                 % (where, "dissected" if present else "found no", hname,
                    "it has one" if op.has(hname) else "it has none"))
        for key in sorted(EXT_KEYS & set(s) - seen_keys):
            t.ok(False, "%s opcode %s: jsonl has %s but tshark dissected no header carrying it"
                 % (where, opname, key))

        # ICRC: tshark prints the four wire bytes as a big-endian number; the
        # jsonl value is the CRC whose little-endian bytes are on the wire.
        crc = p_int(v["infiniband.invariant.crc"])
        if t.ok(crc is not None, "%s opcode %s: tshark shows no Invariant CRC" % (where, opname)):
            cmp("icrc", int.from_bytes(crc.to_bytes(4, "big"), "little"), "infiniband.invariant.crc (byte-swapped)")

    check_errors(t, pcap, len(specs))

    ops_seen = collections.Counter(s.get("opcode") for s in specs)
    print("%s: %d frames, %d opcodes; fields compared: %s" % (
        pcap, len(specs), len(ops_seen), ", ".join("%s=%d" % kv for kv in sorted(compared.items()))))
    oc.print_skipped(version, not_dissected)
    for code in sorted(vendor):
        print("BTH ONLY: opcode 0x%02x is manufacturer-specific (uroce's selective repeat), %d frame(s): "
              "BTH fields compared; what follows the BTH is uroce's own" % (code, vendor[code]))
    t.ok(len(specs) > 0, "%s is empty" % jsonl)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: /usr/bin/python3 check_tshark.py DIR")
        sys.exit(2)
    oc.run(main, sys.argv)
