#!/usr/bin/env python3
"""Syntax-checks this build's LibTorch translation units against another torch's headers.

The GPU machine builds llm-train against the torch its image has (2.11.0 on the H200s, KINDS.md),
not the pinned 2.15 this project builds with here, and a header difference found there costs
minutes of a 15-minute loan. This compiles each translation unit of BUILD's compile_commands.json
that includes LibTorch with -fsyntax-only, that torch's headers in place of the build's and
without the precompiled header, and lists the ones that fail (12-03: trainer/kernels/linear_test.cc's
`sum({0, 1})`, ambiguous under 2.11). No GPU and no second build directory needed.

Usage:
  pip download torch==2.11.0 --no-deps -d /tmp/torch-wheel      # about 530 MB
  scripts/check_torch_headers.py --wheel /tmp/torch-wheel/torch-2.11.0-*.whl [--build build]
      [--jobs 2] [FILE_SUFFIX ...]
FILE_SUFFIX limits the check to units whose path ends so (e.g. trainer/quant/quant.cc).
Exit status: 0 when every unit compiles, 1 when one does not, 2 on bad arguments.
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile

# The build's LibTorch include directories all lie under this part of a path.
TORCH_INCLUDE = "/torch/include"


def build_torch_include(command):
    """The build's LibTorch include root in `command` (.../torch/include), or None."""
    for arg in shlex.split(command):
        path = arg[len("-isystem"):] if arg.startswith("-isystem") else arg
        if path.endswith(TORCH_INCLUDE) or TORCH_INCLUDE + "/" in path:
            return path[: path.index(TORCH_INCLUDE) + len(TORCH_INCLUDE)]
    return None


def syntax_only(command, old_include, new_include):
    """`command` as a syntax check against `new_include`: no output file, no precompiled header
    (built against the other headers), no -Werror (another torch's headers may warn where these
    do not; the GPU check builds with LLMCTL_WERROR=OFF too)."""
    args = shlex.split(command)
    out = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-o" or (arg == "-include" and i + 1 < len(args) and "pch" in args[i + 1]):
            i += 2
            continue
        if arg not in ("-Werror", "-Winvalid-pch"):
            out.append(arg.replace(old_include, new_include))
        i += 1
    return out + ["-fsyntax-only"]


def torch_units(compile_commands, suffixes):
    """The C++ units (not the precompiled header's own) that include LibTorch, those ending in one
    of `suffixes` when any are given."""
    units = []
    for entry in compile_commands:
        if entry["file"].endswith(".cxx") or build_torch_include(entry["command"]) is None:
            continue
        if suffixes and not any(entry["file"].endswith(s) for s in suffixes):
            continue
        units.append(entry)
    return units


def unpack_headers(wheel, into):
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith("torch/include/")]
        if not names:
            raise ValueError(f"{wheel}: no torch/include/ in it (not a torch wheel?)")
        archive.extractall(into, names)
    return os.path.join(into, "torch", "include")


def check(entry, new_include):
    old_include = build_torch_include(entry["command"])
    run = subprocess.run(syntax_only(entry["command"], old_include, new_include),
                         cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], run.returncode, run.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", required=True, help="a torch wheel (.whl) whose headers to use")
    parser.add_argument("--build", default="build", help="the build directory (compile_commands.json)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("suffixes", nargs="*", help="check only units whose path ends so")
    args = parser.parse_args()
    commands_path = os.path.join(args.build, "compile_commands.json")
    try:
        with open(commands_path) as f:
            compile_commands = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check_torch_headers: {commands_path}: {e}", file=sys.stderr)
        return 2
    units = torch_units(compile_commands, args.suffixes)
    if not units:
        print(f"check_torch_headers: no LibTorch unit in {commands_path} matches", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="llmctl-torch-headers-") as scratch:
        try:
            new_include = unpack_headers(args.wheel, scratch)
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            print(f"check_torch_headers: {e}", file=sys.stderr)
            return 2
        failed = []
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for path, code, stderr in pool.map(lambda u: check(u, new_include), units):
                print(("ok   " if code == 0 else "FAIL ") + path, flush=True)
                if code != 0:
                    failed.append(path)
                    print(stderr[-4000:], flush=True)
    print(f"{len(units) - len(failed)} of {len(units)} units compile against "
          f"{os.path.basename(args.wheel)}'s headers")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
