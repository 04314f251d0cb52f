#!/usr/bin/env python3
"""How close any prediction made before a run could come on this machine (issue 39's noise floor).

Reads several `llmctl report ID --format json` documents of one experiment file, run on one machine
(each `make demo` writes one), and sets the estimate's first-run errors beside two oracles, as good
as a prediction made before a run could hope to be, both fitted to the same runs (in-sample, so
they flatter themselves):

- *each row at its median*: every row predicted at the median of its own measured tokens/s over
  the runs, which is what a perfect model of the rows' work would predict on a machine that
  always ran at its typical speed;
- *each row at its median, times the run's speed*: the same, scaled per run by the median of its
  rows' measured over their medians, as a perfect probe of the machine's speed in each run would.

Where the oracles too miss a row by more than the bound in most runs, the rows' own speed moves
more from one run to the next than the bound allows, and no estimate made before the run can hold
it there; the README and docs/estimate.md say so with these figures.

  python3 bench/time_noise_floor.py report-1.json report-2.json ... [--bound 0.2]

A benchmark's reader, not a test: nothing here asserts a time. time_noise_floor_test.py checks its
arithmetic on hand-written reports.
"""
import argparse
import json
import math
import statistics
import sys


def positive_rate(value, what):
    """`value` as a float when it is a finite number above 0, else ValueError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{what} is {json.dumps(value)[:40]}, not a tokens/s above 0")
    return float(value)


def no_rate(value):
    """Whether a report holds no rate here: none, or a numeric 0 (a boolean is not a number)."""
    return value is None or (type(value) in (int, float) and value == 0)


def measured_rows(report):
    """name -> (measured tokens/s, predicted tokens/s or None) for the report's ok rows; ValueError
    for a document that is not such a report."""
    trials = report.get("trials") if isinstance(report, dict) else None
    if not isinstance(trials, list):
        raise ValueError("no 'trials' list: not an `llmctl report --format json` document")
    rows = {}
    for index, trial in enumerate(trials):
        if not isinstance(trial, dict) or not isinstance(trial.get("name"), str):
            raise ValueError(f"trials[{index}] is not a trial with a name")
        measured = trial.get("steady_tokens_per_second")
        # An ok row the report has no measured rate for (none, or 0) is not scored.
        if trial.get("outcome") != "ok" or no_rate(measured):
            continue
        name = trial["name"]
        prediction = trial.get("prediction")
        if prediction is None:
            prediction = {}
        if not isinstance(prediction, dict):
            raise ValueError(f"trial {name}: 'prediction' is not an object")
        predicted = prediction.get("tokens_per_second")
        rows[name] = (positive_rate(measured, f"trial {name}: steady_tokens_per_second"),
                      None if no_rate(predicted) else
                      positive_rate(predicted, f"trial {name}: prediction.tokens_per_second"))
    return rows


def relative_error(predicted, measured):
    return (predicted - measured) / measured


def noise_floor(runs, bound):
    """The per-run and overall scores of the estimate and of the two oracles over `runs`, a list of
    measured_rows() dicts; rows missing from any run are left out of every score."""
    if len(runs) < 2:
        raise ValueError("needs at least two runs of the same experiment")
    names = sorted(set.intersection(*(set(run) for run in runs)))
    if not names:
        raise ValueError("no ok row is in every run")
    median = {n: statistics.median(run[n][0] for run in runs) for n in names}
    per_run = []
    for run in runs:
        speed = statistics.median(run[n][0] / median[n] for n in names)
        as_predicted = [relative_error(run[n][1], run[n][0]) for n in names if run[n][1]]
        at_median = [relative_error(median[n], run[n][0]) for n in names]
        at_median_and_speed = [relative_error(speed * median[n], run[n][0]) for n in names]
        per_run.append({
            "estimate": sum(abs(e) <= bound for e in as_predicted) if as_predicted else None,
            "median": sum(abs(e) <= bound for e in at_median),
            "median_and_speed": sum(abs(e) <= bound for e in at_median_and_speed),
        })
    spread = {}
    for n in names:
        logs = [math.log(run[n][0]) for run in runs]
        spread[n] = {"min": min(run[n][0] for run in runs), "max": max(run[n][0] for run in runs),
                     "sd_log": statistics.stdev(logs)}
    # A run whose estimate scored no row (None) has not every row.
    every = {key: sum(r[key] == len(names) for r in per_run)
             for key in ("estimate", "median", "median_and_speed")}
    return {"rows": names, "per_run": per_run, "every_row": every, "spread": spread}


def markdown(result, paths, bound):
    n = len(result["rows"])
    pct = round(100 * bound)
    lines = [f"| run | estimate: rows within {pct}% | oracle at each row's median | "
             f"oracle at median x the run's speed |", "|---|---:|---:|---:|"]
    for path, r in zip(paths, result["per_run"]):
        estimate = "-" if r["estimate"] is None else f"{r['estimate']} of {n}"
        lines.append(f"| {path} | {estimate} | {r['median']} of {n} | {r['median_and_speed']} of {n} |")
    every = result["every_row"]
    runs = len(result["per_run"])
    lines += ["", f"Every row within {pct}%: the estimate in {every['estimate']} of {runs} runs, "
              f"the oracle at the median in {every['median']}, at the median and the run's speed in "
              f"{every['median_and_speed']}.", "", "| row | measured tokens/s | sd of log |",
              "|---|---|---:|"]
    for name in result["rows"]:
        s = result["spread"][name]
        lines.append(f"| {name} | {s['min']:,.0f}-{s['max']:,.0f} | {s['sd_log']:.3f} |")
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="llmctl report --format json documents")
    parser.add_argument("--bound", type=float, default=0.2, help="the relative error allowed (0.2)")
    args = parser.parse_args(argv)
    runs = []
    for path in args.reports:
        try:
            with open(path) as f:
                runs.append(measured_rows(json.load(f)))
        except (OSError, ValueError) as e:
            print(f"{path}: not a readable report: {e}", file=sys.stderr)
            return 2
    try:
        result = noise_floor(runs, args.bound)
    except ValueError as e:
        print(f"time_noise_floor: {e}", file=sys.stderr)
        return 2
    print(markdown(result, args.reports, args.bound))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
