#!/usr/bin/env python3
"""Writes tokenizer.json files for tokenizer_bench's load figures: large real-shaped and hostile.

make_load_bench_files.py OUTDIR writes, each as OUTDIR/NAME/tokenizer.json:
  byte_bpe_strings  Llama 3's layout (byte-level BPE, Split + ByteLevel, 256 special added tokens)
                    with 256,000 vocabulary entries and 250,000 merges as "left right" strings,
                    pretty-printed as the tokenizers library saves it
  byte_bpe_pairs    the same with merges as ["left", "right"] pairs, as newer files have them
  flat_arrays       hostile: '[' then 13 million '[],' (39 MB), a top-level array
  flat_added_tokens hostile: the same arrays as the added_tokens list of an object
Deterministic (seeded); standard library only.
"""
import json
import os
import random
import sys

VOCAB = 256_000
MERGES = 250_000
HOSTILE_ARRAYS = 13_000_000


def bytes_to_unicode():
    """GPT-2's byte-to-character map, which byte-level BPE vocabularies are written in."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def byte_bpe(pair_merges):
    rng = random.Random(0)
    tokens = bytes_to_unicode()
    known = set(tokens)
    merges = []
    while len(merges) < MERGES:
        # Earlier tokens are shorter: cubing the draw keeps most tokens a few characters long.
        left = tokens[int(len(tokens) * rng.random() ** 3)]
        right = tokens[int(len(tokens) * rng.random() ** 3)]
        merged = left + right
        if merged in known or len(merged) > 16:
            continue
        known.add(merged)
        tokens.append(merged)
        merges.append([left, right] if pair_merges else f"{left} {right}")
    while len(tokens) < VOCAB:
        tokens.append(f"<filler_{len(tokens)}>")
    special = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(254)]
    added = [{"id": VOCAB + i, "content": c, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i, c in enumerate(special)]
    regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def write(outdir, name, text):
    os.makedirs(os.path.join(outdir, name), exist_ok=True)
    with open(os.path.join(outdir, name, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)


def main():
    outdir = sys.argv[1]
    for name, pairs in (("byte_bpe_strings", False), ("byte_bpe_pairs", True)):
        write(outdir, name, json.dumps(byte_bpe(pairs), ensure_ascii=False, indent=2))
    arrays = "[]," * (HOSTILE_ARRAYS - 1) + "[]"
    write(outdir, "flat_arrays", "[" + arrays + "]")
    write(outdir, "flat_added_tokens", '{"added_tokens":[' + arrays + "]}")


if __name__ == "__main__":
    main()
