#!/usr/bin/env python3
"""Writes tokenizer.json files for tokenizer_bench's load figures: large real-shaped and hostile.

make_load_bench_files.py OUTDIR writes, each as OUTDIR/NAME/tokenizer.json:
  byte_bpe_strings  Llama 3's layout (byte-level BPE, Split + ByteLevel, 256 special added tokens)
                    with 256,000 vocabulary entries and 250,000 merges as "left right" strings,
                    pretty-printed as the tokenizers library saves it
  byte_bpe_pairs    the same with merges as ["left", "right"] pairs, as newer files have them
  t5_unigram        Flan-T5's layout (the t5_unigram fixture's normalizer, pre-tokenizer, post
                    processor and decoder) with T5's 32,100 Unigram pieces: <pad>, </s>, <unk>,
                    the fixture's 797 real pieces, generated word-like pieces up to 32,000, then
                    <extra_id_99> ... <extra_id_0>, pretty-printed
  flat_arrays       hostile: '[' then 13 million '[],' (39 MB), a top-level array
  flat_added_tokens hostile: the same arrays as the added_tokens list of an object
Deterministic (seeded); standard library only.
"""
import json
import os
import random
import struct
import sys

VOCAB = 256_000
MERGES = 250_000
HOSTILE_ARRAYS = 13_000_000
T5_PIECES = 32_000
T5_EXTRA_IDS = 100
T5_FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                          "fixtures", "tokenizers", "t5_unigram", "tokenizer.json")


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


def t5_unigram():
    with open(T5_FIXTURE, encoding="utf-8") as f:
        layout = json.load(f)
    real = [p for p in layout["model"]["vocab"] if not p[0].startswith("<")]
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz" * 8 + "äöüßéèàçăîșț"
    pieces = [["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0]] + real
    known = {p[0] for p in pieces}
    first_generated, lowest_real = len(pieces), min(p[1] for p in real)
    while len(pieces) < T5_PIECES:
        # Mostly short pieces, about half of them word starts ("▁" prefixed), as in T5's.
        word = "".join(rng.choice(letters) for _ in range(1 + int(11 * rng.random() ** 2)))
        piece = ("▁" if rng.random() < 0.55 else "") + word
        if piece in known:
            continue
        known.add(piece)
        # Scores fall on with the rank; the model stores float32s, which the file prints as doubles.
        rank = (len(pieces) - first_generated) / (T5_PIECES - first_generated)
        score = lowest_real - 6.0 * rank ** 0.5
        pieces.append([piece, struct.unpack("f", struct.pack("f", score))[0]])
    extra = [f"<extra_id_{i}>" for i in reversed(range(T5_EXTRA_IDS))]
    pieces += [[e, 0.0] for e in extra]
    special = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
               "special": True}
    layout["added_tokens"] = (
        [dict(id=i, content=c, **special) for i, c in enumerate(["<pad>", "</s>", "<unk>"])] +
        [dict(id=T5_PIECES + i, content=e, **special) for i, e in enumerate(extra)])
    layout["model"]["vocab"] = pieces
    return layout


def write(outdir, name, text):
    os.makedirs(os.path.join(outdir, name), exist_ok=True)
    with open(os.path.join(outdir, name, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)


def main():
    outdir = sys.argv[1]
    for name, pairs in (("byte_bpe_strings", False), ("byte_bpe_pairs", True)):
        write(outdir, name, json.dumps(byte_bpe(pairs), ensure_ascii=False, indent=2))
    write(outdir, "t5_unigram", json.dumps(t5_unigram(), ensure_ascii=False, indent=2))
    arrays = "[]," * (HOSTILE_ARRAYS - 1) + "[]"
    write(outdir, "flat_arrays", "[" + arrays + "]")
    write(outdir, "flat_added_tokens", '{"added_tokens":[' + arrays + "]}")


if __name__ == "__main__":
    main()
