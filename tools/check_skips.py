#!/usr/bin/python3
"""Reads a `meson test` JSON log and says what it skipped.

    check_skips.py LOG.json [LOG.json ...]

Prints every skip with its reason: a whole test that exited 77 (its
"SKIP: ..." line), and every GoogleTest case that skipped inside a test
that passed (its "[  SKIPPED ]" line and the message before it). Then fails
(exit 1) on any skip that is not on the allow-list below, so a skip can
never pass for a pass. Also fails when a log ran no test at all.

The allow-list names each permitted skip by its test and the reason it must
give, and why that reason is not a failure here:
"""
import json
import re
import sys

# (suite:test, regular expression the reason must match, why it may skip)
ALLOWED = [
    ("integration:af_xdp", r"^net_af_xdp: the kernel refuses ",
     "the kernel (or its sandbox) refuses AF_XDP sockets or umems: a property of the host, not of uroce"),
    ("interop:rxe", r"^interop: QEMU cannot run here: ",
     "the rxe peer is a QEMU guest; a host where QEMU cannot start at all has no peer to test against"),
]


def reason_of(stdout):
    m = re.findall(r"^SKIP: (.*)$", stdout or "", re.M)
    return m[-1].strip() if m else "(no reason printed)"


def gtest_skips(stdout):
    """GoogleTest cases that skipped: (case, message)."""
    out = []
    lines = (stdout or "").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\[  SKIPPED \] (\S+)( \(\d+ ms\))?$", line)
        if m:
            msg = []
            for j in range(i - 1, max(i - 8, -1), -1):  # the GTEST_SKIP message sits just above
                if lines[j].startswith("[ RUN      ]"):
                    break
                if lines[j].strip() and not lines[j].rstrip().endswith("Skipped"):
                    msg.insert(0, lines[j].strip())
            msg = " ".join(msg)
            out.append((m.group(1), msg or "(no message)"))
    return out


def main(paths):
    allowed_seen, bad, ran = [], [], 0
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                t = json.loads(line)
                ran += 1
                # meson names a test "PROJECT:SUITE / NAME"
                m = re.match(r"^(?:[^:/]+:)?([^/]+?) / (.+)$", t["name"])
                key = "%s:%s" % (m.group(1), m.group(2)) if m else t["name"]
                out = (t.get("stdout") or "") + "\n" + (t.get("stderr") or "")
                if t.get("result") == "SKIP":
                    why = reason_of(out)
                    rule = next((r for r in ALLOWED if r[0] == key and re.search(r[1], why)), None)
                    (allowed_seen if rule else bad).append((key, why, rule[2] if rule else None))
                for case, msg in gtest_skips(out):
                    bad.append(("%s/%s" % (key, case), msg, None))
    for key, why, because in allowed_seen:
        print("skipped (allowed): %s: %s [allowed: %s]" % (key, why, because))
    for key, why, _ in bad:
        print("skipped (NOT allowed): %s: %s" % (key, why))
    if ran == 0:
        print("check_skips: the logs hold no test at all: %s" % " ".join(paths))
        return 1
    print("skips: %d allowed, %d not allowed, in %d tests" % (len(allowed_seen), len(bad), ran))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
