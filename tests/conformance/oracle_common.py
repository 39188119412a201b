"""What the conformance oracles share: the pass/fail tally and verdict, and
how tshark is run and read.

Imported by check_icrc.py, check_tshark.py and check_captures.py, which put
their own directory on sys.path first (they are run from any directory):

    sys.dont_write_bytecode = True
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import oracle_common as oc
"""

import os
import re
import subprocess
import sys
import traceback

import ib_opcodes as ib

MAX_PRINTED = 20


class Tally:
    """Counts checks; prints the first MAX_PRINTED mismatches. A message may
    be a callable, evaluated only when it is printed."""

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


def run(main, args):
    """Runs main(args, tally), prints "N passed, M failed" and exits: status
    0 only if nothing failed and something passed."""
    tally = Tally()
    try:
        main(args, tally)
    except Exception as e:  # an unreadable input is a failure, not a crash without a verdict
        traceback.print_exc()
        tally.ok(False, "aborted: %s: %s" % (type(e).__name__, e))
    print("%d passed, %d failed" % (tally.passed, tally.failed))
    sys.exit(0 if tally.failed == 0 and tally.passed > 0 else 1)


# --- tshark

TSHARK = os.environ.get("TSHARK", "tshark")
# Heuristic dissectors that tshark 4.0 runs on InfiniBand payloads. They guess
# at upper-layer protocols in what is random data here (a 1-byte UD payload
# becomes "Ethernet over IB", EoIB...), then tshark stops showing the ICRC or
# reports the guessed protocol as malformed. The IB headers do not depend on
# them, so they are all off.
PAYLOAD_HEURISTICS = ["eth_over_ib", "mellanox_eoib", "iser_infiniband", "nvme_rdma", "smb_direct_infiniband",
                      "smcr_infiniband", "lnet_ib", "sdp_infiniband", "fc_infiniband"]
# The decode options of every tshark run (see check_tshark.py's docstring):
# RoCEv2 on UDP 4791 as InfiniBand, RPC-over-RDMA off, UDP checksum 0 accepted
# on IPv6 (RoCEv2 sends 0, IBTA Annex A17 / RFC 6935), payload heuristics off.
DECODE_ARGS = ["-d", "udp.port==4791,infiniband", "--disable-protocol", "rpcordma",
               "-o", "udp.ignore_ipv6_zero_checksum:TRUE"]
for _h in PAYLOAD_HEURISTICS:
    DECODE_ARGS += ["--disable-heuristic", _h]
del _h

# The fields both tshark oracles read (by name, so a field one of them does
# not use only adds a column).
FIELDS = [
    "frame.number", "frame.protocols",
    "ip.src", "ip.dst", "ipv6.src", "ipv6.dst",
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


def run_tshark(args):
    cmd = [TSHARK] + args
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = "\n".join(l for l in r.stderr.splitlines() if "Running as user" not in l)
    if r.returncode != 0:
        raise RuntimeError("tshark failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), err))
    return r.stdout


def tshark_fields(pcap, decode_args=DECODE_ARGS, fields=FIELDS):
    """One row (a list of column strings, first occurrence of each field) per
    frame of `tshark -r PCAP DECODE_ARGS -T fields -e FIELD...`."""
    args = ["-r", pcap] + decode_args + ["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]
    for fld in fields:
        args += ["-e", fld]
    return [line.split("\t") for line in run_tshark(args).splitlines() if line.strip()]


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


def print_skipped(version, skipped):
    """The opcodes (Counter opcode -> frames) whose headers after the BTH
    tshark left undissected."""
    for opc, n in sorted(skipped.items()):
        print("SKIPPED: %s does not dissect the headers after the BTH of opcode 0x%02x (%s), %d frame(s): "
              "BTH fields and payload_len compared; extension headers and ICRC not compared"
              % (version, opc, ib.op_name(opc), n))
