#!/usr/bin/env python3
"""Runs the tests that do not link LibTorch under AddressSanitizer, UndefinedBehaviorSanitizer and
LeakSanitizer.

BUILD must be configured with the sanitizer flags (`make sanitize` does it). The script finds, in
BUILD/build.ninja, every test executable that links neither LibTorch nor the trainer (the daemons',
the CLI's, rpc/'s and common/'s tests, and the fuzz corpora's replays), builds them with the
daemons and the CLI that the integration tests start, and runs exactly their ctest tests. Those
tests start the regular build's llm-train (LibTorch, uninstrumented); deploy/'s are left out. Any
sanitizer report fails the test that printed it (UBSan does not recover). Exits 1 when a test
failed, 2 on a bad argument.

  scripts/sanitize.py BUILD [--jobs N] [--trainer-build build]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

# Binaries the integration tests start, built besides the tests.
DAEMONS = ["agent/llm-agent", "controller/llmctld", "controller/cli/llmctl",
           "tests/support/gtest_main_fixture"]
TEST_NAME = re.compile(r"(_test|_fuzz_replay|_fixture)$")
# LibTorch's libraries, or anything of trainer/ (the target itself, or what it links or waits
# for), on a build line: not built here. An uninstrumented LibTorch under ASan is slow and reports
# its own leaks, and trainer/'s few tests without it stay with the trainer's.
TORCH_LINK = re.compile(r"libtorch|libc10|\btrainer/")
# deploy/'s tests run the GPU plan's stages, which build and run the trainer's own tests.
LEFT_OUT = re.compile(r"^deploy/")
ENVIRONMENT = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1",
    "UBSAN_OPTIONS": "print_stacktrace=1",
}


def test_executables(build):
    """The test executables of BUILD/build.ninja outside trainer/ that link no LibTorch, as ninja
    targets."""
    with open(os.path.join(build, "build.ninja"), encoding="utf-8") as f:
        text = f.read()
    targets = []
    for block in text.split("\nbuild ")[1:]:
        first = block.split("\n", 1)[0]
        match = re.match(r"(\S+): CXX_EXECUTABLE_LINKER__", first)
        if not match or TORCH_LINK.search(first) or LEFT_OUT.search(match.group(1)):
            continue
        if TEST_NAME.search(os.path.basename(match.group(1))):
            targets.append(match.group(1))
    return targets


def tests_of(build, executables):
    """The numbers of the ctest tests whose command is one of `executables`."""
    listed = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"],
                            check=True, capture_output=True, text=True)
    wanted = {os.path.realpath(os.path.join(build, e)) for e in executables}
    numbers = []
    for number, test in enumerate(json.loads(listed.stdout)["tests"], start=1):
        command = test.get("command") or []
        if command and os.path.realpath(command[0]) in wanted:
            numbers.append(number)
    return numbers


def borrow_trainer(build, trainer_build):
    """Links TRAINER_BUILD's llm-train into BUILD, where the integration tests look for it: the
    daemons under test are instrumented, the trainer they start is the regular build's."""
    source = os.path.realpath(os.path.join(trainer_build, "trainer", "llm-train"))
    if not os.path.isfile(source):
        print(f"sanitize: {source}: not built (make build); the tests that start llm-train will "
              "fail", file=sys.stderr)
        return
    target = os.path.join(build, "trainer", "llm-train")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(target) or os.path.exists(target):
        os.remove(target)
    os.symlink(source, target)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--trainer-build", default="build",
                        help="the regular build whose llm-train the integration tests start")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.build, "build.ninja")):
        print(f"sanitize: {args.build}/build.ninja: not a configured build", file=sys.stderr)
        return 2
    executables = test_executables(args.build)
    started = time.monotonic()
    subprocess.run(["ninja", "-C", args.build, f"-j{args.jobs}", *executables, *DAEMONS],
                   check=True)
    print(f"sanitize: built {len(executables)} test executables in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    borrow_trainer(args.build, args.trainer_build)
    numbers = tests_of(args.build, executables)
    if not numbers:
        print("sanitize: no tests found", file=sys.stderr)
        return 1
    # By number (-I 0,0,0,N,...): a regular expression of a thousand names is too big for ctest.
    started = time.monotonic()
    ran = subprocess.run(["ctest", "--test-dir", args.build, "--output-on-failure",
                          "-j", str(args.jobs), "-I", "0,0,0," + ",".join(map(str, numbers))],
                         env={**os.environ, **ENVIRONMENT}, check=False)
    print(f"sanitize: {len(numbers)} tests in {time.monotonic() - started:.0f} s", flush=True)
    return 0 if ran.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
