"""Checks a timeline written by test_timeline: valid JSON (Chrome trace event array), one
row per tensor, balanced and ordered spans, and the expected negotiation, queue, memcpy and
collective activities."""
import json
import sys


def main(path):
    with open(path, encoding="utf-8") as f:
        events = json.load(f)  # raises on invalid JSON or text that is not UTF-8
    assert isinstance(events, list) and events, "not a non-empty JSON array"
    rows = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            rows[e["pid"]] = e["args"]["name"]
    by_name = {}
    for e in events:
        if e.get("ph") == "M":
            continue
        assert e["ph"] in ("B", "E", "i"), e
        assert isinstance(e["ts"], (int, float)) and e["pid"] in rows, e
        by_name.setdefault(rows[e["pid"]], []).append(e)

    def spans(name):
        """Returns [(activity, depth)] of B events, checking balance and time order."""
        stack, out, last = [], [], -1.0
        for e in by_name.get(name, []):
            assert e["ts"] >= last, f"{name}: time goes backwards at {e}"
            last = e["ts"]
            if e["ph"] == "B":
                out.append((e["name"], len(stack)))
                stack.append(e["name"])
            elif e["ph"] == "E":
                assert stack, f"{name}: E without B"
                stack.pop()
        assert not stack, f"{name}: unclosed spans {stack}"
        return out

    for k in range(5):
        name = f"tl.grad.{k}"
        assert name in by_name, f"no row for {name}"
        s = spans(name)
        names = [a for a, _ in s]
        for want in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER",
                     "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"):
            assert want in names, f"{name}: no {want} span in {names}"
        assert names.count("ALLREDUCE") == 3, f"{name}: expected 3 steps, got {names}"
        depth = dict((a, d) for a, d in s)
        assert depth["NEGOTIATE_ALLREDUCE"] == 0 and depth["ALLREDUCE"] == 0
        assert depth["MPI_ALLREDUCE"] == 1 and depth["QUEUE"] == 1, f"{name}: nesting {s}"
        ranks = {e["name"] for e in by_name[name] if e["ph"] == "i"}
        assert {"0", "1"} <= ranks, f"{name}: no per-rank negotiation marks ({ranks})"
    s = [a for a, _ in spans("tl.bcast")]
    assert "NEGOTIATE_BROADCAST" in s and "BROADCAST" in s and "MPI_BCAST" in s, s
    s = [a for a, _ in spans("tl.gather")]
    assert "ALLGATHER" in s and "MPI_ALLGATHER" in s, s
    # Quote, backslash and control characters survive; a byte that is not UTF-8 shows as '?'.
    s = [a for a, _ in spans('tl.esc"\\\t\x01?')]
    assert "BROADCAST" in s, s
    print(f"timeline ok: {len(events)} events, {len(rows)} tensors")


if __name__ == "__main__":
    main(sys.argv[1])
