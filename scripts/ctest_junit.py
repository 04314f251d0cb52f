"""Reads ctest's JUnit file (ctest --output-junit): the one place the scripts that summarise a
`make test` run (slowest_tests.py, failed_tests.py) parse it."""
import sys
import xml.etree.ElementTree as ElementTree


def read_junit(argv: list[str], usage: str, default_count: int):
    """(the file's test cases, the optional count argument) from `argv` = [script, RESULTS.xml,
    [N]]; None, after printing the usage or the reason to stderr, when they cannot be had."""
    if len(argv) not in (2, 3):
        print(usage.strip(), file=sys.stderr)
        return None
    try:
        count = int(argv[2]) if len(argv) == 3 else default_count
        root = ElementTree.parse(argv[1]).getroot()
    except ValueError as error:
        print(f"{argv[0]}: the count must be a whole number: {error}", file=sys.stderr)
        return None
    except (OSError, ElementTree.ParseError) as error:
        print(f"{argv[0]}: cannot read {argv[1]}: {error}", file=sys.stderr)
        return None
    return list(root.iter("testcase")), count
