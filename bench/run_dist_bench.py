#!/usr/bin/env python3
"""llm-train's data parallelism against PyTorch's own, in one run, on this machine's CPU.

For each strategy (ddp, and fsdp where llm-train has it) it trains the same model on the same data, with
the same per-rank micro-batch, on both sides:

  ours   llm-train --nproc N         (trainer/dist's launcher; c10d Gloo; strategy: ddp | fsdp)
  peer   torchrun --nproc_per_node N bench/torch_dist_peer.py   (DistributedDataParallel | fully_shard)

--repeats times, alternating ours and peer so that a slow spell of the machine falls on both, and
prints, side by side, the job's tokens/s (every rank's tokens over the slowest rank's step time, after
the warm-up steps): each side's median, the median of the repeats' ours/peer ratios and their spread
(lowest–highest). Then each rank's peak resident set (VmHWM of each rank process, polled while it runs)
of the first repeat, with ratios; ours also gives each rank's exact allocator peak from its result
event.

It is a benchmark, not a test: nothing asserts a time, and `make test` does not run it.

  .venv/bin/python bench/run_dist_bench.py                       # ddp and fsdp, llama-100m, 2 ranks, 3 repeats
  .venv/bin/python bench/run_dist_bench.py --strategies ddp --steps 4 --model experiments/models/cpu-lab-medium
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import write_dataset  # noqa: E402
from child_run import child_env  # noqa: E402
from run_train_bench import DEFAULT_MODEL, DEFAULT_TOKENIZER, REPO_ROOT, write_experiment  # noqa: E402
from train_bench_report import machine_info, mib, ratio  # noqa: E402


def read_jsonl(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def vm_hwm(pid):
    """A process's peak resident set so far (VmHWM), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def reset_peak(pid):
    """Restarts a process's VmHWM from its current resident set (Linux: clear_refs 5)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_job(argv, env, timeout, trained_a_step):
    """Runs ARGV (a launcher), polling its direct children (the ranks) for their peak RSS until it
    exits. Once TRAINED_A_STEP() says every rank has finished step 0, each rank's peak is read and
    restarted, so that besides the whole run's peak the job also has the training steps' own (a
    model built whole before it is sharded weighs on the first, not the second).
    Returns (exit code, {pid: whole-run peak}, {pid: peak after step 0}, wall seconds, output tail)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks, training = {}, {}
    reset = False
    output = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        ranks = children(proc.pid)
        for child in ranks:
            hwm = vm_hwm(child)
            if hwm is not None:
                peaks[child] = max(peaks.get(child, 0), hwm)
                if reset:
                    training[child] = max(training.get(child, 0), hwm)
        if not reset and ranks and trained_a_step():
            reset = all(reset_peak(child) for child in ranks)
        if time.perf_counter() - started > timeout:
            proc.kill()
        time.sleep(0.05)
    reader.join()
    return proc.returncode, peaks, training, time.perf_counter() - started, "".join(output[-30:])


def finished_step_zero(paths):
    """Whether every one of PATHS (JSONL event files) has a step event for step 0."""
    def check():
        for path in paths:
            if not any(e.get("type") == "step" and e.get("step") == 0 for e in read_jsonl_tolerant(path)):
                return False
        return True
    return check


def read_jsonl_tolerant(path):
    """read_jsonl of a file still being written: a last line cut short is skipped."""
    events = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return events
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return events


def job_throughput(rank_steps, warmup):
    """The job's tokens/s over the measured steps: all ranks' tokens over the slowest rank's seconds."""
    tokens = seconds = 0.0
    steps = sorted({s["step"] for s in rank_steps[0] if s["step"] >= warmup})
    for step in steps:
        per_rank = [next(s for s in steps_of if s["step"] == step) for steps_of in rank_steps]
        tokens += sum(s["tokens"] for s in per_rank)
        seconds += max(s["seconds"] for s in per_rank)
    return tokens / seconds if seconds else float("nan"), len(steps)


def run_ours(args, workdir, data, strategy, env):
    experiment = workdir / f"ours-{strategy}.yaml"
    events = workdir / f"ours-{strategy}.events.jsonl"
    write_experiment(experiment, args, data, args.precision, 10**9)
    with open(experiment, "a") as f:
        f.write(f"strategy: {strategy}\ndevices: {args.nproc}\n")
    paths = [events] + [events.with_name(f"{events.stem}.rank{r}{events.suffix}") for r in range(1, args.nproc)]
    code, peaks, training, wall, tail = run_job(
        [str(args.llm_train), "--config", str(experiment), "--events", str(events), "--nproc", str(args.nproc),
         "--master-port", str(args.port)], env, args.timeout, finished_step_zero(paths))
    ranks = [read_jsonl(p) for p in paths]
    results = [next((e for e in r if e.get("type") == "result"), {}) for r in ranks]
    if code != 0 or any(r.get("outcome") != "ok" for r in results):
        raise RuntimeError(f"llm-train --nproc {args.nproc} ({strategy}) exited {code}:\n{tail}")
    # Rank 0's step events already carry the job's tokens (summed over ranks); every rank's seconds.
    steps = [[e for e in r if e.get("type") == "step"] for r in ranks]
    job_steps = [[dict(s, tokens=s["tokens"] / args.nproc) for s in rank] for rank in steps]
    tps, measured = job_throughput(job_steps, args.warmup_steps)
    start = next(e for e in ranks[0] if e.get("type") == "start")
    return {"tokens_per_second": tps, "measured_steps": measured, "rank_rss_peaks": sorted(peaks.values()),
            "rank_training_rss_peaks": sorted(training.values()),
            "allocator_peaks": [r.get("peak_bytes") for r in results], "wall": wall,
            "parameters": start.get("parameters_total"), "threads": start.get("threads"),
            "last_loss": steps[0][-1]["loss"] if steps[0] else None}


def run_peer(args, workdir, data, strategy, env):
    out = workdir / f"peer-{strategy}"
    out.mkdir(exist_ok=True)
    torchrun = Path(sys.executable).with_name("torchrun")
    argv = [str(torchrun), "--nproc_per_node", str(args.nproc), "--master_port", str(args.port),
            str(Path(__file__).resolve().parent / "torch_dist_peer.py"), "--strategy", strategy,
            "--model", str(args.model), "--tokenizer", str(args.tokenizer), "--data", str(data),
            "--out", str(out), "--precision", args.precision, "--max-seq-length", str(args.seq_len),
            "--micro-batch-size", str(args.micro_batch_size), "--steps", str(args.steps),
            "--lr", str(args.lr), "--seed", str(args.seed)]
    paths = [out / f"rank{r}.jsonl" for r in range(args.nproc)]
    code, peaks, training, wall, tail = run_job(argv, env, args.timeout, finished_step_zero(paths))
    ranks = [read_jsonl(p) for p in paths]
    if code != 0 or any(not any(e.get("type") == "result" for e in r) for r in ranks):
        raise RuntimeError(f"torchrun ({strategy}) exited {code}:\n{tail}")
    steps = [[e for e in r if e.get("type") == "step"] for r in ranks]
    tps, measured = job_throughput(steps, args.warmup_steps)
    start = next(e for e in ranks[0] if e.get("type") == "start")
    return {"tokens_per_second": tps, "measured_steps": measured, "rank_rss_peaks": sorted(peaks.values()),
            "rank_training_rss_peaks": sorted(training.values()),
            "wall": wall, "parameters": start.get("parameters_total"), "threads": start.get("threads"),
            "torch_version": start.get("torch_version"),
            "last_loss": sum(r[-1]["loss"] for r in steps) / len(steps)}


def span(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return mib(lo) if lo == hi else f"{lo / 2**20:,.0f}–{hi / 2**20:,.0f} MiB"


def throughputs(runs):
    return [run["tokens_per_second"] for run in runs]


def report(args, rows, machine):
    out = [f"## {args.nproc} ranks on Gloo: llm-train against PyTorch (torchrun), {args.model.name}, "
           f"{args.precision}, seq {args.seq_len}, micro-batch {args.micro_batch_size} per rank "
           f"(global batch {args.micro_batch_size * args.nproc}), AdamW, {args.threads} thread(s) per rank, "
           f"{args.repeats} repeats (ours and peer alternating)\n",
           "| strategy | ours tok/s (median) | peer tok/s (median) | ratio (median of repeats) | "
           "ratio per repeat (lowest–highest) | ours peak RSS per rank, whole run | peer, whole run | "
           "ratio (max) | ours, after step 0 | peer, after step 0 | ratio (max) | "
           "ours allocator peak per rank |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for strategy, ours_runs, peer_runs in rows:
        ratios = [o / p for o, p in zip(throughputs(ours_runs), throughputs(peer_runs))]
        ours, peer = ours_runs[0], peer_runs[0]
        out.append(f"| {strategy} | {statistics.median(throughputs(ours_runs)):,.0f} | "
                   f"{statistics.median(throughputs(peer_runs)):,.0f} | "
                   f"{statistics.median(ratios):.2f}x | {min(ratios):.2f}–{max(ratios):.2f}x | "
                   f"{span(ours['rank_rss_peaks'])} | {span(peer['rank_rss_peaks'])} | "
                   f"{ratio(max(ours['rank_rss_peaks'], default=None), max(peer['rank_rss_peaks'], default=None))}"
                   f" | {span(ours['rank_training_rss_peaks'])} | {span(peer['rank_training_rss_peaks'])} | "
                   f"{ratio(max(ours['rank_training_rss_peaks'], default=None), max(peer['rank_training_rss_peaks'], default=None))}"
                   f" | {span(ours['allocator_peaks'])} |")
    out.append("")
    for strategy, ours_runs, peer_runs in rows:
        ours, peer = ours_runs[0], peer_runs[0]
        each = ", ".join(f"{o:,.0f}/{p:,.0f}" for o, p in zip(throughputs(ours_runs), throughputs(peer_runs)))
        out.append(f"- {strategy}: tok/s per repeat (ours/peer) {each}; {ours['measured_steps']} measured steps "
                   f"per run; parameters {ours['parameters']:,} (ours) / {peer['parameters']:,} (peer); threads "
                   f"per rank {ours['threads']} / {peer['threads']}; last loss {ours['last_loss']:.4f} / "
                   f"{peer['last_loss']:.4f} (different random weights: only the scale is comparable); "
                   f"wall {ours['wall']:.0f} s / {peer['wall']:.0f} s.")
    out.append(f"\nPeer: torch {rows[0][2][0].get('torch_version')}. Machine: {machine}.")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategies", default="ddp,fsdp", help="comma-separated, from ddp,fsdp")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--threads", type=int, default=None,
                    help="intra-op threads per rank (default: the CPUs divided among the ranks)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="runs per side, alternating (default 3)")
    ap.add_argument("--precision", default="32-true", choices=["32-true", "bf16-true"])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=2, help="per rank")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--port", type=int, default=29531, help="the rendezvous port (both sides)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per job before it is killed")
    ap.add_argument("--llm-train", type=Path, default=REPO_ROOT / "build" / "trainer" / "llm-train")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:
        if s not in ("ddp", "fsdp"):
            sys.exit(f"run_dist_bench: unknown strategy '{s}' (choose from ddp, fsdp)")
    if args.repeats < 1:
        sys.exit(f"run_dist_bench: --repeats must be at least 1, not {args.repeats}")
    if args.warmup_steps >= args.steps:
        sys.exit(f"run_dist_bench: --warmup-steps ({args.warmup_steps}) must be below --steps ({args.steps})")
    if not (args.llm_train.is_file() and os.access(args.llm_train, os.X_OK)):
        sys.exit(f"run_dist_bench: llm-train not found at {args.llm_train}; build it first with `make build`")
    args.llm_train = args.llm_train.resolve()
    args.model, args.tokenizer = args.model.resolve(), args.tokenizer.resolve()
    if not (args.model / "config.json").is_file():
        sys.exit(f"run_dist_bench: no config.json in {args.model}")
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.nproc)
    args.device = "cpu"
    args.global_batch_size = args.micro_batch_size * args.nproc  # write_experiment's, for ours
    machine = machine_info()

    workdir = Path(tempfile.mkdtemp(prefix="llmctl-dist-bench-"))
    env = child_env(args.threads, "inherit", "cpu")
    env["LLMCTL_CACHE_DIR"] = str(workdir / "cache")
    data = workdir / "data.jsonl"
    write_dataset(data, args.tokenizer, max(64, 4 * args.global_batch_size * args.steps), args.seq_len)
    rows = []
    for strategy in strategies:
        ours, peer = [], []
        for repeat in range(1, args.repeats + 1):
            print(f"[{strategy} {repeat}/{args.repeats}] ours: llm-train --nproc {args.nproc} ...",
                  file=sys.stderr, flush=True)
            ours.append(run_ours(args, workdir, data, strategy, env))
            print(f"[{strategy} {repeat}/{args.repeats}] peer: torchrun --nproc_per_node {args.nproc} ...",
                  file=sys.stderr, flush=True)
            peer.append(run_peer(args, workdir, data, strategy, env))
        rows.append((strategy, ours, peer))
    text = report(args, rows, machine)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({s: {"ours": o, "peer": p} for s, o, p in rows}, indent=2) + "\n")
    if args.keep:
        print(f"kept {workdir}", file=sys.stderr)
    else:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
