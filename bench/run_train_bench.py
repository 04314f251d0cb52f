#!/usr/bin/env python3
"""Training throughput and memory: llm-train against Hugging Face transformers on the same LibTorch.

Runs one configuration through both trainers, on the CPU (or with --device cuda on the first GPU), with the
same thread count, data, tokenizer, sequence length, batch size and optimizer settings: the ~110M-parameter
LLaMA in bench/models/llama-100m (random init), full fine-tuning with AdamW, in 32-true (fp32 weights and
AdamW state) and bf16-true (everything bf16). Prints a Markdown table of tokens/s, peak RSS and their
ratios (on a GPU also the allocators' peaks and MFU); see bench/README.md.

  .venv/bin/python bench/run_train_bench.py                       # both precisions, 10 steps each
  .venv/bin/python bench/run_train_bench.py --steps 3 --warmup-steps 1 --precisions 32-true
  .venv/bin/python bench/run_train_bench.py --profile-dir out/profile   # + the fused step's top operators

This is a benchmark, not a test: nothing here asserts a time.
"""

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import write_dataset  # noqa: E402
from profile_summary import summarize  # noqa: E402
from child_run import ChildRun, child_env  # noqa: E402
from train_bench_report import gpu_name, machine_info, mib, model_flops_utilization, report  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_MODEL = BENCH_DIR / "models" / "llama-100m"
DEFAULT_TOKENIZER = REPO_ROOT / "experiments" / "tokenizers" / "demo" / "tokenizer.json"
PRECISIONS = ("32-true", "bf16-true")


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def peft_yaml(args, method):
    if method == "none":
        return ""
    targets = ", ".join(t for t in args.lora_targets.split(",") if t)
    return (f"peft:\n  method: {method}\n  r: {args.lora_r}\n  alpha: {args.lora_alpha}\n"
            f"  targets: [{targets}]\n")


def profile_yaml(output_dir, first_step):
    if output_dir is None:
        return ""
    return (f"output_dir: {json.dumps(str(output_dir))}\n"
            f"profile:\n  steps: 1\n  first_step: {first_step}\n  memory_history: false\n")


def write_experiment(path, args, data_path, precision, snapshot_every, method="none", kernels="fused",
                     max_steps=None, profile_dir=None):
    yaml = f"""# Written by bench/run_train_bench.py.
name: bench-{precision}
description: llm-train vs transformers throughput benchmark
model: {json.dumps(str(args.model))}
init: random
tokenizer: {json.dumps(str(args.tokenizer))}
data:
  path: {json.dumps(str(data_path))}
  format: text
  template: none
  mask_prompt: false
  max_seq_length: {args.seq_len}
train:
  micro_batch_size: {args.micro_batch_size}
  global_batch_size: {args.global_batch_size}
  max_steps: {max_steps or args.steps}
  lr: {args.lr}
  warmup_steps: 0
  betas: [0.9, 0.95]
  eps: 1e-8
  weight_decay: 0.0
precision: {precision}
kernels: {kernels}
optimizer: adamw
device: {args.device}
seed: {args.seed}
snapshot_every: {snapshot_every}
log_every: 1
""" + peft_yaml(args, method) + profile_yaml(profile_dir, args.warmup_steps)
    Path(path).write_text(yaml)


def throughput(steps, warmup):
    measured = [s for s in steps if s["step"] >= warmup]
    seconds = sum(s["seconds"] for s in measured)
    tokens = sum(s["tokens"] for s in measured)
    return (tokens / seconds if seconds > 0 else float("nan")), len(measured), tokens


def measured_cpu(marks, warmup, last_step):
    """CPU seconds the child spent in the measured steps: MARKS maps a step to the child's CPU seconds
    when that step's line arrived, -1 to those at the line just before step 0."""
    end, begin = marks.get(last_step), marks.get(warmup - 1)
    if end is None or begin is None:
        return None
    return end - begin


_OURS_STEP_LINE = re.compile(r"^\[step (\d+)/\d+\]")


def ours_cpu_marks(child):
    marks = {}
    for _, line, cpu in child.lines:
        if line.startswith("[info] dataset"):
            marks[-1] = cpu
        m = _OURS_STEP_LINE.match(line)
        if m:
            marks[int(m.group(1)) - 1] = cpu
    return marks


_PHASE_LINE = re.compile(r"^\[step(\d+)(?:_mb(\d+))?_(phase\d)_\w+\]")


def ours_phases(child, steps, warmup):
    """Mean seconds per phase from the arrival times of llm-train's snapshot lines (--phase-timing)."""
    marks = {}  # step -> list of (phase, micro_batch, time)
    for t, line, _ in child.lines:
        m = _PHASE_LINE.match(line)
        if m:
            marks.setdefault(int(m.group(1)), []).append((m.group(3), int(m.group(2) or 0), t))
    per_step = []
    for s in steps:
        if s["step"] < warmup or s["step"] not in marks:
            continue
        fwd = bwd = 0.0
        last = {}
        for phase, _, t in marks[s["step"]]:
            if phase == "phase1" and "phase0" in last:
                fwd += t - last["phase0"]
            if phase == "phase2" and "phase1" in last:
                bwd += t - last["phase1"]
            last[phase] = t
        if "phase3" not in last or "phase2" not in last:
            continue
        first = marks[s["step"]][0][2]
        opt = last["phase3"] - last["phase2"]
        per_step.append({"batch": max(0.0, s["seconds"] - (last["phase3"] - first)), "forward": fwd,
                         "backward": bwd, "optimizer": opt})
    if not per_step:
        return None
    return {k: statistics.mean(p[k] for p in per_step) for k in per_step[0]}


def predict_ours(args, experiment, workdir):
    """`llmctl estimate`'s tokens/s for an experiment llm-train runs here, at --rates' probe (issue 39: the
    node's own rates against what it measured), with an empty LLMCTL_HOME (no stored runs, nothing measured
    for a trial the probe serves). A failure is the row's note, not the bench's end: on a lent GPU the
    measurement is what the time was for, and the note says why the prediction is missing."""
    command = [str(args.llmctl), "estimate", str(experiment), "--format", "json"]
    if args.rates is not None:
        command += ["--rates", str(args.rates)]
    env = dict(os.environ, LLMCTL_HOME=str(workdir / "llmctl-home"))
    env.pop("LLMCTL_CONTROLLER", None)
    done = subprocess.run(command, capture_output=True, text=True, errors="replace", env=env)

    def missing(note):
        log(f"warning: {experiment.name}: {note}")
        return {"predicted_tokens_per_second": None, "prediction_note": note}

    if done.returncode != 0:
        return missing(f"llmctl estimate failed (exit {done.returncode}): {done.stderr.strip()}")
    try:
        trial = json.loads(done.stdout)["trials"][0]
        time = trial.get("time")
        if not time:
            return {"predicted_tokens_per_second": None, "prediction_note": trial.get("time_reason", "")}
        predicted = float(time["tokens_per_second"])
        if not (math.isfinite(predicted) and predicted > 0):
            raise ValueError(f"tokens_per_second {predicted} is not a finite rate")
        return {"predicted_tokens_per_second": predicted,
                "prediction_note": f"{time.get('rates') or 'the data sheets'}; calibration {time['calibration']}"}
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        return missing(f"llmctl estimate's output is not an estimate ({type(e).__name__}: {e}): "
                       f"{done.stdout[:200]!r}")


def run_ours(args, workdir, data_path, precision, method, env, kernels):
    experiment = workdir / f"ours-{precision}-{method}-{kernels}.yaml"
    events = workdir / f"ours-{precision}-{method}-{kernels}.events.jsonl"
    if events.exists():
        events.unlink()
    write_experiment(experiment, args, data_path, precision, 1 if args.phase_timing else 10**9, method,
                     kernels)
    child = ChildRun([str(args.llm_train), "--config", str(experiment), "--events", str(events)], env,
                     echo=args.verbose)
    parsed = [json.loads(l) for l in events.read_text().splitlines() if l.strip()] if events.exists() else []
    start = next((e for e in parsed if e.get("type") == "start"), {})
    steps = [e for e in parsed if e.get("type") == "step"]
    result = next((e for e in parsed if e.get("type") == "result"), {})
    if child.returncode != 0 or result.get("outcome") != "ok":
        raise RuntimeError(f"llm-train ({precision}) failed with exit code {child.returncode}, outcome "
                           f"{result.get('outcome')!r}: {result.get('error', '')}\n{child.tail()}")
    tps, measured, tokens = throughput(steps, args.warmup_steps)
    snapshots = [e for e in parsed if e.get("type") == "snapshot"]
    prediction = predict_ours(args, experiment, workdir) if args.llmctl is not None else {}
    return {
        **prediction,
        "tokens_per_second": tps,
        "measured_steps": measured,
        "measured_tokens": tokens,
        "peak_rss": child.peak_rss_bytes,
        "allocator_peak": result.get("peak_bytes"),
        "reserved_peak": max((e["reserved_bytes"] for e in snapshots), default=None),
        "load_peak": start.get("load_peak_bytes"),
        "parameters": start.get("parameters_total"),
        "trainable": start.get("parameters_trainable"),
        "threads": start.get("threads"),
        "wall": child.wall_seconds,
        "cpu": child.user_seconds + child.system_seconds,
        "first_loss": steps[0]["loss"] if steps else None,
        "last_loss": steps[-1]["loss"] if steps else None,
        "step_seconds": [s["seconds"] for s in steps],
        "phases": ours_phases(child, steps, args.warmup_steps) if args.phase_timing else None,
        "measured_cpu": measured_cpu(ours_cpu_marks(child), args.warmup_steps, args.steps - 1),
    }


def run_profiled(args, workdir, data_path, precision, method, env):
    """One profiled step of llm-train's `kernels: fused` run (the first after the warm-up steps, which
    create the AdamW state), its Kineto trace kept under --profile-dir and summarised."""
    name = f"{precision}-{method}-fused"
    out_dir = args.profile_dir / name
    experiment = workdir / f"profile-{name}.yaml"
    write_experiment(experiment, args, data_path, precision, 10**9, method, "fused",
                     max_steps=args.warmup_steps + 1, profile_dir=out_dir)
    trace = out_dir / "profile" / f"trace-steps-{args.warmup_steps}-{args.warmup_steps}.json"
    trace.unlink(missing_ok=True)  # a trace of an earlier call must not pass for this one's
    child = ChildRun([str(args.llm_train), "--config", str(experiment)], env, echo=args.verbose)
    if child.returncode != 0 or not trace.is_file():
        raise RuntimeError(f"the profiled llm-train run ({name}) failed with exit code {child.returncode} "
                           f"or wrote no {trace}\n{child.tail()}")
    try:
        return summarize(trace, args.device)
    except ValueError as e:
        raise RuntimeError(str(e)) from e


def ours_baseline_rss(args, workdir, data_path, env):
    """Peak RSS of `llm-train --prepare` on the same experiment: the process with LibTorch loaded and the
    data tokenized (the cache is warm by then), but no model: what a training run holds before BuildModel."""
    experiment = workdir / "ours-baseline.yaml"
    write_experiment(experiment, args, data_path, "32-true", 10**9)
    child = ChildRun([str(args.llm_train), "--config", str(experiment), "--prepare"], env)
    if child.returncode != 0:
        raise RuntimeError(f"llm-train --prepare failed with exit code {child.returncode}\n{child.tail()}")
    return child.peak_rss_bytes


def run_peer(args, data_path, precision, method, env):
    argv = [sys.executable, str(BENCH_DIR / "hf_peer_train.py"), "--model", str(args.model),
            "--tokenizer", str(args.tokenizer), "--data", str(data_path), "--precision", precision,
            "--max-seq-length", str(args.seq_len), "--micro-batch-size", str(args.micro_batch_size),
            "--global-batch-size", str(args.global_batch_size), "--steps", str(args.steps),
            "--lr", str(args.lr), "--threads", str(args.threads), "--seed", str(args.seed),
            "--optimizer-impl", args.peer_optimizer, "--device", args.device, "--peft", method, "--lora-r", str(args.lora_r),
            "--lora-alpha", str(args.lora_alpha), "--lora-targets", args.lora_targets]
    child = ChildRun(argv, env, echo=args.verbose)
    parsed, cpu_marks = [], {}
    for _, line, cpu in child.lines:
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            parsed.append(event)
            if event.get("type") == "start":
                cpu_marks[-1] = cpu
            elif event.get("type") == "step":
                cpu_marks[event["step"]] = cpu
    start = next((e for e in parsed if e.get("type") == "start"), {})
    steps = [e for e in parsed if e.get("type") == "step"]
    result = next((e for e in parsed if e.get("type") == "result"), {})
    if child.returncode != 0 or result.get("outcome") != "ok":
        raise RuntimeError(f"the transformers peer ({precision}) failed with exit code "
                           f"{child.returncode}\n{child.tail()}")
    tps, measured, tokens = throughput(steps, args.warmup_steps)
    measured_steps = [s for s in steps if s["step"] >= args.warmup_steps]
    phases = None
    if measured_steps:
        phases = {k: statistics.mean(s["phases"][k] for s in measured_steps)
                  for k in ("batch", "forward", "backward", "optimizer")}
    return {
        "tokens_per_second": tps,
        "measured_steps": measured,
        "measured_tokens": tokens,
        "peak_rss": child.peak_rss_bytes,
        "baseline_rss": result.get("rss_baseline_bytes"),
        "allocator_peak": result.get("cuda_peak_allocated_bytes"),
        "reserved_peak": result.get("cuda_peak_reserved_bytes"),
        "parameters": start.get("parameters_total"),
        "trainable": start.get("parameters_trainable"),
        "threads": start.get("threads"),
        "wall": child.wall_seconds,
        "cpu": child.user_seconds + child.system_seconds,
        "first_loss": steps[0]["loss"] if steps else None,
        "last_loss": steps[-1]["loss"] if steps else None,
        "step_seconds": [s["seconds"] for s in steps],
        "phases": phases,
        "measured_cpu": measured_cpu(cpu_marks, args.warmup_steps, args.steps - 1),
        "versions": f"torch {start.get('torch_version')}, transformers {start.get('transformers_version')}",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per run (default 10)")
    ap.add_argument("--warmup-steps", type=int, default=2,
                    help="first steps left out of tokens/s (default 2: step 0 creates the AdamW state, "
                         "and llm-train takes memory snapshots in steps 0 and 1)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads for both sides (default 2)")
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="comma-separated, from 32-true,bf16-true (default both)")
    ap.add_argument("--llm-train", type=Path, default=REPO_ROOT / "build" / "trainer" / "llm-train",
                    help="the llm-train binary (default build/trainer/llm-train)")
    ap.add_argument("--markdown", type=Path, help="also write the report to this file")
    ap.add_argument("--json", type=Path, help="also write every figure of both sides to this file")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where both sides train (default cpu; cuda: the first GPU)")
    ap.add_argument("--peak-tflops", type=float, default=0,
                    help="the device's dense bf16 peak in TFLOP/s, for MFU (H100 SXM: 989)")
    ap.add_argument("--peak-tflops-fp32", type=float, default=0,
                    help="the device's fp32 peak in TFLOP/s, for the 32-true rows' MFU (H100 SXM: 67)")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory (config.json)")
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each side this many times, alternating, and report each side's fastest run "
                         "(default 1)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--global-batch-size", type=int, default=None, help="default: the micro-batch size")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--peft", default="none",
                    help="comma-separated, from none,lora,qlora (default none: full fine-tuning); "
                         "the peer uses PEFT, and bitsandbytes' CPU backend for qlora")
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--lora-alpha", type=float, default=16)
    ap.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                    help="comma-separated projections that get adapters (both sides)")
    ap.add_argument("--kernels", default="fused,aten",
                    help="comma-separated llm-train `kernels` settings, each a row against the same peer "
                         "runs (default fused,aten)")
    ap.add_argument("--peer-optimizer", default="fused", choices=["fused", "foreach", "default"],
                    help="the peer's torch.optim.AdamW implementation (default fused, the kernel ours uses)")
    ap.add_argument("--omp-wait-policy", default="inherit", choices=["inherit", "passive", "active"],
                    help="OMP_WAIT_POLICY for both children (default: whatever the environment has). "
                         "passive makes idle OpenMP threads sleep instead of spin, which steadies the "
                         "numbers on a machine shared with other work")
    ap.add_argument("--phase-timing", action="store_true",
                    help="time llm-train's forward/backward/optimizer phases too (runs it with "
                         "snapshot_every 1, which adds a memory snapshot per phase)")
    ap.add_argument("--profile-dir", type=Path,
                    help="also run one profiled step of each `kernels: fused` row (the step after the "
                         "warm-up) and summarise its Kineto trace, kept in this directory: the top 10 CUDA "
                         "kernels, or on the CPU top-level operators, by total time")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory and print it")
    ap.add_argument("--llmctl", type=Path,
                    help="also predict each llm-train row's tokens/s with this llmctl's `estimate` (issue 39)")
    ap.add_argument("--rates", type=Path,
                    help="with --llmctl: the probe to predict at (llm-train --probe's JSON of this device)")
    ap.add_argument("--verbose", action="store_true", help="echo the children's output to stderr")
    args = ap.parse_args()

    args.global_batch_size = args.global_batch_size or args.micro_batch_size
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    methods = [m.strip() for m in args.peft.split(",") if m.strip()]
    kernel_settings = [k.strip() for k in args.kernels.split(",") if k.strip()]
    for k in kernel_settings:
        if k not in ("fused", "aten"):
            sys.exit(f"run_train_bench: unknown --kernels setting '{k}' (choose from fused, aten)")
    for m in methods:
        if m not in ("none", "lora", "qlora"):
            sys.exit(f"run_train_bench: unknown --peft method '{m}' (choose from none, lora, qlora)")
    for p in precisions:
        if p not in PRECISIONS:
            sys.exit(f"run_train_bench: unknown precision '{p}' (choose from {', '.join(PRECISIONS)})")
    if args.repeats < 1:
        sys.exit("run_train_bench: --repeats must be at least 1")
    if args.warmup_steps >= args.steps:
        sys.exit(f"run_train_bench: --warmup-steps ({args.warmup_steps}) must be below --steps ({args.steps})")
    if args.profile_dir is not None and "fused" not in kernel_settings:
        sys.exit("run_train_bench: --profile-dir profiles the `kernels: fused` rows; --kernels has none")
    if args.global_batch_size % args.micro_batch_size:
        sys.exit("run_train_bench: --global-batch-size must be a multiple of --micro-batch-size")
    args.llm_train = args.llm_train if args.llm_train.is_absolute() else (Path.cwd() / args.llm_train)
    if not (args.llm_train.is_file() and os.access(args.llm_train, os.X_OK)):
        sys.exit(f"run_train_bench: llm-train not found at {args.llm_train}; build it first with `make build` "
                 "(or pass --llm-train PATH)")
    if args.rates is not None and args.llmctl is None:
        sys.exit("run_train_bench: --rates is the probe --llmctl predicts at; pass --llmctl too")
    if args.llmctl is not None:
        args.llmctl = args.llmctl.resolve()
        if not (args.llmctl.is_file() and os.access(args.llmctl, os.X_OK)):
            sys.exit(f"run_train_bench: --llmctl {args.llmctl} is not an executable")
    if args.rates is not None:
        args.rates = args.rates.resolve()
        if not args.rates.is_file():
            sys.exit(f"run_train_bench: --rates {args.rates} is not a file")
    args.model = args.model.resolve()
    args.tokenizer = args.tokenizer.resolve()
    if args.profile_dir is not None:
        args.profile_dir = args.profile_dir.resolve()
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    if not (args.model / "config.json").is_file():
        sys.exit(f"run_train_bench: no config.json in {args.model}")
    if not args.tokenizer.is_file():
        sys.exit(f"run_train_bench: tokenizer {args.tokenizer} not found")

    workdir = Path(tempfile.mkdtemp(prefix="llmctl-bench-"))
    try:
        env = child_env(args.threads, args.omp_wait_policy, args.device)
        args.gpu_name = gpu_name() if args.device == "cuda" else None
        env["LLMCTL_CACHE_DIR"] = str(workdir / "cache")  # keep the token cache out of the user's
        data_path = workdir / "data.jsonl"
        count = max(64, args.steps * args.global_batch_size)
        shortest, longest = write_dataset(data_path, args.tokenizer, count, args.seq_len)
        data_info = (f"{count} generated English-like texts of {shortest}–{longest} tokens (BOS + text + EOS "
                     f"with {args.tokenizer.relative_to(REPO_ROOT) if args.tokenizer.is_relative_to(REPO_ROOT) else args.tokenizer}), "
                     f"each truncated to {args.seq_len}: every row is full, no padding")
        log(f"workdir {workdir}; {data_info}")

        machine = machine_info() + f"; OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')}"
        log(f"machine: {machine}")
        ours_baseline = ours_baseline_rss(args, workdir, data_path, env)
        log(f"llm-train baseline RSS (--prepare): {mib(ours_baseline)}")
        rows = []
        for precision, method in [(p, m) for p in precisions for m in methods]:
            label = precision if method == "none" else f"{precision} {method} r{args.lora_r}"
            ours_runs = {k: [] for k in kernel_settings}
            peer_runs = []
            for repeat in range(args.repeats):  # alternating, so slow drifts in load hit both sides
                tag = f"{label}" + (f" (run {repeat + 1}/{args.repeats})" if args.repeats > 1 else "")
                for k in kernel_settings:
                    log(f"{tag}: llm-train kernels {k}, {args.steps} steps ...")
                    ours_runs[k].append(run_ours(args, workdir, data_path, precision, method, env, k))
                    r = ours_runs[k][-1]
                    log(f"{tag}: llm-train kernels {k} {r['tokens_per_second']:,.1f} tok/s, peak RSS "
                        f"{mib(r['peak_rss'])}, step seconds {', '.join(f'{s:.2f}' for s in r['step_seconds'])}")
                log(f"{tag}: transformers peer, {args.steps} steps ...")
                peer_runs.append(run_peer(args, data_path, precision, method, env))
                r = peer_runs[-1]
                log(f"{tag}: peer {r['tokens_per_second']:,.1f} tok/s, peak RSS {mib(r['peak_rss'])}, "
                    f"step seconds {', '.join(f'{s:.2f}' for s in r['step_seconds'])}")
            peer = max(peer_runs, key=lambda r: r["tokens_per_second"])
            peer["mfu"] = model_flops_utilization(args, precision, peer)
            for k in kernel_settings:
                ours = max(ours_runs[k], key=lambda r: r["tokens_per_second"])
                for side, r in (("llm-train", ours), ("peer", peer)):
                    if r["threads"] != args.threads:
                        log(f"warning: {side} ran with {r['threads']} threads, not {args.threads}")
                if method != "qlora" and ours["parameters"] != peer["parameters"]:
                    log(f"warning: parameter counts differ: ours {ours['parameters']}, peer {peer['parameters']}")
                if ours["trainable"] != peer["trainable"]:
                    log(f"warning: trainable counts differ: ours {ours['trainable']}, peer {peer['trainable']}")
                ours["mfu"] = model_flops_utilization(args, precision, ours)
                if k == "fused" and args.profile_dir is not None:
                    log(f"{label}: llm-train kernels fused, one profiled step ...")
                    try:
                        ours["profile"] = run_profiled(args, workdir, data_path, precision, method, env)
                    except (RuntimeError, OSError) as e:  # the rows measured stand without it
                        log(f"warning: {label}: the profiled step failed: {e}")
                        ours["profile_error"] = str(e).splitlines()[0]
                rows.append((f"{label} {k}", ours, peer))

        text = report(args, rows, ours_baseline, data_info, machine)
        print(text)
        if args.markdown:
            args.markdown.write_text(text)
            log(f"wrote {args.markdown}")
        if args.json:
            args.json.write_text(json.dumps({
                "device": args.device, "gpu": args.gpu_name, "machine": machine, "model": str(args.model),
                "seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size,
                "global_batch_size": args.global_batch_size, "steps": args.steps,
                "warmup_steps": args.warmup_steps, "peak_tflops": args.peak_tflops,
                "peak_tflops_fp32": args.peak_tflops_fp32, "ours_baseline_rss": ours_baseline,
                "rows": [{"config": label, "ours": ours, "peer": peer} for label, ours, peer in rows]},
                indent=2) + "\n")
            log(f"wrote {args.json}")
    except RuntimeError as e:
        sys.exit(f"run_train_bench: {e}")
    finally:
        if args.keep:
            print(f"[bench] kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
