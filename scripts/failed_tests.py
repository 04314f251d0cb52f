#!/usr/bin/env python3
"""Prints why each failed test of a ctest run failed, from its JUnit file (ctest --output-junit).

Usage: failed_tests.py RESULTS.xml [LINES]. For each failed test: googletest's failure blocks (a
"Failure" line and what follows it up to the next [ RUN ] or [  FAILED  ] line), or, where the
test printed none (a crash, a timeout), the last lines it printed; at most LINES lines a test
(default 40). `make test` runs it last, so the end of a CI log, which is what CI keeps, names the
assertion and its values and not only the test's name.
"""
import re
import sys

from ctest_junit import read_junit

FAILURE = re.compile(r"(: Failure$|^unknown file: Failure|^Failure$)")
END_OF_BLOCK = re.compile(r"^\[ +(RUN|FAILED|OK) +\]")


def failure_lines(output: str, limit: int) -> list[str]:
    lines = output.splitlines()
    picked = []
    inside = False
    for line in lines:
        if FAILURE.search(line):
            inside = True
        elif inside and END_OF_BLOCK.match(line):
            inside = False
        if inside:
            picked.append(line)
    if not picked:
        picked = lines[-limit:]
    if len(picked) > limit:
        picked = picked[:limit] + [f"... ({len(picked) - limit} more lines in the test's output)"]
    return picked


def main() -> int:
    junit = read_junit(sys.argv, __doc__, 40)
    if junit is None:
        return 2
    cases, limit = junit
    failed = [case for case in cases if case.get("status") == "fail"]
    if not failed:
        return 0
    print(f"\nWhy the {len(failed)} failed test{'s' if len(failed) != 1 else ''} failed:")
    for case in failed:
        output = "".join(child.text or "" for child in case if child.tag == "system-out")
        print(f"--- {case.get('name', '?')}")
        for line in failure_lines(output, limit):
            print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
