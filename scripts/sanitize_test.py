#!/usr/bin/env python3
"""Tests for sanitize.py's choice of test executables, on a small build.ninja, then its refusal of
a directory that is not a build."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sanitize  # noqa: E402

# Link lines as CMake's Ninja generator writes them: the target, its rule, then its inputs.
BUILD_NINJA = """\
rule CXX_EXECUTABLE_LINKER__x

build rpc/rpc_tls_test: CXX_EXECUTABLE_LINKER__rpc_tls_test_RelWithDebInfo a.o | rpc/libllmctl_rpc.a
  FLAGS = -O2

build trainer/trainer_model_test: CXX_EXECUTABLE_LINKER__trainer_model_test b.o | trainer/libllmctl_trainer.a
  FLAGS = -O2

build trainer/dist/dist_rank_env_test: CXX_EXECUTABLE_LINKER__rank e.o | trainer/dist/libllmctl_rank_launch.a
  FLAGS = -O2

build controller/cli/cli_estimate_test: CXX_EXECUTABLE_LINKER__est f.o | common/libllmctl_common.a || trainer/CMakeFiles/llmctl_torch_pch
  FLAGS = -O2

build deploy/gpu_check_test: CXX_EXECUTABLE_LINKER__gpu g.o | common/libllmctl_common.a
  FLAGS = -O2

build common/store_test: CXX_EXECUTABLE_LINKER__store_test c.o | /venv/torch/lib/libtorch_cpu.so
  FLAGS = -O2

build common/tokenizer/tokenizer_fuzz_replay: CXX_EXECUTABLE_LINKER__replay d.o | common/libllmctl_common.a
  FLAGS = -O2

build controller/llmctld: CXX_EXECUTABLE_LINKER__llmctld e.o | controller/libllmctl_controller.a
  FLAGS = -O2

build common/CMakeFiles/x.dir/x_test.cc.o: CXX_COMPILER__x x_test.cc
  FLAGS = -O2
"""


class SanitizeTest(unittest.TestCase):
    def test_only_test_executables_outside_trainer_without_libtorch_are_chosen(self):
        with tempfile.TemporaryDirectory(prefix="llmctl-sanitize-") as build:
            with open(os.path.join(build, "build.ninja"), "w", encoding="utf-8") as f:
                f.write(BUILD_NINJA)
            self.assertEqual(sanitize.test_executables(build),
                             ["rpc/rpc_tls_test", "common/tokenizer/tokenizer_fuzz_replay"])

    def test_a_directory_without_a_build_is_refused_by_name(self):
        with tempfile.TemporaryDirectory(prefix="llmctl-sanitize-") as build:
            ran = subprocess.run([sys.executable, os.path.join(HERE, "sanitize.py"), build],
                                 capture_output=True, text=True)
            self.assertEqual(ran.returncode, 2, ran.stderr)
            self.assertIn(build + "/build.ninja: not a configured build", ran.stderr)


if __name__ == "__main__":
    unittest.main()
