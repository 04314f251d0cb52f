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
import xml.etree.ElementTree as ElementTree

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
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = sys.argv[1]
    limit = int(sys.argv[2]) if len(sys.argv) == 3 else 40
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as error:
        print(f"failed_tests: cannot read {path}: {error}", file=sys.stderr)
        return 1
    failed = [case for case in root.iter("testcase") if case.get("status") == "fail"]
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
