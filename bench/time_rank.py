#!/usr/bin/env python3
"""Predicted against measured step time and peak over an experiment's rows (issue 28's checks).

For every trial of the file that is not meant to run out of memory, runs the real llm-train
(`--repeats` times, alternating the trials) and reads its `step` events; asks `llmctl estimate
--format json` for the predicted step time; prints both per trial and the Spearman rank correlation
of the two orders, per repeat. With `--calibrate`, also the factor per matmul class (bf16, fp32)
that the measured steps imply: the median of (measured - fixed) / calibrated nominal seconds,
which is how `llmctl` calibrates from stored runs and how common/estimate/step_time.cc's built-in
CPU factors were set.

Each trial trains on its own data; the estimate draws the same micro-batches with the trial's seed
(the time at their mean length), so both sides see the same sequences.

It is a benchmark, not a test: nothing here asserts a time.

  .venv/bin/python bench/time_rank.py experiments/cpu-lab.yaml --repeats 3 --calibrate
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Steps 0 and 1 create the optimizer's state and take the memory snapshots; later steps are timed.
TIMED_FROM_STEP = 2


def run(argv, **kwargs):
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kwargs)


def trials_of(llm_train, experiment):
    """(name, expected outcome or '') for each trial of the file (llm-train --list)."""
    out = run([str(llm_train), "--config", str(experiment), "--list"]).stdout
    rows = []
    for line in out.splitlines():
        name, _, expect = line.partition("\t")
        rows.append((name, expect))
    return rows


def predictions(llmctl, experiment):
    """name -> the estimate's json row, for trials with a predicted time."""
    out = run([str(llmctl), "estimate", str(experiment), "--format", "json"]).stdout
    return {t["name"]: t for t in json.loads(out)["trials"] if t.get("time")}


def measure(llm_train, experiment, trial, sets, workdir, index):
    """Mean seconds of the timed steps and the tokens they held, from the run's step events."""
    events = workdir / f"events-{trial}-{index}.jsonl"
    argv = [str(llm_train), "--config", str(experiment), "--trial", trial, "--events", str(events)]
    for key, value in sets:
        argv += ["--set", f"{key}={value}"]
    result = subprocess.run(argv, text=True, capture_output=True)
    if result.returncode != 0:
        return None, None, f"exit {result.returncode}: {result.stderr.strip().splitlines()[-1:]}"
    all_events = [json.loads(line) for line in events.read_text().splitlines()]
    # The run's allocated peak, as the report takes it: every event's high-water mark.
    peak = max((e.get("peak_bytes", 0) for e in all_events), default=0)
    steps = [e for e in all_events if e.get("type") == "step"]
    # A trial of two steps (cpu-offload) is timed from its second.
    first = min(TIMED_FROM_STEP, max((e["step"] for e in steps), default=0))
    steps = [e for e in steps if e["step"] >= first]
    if not steps:
        return None, None, "no timed steps"
    return statistics.mean(e["seconds"] for e in steps), peak, None


def spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calibrate", action="store_true", help="also print the factors the runs imply")
    ap.add_argument("--llm-train", type=Path, default=REPO_ROOT / "build" / "trainer" / "llm-train")
    ap.add_argument("--llmctl", type=Path, default=REPO_ROOT / "build" / "controller" / "cli" / "llmctl")
    ap.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = ap.parse_args()

    experiment = args.experiment.resolve()
    sets = []
    predicted = predictions(args.llmctl, experiment)
    trials = [name for name, expect in trials_of(args.llm_train, experiment)
              if expect != "oom" and name in predicted]
    measured = {name: [] for name in trials}
    peaks = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in trials:
                seconds, peak, error = measure(args.llm_train, experiment, name, sets, Path(tmp),
                                               repeat)
                if error:
                    print(f"{name}: {error}", file=sys.stderr)
                measured[name].append(seconds)
                if peak:
                    peaks[name] = peak  # the same every run: the allocator counts exactly
    ok = [n for n in trials if all(s is not None for s in measured[n])]

    lines = [f"## Predicted and measured step time: {args.experiment} ({args.repeats} runs)", "",
             "| trial | matmuls | predicted step s | measured step s (runs) | measured / predicted "
             "| predicted peak MiB | measured peak MiB | peak error |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for n in ok:
        p = predicted[n]["time"]
        best = min(measured[n])
        runs = ", ".join(f"{s:.3f}" for s in measured[n])
        predicted_peak = predicted[n]["peak_bytes"]
        peak = peaks.get(n, 0)
        peak_error = f"{100 * (predicted_peak - peak) / peak:+.1f}%" if peak else "–"
        lines.append(f"| {n} | {p['work']['matmul_class']} | {p['step_seconds']:.3f} | {runs} | "
                     f"{best / p['step_seconds']:.2f} | {predicted_peak / 2**20:.1f} | "
                     f"{peak / 2**20:.1f} | {peak_error} |")
    lines.append("")
    for r in range(args.repeats):
        rho = spearman([predicted[n]["time"]["step_seconds"] for n in ok],
                       [measured[n][r] for n in ok])
        lines.append(f"run {r + 1}: Spearman rank correlation of predicted and measured step "
                     f"times over {len(ok)} trials: {rho:.3f}")
    if ok:
        # Issue 28's check of a plan: the trial predicted fastest against the fastest measured.
        fastest_predicted = min(ok, key=lambda n: predicted[n]["time"]["step_seconds"])
        fastest_measured = min(ok, key=lambda n: min(measured[n]))
        gap = min(measured[fastest_predicted]) / min(measured[fastest_measured]) - 1
        lines.append(f"predicted fastest: {fastest_predicted} ({min(measured[fastest_predicted]):.3f} s "
                     f"measured); measured fastest: {fastest_measured} "
                     f"({min(measured[fastest_measured]):.3f} s): {100 * gap:+.1f}%")
    if args.calibrate:
        # The runs' factors relative to the one the estimate used: measured / predicted x factor
        # (every CPU term is calibrated).
        for cls in ("bf16", "fp32"):
            ratios = [min(measured[n]) / predicted[n]["time"]["step_seconds"] *
                      predicted[n]["time"]["factor"]
                      for n in ok if predicted[n]["time"]["work"]["matmul_class"] == cls]
            if ratios:
                lines.append(f"{cls} factor the runs imply: {statistics.median(ratios):.4f} "
                             f"(median of {len(ratios)})")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
