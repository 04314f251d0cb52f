#!/usr/bin/env python3
"""The Hugging Face transformers peer of llm-train, for bench/run_train_bench.py.

Trains LlamaForCausalLM (random init, SDPA attention) on the same JSONL text data, tokenizer, sequence
length, batch size and AdamW settings that the driver gives llm-train, on the same LibTorch, and prints
one JSON object per line on stdout:

  {"type": "start", ...}                         after the model and optimizer exist
  {"type": "step", "step": i, "loss": .., "tokens": .., "seconds": .., "phases": {...}}
  {"type": "result", "tokens_per_second": .., "rss_baseline_bytes": .., "rss_peak_bytes": .., ...}

The step loop mirrors llm-train's (trainer/train/trainer.cc): take the micro-batches, forward, loss (mean
cross-entropy over the label tokens with transformers' shift, logits upcast to fp32), backward, AdamW step,
grads set to None. A step's "seconds" covers all of it, batch assembly included, as llm-train's does.

It can run on its own:
  .venv/bin/python bench/hf_peer_train.py --model bench/models/llama-100m \
      --tokenizer experiments/tokenizers/demo/tokenizer.json --data DATA.jsonl --steps 5
"""

import argparse
import json
import math
import os
import random
import resource
import sys
import time


def rss_bytes():
    """The process's current resident set size, from /proc/self/status (VmRSS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes():
    """The process's peak resident set size so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def learning_rate(peak, step, warmup_steps, total_steps):
    """llm-train's schedule: linear warmup, then cosine decay to zero at the last step."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    decay_steps = total_steps - warmup_steps
    if decay_steps <= 0:
        return peak
    progress = (step - warmup_steps) / decay_steps
    return 0.5 * peak * (1.0 + math.cos(math.pi * progress))


def load_examples(data_path, tokenizer_path, max_seq_length):
    """BOS + text tokens + EOS, truncated to max_seq_length: llm-train's data.format text, template none."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    bos = tokenizer.token_to_id("<s>")
    eos = tokenizer.token_to_id("</s>")
    examples = []
    with open(data_path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            text = json.loads(line)["text"]
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            full = ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])
            examples.append(full[:max_seq_length])
    return examples, (eos if eos is not None else 0)


def make_batch(torch, rows, pad_id):
    """Right-padded input ids and labels (-100 on padding), as llm-train's batch iterator makes them."""
    t_max = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), t_max), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), t_max), -100, dtype=torch.long)
    real = 0
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        labels[i, : len(r)] = input_ids[i, : len(r)]
        real += len(r)
    return input_ids, labels, real


def quantize_decoder_linears(torch, model, double_quant, compute_dtype):
    """Replaces every decoder projection with a bitsandbytes Linear4bit holding its weight in NF4 (blocksize
    64), one module at a time: what from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", ...)) does; lm_head and the embeddings stay unquantised, as there."""
    import bitsandbytes as bnb

    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if not isinstance(child, torch.nn.Linear):
                    continue
                quantized = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                              compute_dtype=compute_dtype, compress_statistics=double_quant,
                                              quant_type="nf4")
                quantized.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False,
                                                     compress_statistics=double_quant, quant_type="nf4")
                if child.bias is not None:
                    quantized.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, name, quantized.to("cpu"))  # .to() quantises
                del child


def add_adapters(torch, model, args):
    from peft import LoraConfig, get_peft_model

    if args.peft == "qlora":
        compute = torch.bfloat16 if args.compute_dtype == "bf16" else torch.float32
        quantize_decoder_linears(torch, model, bool(args.double_quant), compute)
    config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                        target_modules=[t for t in args.lora_targets.split(",") if t], bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="directory with config.json")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json")
    ap.add_argument("--data", required=True, help="JSONL with a 'text' field per line")
    ap.add_argument("--precision", default="32-true", choices=["32-true", "bf16-true"])
    ap.add_argument("--max-seq-length", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--global-batch-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup-steps", type=int, default=0, help="learning-rate warmup (not timing)")
    ap.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.95])
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--optimizer-impl", default="fused", choices=["fused", "foreach", "default"],
                    help="torch.optim.AdamW implementation: fused=True (llm-train uses the same kernel), "
                         "foreach=True, or PyTorch's default choice (the per-tensor loop on CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the model trains (cuda: the first GPU; step times then wait for the GPU)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--peft", default="none", choices=["none", "lora", "qlora"],
                    help="lora: PEFT LoRA adapters over frozen weights; qlora: the same over bitsandbytes "
                         "Linear4bit (NF4) decoder projections, as BitsAndBytesConfig(load_in_4bit) makes them")
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--lora-alpha", type=float, default=8)
    ap.add_argument("--lora-dropout", type=float, default=0.0)
    ap.add_argument("--lora-targets", default="q_proj,v_proj", help="comma-separated module names")
    ap.add_argument("--double-quant", type=int, default=1, help="qlora: bnb_4bit_use_double_quant")
    ap.add_argument("--compute-dtype", default="bf16", choices=["bf16", "fp32"], help="qlora: compute dtype")
    args = ap.parse_args()

    started = time.perf_counter()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    global_batch = args.global_batch_size or args.micro_batch_size
    if global_batch % args.micro_batch_size:
        sys.exit("hf_peer_train: global batch size must be a multiple of the micro-batch size")
    accumulation = global_batch // args.micro_batch_size

    examples, pad_id = load_examples(args.data, args.tokenizer, args.max_seq_length)
    if len(examples) < args.micro_batch_size:
        sys.exit(f"hf_peer_train: {len(examples)} examples, fewer than one micro-batch")

    # Baseline: interpreter, torch, transformers and the tokenized data, before any model tensor exists.
    rss_baseline = rss_bytes()
    peak_before_model = peak_rss_bytes()

    dtype = torch.bfloat16 if args.precision == "bf16-true" else torch.float32
    device = torch.device(args.device)
    config = LlamaConfig.from_pretrained(args.model)
    torch.manual_seed(args.seed)
    # Built directly in the training dtype on the device (as llm-train builds its modules under that
    # default dtype and device), so no fp32 or host copy of the model ever exists.
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if args.peft != "none":
        if args.device != "cpu":
            sys.exit("hf_peer_train: --peft runs on the CPU only (its NF4 path is bitsandbytes' CPU backend)")
        model = add_adapters(torch, model, args)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}[args.optimizer_impl]
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=tuple(args.betas), eps=args.eps,
                                  weight_decay=args.weight_decay, **impl)
    emit({"type": "start", "parameters_total": sum(p.numel() for p in model.parameters()),
          "parameters_trainable": sum(p.numel() for p in params), "peft": args.peft,
          "dtype": str(dtype), "threads": torch.get_num_threads(), "torch_version": torch.__version__,
          "transformers_version": transformers.__version__, "attn_implementation":
          model.config._attn_implementation, "optimizer_impl": args.optimizer_impl,
          "accumulation": accumulation, "examples": len(examples),
          "rss_baseline_bytes": rss_baseline, "rss_peak_before_model_bytes": peak_before_model,
          "rss_after_model_bytes": rss_bytes(), "setup_seconds": time.perf_counter() - started})

    def synchronize():  # a GPU step's time is when its kernels end, not when they were queued
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        # Training's peak, as llm-train reports it: from here on (the load peak is separate there too).
        synchronize()
        torch.cuda.reset_peak_memory_stats()

    rng = random.Random(args.seed)
    order, cursor = [], 0

    def next_rows():
        nonlocal order, cursor
        if cursor >= len(order):
            order = list(range(len(examples)))
            rng.shuffle(order)
            cursor = 0
        rows = [examples[i] for i in order[cursor:cursor + args.micro_batch_size]]
        cursor += args.micro_batch_size
        return rows

    train_seconds, train_tokens = 0.0, 0
    for step in range(args.steps):
        t0 = time.perf_counter()
        lr = learning_rate(args.lr, step, args.warmup_steps, args.steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batches = [make_batch(torch, next_rows(), pad_id) for _ in range(accumulation)]
        label_tokens = [int((labels[:, 1:] != -100).sum()) for _, labels, _ in batches]
        total_labels = sum(label_tokens)
        t_fwd = t_bwd = 0.0
        loss_sum, tokens = 0.0, 0
        for (input_ids, labels, real), n_labels in zip(batches, label_tokens):
            input_ids, labels = input_ids.to(device), labels.to(device)
            a = time.perf_counter()
            loss = model(input_ids=input_ids, labels=labels, use_cache=False).loss
            loss_value = loss.item()  # waits for the forward pass
            b = time.perf_counter()
            (loss * (n_labels / total_labels)).backward()
            synchronize()
            c = time.perf_counter()
            t_fwd += b - a
            t_bwd += c - b
            loss_sum += loss_value * n_labels
            tokens += real
            del loss
        a = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize()
        b = time.perf_counter()
        seconds = b - t0
        train_seconds += seconds
        train_tokens += tokens
        emit({"type": "step", "step": step, "loss": loss_sum / max(1, total_labels), "lr": lr,
              "tokens": tokens, "seconds": seconds,
              "phases": {"batch": seconds - t_fwd - t_bwd - (b - a), "forward": t_fwd,
                         "backward": t_bwd, "optimizer": b - a},
              "rss_bytes": rss_bytes()})

    emit({"type": "result", "outcome": "ok", "steps": args.steps, "train_seconds": train_seconds,
          "tokens_per_second": train_tokens / train_seconds if train_seconds > 0 else 0.0,
          "rss_baseline_bytes": rss_baseline, "rss_peak_bytes": peak_rss_bytes(),
          "rss_end_bytes": rss_bytes(), "wall_seconds": time.perf_counter() - started,
          "cuda_peak_allocated_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
          "cuda_peak_reserved_bytes": torch.cuda.max_memory_reserved() if device.type == "cuda" else None})


if __name__ == "__main__":
    main()
