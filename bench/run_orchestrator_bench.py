#!/usr/bin/env python3
"""run_orchestrator_bench.py: what the orchestrator costs against running llm-train by hand.

The peer is what the labs do: run each trial of an experiment file, one after another, with the trainer
directly (`llm-train --config FILE --trial NAME --events FILE`). Ours is the main job: `llmctl submit FILE
--wait` with a fresh embedded controller and agent (daemon start, input upload, one worker process per
trial, events streamed into SQLite, the report). Both run the same trials with the same llm-train binary
in the same run (the peer's token cache is warmed first; the agent keeps its own cache, so ours includes
tokenizing the data once); the script prints both wall times, their ratio, and checks that
both measured the same peak memory per trial (the accounting must not depend on who ran the trainer).
Because trainer times swing by tens of percent on a shared machine (CPU steal), it also prints each side's
time outside the trainer processes: by hand, the total less each llm-train's wall time; ours, the total
less each worker's life (the supervisor's worker.json to exit.json). That is the orchestrator's own cost.
Not a test: nothing asserts a time.

  python3 bench/run_orchestrator_bench.py [--experiment experiments/cpu-lab.yaml] [--build build]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time


def run(command, env, **kwargs):
    return subprocess.run(command, env=env, check=True, text=True, capture_output=True, **kwargs)


def peak_of(events_path):
    peak = 0
    with open(events_path) as events:
        for line in events:
            event = json.loads(line)
            if event.get("type") == "snapshot":
                peak = max(peak, event.get("allocated_bytes", 0))
    return peak


def worker_seconds(runs_dir):
    """The summed lives of the agent's workers: each run's supervisor writes worker.json when it has
    forked the worker and exit.json when the worker has exited."""
    total = 0.0
    for worker in runs_dir.glob("*/*/*/worker.json"):
        total += (worker.parent / "exit.json").stat().st_mtime - worker.stat().st_mtime
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="experiments/cpu-lab.yaml")
    parser.add_argument("--build", default="build")
    args = parser.parse_args()
    build = pathlib.Path(args.build).resolve()
    llm_train = build / "trainer" / "llm-train"
    llmctl = build / "controller" / "cli" / "llmctl"
    with tempfile.TemporaryDirectory(prefix="llmctl-orch-bench-") as scratch:
        scratch = pathlib.Path(scratch)
        env = dict(os.environ, LLMCTL_CACHE_DIR=str(scratch / "cache"), OMP_NUM_THREADS="2")
        env.pop("LLMCTL_CONTROLLER", None)
        trials = [line.split("\t")[0] for line in
                  run([llm_train, "--config", args.experiment, "--list"], env).stdout.splitlines()]
        # Warm the token cache both sides use, so neither pays for tokenizing.
        run([llm_train, "--config", args.experiment, "--trial", trials[0], "--prepare"], env)

        started = time.monotonic()
        direct_peaks = {}
        direct_in_trainer = 0.0
        for trial in trials:
            events = scratch / f"{trial}.jsonl"
            trial_started = time.monotonic()
            subprocess.run([llm_train, "--config", args.experiment, "--trial", trial, "--events", events],
                           env=env, capture_output=True)
            direct_in_trainer += time.monotonic() - trial_started
            direct_peaks[trial] = peak_of(events)
        direct_seconds = time.monotonic() - started

        home = scratch / "home"
        # The embedded daemons of `home`, whatever controller a config file of the user's names.
        ours_env = dict(env, LLMCTL_HOME=str(home), XDG_CONFIG_HOME=str(scratch / "no-config"))
        started = time.monotonic()
        submitted = subprocess.run([llmctl, "submit", args.experiment, "--wait"], env=ours_env,
                                   capture_output=True, text=True)
        ours_seconds = time.monotonic() - started
        ours_in_trainer = worker_seconds(home / "agent" / "runs")
        report = json.loads(run([llmctl, "report", "--format", "json"], ours_env).stdout)
        run([llmctl, "daemon", "stop"], ours_env)
        if submitted.returncode != 0:
            sys.exit("llmctl submit failed:\n" + submitted.stdout[-2000:] + submitted.stderr[-2000:])

    ours_peaks = {t["name"]: (t.get("at_peak") or {}).get("allocated_bytes", 0) for t in report["trials"]}
    same = all(ours_peaks.get(trial) == direct_peaks[trial] for trial in trials)
    print(f"{len(trials)} trials of {args.experiment}")
    print(f"llm-train by hand, one after another: {direct_seconds:.1f} s")
    print(f"llmctl submit --wait (embedded controller + agent, cold start): {ours_seconds:.1f} s")
    print(f"ratio ours / by hand: {ours_seconds / direct_seconds:.3f}")
    print(f"outside the trainer processes: by hand {direct_seconds - direct_in_trainer:.2f} s, "
          f"llmctl {ours_seconds - ours_in_trainer:.2f} s "
          f"({(ours_seconds - ours_in_trainer) * 1000 / len(trials):.0f} ms per trial)")
    print("peak allocated bytes per trial identical on both sides: " + ("yes" if same else "NO"))
    if not same:
        for trial in trials:
            print(f"  {trial}: by hand {direct_peaks[trial]}, llmctl {ours_peaks.get(trial)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
