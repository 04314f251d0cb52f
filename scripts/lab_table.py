#!/usr/bin/env python3
"""lab_table.py TRIALS EVENTS_DIR: the Markdown table of an experiment run trial by trial (`make cpu-lab`).

TRIALS is `llm-train --config FILE --list` output (name, then a tab and the expected outcome); EVENTS_DIR
holds <name>.jsonl, each trial's event log. Per trial: the expected and the actual outcome, the memory
categories at the snapshot with the most allocated bytes (for an out-of-memory trial, the snapshot taken
when the allocation failed), the peak, the training time and tokens/s, all read from the events.
Standard library only.
"""
import json
import sys
from pathlib import Path


def mib(n):
    return "–" if n is None else f"{n / 2**20:,.1f}"


def summarize(events):
    snapshots = [e for e in events if e.get("type") == "snapshot"]
    result = next((e for e in events if e.get("type") == "result"), None)
    failed = [s for s in snapshots if s.get("phase") == "oom"]
    peak_snapshot = failed[-1] if failed else max(snapshots, key=lambda s: s["allocated_bytes"], default=None)
    return result, peak_snapshot


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: lab_table.py TRIALS EVENTS_DIR")
    trials = [line.rstrip("\n").split("\t") for line in Path(sys.argv[1]).read_text().splitlines() if line]
    events_dir = Path(sys.argv[2])
    rows = ["| trial | expected | outcome | Params MiB | Grads MiB | Optim MiB (device + host) | Acts MiB | "
            "peak MiB | train s | tokens/s |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    mismatches = 0
    for fields in trials:
        name, expected = fields[0], (fields[1] if len(fields) > 1 else "")
        path = events_dir / f"{name}.jsonl"
        events = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
        result, snap = summarize(events)
        outcome = result["outcome"] if result else "not run"
        if expected and outcome != expected:
            mismatches += 1
            outcome = f"**{outcome}** (expected {expected})"
        if snap:
            optim = mib(snap["optim_device_bytes"])
            if snap["optim_host_bytes"]:
                optim += f" + {mib(snap['optim_host_bytes'])}"
            memory = [mib(snap["params_bytes"]), mib(snap["grads_bytes"]), optim, mib(snap["other_bytes"])]
        else:
            memory = ["–"] * 4
        peak = mib(result["peak_bytes"]) if result else "–"
        seconds = f"{result['train_seconds']:.1f}" if result else "–"
        speed = f"{result['tokens_per_second']:,.0f}" if result and result["tokens_per_second"] else "–"
        rows.append(f"| {name} | {expected or '–'} | {outcome} | " + " | ".join(memory) +
                    f" | {peak} | {seconds} | {speed} |")
    print("\n".join(rows))
    if mismatches:
        print(f"\n{mismatches} trial(s) ended other than the experiment file expects.", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
