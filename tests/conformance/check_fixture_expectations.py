"""What each of the project's fixtures must show, by construction.

Runs uroce-pcap on pcap-fixtures/ and checks the per-QP figures against the
events each fixture was scripted with (see pcap-fixtures/README.md), and that
--strict refuses every file in pcap-fixtures/bad/.

    check_fixture_expectations.py UROCE_PCAP FIXTURE_DIR
"""
import json
import subprocess
import sys

pcap, fixtures = sys.argv[1], sys.argv[2]
passed = failed = 0


def check(what, got, want):
    global passed, failed
    if got == want:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}: got {got!r}, want {want!r}")


def decode(name, mtu=None):
    args = [pcap, "--json"] + (["--mtu", str(mtu)] if mtu else []) + [f"{fixtures}/{name}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    return doc, {(q["dst"], q["destqp"]): q for q in doc["qps"]}


for name, a, b in [("rc_conversation_v4.pcap", "10.90.0.1", "10.90.0.2"),
                   ("rc_conversation_v6_vlan.pcap", "fd00:90::1", "fd00:90::2")]:
    doc, qps = decode(name, mtu=1024)
    req, rsp = qps[(b, 0x12)], qps[(a, 0x11)]
    check(f"{name} bad frames", doc["totals"]["malformed"], 0)
    # SEND_LAST, WRITE_IMM, READ, CMP_SWAP, FETCH_ADD, SEND_INV, WRITE_LAST x2, SEND_ONLY x2
    check(f"{name} messages", req["messages"], 10)
    check(f"{name} gaps (the lost WRITE_MIDDLE)", req["psn_gaps"], 1)
    check(f"{name} repeats (go-back-N and the RNR retry)", req["psn_repeats"], 2)
    check(f"{name} NAK psn_seq_error", rsp["naks"]["psn_seq_error"], 1)
    check(f"{name} RNR NAKs", rsp["rnr_naks"], 1)
    check(f"{name} payload to responder", req["payload_bytes"], 2500 + 100 + 64 + 4 * 1024 + 64)
    check(f"{name} payload from responder (READ)", rsp["payload_bytes"], 3000)
    check(f"{name} vlan", all(f["vlan"] == (0x6064 if "vlan" in name else -1) for f in doc["frames"]), True)
    # Without --mtu the PSN after a READ is unknown, so the first atomic is not judged.
    _, qps_nomtu = decode(name)
    check(f"{name} gaps without --mtu", qps_nomtu[(b, 0x12)]["psn_gaps"], 1)

doc, qps = decode("cnp_ecn.pcap")
check("cnp_ecn CE marks", qps[("10.90.0.2", 0x12)]["ecn_ce"], 2)
check("cnp_ecn CNPs", qps[("10.90.0.1", 0x11)]["cnps"], 2)

doc, qps = decode("ud_uc.pcap")
check("ud_uc UD to B", qps[("10.90.0.2", 0x12)]["packets"], 4)
check("ud_uc messages to B", qps[("10.90.0.2", 0x12)]["messages"], 3)

# The bad fixture: --strict must fail, and each damage be named.
r = subprocess.run([pcap, "--strict", "--json", f"{fixtures}/bad/malformed.pcap"], capture_output=True, text=True)
check("--strict exit status on bad/malformed.pcap", r.returncode, 1)
doc = json.loads(r.stdout)
check("malformed statuses", [f["status"] for f in doc["frames"]],
      ["ICRC mismatch", "truncated header: IPv4", "BTH TVer is not 0", "ok"])
check("bad ICRC count", doc["totals"]["bad_icrc"], 1)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
