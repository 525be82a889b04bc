# SPDX-License-Identifier: Apache-2.0
"""examples/torch_ddp/train.py --checkpoint / --resume: a two-process gloo run of the Accordion
hook (levels switched at every epoch end, momentum SGD) is killed (SIGKILL, both workers) during
its second epoch, resumed from its first epoch's checkpoint, and ends with the model, optimizer
and hook state of a run that was never interrupted, bit for bit."""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TRAIN = os.path.join(ROOT, "examples", "torch_ddp", "train.py")
EPOCHS = 3
ARGS = ["--runs", "accordion", "--epochs", str(EPOCHS), "--train-limit", "4096", "--test-limit", "100",
        "--bucket-cap-mb", "0.25", "--decay-epoch", "2"]


def command(folder, *extra):
    return [sys.executable, TRAIN, *ARGS, "--checkpoint", folder, *extra]


def saved(folder, epoch, rank):
    return os.path.join(folder, "accordion", f"epoch{epoch}.rank{rank}.pt")


def flat(obj, prefix=""):
    """{path: leaf} of nested dicts and lists."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in flat(val, f"{prefix}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, val in enumerate(obj) for k, v in flat(val, f"{prefix}/{i}").items()}
    return {prefix: obj}


class ResumeAfterKill(unittest.TestCase):
    def test_killed_and_resumed_equals_uninterrupted(self):
        with tempfile.TemporaryDirectory() as tmp:
            whole, killed = os.path.join(tmp, "whole"), os.path.join(tmp, "killed")
            subprocess.run(command(whole), check=True, stdout=subprocess.DEVNULL)
            run = subprocess.Popen(command(killed), stdout=subprocess.DEVNULL, start_new_session=True)
            deadline = time.time() + 300
            while not all(os.path.exists(saved(killed, 1, r)) for r in range(2)):
                self.assertIsNone(run.poll(), "the run ended before its first checkpoint")
                self.assertLess(time.time(), deadline)
                time.sleep(0.02)
            self.assertIsNone(run.poll(), "the run ended before it could be killed")
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
            self.assertFalse(os.path.exists(saved(killed, EPOCHS, 0)), "the killed run had finished")
            resumed = subprocess.run(command(killed, "--resume"), check=True, capture_output=True, text=True)
            self.assertRegex(resumed.stdout, r"accordion: resumed after epoch [12]\n")
            for rank in range(2):
                want = flat(torch.load(saved(whole, EPOCHS, rank), weights_only=True))
                got = flat(torch.load(saved(killed, EPOCHS, rank), weights_only=True))
                self.assertEqual(want.keys(), got.keys())
                for key in ("/model", "/optimizer", "/hook", "/generator"):
                    self.assertTrue(any(k.startswith(key) for k in want), key)
                for key, value in want.items():
                    if key == "/seconds":
                        continue  # wall-clock time
                    if isinstance(value, torch.Tensor):
                        self.assertTrue(torch.equal(value, got[key]), f"rank {rank}: {key} differs")
                    else:
                        self.assertEqual(value, got[key], f"rank {rank}: {key}")


if __name__ == "__main__":
    unittest.main()
