#!/usr/bin/env python3
"""Prints the N slowest tests of a ctest run from its JUnit file (ctest --output-junit).

Usage: slowest_tests.py RESULTS.xml [N]. Prints the total of all tests' times too, so a run's test
stage can be read against the sum of its parts (ctest -j runs them side by side).
"""
import sys

from ctest_junit import read_junit


def main() -> int:
    junit = read_junit(sys.argv, __doc__, 10)
    if junit is None:
        return 2
    cases, count = junit
    times = []
    for case in cases:
        times.append((float(case.get("time", "0")), case.get("name", "?"), case.get("status", "")))
    times.sort(reverse=True)
    total = sum(t for t, _, _ in times)
    print(f"\nThe {min(count, len(times))} slowest of {len(times)} tests "
          f"(all tests' times add up to {total:.0f} s):")
    for seconds, name, status in times[:count]:
        suffix = "" if status in ("run", "") else f"  ({status})"
        print(f"  {seconds:8.1f} s  {name}{suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
