#!/usr/bin/env python3
"""Records whole-suite runs and writes the sanitizer table of docs/reliability.md.

  test-record.py add JUNIT.xml MODE RECORD.tsv   append one line for a ctest run (scripts/test.sh
                                                  does this when HVD_TEST_RECORD=RECORD.tsv)
  test-record.py doc RECORD.tsv [--doc FILE]      write the "sanitizers" section from the newest
                                                  run of each mode

A line: date (UTC), mode (plain, address,undefined, thread), tests, passed, failed, skipped,
seconds, the skipped tests with their reason, the failed tests."""
import argparse
import os
import sys
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "faults"))


def add(a):
    root = ET.parse(a.junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    passed, failed, skipped, secs = [], [], [], 0.0
    for tc in suite.iter("testcase"):
        name = tc.get("name")
        secs += float(tc.get("time") or 0)
        if tc.find("failure") is not None or tc.find("error") is not None:
            failed.append(name)
        elif tc.find("skipped") is not None or tc.get("status") in ("notrun", "disabled"):
            out = (tc.findtext("system-out") or "").strip().splitlines()
            why = next((l for l in reversed(out) if l.lower().startswith("skip")), "")
            skipped.append("%s (%s)" % (name, why[:120]) if why else name)
        else:
            passed.append(name)
    n = len(passed) + len(failed) + len(skipped)
    with open(a.record, "a") as f:
        f.write("\t".join([time.strftime("%Y-%m-%d", time.gmtime()), a.mode, str(n), str(len(passed)),
                           str(len(failed)), str(len(skipped)), "%.0f" % secs, "; ".join(skipped),
                           "; ".join(failed)]) + "\n")
    return 0


def doc(a):
    import reldoc
    newest = {}
    with open(a.record) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) == 9:
                newest[p[1]] = p
    if not newest:
        print("test-record: no runs in %s" % a.record, file=sys.stderr)
        return 1
    L = ["## Sanitizers (scripts/test.sh, the whole ctest suite)", "",
         "The newest recorded run of each build (`HVD_TEST_RECORD=tests/suite-runs.tsv bash scripts/test.sh "
         "[--sanitize ...]`, then `python3 scripts/test-record.py doc tests/suite-runs.tsv`). A sanitizer "
         "report fails the test that triggered it (`halt_on_error=1`, ASan leak checking on).", "",
         "| build | date | tests | passed | failed | skipped | test time (s) | skipped, and why | failed |",
         "|---|---|---|---|---|---|---|---|---|"]
    def grouped(items):
        """'a (why); b (why)' -> 'a, b: why' (tests skipped for the same reason together)."""
        by = {}
        for it in filter(None, items.split("; ")):
            name, _, why = it.partition(" (")
            by.setdefault(why[:-1] if why.endswith(")") else why, []).append(name)
        return "; ".join("%s: %s" % (", ".join(n), w) if w else ", ".join(n) for w, n in by.items())

    for mode in ("plain", "address,undefined", "thread"):
        if mode in newest:
            p = newest[mode]
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                {"plain": "plain (-Werror)", "address,undefined": "ASan+UBSan", "thread": "TSan"}[mode],
                p[0], p[2], p[3], p[4], p[5], p[6], reldoc.md_cell(grouped(p[7])) or "–", reldoc.md_cell(p[8]) or "–"))
    reldoc.write_section(a.doc, "sanitizers", "\n".join(L))
    print("test-record: wrote the sanitizer section of %s" % a.doc)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("add")
    s.add_argument("junit")
    s.add_argument("mode")
    s.add_argument("record")
    d = sub.add_parser("doc")
    d.add_argument("record")
    d.add_argument("--doc", default=os.path.join(REPO, "docs", "reliability.md"))
    a = ap.parse_args()
    return add(a) if a.cmd == "add" else doc(a)


if __name__ == "__main__":
    sys.exit(main())
