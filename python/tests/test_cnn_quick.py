# SPDX-License-Identifier: Apache-2.0
"""The short version of examples/torch_ddp/accordion_cnn.py: 2 epochs of 256 images, one seed.
Every run completes and results.json holds each run in the schema the report and docs describe
(method, policy, seed, levels named low and high, per epoch the test accuracy, cumulative floats
growing, a level per parameter); results.md has the table and a verdict per family, and the four
plots are written. A second call trains nothing (the runs are kept) and writes the same
results.json."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch_ddp",
                      "accordion_cnn.py")
ARGS = ["--epochs", "2", "--train-images", "256", "--test-images", "256", "--seeds", "1"]


class Quick(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = cls.tmp.name
        cls.first = subprocess.run([sys.executable, SCRIPT, "--out", cls.out] + ARGS, capture_output=True, text=True,
                                   timeout=300)
        with open(os.path.join(cls.out, "results.json")) as f:
            cls.results = json.load(f)
        cls.second = subprocess.run([sys.executable, SCRIPT, "--out", cls.out] + ARGS, capture_output=True, text=True,
                                    timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_run_completes_in_the_schema(self):
        self.assertEqual(self.first.returncode, 0, self.first.stderr[-2000:])
        runs = self.results["runs"]
        self.assertEqual(len(runs), 10)
        self.assertEqual({r["method"] for r in runs}, {"uncompressed", "torch-powersgd", "powersgd", "topk"})
        layers = self.results["layers"]
        self.assertEqual(len(layers), 29)
        for r in runs:
            with self.subTest(run=r["run"]):
                self.assertEqual(r["seed"], 1)
                self.assertTrue(set(r["levels"]) <= {"low", "high"})
                self.assertEqual(r["policy"].startswith("accordion"), set(r["levels"]) == {"low", "high"})
                self.assertEqual([e["epoch"] for e in r["epochs"]], [0, 1])
                floats = [e["floats"] for e in r["epochs"]]
                self.assertTrue(0 < floats[0] < floats[1])
                for e in r["epochs"]:
                    self.assertTrue(0.0 <= e["test_accuracy"] <= 1.0)
                    self.assertEqual(len(e["levels"]), len(layers))
                    self.assertTrue(set(e["levels"]) <= {"low", "high", "dense"})
        self.assertIn("epoch 2/2", self.first.stdout)

    def test_report(self):
        with open(os.path.join(self.out, "results.md")) as f:
            md = f.read()
        self.assertEqual(md.count("the claim HOLDS") + md.count("the claim does NOT hold"), 3)
        for plot in ("accuracy", "floats", "levels", "norms"):
            self.assertTrue(os.path.getsize(os.path.join(self.out, plot + ".svg")) > 0, plot)

    def test_rerun_resumes(self):
        self.assertEqual(self.second.returncode, 0, self.second.stderr[-2000:])
        self.assertNotIn("runs to train", self.second.stdout)
        with open(os.path.join(self.out, "results.json")) as f:
            self.assertEqual(json.load(f), self.results)


if __name__ == "__main__":
    unittest.main()
