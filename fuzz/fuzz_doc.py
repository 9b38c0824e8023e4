#!/usr/bin/env python3
"""fuzz_doc.py [RUNS.tsv] [--doc docs/reliability.md]: writes the fuzzing section of
docs/reliability.md from the runs scripts/fuzz.sh recorded (HVD_FUZZ_RECORD=fuzz/runs.tsv:
date, target, seconds, executions, corpus files before and after, result; one line per
target per run). Totals per target, then every recorded run."""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "faults"))
import reldoc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs", nargs="?", default=os.path.join(REPO, "fuzz", "runs.tsv"))
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "reliability.md"))
    a = ap.parse_args()
    rows = []
    with open(a.runs) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) == 7:
                rows.append((p[0], p[1], int(p[2]), int(p[3]), int(p[4]), int(p[5]), p[6]))
    if not rows:
        print("fuzz_doc: no runs in %s" % a.runs, file=sys.stderr)
        return 1
    L = ["## Fuzzing (scripts/fuzz.sh, libFuzzer with ASan+UBSan)", "",
         "Recorded with `HVD_FUZZ_KEEP=1 HVD_FUZZ_RECORD=fuzz/runs.tsv bash scripts/fuzz.sh SECONDS`, "
         "then `python3 fuzz/fuzz_doc.py`: what was found is merged (minimised) into `fuzz/corpus/`, "
         "which CI's short runs start from. A crash, leak or failed assertion fails the run.", "",
         "| target | decoder | runs | fuzzing time | executions | corpus files now | failures |",
         "|---|---|---|---|---|---|---|"]
    what = {"fuzz_frame": "byte stream → frames (length, AES-GCM open), envelope, every message body; HELLO",
            "fuzz_message": "msgpack pre-check, msgpack-c, every message description; re-encode round trip",
            "fuzz_addrs": "address lists and base64 secrets in text form; format/parse round trip"}
    total_s, total_x = 0, 0
    for t in sorted(set(r[1] for r in rows)):
        rs = [r for r in rows if r[1] == t]
        secs, execs = sum(r[2] for r in rs), sum(r[3] for r in rs)
        total_s += secs
        total_x += execs
        L.append("| %s | %s | %d | %.2f h | %s | %d | %d |" % (
            t, what.get(t, ""), len(rs), secs / 3600, format(execs, ",").replace(",", " "), rs[-1][5],
            sum(1 for r in rs if r[6] != "ok")))
    L += ["", "In all: %.2f hours, %s executions." % (total_s / 3600, format(total_x, ",").replace(",", " ")), "",
          "| date | target | seconds | executions | executions/s | corpus before → after | result |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append("| %s | %s | %d | %s | %.0f | %d → %d | %s |" % (
            r[0], r[1], r[2], format(r[3], ",").replace(",", " "), r[3] / max(r[2], 1), r[4], r[5], r[6]))
    reldoc.write_section(a.doc, "fuzz", "\n".join(L))
    print("fuzz_doc: wrote the fuzzing section of %s (%d runs)" % (a.doc, len(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
