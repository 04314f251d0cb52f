#!/usr/bin/env python3
"""Training throughput and memory: llm-train against Hugging Face transformers on the same LibTorch.

Runs one configuration through both trainers, on the CPU (or with --device cuda on the first GPU), with the
same thread count, data, tokenizer, sequence length, batch size and optimizer settings: the ~110M-parameter
LLaMA in bench/models/llama-100m (random init), full fine-tuning with AdamW, in 32-true (fp32 weights and
AdamW state) and bf16-true (everything bf16). Prints a Markdown table of tokens/s, peak RSS and their
ratios (on a GPU also the allocators' peaks and MFU); see bench/README.md.

  .venv/bin/python bench/run_train_bench.py                       # both precisions, 10 steps each
  .venv/bin/python bench/run_train_bench.py --steps 3 --warmup-steps 1 --precisions 32-true

This is a benchmark, not a test: nothing here asserts a time.
"""

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_MODEL = BENCH_DIR / "models" / "llama-100m"
DEFAULT_TOKENIZER = REPO_ROOT / "experiments" / "tokenizers" / "demo" / "tokenizer.json"
PRECISIONS = ("32-true", "bf16-true")

# ---------------------------------------------------------------------------------------------------
# Data: deterministic English-like prose, every record far longer than the sequence length.

_NOUNS = """river garden window teacher market village engine letter mountain question harvest kitchen
station library winter morning journey captain doctor student farmer bridge forest island machine
story problem answer company history science weather season valley harbor castle painting message
number pattern signal voice shadow meadow lantern compass mirror ladder blanket orchard workshop
council festival summer evening traveler merchant sailor soldier writer painter builder engineer
museum theater hospital factory school office garden field road city country ocean desert cloud""".split()
_VERBS = """carried opened followed answered described noticed gathered repaired measured explained
visited watched painted counted built crossed remembered discovered prepared collected studied
returned wondered promised finished started reached covered wrote read found kept left brought
moved changed turned showed played called asked told gave made took""".split()
_ADJECTIVES = """quiet bright narrow ancient careful patient heavy gentle sudden distant golden hidden
simple strange familiar wooden silver early late small large warm cold green empty crowded steady
honest clever tired busy open""".split()
_ADVERBS = """slowly quickly carefully quietly suddenly finally easily often never always rarely
gladly softly boldly""".split()
_PLACES = """near the river|across the valley|behind the old mill|under the bridge|inside the station|
beside the harbor|along the narrow road|at the edge of the forest|in the middle of the market|
on the far side of the island""".replace("\n", "").split("|")
_CONNECTORS = ["and then", "because", "although", "while", "so", "but", "after", "before", "until"]


def _sentence(rng):
    subject = f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    obj = f"a {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    clause = f"{subject} {rng.choice(_ADVERBS)} {rng.choice(_VERBS)} {obj} {rng.choice(_PLACES)}"
    if rng.random() < 0.6:
        other = (f"the {rng.choice(_NOUNS)} {rng.choice(_VERBS)} the {rng.choice(_NOUNS)}"
                 f" in {rng.randint(2, 1999)}")
        clause += f" {rng.choice(_CONNECTORS)} {other}"
    return clause[0].upper() + clause[1:] + rng.choice([".", ".", ".", "!", "?"])


def make_texts(count, min_words, seed=1234):
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        sentences, words = [], 0
        while words < min_words:
            s = _sentence(rng)
            sentences.append(s)
            words += len(s.split())
        texts.append(" ".join(sentences))
    return texts


def write_dataset(path, tokenizer_path, count, seq_len):
    """Writes COUNT records of {"text": ...}; checks every one tokenizes to more than SEQ_LEN tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    min_words = max(64, seq_len)  # at least ~1 token per word; checked below
    while True:
        texts = make_texts(count, min_words)
        lengths = [len(tokenizer.encode(t, add_special_tokens=False).ids) + 2 for t in texts]
        if min(lengths) > seq_len:
            break
        min_words *= 2
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return min(lengths), max(lengths)


# ---------------------------------------------------------------------------------------------------
# Running a child: stdout lines time-stamped as they arrive, stderr kept, peak RSS from wait4.


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of a live process, all its threads (from /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime: fields 14, 15
    except (OSError, IndexError, ValueError):
        return None


class ChildRun:
    def __init__(self, argv, env, echo=False):
        self.argv = argv
        self.lines = []  # (perf_counter seconds, line, child CPU seconds so far)
        self.stderr_lines = []
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                bufsize=1)

        def pump(stream, sink, stamp):
            for line in stream:
                line = line.rstrip("\n")
                # Stdout lines carry their arrival time and the child's CPU seconds at that moment.
                sink.append((time.perf_counter(), line, cpu_seconds(proc.pid)) if stamp else line)
                if echo:
                    print(f"    | {line}", file=sys.stderr, flush=True)

        readers = [threading.Thread(target=pump, args=(proc.stdout, self.lines, True), daemon=True),
                   threading.Thread(target=pump, args=(proc.stderr, self.stderr_lines, False), daemon=True)]
        for r in readers:
            r.start()
        # Wait for the exit without reaping, so /proc/PID stays readable until the readers are done.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        self.wall_seconds = time.perf_counter() - started
        for r in readers:
            r.join()
        _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # keeps Popen from waiting again
        self.returncode = proc.returncode
        self.peak_rss_bytes = rusage.ru_maxrss * 1024  # KiB on Linux
        self.user_seconds = rusage.ru_utime
        self.system_seconds = rusage.ru_stime

    def tail(self, n=15):
        out = [l for _, l, _ in self.lines[-n:]] + self.stderr_lines[-n:]
        return "\n".join("    " + l for l in out)


def child_env(threads, wait_policy, device):
    env = dict(os.environ)
    if wait_policy != "inherit":
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env["OPENBLAS_NUM_THREADS"] = str(threads)  # numpy's OpenBLAS, loaded by transformers in the peer
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU benchmark: neither side may touch a GPU
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


# ---------------------------------------------------------------------------------------------------
# Both sides.


def peft_yaml(args, method):
    if method == "none":
        return ""
    targets = ", ".join(t for t in args.lora_targets.split(",") if t)
    return (f"peft:\n  method: {method}\n  r: {args.lora_r}\n  alpha: {args.lora_alpha}\n"
            f"  targets: [{targets}]\n")


def write_experiment(path, args, data_path, precision, snapshot_every, method="none", kernels="fused"):
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
  max_steps: {args.steps}
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
""" + peft_yaml(args, method)
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
    return {
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


# ---------------------------------------------------------------------------------------------------
# Report.


def mib(n):
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def percent(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def model_flops_utilization(args, precision, side):
    """6 · N · tokens/s over the device's dense peak for the precision (None without a peak)."""
    peak = args.peak_tflops if precision.startswith("bf16") else args.peak_tflops_fp32
    if not peak or not side["parameters"] or side["tokens_per_second"] != side["tokens_per_second"]:
        return None
    return 6 * side["parameters"] * side["tokens_per_second"] / (peak * 1e12)


def ratio(a, b, fmt="{:.2f}x"):
    if a is None or b is None or not b or a != a or b != b:
        return "n/a"
    return fmt.format(a / b)


def gpu_name():
    """The first GPU's name as nvidia-smi reports it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out.splitlines()[0] if out else "GPU (nvidia-smi unavailable)"


def machine_info():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} logical CPUs, load average {load}"


def report(args, rows, ours_baseline, data_info, machine):
    out = []
    out.append(f"## llm-train vs transformers: {args.model.name}, seq {args.seq_len}, micro-batch "
               f"{args.micro_batch_size}, global batch {args.global_batch_size}, AdamW, "
               f"{'CPU, ' + str(args.threads) + ' thread(s)' if args.device == 'cpu' else args.gpu_name}"
               + (f", best of {args.repeats} runs per side" if args.repeats > 1 else "")
               + (f"; adapters: alpha {args.lora_alpha:g} on {args.lora_targets} (peer: PEFT, "
                  "bitsandbytes for qlora)" if args.peft != "none" else "") + "\n")
    out.append("| config | ours tok/s | peer tok/s | ratio (ours/peer) | ours peak RSS | peer peak RSS | "
               "ratio | ours peak − baseline | peer peak − baseline | ratio | ours allocator peak¹ |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for precision, ours, peer in rows:
        ours_net = ours["peak_rss"] - ours_baseline
        peer_net = peer["peak_rss"] - peer["baseline_rss"] if peer["baseline_rss"] else None
        out.append(
            f"| {precision} | {ours['tokens_per_second']:,.0f} | {peer['tokens_per_second']:,.0f} | "
            f"{ratio(ours['tokens_per_second'], peer['tokens_per_second'])} | "
            f"{mib(ours['peak_rss'])} | {mib(peer['peak_rss'])} | {ratio(ours['peak_rss'], peer['peak_rss'])} | "
            f"{mib(ours_net)} | {mib(peer_net)} | {ratio(ours_net, peer_net)} | {mib(ours['allocator_peak'])} |")
    out.append("")
    out.append("Tokens/s: non-padding input tokens of the measured steps over their summed step times "
               f"(the first {args.warmup_steps} step(s) of {args.steps} are warm-up and not counted; "
               "a step's time covers batch assembly, forward, loss, backward and the optimizer step, "
               "on both sides). Ratio > 1 means llm-train is faster / uses more memory.")
    out.append("")
    out.append("Peak RSS: the child process's resident-set high-water mark (`ru_maxrss` from `wait4`): "
               "everything the process touched, tensors, allocator slack, libraries, and for the peer the "
               "Python interpreter, torch's Python modules and transformers. "
               f"Baseline: the RSS before any model tensor exists — ours {mib(ours_baseline)} (peak RSS "
               "of `llm-train --prepare` on the same experiment: LibTorch loaded, data tokenized, no "
               "model), the peer's as it reports it just before building the model "
               f"({', '.join(mib(p['baseline_rss']) + ' for ' + pr for pr, _, p in rows)}). "
               "Peak − baseline is the fairest memory comparison: what training itself added.")
    out.append("")
    out.append("¹ Allocator peak: llm-train's exact high-water mark of LibTorch CPU tensor bytes during "
               "training (its counting allocator, the `result` event's `peak_bytes`); it excludes "
               "oneDNN/BLAS scratch, malloc slack and code. The peer has no such counter.")
    if args.device == "cuda":
        out.append("")
        out.append("| config | ours GPU peak | peer GPU peak | ratio | ours reserved | peer reserved | ratio | "
                   "ours MFU | peer MFU |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for precision, ours, peer in rows:
            out.append(f"| {precision} | {mib(ours['allocator_peak'])} | {mib(peer['allocator_peak'])} | "
                       f"{ratio(ours['allocator_peak'], peer['allocator_peak'])} | {mib(ours['reserved_peak'])} | "
                       f"{mib(peer['reserved_peak'])} | {ratio(ours['reserved_peak'], peer['reserved_peak'])} | "
                       f"{percent(ours['mfu'])} | {percent(peer['mfu'])} |")
        out.append("")
        out.append("GPU peak: each side's CUDA caching-allocator high-water mark of allocated bytes during "
                   "training (llm-train's `result` peak_bytes; the peer's torch.cuda.max_memory_allocated() "
                   "after a reset once the model and optimizer exist); reserved: what the allocator held. "
                   f"MFU = 6 · N · tokens/s / peak, N = all parameters (embeddings included, attention's "
                   f"own FLOPs not counted), peak {args.peak_tflops:g} TFLOP/s for bf16 rows and "
                   f"{args.peak_tflops_fp32:g} TFLOP/s for fp32 rows (dense, no sparsity).")
    out.append("")
    out.append("| config | side | params | threads | process wall s | process CPU s | measured steps: "
               "wall s | CPU s | tok per CPU-s | first loss | last loss |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for precision, ours, peer in rows:
        for side, r in (("ours", ours), ("peer", peer)):
            fl = "n/a" if r["first_loss"] is None else f"{r['first_loss']:.4f}"
            ll = "n/a" if r["last_loss"] is None else f"{r['last_loss']:.4f}"
            wall = sum(r["step_seconds"][args.warmup_steps:])
            cpu = r["measured_cpu"]
            cpu_text = "n/a" if cpu is None else f"{cpu:.1f}"
            per_cpu = "n/a" if not cpu else f"{r['measured_tokens'] / cpu:,.0f}"
            out.append(f"| {precision} | {side} | {r['parameters']:,} | {r['threads']} | {r['wall']:.1f} | "
                       f"{r['cpu']:.1f} | {wall:.1f} | {cpu_text} | {per_cpu} | {fl} | {ll} |")
    out.append("")
    out.append("Process wall/CPU: the whole child, start-up and model building included. Measured steps: "
               "the steps counted in tokens/s; their CPU seconds (all threads, read from /proc as each "
               "step's line arrives) are less sensitive than wall time to other load on a shared "
               "machine, though OpenMP threads spinning at barriers count as CPU time too.")
    if any(o["phases"] or p["phases"] for _, o, p in rows):
        out.append("")
        out.append("Mean seconds per measured step, by phase"
                   + ("" if args.phase_timing else " (ours: run with --phase-timing)") + ":")
        out.append("")
        out.append("| config | side | batch | forward (+loss) | backward | optimizer | step |")
        out.append("|---|---|---:|---:|---:|---:|---:|")
        for precision, ours, peer in rows:
            for side, r in (("ours", ours), ("peer", peer)):
                ph = r["phases"]
                if not ph:
                    continue
                out.append(f"| {precision} | {side} | {ph['batch']:.3f} | {ph['forward']:.3f} | "
                           f"{ph['backward']:.3f} | {ph['optimizer']:.3f} | {sum(ph.values()):.3f} |")
        if args.phase_timing:
            out.append("")
            out.append("Ours are read from the arrival times of llm-train's per-phase snapshot lines "
                       "(snapshot_every 1), so its phases include taking a memory snapshot.")
    out.append("")
    out.append(f"Data: {data_info}. Peer: {rows[0][2]['versions']}, LlamaForCausalLM with "
               f"attn_implementation=sdpa, torch.optim.AdamW({'fused=True' if args.peer_optimizer == 'fused' else args.peer_optimizer}). "
               f"llm-train: {args.llm_train}. Machine: {machine} (at the start).")
    return "\n".join(out) + "\n"


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
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory and print it")
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
    if args.global_batch_size % args.micro_batch_size:
        sys.exit("run_train_bench: --global-batch-size must be a multiple of --micro-batch-size")
    args.llm_train = args.llm_train if args.llm_train.is_absolute() else (Path.cwd() / args.llm_train)
    if not (args.llm_train.is_file() and os.access(args.llm_train, os.X_OK)):
        sys.exit(f"run_train_bench: llm-train not found at {args.llm_train}; build it first with `make build` "
                 "(or pass --llm-train PATH)")
    args.model = args.model.resolve()
    args.tokenizer = args.tokenizer.resolve()
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
        log = lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True)
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
