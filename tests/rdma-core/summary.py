#!/usr/bin/python3
"""Reads the verbose output of rdma-core's run_tests.py (Python unittest)
and prints pass, fail, error and skip counts, each skip with its reason
(grouped, and whether expected.txt allows it or says uroce owes it), and
each failure and error. Exit status 0 only when: every skip's reason is
"allowed" or "owed", every failure and error is a "failing" test, and
every "owed" reason and "failing" test still happens (a stale line fails,
so the list only shrinks); else 1. A line is stale only when none of the
outputs given shows it: the suite runs in two modes, and one mode may
never reach what another skips.

    summary.py SUITE_OUTPUT EXPECTED [OTHER_MODE_OUTPUT...]
"""
import collections
import re
import sys



def parse(text):
    """Each test's verdict: counts, skips by reason, and what went wrong."""
    counts = collections.Counter()
    skips = collections.defaultdict(list)
    bad = []
    # One record per test: from its "test_x (module.Class.test_x)" line to
    # the next one. Its verdict follows " ... ", on that line or, when the
    # test printed something first, alone on a later line.
    verdict_re = re.compile(r"^(ok|FAIL|ERROR|expected failure|unexpected success|skipped (['\"])(.*)\2)$")
    records = re.split(r"^(?=test_\S+ \([\w.]+\)$|test_\S+ \([\w.]+\) \.\.\. )", text, flags=re.M)
    for rec in records:
        head = re.match(r"test_\S+ \(([\w.]+)\)", rec)
        if not head:
            continue
        name = head.group(1)
        verdict = None
        after = rec.split(" ... ", 1)
        if len(after) == 2:
            for cand in after[1].splitlines():
                m = verdict_re.match(cand.strip())
                if m:
                    verdict = m
                    break
        if verdict is None:
            counts["no verdict"] += 1
            bad.append(f"no verdict: {name}")
            continue
        v = verdict.group(1)
        if v == "ok":
            counts["passed"] += 1
        elif v.startswith("skipped"):
            counts["skipped"] += 1
            skips[verdict.group(3)].append(name)
        elif v in ("FAIL", "ERROR"):
            counts["failed" if v == "FAIL" else "errors"] += 1
            bad.append(f"{v}: {name}")
        else:
            counts[v] += 1
            bad.append(f"{v}: {name}")
    return counts, skips, bad


def main():
    text = open(sys.argv[1], errors="replace").read()
    expect = collections.defaultdict(list)
    for raw in open(sys.argv[2]):
        raw = raw.split("#", 1)[0].strip()
        if not raw:
            continue
        kind, value = raw.split(":", 1)
        expect[kind.strip()].append(value.strip())
    allowed = [re.compile(v) for v in expect["allowed"]]
    owed = {v: re.compile(v) for v in expect["owed"]}
    failing = set(expect["failing"])
    racy = set(expect["racy"])
    counts, skips, bad = parse(text)
    ran = re.search(r"^Ran (\d+) tests?", text, re.M)
    total = int(ran.group(1)) if ran else 0
    print(f"rdma-core suite: {total} tests: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['errors']} errors, {counts['skipped']} skipped")
    if sum(counts.values()) != total:
        print(f"  the output names {sum(counts.values())} verdicts for {total} tests")
        bad.append("verdict count")
    problems = []
    owed_seen = set()
    n_allowed = n_owed = 0
    for reason, names in sorted(skips.items(), key=lambda kv: -len(kv[1])):
        if any(a.search(reason) for a in allowed):
            tag = "allowed"
            n_allowed += len(names)
        else:
            hit = [k for k, r in owed.items() if r.search(reason)]
            if hit:
                tag = "owed (#29)"
                n_owed += len(names)
                owed_seen.update(hit)
            else:
                tag = "NOT EXPECTED"
                problems.append(f"skip not in expected.txt: {reason} (x{len(names)})")
        print(f"  skip x{len(names)} [{tag}]: {reason}")
        for n in names:
            print(f"      {n}")
    print(f"  skips: {n_allowed} allowed (another vendor, or hardware or setup this machine lacks), "
          f"{n_owed} owed (features uroce lacks, #29)")
    known = 0
    for b in bad:
        verdict, _, name = b.partition(": ")
        if name in failing and verdict in ("FAIL", "ERROR"):
            known += 1
            print(f"  {b} [failing (#29)]")
        elif name in racy and verdict in ("FAIL", "ERROR"):
            known += 1
            print(f"  {b} [racy (#29): passes or fails by timing]")
        else:
            print(f"  {b} [NOT EXPECTED]")
            problems.append(b)
    names_seen = {b.partition(": ")[2] for b in bad}
    for name in sorted(racy - names_seen):
        print(f"  passed: {name} [racy (#29): passes or fails by timing]")
    # Staleness over every mode's output.
    for other in sys.argv[3:]:
        _, oskips, obad = parse(open(other, errors="replace").read())
        names_seen |= {b.partition(": ")[2] for b in obad}
        for reason in oskips:
            owed_seen.update(k for k, r in owed.items() if r.search(reason))
    for name in sorted(failing - names_seen):
        problems.append(f"listed as failing but did not fail (remove its line): {name}")
    for k in sorted(set(owed) - owed_seen):
        problems.append(f"owed skip no longer seen (remove its line): {k}")
    applicable = total - n_allowed
    print(f"  of the {applicable} tests that apply to uroce (all but the allowed skips): {counts['passed']} passed "
          f"({100.0 * counts['passed'] / max(applicable, 1):.0f}%), {known} known failures, {n_owed} owed skips")
    for p in problems:
        print(f"  PROBLEM: {p}")
    return 0 if not problems and total > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
