#!/usr/bin/env python3
"""How much of a profiled step's communication overlapped its compute, from a Kineto trace.

llm-train writes a Chrome trace of its profiled steps (`profile.steps`, docs/experiment-files.md: rank 0's
trace-steps-*.json). c10d records each Gloo collective as a span on the worker thread that runs it
("gloo:all_reduce", ...); the step's own ops run on the main thread. For every collective span this
prints how long it was and how much of that time the main thread was computing (inside any aten op),
then the totals: a collective in flight while the main thread computes is communication the step does
not wait for.

  .venv/bin/python bench/collective_overlap.py out/profile/trace-steps-2-2.json
"""

import argparse
import json
import sys


def merged(intervals):
    """The union of (start, end) intervals, as disjoint sorted intervals."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def covered(span, intervals):
    start, end = span
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a Chrome trace JSON written by llm-train's profiler")
    args = ap.parse_args()
    try:
        with open(args.trace) as f:
            events = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]
    except (OSError, json.JSONDecodeError) as error:
        sys.exit(f"collective_overlap: cannot read {args.trace}: {error}")
    collectives = [e for e in events if str(e.get("name", "")).startswith(("gloo:", "nccl:"))]
    if not collectives:
        sys.exit(f"collective_overlap: {args.trace} has no gloo: or nccl: spans (a one-process run?)")
    worker_threads = {e["tid"] for e in collectives}
    compute = merged((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("tid") not in worker_threads and str(e.get("name", "")).startswith("aten::"))
    t0 = min(e["ts"] for e in events)
    total = overlapped = 0.0
    print(f"{'start ms':>9} {'ms':>8} {'overlapped ms':>14}  collective (elements)")
    for e in sorted(collectives, key=lambda e: e["ts"]):
        span = (e["ts"], e["ts"] + e["dur"])
        hidden = covered(span, compute)
        total += e["dur"]
        overlapped += hidden
        dims = e.get("args", {}).get("Input Dims", "")
        print(f"{(e['ts'] - t0) / 1000:9.2f} {e['dur'] / 1000:8.2f} {hidden / 1000:14.2f}  {e['name']} {dims}")
    print(f"{len(collectives)} collectives, {total / 1000:.1f} ms in all, {overlapped / 1000:.1f} ms "
          f"({100 * overlapped / total:.0f}%) while the main thread computed")


if __name__ == "__main__":
    main()
