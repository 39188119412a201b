#!/usr/bin/python3
"""Oracle (a): the ICRC of every frame written by gen_frames.

    /usr/bin/python3 check_icrc.py DIR

Reads DIR/frames.pcap and DIR/frames.jsonl (see README.md for the format).

* IPv4 frames: the reference is scapy.contrib.roce's BTH.compute_icrc (the
  ICRC scapy itself would put on the frame).
* IPv6 frames: scapy has no IPv6 ICRC, so the reference is the independent
  implementation below of the IBTA Annex A17 masking rules (zlib CRC-32 over
  8 bytes of 0xFF standing in for the LRH, the IP header with its variant
  fields set to all ones, the UDP header with checksum 0xFFFF, the BTH with
  byte 4 (FECN/BECN/resv6) set to 0xFF, and the rest of the packet up to the
  ICRC). The same masking code also handles IPv4; it is run on every IPv4
  frame and must agree with scapy, and on the ConnectX-4 Lx CNP, which shows
  the IPv6 code shares its CRC and byte-order logic with a path that is
  verified against scapy and hardware.

Checked per frame: the reference ICRC equals the frame's last four bytes, and
equals the jsonl `icrc` (the CRC value whose little-endian bytes are the
frame's last four). The scapy oracle itself is checked against a real
hardware ICRC: ../../../shared/captures/hw-cx4lx/cnp.pcap (ICRC 82 fd 00 2a).

Exit status is non-zero on any failure. The last line is "N passed, M failed".
"""

import json
import logging
import os
import struct
import sys
import zlib

sys.dont_write_bytecode = True  # do not leave __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
logging.getLogger("scapy").setLevel(logging.ERROR)

from scapy.utils import RawPcapReader  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.contrib.roce import BTH  # noqa: E402  (binds UDP dport 4791 -> BTH)

ROCE_PORT = 4791
HERE = os.path.dirname(os.path.abspath(__file__))
HW_CNP = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "captures", "hw-cx4lx", "cnp.pcap"))
HW_CNP_ICRC = bytes.fromhex("82fd002a")


def l3_offset(frame):
    """Offset of the IP header and the IP version, after Ethernet and any
    802.1Q/802.1ad tags; (None, None) if the frame is not IP."""
    if len(frame) < 14:
        return None, None
    off = 12
    etype = struct.unpack_from("!H", frame, off)[0]
    off += 2
    while etype in (0x8100, 0x88A8, 0x9100):
        if len(frame) < off + 4:
            return None, None
        etype = struct.unpack_from("!H", frame, off + 2)[0]
        off += 4
    if etype == 0x0800:
        return off, 4
    if etype == 0x86DD:
        return off, 6
    return None, None


def ip_datagram(frame):
    """(version, datagram bytes cut to the IP-declared length, error)."""
    off, ver = l3_offset(frame)
    if off is None:
        return None, None, "not an IPv4/IPv6 Ethernet frame"
    if ver == 4:
        if len(frame) < off + 20:
            return 4, None, "truncated IPv4 header"
        total = struct.unpack_from("!H", frame, off + 2)[0]
    else:
        if len(frame) < off + 40:
            return 6, None, "truncated IPv6 header"
        total = 40 + struct.unpack_from("!H", frame, off + 4)[0]
    if len(frame) < off + total:
        return ver, None, "frame shorter than IP length (%d < %d)" % (len(frame) - off, total)
    return ver, frame[off:off + total], None


def icrc_masked(dgram):
    """Independent ICRC over an IP datagram (IPv4 or IPv6, UDP, BTH...ICRC)
    by the IBTA A17 masking rules. Returns the CRC-32 value; the wire bytes
    are its little-endian encoding."""
    ver = dgram[0] >> 4
    if ver == 4:
        ihl = (dgram[0] & 0x0F) * 4
        if dgram[9] != 17:
            raise ValueError("IPv4 protocol %d is not UDP" % dgram[9])
        ip = bytearray(dgram[:ihl])
        ip[1] = 0xFF                 # type of service (DSCP + ECN)
        ip[8] = 0xFF                 # time to live
        ip[10:12] = b"\xff\xff"      # header checksum
        rest = dgram[ihl:]
    elif ver == 6:
        if dgram[6] != 17:
            raise ValueError("IPv6 next header %d is not UDP (extension headers unsupported)" % dgram[6])
        ip = bytearray(dgram[:40])
        ip[0] |= 0x0F                # traffic class, high nibble (version kept)
        ip[1:4] = b"\xff\xff\xff"    # traffic class low nibble + flow label
        ip[7] = 0xFF                 # hop limit
        rest = dgram[40:]
    else:
        raise ValueError("IP version %d" % ver)
    if len(rest) < 8 + 12 + 4:
        raise ValueError("too short for UDP + BTH + ICRC")
    udp = bytearray(rest[:8])
    udp[6:8] = b"\xff\xff"           # UDP checksum
    bth = bytearray(rest[8:20])
    bth[4] = 0xFF                    # FECN, BECN, resv6
    body = rest[20:-4]               # extension headers, payload, pad
    crc = zlib.crc32(b"\xff" * 8)
    crc = zlib.crc32(bytes(ip), crc)
    crc = zlib.crc32(bytes(udp), crc)
    crc = zlib.crc32(bytes(bth), crc)
    crc = zlib.crc32(body, crc)
    return crc & 0xFFFFFFFF


def scapy_icrc(frame):
    """scapy's ICRC wire bytes for an IPv4 RoCEv2 frame, or (None, why)."""
    pkt = Ether(frame)
    if BTH not in pkt:
        return None, "scapy did not dissect a BTH (layers: %s)" % pkt.summary()
    if IP not in pkt or UDP not in pkt:
        return None, "scapy found no IPv4/UDP"
    return pkt[BTH].compute_icrc(None), None


def bth_opcode(dgram):
    hl = (dgram[0] & 0x0F) * 4 if dgram[0] >> 4 == 4 else 40
    return dgram[hl + 8] if len(dgram) > hl + 8 else -1


def wire_icrc(dgram):
    return dgram[-4:]


def check_hw_vector(t):
    """The oracle against a real ConnectX-4 Lx ICRC."""
    if not os.path.exists(HW_CNP):
        t.ok(False, "hardware vector %s not found" % HW_CNP)
        return
    frames = [bytes(d) for d, _ in RawPcapReader(HW_CNP)]
    if not t.ok(len(frames) == 1, "hw vector: expected 1 frame in %s, got %d" % (HW_CNP, len(frames))):
        return
    ver, dgram, err = ip_datagram(frames[0])
    if not t.ok(err is None and ver == 4, "hw vector: %s" % err):
        return
    t.ok(wire_icrc(dgram) == HW_CNP_ICRC,
         "hw vector: frame ICRC bytes %s, expected %s" % (wire_icrc(dgram).hex(" "), HW_CNP_ICRC.hex(" ")))
    got, why = scapy_icrc(frames[0])
    t.ok(got == HW_CNP_ICRC, "hw vector: scapy computes %s, hardware sent %s (%s)"
         % (got.hex(" ") if got else None, HW_CNP_ICRC.hex(" "), why or "scapy oracle is broken"))
    mine = struct.pack("<I", icrc_masked(dgram))
    t.ok(mine == HW_CNP_ICRC, "hw vector: masking implementation computes %s, hardware sent %s"
         % (mine.hex(" "), HW_CNP_ICRC.hex(" ")))


def main(argv, t):
    d = argv[1]
    pcap = os.path.join(d, "frames.pcap")
    jsonl = os.path.join(d, "frames.jsonl")

    check_hw_vector(t)

    with open(jsonl) as f:
        specs = [json.loads(line) for line in f if line.strip()]
    reader = RawPcapReader(pcap)
    linktype = getattr(reader, "linktype", 1)
    if not t.ok(linktype == 1, "%s: link type %s, expected 1 (Ethernet)" % (pcap, linktype)):
        return

    n = {4: 0, 6: 0}
    idx = -1
    for idx, (data, _meta) in enumerate(reader):
        frame = bytes(data)
        where = "frame %d" % idx
        spec = specs[idx] if idx < len(specs) else None
        if spec is not None and spec.get("i") != idx:
            t.ok(False, "%s: jsonl line %d has i=%r" % (where, idx, spec.get("i")))
        ver, dgram, err = ip_datagram(frame)
        if not t.ok(err is None, "%s: %s" % (where, err)):
            continue
        n[ver] += 1
        if spec is not None:
            t.ok(spec.get("ipver") == ver, "%s: jsonl ipver %r, frame is IPv%d" % (where, spec.get("ipver"), ver))
        trailing = len(frame) - (l3_offset(frame)[0] + len(dgram))
        wire = wire_icrc(dgram)
        t.ok(trailing == 0 and frame[-4:] == wire,
             "%s: %d bytes after the IP datagram, so the frame's last four bytes are not the ICRC" % (where, trailing))

        try:
            mine = icrc_masked(dgram)
        except ValueError as e:
            t.ok(False, "%s: %s" % (where, e))
            continue
        mine_b = struct.pack("<I", mine)

        if ver == 4:
            ref_b, why = scapy_icrc(frame)
            if not t.ok(ref_b is not None, "%s: %s" % (where, why)):
                continue
            ref_name = "scapy"
            # The masking implementation must agree with scapy (validates the
            # IPv6 path's shared CRC/byte-order logic against the oracle).
            t.ok(mine_b == ref_b, "%s (IPv4): masking implementation %s != scapy %s"
                 % (where, mine_b.hex(" "), ref_b.hex(" ")))
        else:
            ref_b = mine_b
            ref_name = "A17-masking"

        t.ok(wire == ref_b, "%s (IPv%d, opcode 0x%02x): ICRC on wire %s, %s computes %s"
             % (where, ver, bth_opcode(dgram), wire.hex(" "), ref_name, ref_b.hex(" ")))
        if spec is not None:
            ref_val = struct.unpack("<I", ref_b)[0]
            got = spec.get("icrc")
            t.ok(got == ref_val, "%s: jsonl icrc %s, %s computes 0x%08x"
                 % (where, "0x%08x" % got if isinstance(got, int) else repr(got), ref_name, ref_val))
    reader.close()
    nframes = idx + 1
    t.ok(nframes == len(specs), "%s has %d frames, %s has %d lines" % (pcap, nframes, jsonl, len(specs)))
    t.ok(nframes > 0, "%s has no frames" % pcap)
    t.ok(n[4] > 0, "no IPv4 frames, the scapy oracle checked nothing")
    t.ok(n[6] > 0, "no IPv6 frames, the IPv6 path checked nothing")
    print("checked %d IPv4 frames (scapy oracle) and %d IPv6 frames (A17 masking oracle)" % (n[4], n[6]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: /usr/bin/python3 check_icrc.py DIR")
        sys.exit(2)
    oc.run(main, sys.argv)
