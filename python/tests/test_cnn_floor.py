# SPDX-License-Identifier: Apache-2.0
"""The floor of examples/torch_ddp/accordion_cnn: the epochs its report counts as forced low
(accordion_cnn_report.forced_low) are exactly those in which a bellows_torch State with Accordion
runs a parameter low when its gradient never changes (so no check finds a change of eta or more),
for the CNN's schedule (16 epochs, decays from epochs 8 and 12) at check intervals 1, 2 and 3, on
2 gloo processes."""
import os
import sys
import unittest

import torch
import torch.nn as nn

import bellows_torch
import dist_util
from test_state_dict import Bucket

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch_ddp"))
import accordion_cnn_report  # noqa: E402

EPOCHS = 16
STEPS_PER_EPOCH = 2


def levels_by_epoch(rank, interval):
    """The level of a PowerSGD-compressed weight in each epoch, under constant gradients."""
    settings = dict(epochs=EPOCHS, interval=interval)
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(12, 8))
    state = bellows_torch.State(compressor="powersgd", low=2, high=1, accordion=True, interval=interval, model=net,
                                overlap=False)
    params = list(net.named_parameters())
    grads = {n: torch.full(p.shape, 0.5) for n, p in params}
    levels = []
    for epoch in range(EPOCHS):
        levels.append(state.telemetry()["0.weight"]["level"])
        for _ in range(STEPS_PER_EPOCH):
            bellows_torch.hook(state, Bucket(0, params, grads)).wait()
        lr = 0.05 * 0.1 ** sum(epoch + 1 >= m for m in accordion_cnn_report.milestones(settings))
        state.end_epoch(lr)
    forced = [accordion_cnn_report.forced_low(settings, e) for e in range(EPOCHS)]
    return levels, forced


def body(rank):
    return {interval: levels_by_epoch(rank, interval) for interval in (1, 2, 3)}


class Floor(unittest.TestCase):
    def test_forced_epochs_are_the_detectors(self):
        for interval, (levels, forced) in dist_util.run(body).items():
            with self.subTest(interval=interval):
                self.assertEqual(["low" if f else "high" for f in forced], levels)
                self.assertIn("high", levels)  # the test could tell them apart


if __name__ == "__main__":
    unittest.main()
