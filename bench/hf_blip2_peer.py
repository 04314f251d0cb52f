#!/usr/bin/env python3
"""The transformers side of bench/run_blip2_bench.py: BLIP-2 captioning fine-tuning in a plain loop.

Builds Blip2ForConditionalGeneration from a config.json (random init), reads an imagefolder caption set the
way the labs' script does (BlipImageProcessorPil with the model's image size and CLIP's mean/std; the
tokenizer's ids at max_length, BOS first; the image placeholder num_query_tokens times before them, as
Blip2Processor lays them out; labels -100 on the placeholders and the padding) and trains with fused AdamW.
Prints one JSON line per step and a result line:
  {"type": "step", "step": i, "seconds": s, "data_seconds": d, "tokens": n, "loss": x}
  {"type": "result", "rss_peak_bytes": .., "rss_after_imports_bytes": .., "rss_after_model_bytes": ..}
The batches follow a fixed permutation of the seed, not llm-train's order: each side sees batches of the
same size and the same caption lengths on average, which is what time and memory depend on.
"""
import argparse
import json
import os
import random
import resource
import time


def emit(obj):
    print(json.dumps(obj), flush=True)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=50)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoTokenizer, Blip2Config, Blip2ForConditionalGeneration
    from transformers.image_transforms import convert_to_rgb
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    rss_after_imports = rss_bytes()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = Blip2Config.from_pretrained(args.model)
    model = Blip2ForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.0, fused=True)
    rss_after_model = rss_bytes()

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    side = config.vision_config.image_size
    processor = BlipImageProcessorPil(size={"height": side, "width": side},
                                      image_mean=[0.48145466, 0.4578275, 0.40821073],
                                      image_std=[0.26862954, 0.26130258, 0.27577711], do_convert_rgb=True)
    with open(os.path.join(args.data, "metadata.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    order = list(range(len(rows)))
    random.Random(args.seed).shuffle(order)
    placeholders = [config.image_token_index] * config.num_query_tokens
    pad = config.text_config.pad_token_id

    def batch(step):
        picked = [rows[order[(step * args.micro_batch_size + i) % len(rows)]]
                  for i in range(args.micro_batch_size)]
        images = [convert_to_rgb(Image.open(os.path.join(args.data, r["file_name"]))) for r in picked]
        pixel_values = torch.tensor(np.asarray(processor(images, return_tensors="np")["pixel_values"]))
        ids = [placeholders + tokenizer(r["text"], truncation=True, max_length=args.max_length)["input_ids"]
               for r in picked]
        width = max(len(i) for i in ids)
        input_ids = torch.tensor([i + [pad] * (width - len(i)) for i in ids])
        attention_mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
        labels = input_ids.clone()
        labels[:, : config.num_query_tokens] = -100
        labels[attention_mask == 0] = -100
        return pixel_values, input_ids, attention_mask, labels

    for step in range(args.steps):
        started = time.perf_counter()
        pixel_values, input_ids, attention_mask, labels = batch(step)
        data_seconds = time.perf_counter() - started
        loss = model(pixel_values=pixel_values, input_ids=input_ids, attention_mask=attention_mask,
                     labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        emit({"type": "step", "step": step, "seconds": time.perf_counter() - started,
              "data_seconds": data_seconds,
              "tokens": int(attention_mask.sum()), "loss": float(loss)})
    emit({"type": "result", "rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
          "rss_after_imports_bytes": rss_after_imports, "rss_after_model_bytes": rss_after_model})


if __name__ == "__main__":
    main()
