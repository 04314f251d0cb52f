#!/usr/bin/env python3
"""Tests for check_torch_headers.py: the command rewrite, and whole runs against small wheels
whose one header compiles with the unit or does not."""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_torch_headers  # noqa: E402

SCRIPT = os.path.join(HERE, "check_torch_headers.py")
OLD = "/venv/lib/python3.11/site-packages/torch/include"


class RewriteTest(unittest.TestCase):
    def test_finds_the_builds_torch_include_root(self):
        command = f"/usr/bin/c++ -I/src -isystem {OLD} -isystem {OLD}/torch/csrc/api/include -c a.cc"
        self.assertEqual(check_torch_headers.build_torch_include(command), OLD)
        self.assertIsNone(check_torch_headers.build_torch_include("/usr/bin/c++ -I/src -c a.cc"))

    def test_syntax_only_swaps_headers_and_drops_output_pch_and_werror(self):
        command = (f"/usr/bin/c++ -isystem {OLD} -isystem {OLD}/torch/csrc/api/include -Werror "
                   "-Winvalid-pch -include /b/CMakeFiles/x_pch.dir/cmake_pch.hxx -o a.o -c /s/a.cc")
        self.assertEqual(
            check_torch_headers.syntax_only(command, OLD, "/new/torch/include"),
            ["/usr/bin/c++", "-isystem", "/new/torch/include", "-isystem",
             "/new/torch/include/torch/csrc/api/include", "-c", "/s/a.cc", "-fsyntax-only"])

    def test_units_leave_out_the_pch_and_units_without_torch(self):
        commands = [
            {"file": "/s/a.cc", "command": f"c++ -isystem {OLD} -c /s/a.cc", "directory": "/b"},
            {"file": "/s/b.cc", "command": "c++ -c /s/b.cc", "directory": "/b"},
            {"file": "/b/pch.hxx.cxx", "command": f"c++ -isystem {OLD} -c x", "directory": "/b"},
        ]
        self.assertEqual([u["file"] for u in check_torch_headers.torch_units(commands, [])],
                         ["/s/a.cc"])
        self.assertEqual(check_torch_headers.torch_units(commands, ["b.cc"]), [])


class RunTest(unittest.TestCase):
    """The script on a one-unit build whose unit calls f(int) from <probe.h>."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="llmctl-torch-headers-test-")
        self.addCleanup(self.dir.cleanup)
        root = self.dir.name
        old = os.path.join(root, "venv", "torch", "include")
        os.makedirs(old)
        with open(os.path.join(old, "probe.h"), "w") as f:
            f.write("inline int f(int x) { return x; }\n")
        with open(os.path.join(root, "unit.cc"), "w") as f:
            f.write("#include <probe.h>\nint g() { return f(1); }\n")
        self.build = os.path.join(root, "build")
        os.makedirs(self.build)
        with open(os.path.join(self.build, "compile_commands.json"), "w") as f:
            json.dump([{"directory": self.build, "file": os.path.join(root, "unit.cc"),
                        "command": f"c++ -isystem {old} -Werror -o unit.o -c {root}/unit.cc"}], f)

    def wheel(self, header):
        path = os.path.join(self.dir.name, "torch-9.9.9-py3-none-any.whl")
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("torch/include/probe.h", header)
        return path

    def run_script(self, wheel):
        return subprocess.run([sys.executable, SCRIPT, "--wheel", wheel, "--build", self.build,
                               "--jobs", "1"], capture_output=True, text=True)

    def test_passes_when_the_other_headers_compile_the_unit(self):
        run = self.run_script(self.wheel("inline int f(long x) { return 2 * x; }\n"))
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("1 of 1 units compile", run.stdout)

    def test_fails_naming_the_unit_that_does_not(self):
        # Two overloads a literal 1 converts to equally well: the call is ambiguous, as 2.11's
        # sum(OptionalIntArrayRef) and sum(DimnameList) were for a braced list.
        run = self.run_script(self.wheel("inline int f(long x) { return 1; }\n"
                                         "inline int f(unsigned x) { return 2; }\n"))
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertIn("FAIL " + os.path.join(self.dir.name, "unit.cc"), run.stdout)
        self.assertIn("ambiguous", run.stdout)

    def test_refuses_a_file_that_is_not_a_torch_wheel(self):
        path = os.path.join(self.dir.name, "other.whl")
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("other/x.h", "")
        run = self.run_script(path)
        self.assertEqual(run.returncode, 2)
        self.assertIn("no torch/include/", run.stderr)


if __name__ == "__main__":
    unittest.main()
