#!/usr/bin/env python3
"""The top operations of a profiled llm-train step by total time, from its Kineto trace.

llm-train writes a Chrome trace of its profiled steps (`profile.steps`, docs/llm-train.md:
output_dir/profile/trace-steps-A-B.json), each step a `ProfilerStep#N` span. On CUDA this sums the GPU
kernels (events of category "kernel") by name; on the CPU the top-level operators (category "cpu_op" not
nested inside another on the same thread: `aten::linear`, not the `aten::addmm` it calls, so no time
counts twice). Each entry's share is its total over the profiled steps' wall time; on CUDA the shares
add up to the fraction of the step the GPU was running kernels (less where kernels overlap on streams).

  .venv/bin/python bench/profile_summary.py --device cuda out/profile/trace-steps-2-2.json
"""

import argparse
import json
import sys


def load_events(trace):
    """The complete ("X") events of a Chrome trace; ValueError names the file and what is wrong."""
    try:
        with open(trace) as f:
            document = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the trace {trace}: {error}") from error
    events = document.get("traceEvents") if isinstance(document, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{trace} is not a Chrome trace: no traceEvents list")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]


def top_level(ops):
    """The operators not nested inside another one on the same thread."""
    outer, open_until = [], {}
    for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
        key = (e.get("pid"), e.get("tid"))
        if e["ts"] >= open_until.get(key, float("-inf")):
            outer.append(e)
            open_until[key] = e["ts"] + e["dur"]
    return outer


def summarize(trace, device, top=10):
    """A dict: the steps' wall microseconds, the kind of entry, and the TOP entries by total time (name,
    microseconds, calls, share of the steps' wall time) with what they cover together."""
    events = load_events(trace)
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError(f"{trace} has no ProfilerStep# span: not a trace of llm-train's profiled steps")
    step_us = sum(e["dur"] for e in steps)
    if device == "cuda":
        kind, entries = "kernel", [e for e in events if e.get("cat") == "kernel"]
        if not entries:
            raise ValueError(f"{trace} has no CUDA kernel events: was the step on the GPU?")
    else:
        kind, entries = "top-level cpu_op", top_level([e for e in events if e.get("cat") == "cpu_op"])
    totals = {}
    for e in entries:
        total = totals.setdefault(e["name"], [0.0, 0])
        total[0] += e["dur"]
        total[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    rows = [{"name": name, "us": us, "calls": calls, "share": us / step_us} for name, (us, calls) in ranked]
    return {"trace": str(trace), "steps": len(steps), "step_us": step_us, "kind": kind,
            "entries": len(entries), "all_us": sum(e["dur"] for e in entries), "top": rows,
            "top_share": sum(r["share"] for r in rows)}


def markdown(summary, title):
    """SUMMARY as a Markdown table under TITLE."""
    out = [f"{title}: the top {len(summary['top'])} {summary['kind']}s of {summary['steps']} profiled "
           f"step(s), {summary['step_us'] / 1000:,.1f} ms of wall time; all {summary['entries']:,} "
           f"{summary['kind']}s took {summary['all_us'] / 1000:,.1f} ms "
           f"({100 * summary['all_us'] / summary['step_us']:.1f}% of it), these "
           f"{100 * summary['top_share']:.1f}%.", "",
           f"| {summary['kind']} | ms | calls | share of the step |", "|---|---:|---:|---:|"]
    for r in summary["top"]:
        name = r["name"].replace("|", "\\|")
        if len(name) > 100:  # templated autograd nodes differ at their ends
            name = name[:60] + "..." + name[-37:]
        out.append(f"| `{name}` | {r['us'] / 1000:,.2f} | {r['calls']:,} | {100 * r['share']:.1f}% |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a Chrome trace JSON written by llm-train's profiler")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the step ran: cuda sums GPU kernels, cpu top-level operators")
    ap.add_argument("--top", type=int, default=10, help="how many entries (default 10)")
    args = ap.parse_args()
    if args.top < 1:
        sys.exit("profile_summary: --top must be at least 1")
    try:
        print(markdown(summarize(args.trace, args.device, args.top), args.trace), end="")
    except ValueError as error:
        sys.exit(f"profile_summary: {error}")


if __name__ == "__main__":
    main()
