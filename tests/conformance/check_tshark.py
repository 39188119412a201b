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

`--disable-heuristic ...` (PAYLOAD_HEURISTICS below): tshark's guesses at
upper-layer protocols inside the random payloads are off; they otherwise hide
the ICRC field or flag the guessed protocol as malformed.

tshark 4.0 only dissects the BTH of opcodes it does not know (it shows the
rest as "Unknown/Vendor Specific Data", `infiniband.vendor`): for those
frames the BTH fields are still compared, the extension headers, payload
length and ICRC are not, and the script prints which opcodes were affected.

Exit status is non-zero on any failure. The last line is "N passed, M failed".
"""

import collections
import json
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # do not leave __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ib_opcodes as ib  # noqa: E402

MAX_PRINTED = 20
TSHARK = os.environ.get("TSHARK", "tshark")
# Heuristic dissectors that tshark 4.0 runs on InfiniBand payloads. They guess
# at upper-layer protocols in what is random data here (a 1-byte UD payload
# becomes "Ethernet over IB", EoIB...), then tshark stops showing the ICRC or
# reports the guessed protocol as malformed. The IB headers do not depend on
# them, so they are all off.
PAYLOAD_HEURISTICS = ["eth_over_ib", "mellanox_eoib", "iser_infiniband", "nvme_rdma", "smb_direct_infiniband",
                      "smcr_infiniband", "lnet_ib", "sdp_infiniband", "fc_infiniband"]
DECODE_ARGS = ["-d", "udp.port==4791,infiniband", "--disable-protocol", "rpcordma",
               "-o", "udp.ignore_ipv6_zero_checksum:TRUE"]
for _h in PAYLOAD_HEURISTICS:
    DECODE_ARGS += ["--disable-heuristic", _h]
PI_WARN = 0x00600000
PI_ERROR = 0x00800000
AGG = "\x1f"  # aggregator for multi-occurrence fields in pass 2

FIELDS = [
    "frame.number", "frame.protocols",
    "vlan.priority", "vlan.dei", "vlan.id",
    "ip.dsfield.dscp", "ip.dsfield.ecn", "ipv6.tclass.dscp", "ipv6.tclass.ecn",
    "udp.srcport", "udp.dstport", "udp.length",
    "infiniband.bth.opcode", "infiniband.bth.se", "infiniband.bth.m", "infiniband.bth.padcnt",
    "infiniband.bth.tver", "infiniband.bth.p_key", "infiniband.reserved", "infiniband.bth.destqp",
    "infiniband.bth.a", "infiniband.bth.psn",
    "infiniband.deth", "infiniband.deth.q_key", "infiniband.deth.srcqp",
    "infiniband.reth", "infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen",
    "infiniband.atomiceth", "infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt",
    "infiniband.aeth", "infiniband.aeth.syndrome", "infiniband.aeth.msn",
    "infiniband.atomicacketh", "infiniband.atomicacketh.origremdt",
    "infiniband.immdt", "infiniband.ieth",
    "infiniband.vendor", "infiniband.invariant.crc",
]

PROTO_RE = re.compile(r"^eth:ethertype:(?:vlan:ethertype:)*(ip|ipv6):udp:infiniband(?::|$)")


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.printed = 0

    def ok(self, cond, msg):
        if cond:
            self.passed += 1
            return True
        self.failed += 1
        if self.printed < MAX_PRINTED:
            print("MISMATCH: " + (msg() if callable(msg) else msg))
        elif self.printed == MAX_PRINTED:
            print("... (further mismatches not printed)")
        self.printed += 1
        return False


def run_tshark(args):
    cmd = [TSHARK] + args
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = "\n".join(l for l in r.stderr.splitlines() if "Running as user" not in l)
    if r.returncode != 0:
        raise RuntimeError("tshark failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), err))
    return r.stdout


def tshark_version():
    try:
        out = subprocess.run([TSHARK, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True).stdout
        m = re.search(r"\b(\d+\.\d+\.\d+)\b", out)
        return "tshark " + m.group(1)
    except (OSError, AttributeError):
        return "tshark (version unknown)"


def p_int(s):
    """An integer as tshark prints it: decimal, or 0x-prefixed hex."""
    if s is None or s == "":
        return None
    s = s.strip()
    if s.lower().startswith("0x"):
        return int(s, 16)
    if s in ("True", "False"):
        return 1 if s == "True" else 0
    return int(s, 10)


def p_bytes(s):
    """An FT_BYTES field (hex digits, optionally ':'-separated) as a big-endian integer."""
    if s is None or s == "":
        return None
    return int(s.replace(":", "").strip(), 16)


# (jsonl key, tshark field, parser) per extension header, keyed by the
# tshark presence field. AtomicETH's VA and R_Key are dissected by tshark 4.0
# under the RETH field names (infiniband.reth.va / infiniband.reth.r_key).
EXT = [
    ("infiniband.deth", "DETH", [("deth_qkey", "infiniband.deth.q_key", p_int),
                                 ("deth_src_qp", "infiniband.deth.srcqp", p_int)]),
    ("infiniband.reth", "RETH", [("reth_va", "infiniband.reth.va", p_int),
                                 ("reth_rkey", "infiniband.reth.r_key", p_int),
                                 ("reth_len", "infiniband.reth.dmalen", p_int)]),
    ("infiniband.atomiceth", "AtomicETH", [("atomic_va", "infiniband.reth.va", p_int),
                                           ("atomic_rkey", "infiniband.reth.r_key", p_int),
                                           ("atomic_swap_add", "infiniband.atomiceth.swapdt", p_int),
                                           ("atomic_compare", "infiniband.atomiceth.cmpdt", p_int)]),
    ("infiniband.aeth", "AETH", [("aeth_syndrome", "infiniband.aeth.syndrome", p_int),
                                 ("aeth_msn", "infiniband.aeth.msn", p_int)]),
    ("infiniband.atomicacketh", "AtomicAckETH", [("atomic_ack_orig", "infiniband.atomicacketh.origremdt", p_int)]),
    ("infiniband.immdt", "ImmDt", [("imm", "infiniband.immdt", p_bytes)]),
    ("infiniband.ieth", "IETH", [("ieth_rkey", "infiniband.ieth", p_bytes)]),
]
EXT_KEYS = {"deth_qkey", "deth_src_qp", "feth", "reth_va", "reth_rkey", "reth_len", "atomic_va", "atomic_rkey",
            "atomic_swap_add", "atomic_compare", "aeth_syndrome", "aeth_msn", "atomic_ack_orig", "imm",
            "ieth_rkey"}


def check_errors(t, pcap, nframes):
    out = run_tshark(["-r", pcap] + DECODE_ARGS + [
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
    version = tshark_version()
    print("using %s" % version)

    args = ["-r", pcap] + DECODE_ARGS + ["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]
    for fld in FIELDS:
        args += ["-e", fld]
    rows = [line.split("\t") for line in run_tshark(args).splitlines() if line.strip()]
    t.ok(len(rows) == len(specs), "tshark sees %d frames in %s, %s has %d lines"
         % (len(rows), pcap, jsonl, len(specs)))

    not_dissected = collections.Counter()   # opcode -> frames whose ext headers tshark left undissected
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

        op = ib.OPCODES.get(opcode)
        if not t.ok(op is not None, "%s: opcode %s is not in the IBTA opcode list" % (where, opcode)):
            continue
        opname = "0x%02x %s" % (opcode, op.name)

        # Payload length from tshark's UDP length and the IBTA header lengths.
        ulen, pad = p_int(v["udp.length"]), p_int(v["infiniband.bth.padcnt"])
        cmp("payload_len", ib.payload_len(op, ulen, pad), "udp.length - headers - pad - ICRC")

        if v["infiniband.vendor"]:
            # tshark did not dissect past the BTH: nothing more it can tell us.
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
    for opc, n in sorted(not_dissected.items()):
        print("SKIPPED: %s does not dissect the headers after the BTH of opcode 0x%02x (%s), %d frame(s): "
              "BTH fields and payload_len compared; extension headers and ICRC not compared"
              % (version, opc, ib.op_name(opc), n))
    t.ok(len(specs) > 0, "%s is empty" % jsonl)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: /usr/bin/python3 check_tshark.py DIR")
        sys.exit(2)
    tally = Tally()
    try:
        main(sys.argv, tally)
    except Exception as e:
        import traceback
        traceback.print_exc()
        tally.ok(False, "aborted: %s: %s" % (type(e).__name__, e))
    print("%d passed, %d failed" % (tally.passed, tally.failed))
    sys.exit(0 if tally.failed == 0 and tally.passed > 0 else 1)
