#!/usr/bin/env python3
"""Tests for time_noise_floor.py on hand-written reports (bench/CMakeLists.txt runs them)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from time_noise_floor import measured_rows, noise_floor  # noqa: E402


def report(rows):
    """A report of (name, outcome, measured, predicted) rows, as `llmctl report --format json` has them."""
    trials = []
    for name, outcome, measured, predicted in rows:
        trial = {"name": name, "outcome": outcome, "steady_tokens_per_second": measured}
        if predicted is not None:
            trial["prediction"] = {"tokens_per_second": predicted}
        trials.append(trial)
    return {"experiment_id": 1, "name": "lab", "trials": trials}


class TimeNoiseFloorTest(unittest.TestCase):
    def test_reads_only_ok_rows_with_a_measured_rate(self):
        rows = measured_rows(report([("a", "ok", 100.0, 110.0), ("b", "oom", None, 50.0),
                                     ("c", "ok", 0, 10.0), ("d", "ok", 40.0, None)]))
        self.assertEqual(rows, {"a": (100.0, 110.0), "d": (40.0, None)})

    def test_refuses_a_document_that_is_not_a_report(self):
        for document, says in (([1, 2], "no 'trials' list"), ({"trials": "x"}, "no 'trials' list"),
                               ({"trials": ["x"]}, "trials[0] is not a trial"),
                               ({"trials": [{"outcome": "ok"}]}, "trials[0] is not a trial"),
                               (report([("a", "ok", "fast", None)]), "trial a: steady_tokens_per_second"),
                               (report([("a", "ok", -5.0, None)]), "trial a: steady_tokens_per_second"),
                               (report([("a", "ok", float("nan"), None)]), "not a tokens/s above 0"),
                               (report([("a", "ok", 1e400, None)]), "not a tokens/s above 0"),
                               (report([("a", "ok", 100.0, True)]), "trial a: prediction.tokens_per_second"),
                               (report([("a", "ok", 100.0, False)]), "trial a: prediction.tokens_per_second"),
                               (report([("a", "ok", False, None)]), "trial a: steady_tokens_per_second"),
                               ({"trials": [{"name": "a", "outcome": "ok", "steady_tokens_per_second": 9.0,
                                             "prediction": []}]}, "'prediction' is not an object"),
                               ({"trials": [{"name": "a", "outcome": "ok", "steady_tokens_per_second": 9.0,
                                             "prediction": [1]}]}, "'prediction' is not an object")):
            with self.assertRaises(ValueError) as refused:
                measured_rows(document)
            self.assertIn(says, str(refused.exception))

    def test_a_machine_whose_rows_move_apart_defeats_both_oracles(self):
        # Row a's medians: 100. Run 1 measures a at 70 and b at 130 (b's median 100): at the median
        # both are off by +43% and -23%; the run's speed (median of 0.7 and 1.3) is 1.0, so scaling
        # does not help. Runs 2 and 3 sit at the median.
        runs = [measured_rows(report([("a", "ok", 70.0, 100.0), ("b", "ok", 130.0, 100.0)])),
                measured_rows(report([("a", "ok", 100.0, 100.0), ("b", "ok", 100.0, 100.0)])),
                measured_rows(report([("a", "ok", 100.0, 100.0), ("b", "ok", 100.0, 100.0)]))]
        result = noise_floor(runs, 0.2)
        self.assertEqual([r["median"] for r in result["per_run"]], [0, 2, 2])
        self.assertEqual([r["median_and_speed"] for r in result["per_run"]], [0, 2, 2])
        self.assertEqual([r["estimate"] for r in result["per_run"]], [0, 2, 2])
        self.assertEqual(result["every_row"], {"median": 2, "median_and_speed": 2, "estimate": 2})

    def test_the_runs_speed_is_what_the_second_oracle_takes_out(self):
        # Run 2 is a slow run: every row at half its speed in run 1 and 3. The median oracle misses
        # every row of it (+100%); scaled by the run's speed (0.5) it misses none.
        fast = [("a", "ok", 100.0, 100.0), ("b", "ok", 300.0, 300.0)]
        slow = [("a", "ok", 50.0, 100.0), ("b", "ok", 150.0, 300.0)]
        runs = [measured_rows(report(r)) for r in (fast, slow, fast)]
        result = noise_floor(runs, 0.2)
        self.assertEqual([r["median"] for r in result["per_run"]], [2, 0, 2])
        self.assertEqual([r["median_and_speed"] for r in result["per_run"]], [2, 2, 2])
        self.assertEqual(result["every_row"]["median_and_speed"], 3)
        self.assertAlmostEqual(result["spread"]["a"]["min"], 50.0)
        self.assertAlmostEqual(result["spread"]["b"]["max"], 300.0)

    def test_a_row_missing_from_a_run_is_left_out(self):
        runs = [measured_rows(report([("a", "ok", 100.0, 100.0), ("b", "ok", 10.0, 100.0)])),
                measured_rows(report([("a", "ok", 100.0, 100.0), ("b", "oom", None, 100.0)]))]
        self.assertEqual(noise_floor(runs, 0.2)["rows"], ["a"])

    def test_refuses_one_run_and_runs_with_no_row_in_common(self):
        one = measured_rows(report([("a", "ok", 100.0, 100.0)]))
        other = measured_rows(report([("b", "ok", 100.0, 100.0)]))
        with self.assertRaises(ValueError):
            noise_floor([one], 0.2)
        with self.assertRaises(ValueError):
            noise_floor([one, other], 0.2)

    def test_the_command_prints_a_table_and_refuses_an_unreadable_report(self):
        with tempfile.TemporaryDirectory(prefix="llmctl-noise-floor-") as d:
            paths = []
            for i, measured in enumerate((100.0, 90.0)):
                path = os.path.join(d, f"r{i}.json")
                with open(path, "w") as f:
                    json.dump(report([("a", "ok", measured, 95.0)]), f)
                paths.append(path)
            script = os.path.join(HERE, "time_noise_floor.py")
            out = subprocess.run([sys.executable, script] + paths, capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("Every row within 20%: the estimate in 2 of 2 runs", out.stdout)
            bad = os.path.join(d, "bad.json")
            with open(bad, "w") as f:
                f.write("{not json")
            out = subprocess.run([sys.executable, script, paths[0], bad], capture_output=True, text=True)
            self.assertEqual(out.returncode, 2)
            self.assertIn(f"{bad}: not a readable report", out.stderr)


if __name__ == "__main__":
    unittest.main()
