#!/usr/bin/env python3
"""PyTorch's own data parallelism, the peer of `llm-train --nproc N` for bench/run_dist_bench.py.

Started by torchrun (one process per rank, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment),
it trains LlamaForCausalLM (random init, SDPA attention) on the same JSONL text data, tokenizer, sequence
length and AdamW settings as bench/hf_peer_train.py, wrapped the way the labs do it:

  --strategy ddp    torch.nn.parallel.DistributedDataParallel (bucket_cap_mb 25, the default)
  --strategy fsdp   torch.distributed.fsdp.fully_shard on every decoder layer, then on the root (FSDP2,
                    FULL_SHARD: reshard after forward)

over Gloo on the CPU. Each rank reads its shard of the examples the way DistributedSampler does (the
shuffled order, every WORLD_SIZE-th from position RANK) and writes one JSON object per line to
OUT/rank<r>.jsonl:

  {"type": "start", ...}                      after the model and optimizer exist
  {"type": "step", "step": i, "loss": .., "tokens": .., "seconds": ..}   tokens: this rank's
  {"type": "result", "rss_peak_bytes": .., "rss_baseline_bytes": .., ...}
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_peer_train import learning_rate, load_examples, make_batch, peak_rss_bytes, rss_bytes  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", required=True, choices=["ddp", "fsdp"])
    ap.add_argument("--model", required=True, help="directory with config.json")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json")
    ap.add_argument("--data", required=True, help="JSONL with a 'text' field per line")
    ap.add_argument("--out", required=True, type=Path, help="directory for rank<r>.jsonl")
    ap.add_argument("--precision", default="32-true", choices=["32-true", "bf16-true"])
    ap.add_argument("--max-seq-length", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=2, help="per rank")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.95])
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    started = time.perf_counter()
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, LlamaConfig

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = open(args.out / f"rank{rank}.jsonl", "w", encoding="utf-8")

    def emit(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    examples, pad_id = load_examples(args.data, args.tokenizer, args.max_seq_length)
    rss_baseline = rss_bytes()
    dtype = torch.bfloat16 if args.precision == "bf16-true" else torch.float32
    config = LlamaConfig.from_pretrained(args.model)
    torch.manual_seed(args.seed)  # the same initial weights on every rank, as llm-train broadcasts
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.train()
    if args.strategy == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    # fused AdamW is the kernel llm-train calls; FSDP2's DTensor shards take the foreach path instead.
    impl = {"fused": True} if args.strategy == "ddp" else {"foreach": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=tuple(args.betas), eps=args.eps,
                                  weight_decay=0.0, **impl)
    emit({"type": "start", "rank": rank, "world_size": world, "strategy": args.strategy,
          "parameters_total": sum(p.numel() for p in model.parameters()),  # a DTensor's numel is global
          "threads": torch.get_num_threads(), "torch_version": torch.__version__,
          "rss_baseline_bytes": rss_baseline, "setup_seconds": time.perf_counter() - started})

    rng = random.Random(args.seed)
    order, cursor = [], 0

    def next_rows():
        # DistributedSampler's split of one shuffled order: the job's global batch, each rank every
        # world-th example of it.
        nonlocal order, cursor
        take = args.micro_batch_size * world
        if cursor + take > len(order):
            order = list(range(len(examples)))
            rng.shuffle(order)
            cursor = 0
        mine = order[cursor + rank:cursor + take:world]
        cursor += take
        return [examples[i] for i in mine]

    for step in range(args.steps):
        dist.barrier()  # every rank's step starts together, as the collectives make them end together
        t0 = time.perf_counter()
        lr = learning_rate(args.lr, step, 0, args.steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        input_ids, labels, real = make_batch(torch, next_rows(), pad_id)
        loss = model(input_ids=input_ids, labels=labels, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        emit({"type": "step", "step": step, "loss": loss.item(), "tokens": real,
              "seconds": time.perf_counter() - t0, "rss_bytes": rss_bytes()})

    emit({"type": "result", "outcome": "ok", "rss_baseline_bytes": rss_baseline,
          "rss_peak_bytes": peak_rss_bytes(), "wall_seconds": time.perf_counter() - started})
    out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
