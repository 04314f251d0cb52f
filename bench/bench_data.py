"""The benchmarks' training data: deterministic English-like prose, every record far longer than the
sequence length."""

import json
import random

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
