#!/usr/bin/env python3
"""Tests for check_skips.py, on the JUnit file of a real ctest run.

Usage: check_skips_test.py CTEST GTEST_MAIN_FIXTURE (ctest passes both: tests/support/
CMakeLists.txt).
GTEST_MAIN_FIXTURE is tests/support/gtest_main_fixture.cc's binary, whose LLMCTL_FIXTURE_MODE says
whether its tests pass, skip or fail; each case runs it as llmctl_test registers a test.
"""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK_SKIPS = os.path.join(HERE, "check_skips.py")
CTEST = ""
FIXTURE = ""


def cmake_quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class CheckSkipsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="llmctl-check-skips-")
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def run_ctest(self, modes):
        """Runs the fixture once per mode ({test name: mode}) under ctest, with llmctl_test's
        SKIP_RETURN_CODE; returns ctest's exit status and the JUnit file's path."""
        lines = []
        for name, mode in modes.items():
            lines.append(f"add_test({cmake_quote(name)} {cmake_quote(FIXTURE)})")
            lines.append(f"set_tests_properties({cmake_quote(name)} PROPERTIES "
                         f"ENVIRONMENT \"LLMCTL_FIXTURE_MODE={mode}\" SKIP_RETURN_CODE 77)")
        with open(self.path("CTestTestfile.cmake"), "w", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")
        junit = self.path("results.xml")
        # The fixture's failing modes keep their temporary directory (gtest_main.cc): inside ours.
        ctest = subprocess.run([CTEST, "--test-dir", self.dir.name, "--output-junit", junit],
                               capture_output=True, text=True, check=False,
                               env={**os.environ, "TMPDIR": self.dir.name})
        return ctest.returncode, junit

    def check(self, junit, expected_text):
        expected = self.path("expected-skips.txt")
        with open(expected, "w", encoding="utf-8") as file:
            file.write(expected_text)
        return subprocess.run([sys.executable, CHECK_SKIPS, junit, expected],
                              capture_output=True, text=True, check=False)

    def test_an_expected_skip_is_listed_with_its_reason_and_passes(self):
        code, junit = self.run_ctest({"Passing": "pass", "Skipping": "skip"})
        self.assertEqual(code, 0)
        result = self.check(junit, "# the fixture's\n\nSkip*  it runs nowhere\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("1 tests skipped:", result.stdout)
        self.assertIn("Skipping: FixtureTest.SkipsWhenAsked: nothing to run it on here",
                      result.stdout)
        self.assertNotIn("Passing", result.stdout)

    def test_a_parameterized_name_matches_without_its_getparam_comment(self):
        code, junit = self.run_ctest({"Devices/Fixture.Skips/cuda  # GetParam() = cuda": "skip"})
        self.assertEqual(code, 0)
        result = self.check(junit, "Devices/Fixture.*/cuda  no CUDA device here\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("  Devices/Fixture.Skips/cuda: FixtureTest.SkipsWhenAsked: "
                      "nothing to run it on here\n", result.stdout)

    def test_an_unexpected_skip_fails_naming_it_and_its_reason(self):
        code, junit = self.run_ctest({"Skipping": "skip", "AlsoSkipping": "skip"})
        self.assertEqual(code, 0)
        result = self.check(junit, "AlsoSkipping  listed\n")
        self.assertEqual(result.returncode, 1)
        self.assertIn("Skipping: FixtureTest.SkipsWhenAsked: nothing to run it on here  "
                      "(not expected)", result.stdout)
        self.assertIn("1 of the 2 skipped tests are not listed", result.stderr)
        self.assertIn(": Skipping\n", result.stderr)

    def test_a_failure_beside_a_skip_is_a_failure_not_a_skip(self):
        code, junit = self.run_ctest({"TearDownFails": "skip-then-teardown-fails", "Fails": "fail"})
        self.assertNotEqual(code, 0)
        with open(junit, encoding="utf-8") as file:
            text = file.read()
        self.assertEqual(text.count('status="fail"'), 2, text)
        result = self.check(junit, "")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("skipped", result.stdout)

    def test_a_pattern_without_a_reason_is_refused_with_its_line(self):
        code, junit = self.run_ctest({"Skipping": "skip"})
        self.assertEqual(code, 0)
        result = self.check(junit, "# comment\nSkipping\n")
        self.assertEqual(result.returncode, 2)
        self.assertIn("expected-skips.txt:2: 'Skipping' has a pattern but no reason", result.stderr)

    def test_an_unreadable_results_file_is_refused_with_its_path(self):
        result = self.check(self.path("missing.xml"), "")
        self.assertEqual(result.returncode, 2)
        self.assertIn("cannot read " + self.path("missing.xml"), result.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    CTEST, FIXTURE = sys.argv[1], os.path.abspath(sys.argv[2])
    unittest.main(argv=sys.argv[:1], verbosity=2)
