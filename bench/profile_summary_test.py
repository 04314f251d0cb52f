#!/usr/bin/env python3
"""Tests for profile_summary.py on small hand-written Kineto traces (bench/CMakeLists.txt runs them)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_summary import markdown, summarize  # noqa: E402


def op(name, ts, dur, cat="cpu_op", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 7, "tid": 1, "ts": 0,
        "dur": 1000}


class ProfileSummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="llmctl-profile-summary-")
        self.addCleanup(self.dir.cleanup)

    def trace(self, events, name="trace.json"):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            json.dump({"traceEvents": events + [{"ph": "M", "name": "process_name", "pid": 7}]}, f)
        return path

    def test_cpu_counts_only_top_level_operators_once_each(self):
        # aten::linear holds aten::addmm, which holds aten::mm: only the outer 300 us count. An operator on
        # another thread at the same time is top-level there. One starting where another ends is outer.
        events = [STEP, op("aten::linear", 100, 300), op("aten::addmm", 110, 250), op("aten::mm", 120, 200),
                  op("autograd::engine::evaluate_function: MmBackward0", 150, 100, tid=2),
                  op("aten::mm", 150, 80, tid=2),
                  op("aten::linear", 400, 200), op("aten::add", 600, 50)]
        summary = summarize(self.trace(events), "cpu")
        self.assertEqual(summary["kind"], "top-level cpu_op")
        self.assertEqual(summary["step_us"], 1000)
        self.assertEqual([(r["name"], r["us"], r["calls"]) for r in summary["top"]],
                         [("aten::linear", 500, 2),
                          ("autograd::engine::evaluate_function: MmBackward0", 100, 1),
                          ("aten::add", 50, 1)])
        self.assertEqual(summary["entries"], 4)
        self.assertAlmostEqual(summary["top"][0]["share"], 0.5)
        self.assertAlmostEqual(summary["top_share"], 0.65)

    def test_cuda_sums_kernels_and_leaves_out_host_operators(self):
        events = [STEP, op("aten::mm", 0, 900), op("sm90_xmma_gemm_bf16", 10, 300, "kernel", 9),
                  op("sm90_xmma_gemm_bf16", 400, 200, "kernel", 9),
                  op("fused_cross_entropy", 700, 100, "kernel", 9), op("cudaLaunchKernel", 5, 3, "cuda_runtime")]
        summary = summarize(self.trace(events), "cuda", top=1)
        self.assertEqual(summary["kind"], "kernel")
        self.assertEqual(summary["entries"], 3)
        self.assertEqual(summary["all_us"], 600)
        self.assertEqual([(r["name"], r["us"], r["calls"]) for r in summary["top"]],
                         [("sm90_xmma_gemm_bf16", 500, 2)])
        text = markdown(summary, "bf16-true")
        self.assertIn("| `sm90_xmma_gemm_bf16` | 0.50 | 2 | 50.0% |", text)
        self.assertIn("took 0.6 ms (60.0% of it), these 50.0%", text)

    def test_long_names_keep_both_ends(self):
        name = "autograd::engine::evaluate_function: torch::autograd::CppNode<" + "x" * 80 + "::GluLinearFunction>"
        text = markdown(summarize(self.trace([STEP, op(name, 0, 10)]), "cpu"), "t")
        self.assertIn("...", text)
        self.assertIn("::GluLinearFunction>` |", text)
        self.assertIn("| `autograd::engine::evaluate_function", text)

    def test_refuses_what_is_not_a_profiled_llm_train_step(self):
        with self.assertRaisesRegex(ValueError, "no ProfilerStep# span"):
            summarize(self.trace([op("aten::mm", 0, 5)]), "cpu")
        with self.assertRaisesRegex(ValueError, "no CUDA kernel events"):
            summarize(self.trace([STEP, op("aten::mm", 0, 5)]), "cuda")
        with self.assertRaisesRegex(ValueError, "cannot read the trace .*missing.json"):
            summarize(os.path.join(self.dir.name, "missing.json"), "cpu")
        bad = os.path.join(self.dir.name, "bad.json")
        with open(bad, "w") as f:
            f.write("[1, 2]")
        with self.assertRaisesRegex(ValueError, "bad.json is not a Chrome trace"):
            summarize(bad, "cpu")


if __name__ == "__main__":
    unittest.main()
