#!/usr/bin/env python3
"""Writes a synthetic image-caption set in Hugging Face's imagefolder layout, for tests and the demo.

Each image is one shape (circle, square or triangle) of one colour and size on a plain background, and
its caption says so: "a large red circle on a white background". PNG files written with the standard
library alone (zlib), and metadata.jsonl with file_name and text, so nothing is downloaded and no
imaging library is needed.

    scripts/make_caption_set.py OUT_DIR [--count N] [--size PIXELS] [--seed S]
"""
import argparse
import json
import os
import random
import struct
import zlib

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220), "yellow": (240, 210, 30),
           "purple": (140, 50, 170), "orange": (245, 140, 20)}
BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0), "grey": (128, 128, 128)}
SHAPES = ["circle", "square", "triangle"]


def inside(shape, x, y, cx, cy, r):
    """Whether pixel centre (x, y) lies in the shape of half-width r centred at (cx, cy)."""
    dx, dy = x + 0.5 - cx, y + 0.5 - cy
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return abs(dx) <= r and abs(dy) <= r
    # An upward triangle with its base at cy + r and apex at cy - r.
    return -r <= dy <= r and abs(dx) <= (dy + r) / 2


def png(width, height, rows):
    """An 8-bit RGB PNG of `rows` (each a bytes of width * 3)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + row for row in rows)  # filter type 0 per row
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.count < 1 or args.size < 16:
        parser.error("--count must be at least 1 and --size at least 16")
    rng = random.Random(args.seed)
    os.makedirs(os.path.join(args.out_dir, "images"), exist_ok=True)
    rows = []
    for i in range(args.count):
        shape, colour, background = rng.choice(SHAPES), rng.choice(list(COLOURS)), rng.choice(list(BACKGROUNDS))
        large = rng.random() < 0.5
        r = args.size * (0.35 if large else 0.18)
        cx = args.size / 2 + rng.uniform(-0.1, 0.1) * args.size
        cy = args.size / 2 + rng.uniform(-0.1, 0.1) * args.size
        fg, bg = bytes(COLOURS[colour]), bytes(BACKGROUNDS[background])
        pixels = [b"".join(fg if inside(shape, x, y, cx, cy, r) else bg for x in range(args.size))
                  for y in range(args.size)]
        name = f"images/{i:05d}.png"
        with open(os.path.join(args.out_dir, name), "wb") as f:
            f.write(png(args.size, args.size, pixels))
        caption = f"a {'large' if large else 'small'} {colour} {shape} on a {background} background"
        rows.append({"file_name": name, "text": caption})
    with open(os.path.join(args.out_dir, "metadata.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {args.count} captioned images to {args.out_dir}")


if __name__ == "__main__":
    main()
