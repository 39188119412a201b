"""The BTH opcode list of the IBTA specification (vol. 1, 9.2 table 35 and
9.3; Memory Placement Extensions for FLUSH / ATOMIC WRITE; Annex A17 for the
RoCEv2 CNP), written out here for the Python oracles. It is deliberately
independent of the C++ opcode table: nothing in this file is generated from
or copied out of stack/wire.

For every opcode: its name, the extension headers that follow the BTH (in
wire order), whether it is a request (sent by a requester and covered by
the request PSN sequence), a response, or a CNP, whether it ends a message,
and whether it is a READ request.
"""

BTH_LEN = 12
ICRC_LEN = 4
UDP_LEN = 8

HDR_LEN = {
    "RDETH": 4,
    "DETH": 8,
    "XRCETH": 4,
    "FETH": 4,
    "RETH": 16,
    "AtomicETH": 28,
    "AETH": 4,
    "AtomicAckETH": 8,
    "ImmDt": 4,
    "IETH": 4,
    "CNP": 16,  # 16 reserved bytes after the BTH of a RoCEv2 CNP (A17.9.3)
}

REQUEST, RESPONSE, CNP = "request", "response", "cnp"


class Op:
    def __init__(self, code, name, hdrs, kind, ends_message=False, read_request=False):
        self.code = code
        self.name = name
        self.hdrs = tuple(hdrs)
        self.kind = kind
        self.ends_message = ends_message
        self.read_request = read_request
        self.hdr_len = BTH_LEN + sum(HDR_LEN[h] for h in self.hdrs)

    @property
    def is_request(self):
        return self.kind == REQUEST

    def has(self, hdr):
        return hdr in self.hdrs

    def __repr__(self):
        return "0x%02x %s" % (self.code, self.name)


def _build():
    t = {}

    def add(code, name, hdrs, kind, ends=False, read=False):
        assert code not in t
        t[code] = Op(code, name, hdrs, kind, ends, read)

    for base, tr in ((0x00, "RC"), (0x20, "UC"), (0x40, "RD"), (0xA0, "XRC")):
        # RD requests carry RDETH and DETH; XRC requests, the XRCETH.
        pre = {"RD": ["RDETH", "DETH"], "XRC": ["XRCETH"]}.get(tr, [])
        add(base + 0x00, tr + "_SEND_FIRST", pre, REQUEST)
        add(base + 0x01, tr + "_SEND_MIDDLE", pre, REQUEST)
        add(base + 0x02, tr + "_SEND_LAST", pre, REQUEST, ends=True)
        add(base + 0x03, tr + "_SEND_LAST_WITH_IMMEDIATE", pre + ["ImmDt"], REQUEST, ends=True)
        add(base + 0x04, tr + "_SEND_ONLY", pre, REQUEST, ends=True)
        add(base + 0x05, tr + "_SEND_ONLY_WITH_IMMEDIATE", pre + ["ImmDt"], REQUEST, ends=True)
        add(base + 0x06, tr + "_RDMA_WRITE_FIRST", pre + ["RETH"], REQUEST)
        add(base + 0x07, tr + "_RDMA_WRITE_MIDDLE", pre, REQUEST)
        add(base + 0x08, tr + "_RDMA_WRITE_LAST", pre, REQUEST, ends=True)
        add(base + 0x09, tr + "_RDMA_WRITE_LAST_WITH_IMMEDIATE", pre + ["ImmDt"], REQUEST, ends=True)
        add(base + 0x0A, tr + "_RDMA_WRITE_ONLY", pre + ["RETH"], REQUEST, ends=True)
        add(base + 0x0B, tr + "_RDMA_WRITE_ONLY_WITH_IMMEDIATE", pre + ["RETH", "ImmDt"], REQUEST, ends=True)
        if tr == "UC":
            continue
        # Responses of RD carry the RDETH but no DETH.
        rpre = ["RDETH"] if tr == "RD" else []
        add(base + 0x0C, tr + "_RDMA_READ_REQUEST", pre + ["RETH"], REQUEST, ends=True, read=True)
        add(base + 0x0D, tr + "_RDMA_READ_RESPONSE_FIRST", rpre + ["AETH"], RESPONSE)
        add(base + 0x0E, tr + "_RDMA_READ_RESPONSE_MIDDLE", rpre, RESPONSE)
        add(base + 0x0F, tr + "_RDMA_READ_RESPONSE_LAST", rpre + ["AETH"], RESPONSE)
        add(base + 0x10, tr + "_RDMA_READ_RESPONSE_ONLY", rpre + ["AETH"], RESPONSE)
        add(base + 0x11, tr + "_ACKNOWLEDGE", rpre + ["AETH"], RESPONSE)
        add(base + 0x12, tr + "_ATOMIC_ACKNOWLEDGE", rpre + ["AETH", "AtomicAckETH"], RESPONSE)
        add(base + 0x13, tr + "_COMPARE_SWAP", pre + ["AtomicETH"], REQUEST, ends=True)
        add(base + 0x14, tr + "_FETCH_ADD", pre + ["AtomicETH"], REQUEST, ends=True)
        if tr == "RD":
            add(base + 0x15, "RD_RESYNC", pre, REQUEST)
    add(0x16, "RC_SEND_LAST_WITH_INVALIDATE", ["IETH"], REQUEST, ends=True)
    add(0x17, "RC_SEND_ONLY_WITH_INVALIDATE", ["IETH"], REQUEST, ends=True)
    add(0x1C, "RC_FLUSH", ["FETH", "RETH"], REQUEST, ends=True)
    add(0x1D, "RC_ATOMIC_WRITE", ["RETH"], REQUEST, ends=True)
    add(0xB6, "XRC_SEND_LAST_WITH_INVALIDATE", ["XRCETH", "IETH"], REQUEST, ends=True)
    add(0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE", ["XRCETH", "IETH"], REQUEST, ends=True)
    add(0xBC, "XRC_FLUSH", ["XRCETH", "FETH", "RETH"], REQUEST, ends=True)
    add(0xBD, "XRC_ATOMIC_WRITE", ["XRCETH", "RETH"], REQUEST, ends=True)
    add(0x64, "UD_SEND_ONLY", ["DETH"], REQUEST, ends=True)
    add(0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", ["DETH", "ImmDt"], REQUEST, ends=True)
    add(0x81, "CNP", ["CNP"], CNP)
    return t


OPCODES = _build()


def op_name(code):
    op = OPCODES.get(code)
    return op.name if op else "UNKNOWN"


def payload_len(op, udp_length, padcnt):
    """Payload bytes (without pad and ICRC) of a RoCEv2 packet whose UDP
    length is udp_length."""
    return udp_length - UDP_LEN - op.hdr_len - padcnt - ICRC_LEN


# AETH syndrome (IBTA 9.3.5): bits 6:5 are the class.
AETH_ACK, AETH_RNR_NAK, AETH_RESERVED, AETH_NAK = 0, 1, 2, 3
NAK_CODES = {
    0: "psn_seq_error",
    1: "invalid_request",
    2: "remote_access_error",
    3: "remote_operational_error",
    4: "invalid_rd_request",
}


def aeth_class(syndrome):
    return (syndrome >> 5) & 3
