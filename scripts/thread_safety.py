#!/usr/bin/env python3
"""Checks the lock annotations (common/thread_annotations.h) with clang's -Wthread-safety.

Compiles, syntax only, every translation unit of the libraries that do not use LibTorch (common,
controller, agent, rpc; and their binaries' mains) with the flags CMake gave GCC (BUILD/compile_commands.json,
so the generated protobuf headers must have been built), clang's thread-safety warnings as errors
and every other warning off. Exits 1 naming each unit that failed, 2 on a bad argument.

  scripts/thread_safety.py BUILD [--jobs N] [--clang CLANG++]
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import time

LIBRARIES = ("common/", "controller/", "agent/", "rpc/")
# The tests hold no annotated state; leaving them out takes the check from 128 units to 29.
TEST_SUFFIXES = ("_test.cc", "_fuzz.cc", "_fuzz_test.cc")
# -Wthread-safety-precise is off: the dispatcher's parts each hold a reference to the one
# dispatch::DispatcherCore, so clang sees `links_.core_.mutex` and `core_.mutex` as two mutexes where
# there is one. A call with no such mutex held is still an error.
CLANG_FLAGS = ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Wno-thread-safety-precise",
               "-Werror"]


def clang_command(entry, clang):
    """The entry's GCC command as a clang syntax check, or None when it is not one of ours."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    output = args[args.index("-o") + 1] if "-o" in args else ""
    if not output.startswith(LIBRARIES) or any("torch" in arg for arg in args):
        return None
    if entry["file"].endswith(TEST_SUFFIXES) or "/tests/" in entry["file"]:
        return None
    kept = []
    skip = False
    for arg in args[1:]:
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
        else:
            kept.append(arg)
    return [clang] + kept + CLANG_FLAGS


def check(command, directory):
    result = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    return result.returncode, result.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clang", default="clang++")
    options = parser.parse_args()
    database = os.path.join(options.build, "compile_commands.json")
    try:
        with open(database) as file:
            entries = json.load(file)
    except (OSError, ValueError) as error:
        print(f"thread_safety: cannot read {database}: {error} (configure the build first)",
              file=sys.stderr)
        return 2
    units = []
    for entry in entries:
        command = clang_command(entry, options.clang)
        if command is not None:
            units.append((entry["file"], command, entry["directory"]))
    if not units:
        print(f"thread_safety: {database} lists none of {', '.join(LIBRARIES)}", file=sys.stderr)
        return 2
    start = time.monotonic()
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=options.jobs) as pool:
        futures = {pool.submit(check, command, directory): file
                   for file, command, directory in units}
        for future in concurrent.futures.as_completed(futures):
            code, errors = future.result()
            if code != 0:
                failed.append(futures[future])
                sys.stderr.write(errors)
    took = time.monotonic() - start
    print(f"thread_safety: {len(units)} units, {len(failed)} failed, {took:.0f} s")
    for file in sorted(failed):
        print(f"thread_safety: failed: {file}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
