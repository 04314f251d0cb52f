#!/usr/bin/env python3
"""Lists a ctest run's skipped tests with their reasons, and fails on any not expected.

Usage: check_skips.py RESULTS.xml EXPECTED_SKIPS

RESULTS.xml is ctest's JUnit file (ctest --output-junit). A test counts as skipped only where it
exited with SKIP_RETURN_CODE (a test binary's main exits so when nothing failed and a GTEST_SKIP
ran, and prints "skip reason: SUITE.TEST: MESSAGE" for each; tests/support/gtest_main.cc).
EXPECTED_SKIPS (tests/expected-skips.txt) holds one expected skip a line: a test name pattern
(fnmatch: * and ?, matched against ctest's name without gtest_discover_tests' "  # GetParam() = ..."
comment) and, after whitespace, why it skips here.
Blank lines and lines starting with # are ignored.

Exit status: 0 when every skipped test matches a pattern, 1 when one does not (each is named, with
its reason), 2 when either file cannot be read or EXPECTED_SKIPS has a line without a reason.
"""
import fnmatch
import re
import sys
import xml.etree.ElementTree as ElementTree

SKIP_REASON = re.compile(r"^skip reason: (.*)$", re.MULTILINE)
# gtest_discover_tests names a parameterized test "SUITE.TEST/PARAM  # GetParam() = VALUE".
PARAM_COMMENT = re.compile(r"\s+# GetParam\(\) = .*$")


class InputError(Exception):
    pass


def read_expected(path):
    """[(pattern, why)] from EXPECTED_SKIPS; InputError naming the line when one is malformed."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as error:
        raise InputError(f"cannot read {path}: {error}") from error
    expected = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        fields = text.split(None, 1)
        if len(fields) < 2:
            raise InputError(f"{path}:{number}: '{text}' has a pattern but no reason after it")
        expected.append((fields[0], fields[1].strip()))
    return expected


def read_skips(path):
    """[(test name, reason)] of the JUnit file's skipped tests, in its order."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as error:
        raise InputError(f"cannot read {path}: {error}") from error
    skips = []
    for case in root.iter("testcase"):
        if case.get("status") != "notrun" or case.find("skipped") is None:
            continue
        output = case.findtext("system-out") or ""
        reasons = SKIP_REASON.findall(output)
        # A discovered test's one reason is "SUITE.TEST: MESSAGE", its own name; a ONE_PROCESS
        # test's are each of its skipped tests'.
        name = PARAM_COMMENT.sub("", case.get("name", "?"))
        prefix = name + ": "
        reasons = [r[len(prefix):] if r.startswith(prefix) else r for r in reasons]
        skips.append((name, "; ".join(reasons) or "(printed no skip reason)"))
    return skips


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    results_path, expected_path = sys.argv[1], sys.argv[2]
    try:
        expected = read_expected(expected_path)
        skips = read_skips(results_path)
    except InputError as error:
        print(f"check_skips: {error}", file=sys.stderr)
        return 2
    unexpected = []
    if skips:
        print(f"\n{len(skips)} tests skipped:")
    for name, reason in skips:
        listed = any(fnmatch.fnmatchcase(name, pattern) for pattern, _ in expected)
        print(f"  {name}: {reason}{'' if listed else '  (not expected)'}")
        if not listed:
            unexpected.append(name)
    if unexpected:
        print(f"check_skips: {len(unexpected)} of the {len(skips)} skipped tests are not listed in "
              f"{expected_path}: a test that cannot run here must fail, or be listed there with "
              f"why it does not apply here: {', '.join(unexpected)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
