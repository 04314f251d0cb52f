#!/usr/bin/env python3
"""Tests for check_layering.py on small trees that keep or break each rule, then on this repository."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_layering.py")


class CheckLayeringTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="llmctl-layering-")
        self.addCleanup(self.dir.cleanup)
        self.write("trainer/CMakeLists.txt", "llmctl_library(llmctl_trainer TORCH SOURCES a.cc)\n")
        self.write("common/tokenizer/tokenizer.h", '#include "common/status.h"\n')
        self.write("controller/cli/estimate.cc", '#include "common/tokenizer/tokenizer.h"\n')
        self.write("controller/CMakeLists.txt", "llmctl_library(llmctl_cli DEPS llmctl_common)\n")
        self.write("trainer/model/llama.cc", '#include <torch/torch.h>\n#include "common/status.h"\n')

    def write(self, relative, text):
        path = os.path.join(self.dir.name, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def check(self, root=None):
        return subprocess.run([sys.executable, CHECK, root or self.dir.name], capture_output=True,
                              text=True)

    def test_a_tree_that_keeps_the_rules_passes(self):
        result = self.check()
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_the_controller_including_the_trainer_fails_naming_the_line(self):
        self.write("controller/cli/estimate.cc", '// x\n#include "trainer/inputs/trial_inputs.h"\n')
        result = self.check()
        self.assertEqual(result.returncode, 1)
        self.assertIn("controller/cli/estimate.cc:2: controller/ must not include "
                      "trainer/inputs/trial_inputs.h", result.stderr)

    def test_the_controller_linking_a_trainer_library_fails(self):
        self.write("controller/CMakeLists.txt",
                   "# llmctl_trainer in a comment is fine\n"
                   "llmctl_library(llmctl_cli DEPS llmctl_common llmctl_trainer)\n")
        result = self.check()
        self.assertEqual(result.returncode, 1)
        self.assertIn("controller/CMakeLists.txt:2: controller/ must not link llmctl_trainer",
                      result.stderr)
        self.assertNotIn(":1:", result.stderr)

    def test_common_including_libtorch_fails(self):
        self.write("common/data/batch.h", "#include <ATen/ATen.h>\n")
        result = self.check()
        self.assertEqual(result.returncode, 1)
        self.assertIn("common/data/batch.h:1: common/ must not include ATen/ATen.h", result.stderr)

    def test_the_trainer_including_a_transport_fails(self):
        self.write("trainer/train/events.cc", '#include "rpc/tls.h"\n')
        result = self.check()
        self.assertEqual(result.returncode, 1)
        self.assertIn("trainer/train/events.cc:1: trainer/ must not include rpc/tls.h", result.stderr)

    def test_this_repository_keeps_the_rules(self):
        result = self.check(os.path.dirname(HERE))
        self.assertEqual(result.returncode, 0, result.stderr)


if __name__ == "__main__":
    unittest.main()
