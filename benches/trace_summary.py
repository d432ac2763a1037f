#!/usr/bin/env python3
"""A step's profile by op class from a `weft train --trace` file.

    python3 benches/trace_summary.py TRACE.json [TOP]

Per traced step and device lane: the step's wall time (the host lane's
`step N` span), the sum of the device spans (ops, fused chains,
collectives, transfers), and the spans by name, largest total first. With
`--trace-sync` the spans are device times; without, on a GPU they are the
host's enqueue times, so "spans / step" near 1 says the host is the
bottleneck (launch-bound), far below 1 that the device is.
"""
import collections
import json
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    doc = json.load(open(path))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    print(f"{path}: {doc.get('otherData', {}).get('device_times', '')}")
    steps = {e["args"]["train_step"]: e["dur"] for e in ev if e.get("cat") == "step"}
    lanes = sorted({e["tid"] for e in ev if e.get("tid", 0) > 0 and e.get("cat") != "predicted"})
    for s, wall in sorted(steps.items()):
        for lane in lanes[:1]:
            mine = [e for e in ev if e.get("tid") == lane and e["args"].get("train_step") == s]
            busy = sum(e["dur"] for e in mine)
            n = len(mine)
            print(f"step {s} device {lane - 1}: wall {wall / 1e3:.2f} ms, {n} spans, "
                  f"sum {busy / 1e3:.2f} ms ({busy / max(wall, 1e-9):.2f} of the step), "
                  f"{busy / max(n, 1):.1f} us per span")
    last = max(steps) if steps else None
    by = collections.defaultdict(lambda: [0, 0.0])
    cats = collections.defaultdict(lambda: [0, 0.0])
    for e in ev:
        if e.get("tid") == (lanes[0] if lanes else -1) and e["args"].get("train_step") == last:
            by[(e["cat"], e["name"])][0] += 1
            by[(e["cat"], e["name"])][1] += e["dur"]
            cats[e["cat"]][0] += 1
            cats[e["cat"]][1] += e["dur"]
    print(f"by kind (step {last}, device {lanes[0] - 1 if lanes else '-'}):")
    for c, (n, t) in sorted(cats.items(), key=lambda x: -x[1][1]):
        print(f"  {t / 1e3:9.3f} ms {n:6d}x  {c}")
    print(f"top {top} by name:")
    for (c, name), (n, t) in sorted(by.items(), key=lambda x: -x[1][1])[:top]:
        print(f"  {t / 1e3:9.3f} ms {n:6d}x  {t / n:9.1f} us  {c:10s} {name[:90]}")


if __name__ == "__main__":
    main()
