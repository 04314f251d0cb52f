#!/usr/bin/env python3
"""BLIP-2 captioning fine-tuning: llm-train against transformers on the same LibTorch, side by side.

One configuration (default: experiments/models/cpu-lab-blip2-small, a ViT over 224 x 224 images, a Q-Former
and OPT, random init, fp32, micro-batch 4, AdamW) on experiments/data/captions, trained by
build/trainer/llm-train and by bench/hf_blip2_peer.py (Blip2ForConditionalGeneration in a plain loop,
fused AdamW), each in its own process with the same threads. Both step times include making the batch
(decoding, resizing and normalising the images, tokenizing on the peer's side; llm-train tokenized the
captions once beforehand). Prints tokens/s (placeholder and caption tokens, padding excluded, after the
warm-up steps) and peak resident memory of each side, whole and above what the process holds before it
builds a model (llm-train: its RSS with LibTorch loaded, `llm-train --keys`; the peer: after importing
torch, transformers and PIL), and their ratios. A benchmark, not a test.

    .venv/bin/python bench/run_blip2_bench.py [--steps 8] [--warmup-steps 2] [--threads 2] [--repeats 1]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_run import HEAP_TUNABLES  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))


def run(command, env, stdout_path):
    """Runs `command`; returns its exit code and its peak resident set size in bytes."""
    with open(stdout_path, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024


def tokens_per_second(steps, warmup):
    timed = [s for s in steps if s["step"] >= warmup]
    return sum(s["tokens"] for s in timed) / sum(s["seconds"] for s in timed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-train", default=os.path.join(ROOT, "build", "trainer", "llm-train"))
    parser.add_argument("--model", default=os.path.join(ROOT, "experiments", "models", "cpu-lab-blip2-small"))
    parser.add_argument("--tokenizer", default=os.path.join(ROOT, "experiments", "tokenizers", "captions"))
    parser.add_argument("--data", default=os.path.join(ROOT, "experiments", "data", "captions"))
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads), CUDA_VISIBLE_DEVICES="",
               GLIBC_TUNABLES=HEAP_TUNABLES)
    best = {}
    _, llm_train_baseline = run([args.llm_train, "--keys"], env, os.devnull)
    with tempfile.TemporaryDirectory(prefix="blip2-bench-") as tmp:
        env["LLMCTL_CACHE_DIR"] = os.path.join(tmp, "cache")
        experiment = os.path.join(tmp, "blip2.yaml")
        with open(experiment, "w") as f:
            json.dump({"name": "blip2-bench", "model": args.model, "init": "random", "tokenizer": args.tokenizer,
                       "data": {"path": args.data, "format": "imagefolder", "max_seq_length": 50},
                       "train": {"micro_batch_size": args.micro_batch_size, "max_steps": args.steps,
                                 "lr": 5e-6, "betas": [0.9, 0.95]},
                       "precision": "32-true", "optimizer": "adamw", "device": "cpu",
                       "snapshot_every": 0}, f)  # JSON is YAML
        for repeat in range(args.repeats):
            events = os.path.join(tmp, f"events-{repeat}.jsonl")
            code, rss = run([args.llm_train, "--config", experiment, "--events", events], env,
                            os.path.join(tmp, "llm-train.out"))
            if code != 0:
                sys.exit("llm-train failed:\n" + open(os.path.join(tmp, "llm-train.out")).read())
            lines = [json.loads(line) for line in open(events)]
            ours = {"tokens_per_second": tokens_per_second([e for e in lines if e["type"] == "step"],
                                                           args.warmup_steps),
                    "rss_peak_bytes": rss, "rss_base_bytes": llm_train_baseline,
                    "allocator_peak_bytes": max(e.get("peak_bytes", 0) for e in lines if e["type"] == "step")}
            peer_out = os.path.join(tmp, "peer.out")
            code, rss = run([sys.executable, os.path.join(ROOT, "bench", "hf_blip2_peer.py"), "--model", args.model,
                             "--tokenizer", args.tokenizer, "--data", args.data,
                             "--micro-batch-size", str(args.micro_batch_size), "--steps", str(args.steps),
                             "--threads", str(args.threads)], env, peer_out)
            if code != 0:
                sys.exit("peer failed:\n" + open(peer_out).read())
            lines = [json.loads(line) for line in open(peer_out) if line.startswith("{")]
            peer = {"tokens_per_second": tokens_per_second([e for e in lines if e["type"] == "step"],
                                                           args.warmup_steps),
                    "rss_peak_bytes": rss,
                    "rss_base_bytes": [e for e in lines if e["type"] == "result"][0]["rss_after_imports_bytes"]}
            for side, result in (("llm-train", ours), ("transformers", peer)):
                if side not in best or result["tokens_per_second"] > best[side]["tokens_per_second"]:
                    best[side] = result
    ours, peer = best["llm-train"], best["transformers"]
    mib = 1 << 20
    print(f"BLIP-2 ({os.path.basename(args.model)}), fp32 AdamW, micro-batch {args.micro_batch_size}, "
          f"{args.steps} steps ({args.warmup_steps} warm-up), {args.threads} threads, best of {args.repeats}")
    def above(side):
        return side["rss_peak_bytes"] - side["rss_base_bytes"]
    print(f"{'':14}{'tokens/s':>10}{'peak RSS MiB':>14}{'above base MiB':>16}")
    for name, side in (("llm-train", ours), ("transformers", peer)):
        print(f"{name:14}{side['tokens_per_second']:>10.1f}{side['rss_peak_bytes'] / mib:>14.1f}"
              f"{above(side) / mib:>16.1f}")
    print(f"{'ratio':14}{ours['tokens_per_second'] / peer['tokens_per_second']:>9.2f}x"
          f"{ours['rss_peak_bytes'] / peer['rss_peak_bytes']:>13.2f}x{above(ours) / above(peer):>15.2f}x")
    print(f"llm-train's allocator peak in training: {ours['allocator_peak_bytes'] / mib:.1f} MiB")


if __name__ == "__main__":
    main()
