# SPDX-License-Identifier: Apache-2.0
"""A NaN in one rank's gradient: through the hook, every rank leaves that layer as it was and
counts the step as non-finite, the other layers are averaged, and the skipped step changes no
state: the step after it equals bellows run directly on the steps without it."""
import unittest

import torch

import bellows_torch
import dist_util
from test_powersgd_vs_torch import FakeBucket

SHAPES = [(8, 12), (8,)]
N = sum(torch.Size(s).numel() for s in SHAPES)
NAMES = [f"bucket0.grad{j}" for j in range(len(SHAPES))]  # the keys of a State without a model


def gradient(rank, step):
    return torch.randn(N, generator=torch.Generator().manual_seed(10 * rank + step))


def body(rank):
    state = bellows_torch.State("powersgd", low=2, seed=5)
    inputs, outputs = [], []
    for step in range(3):
        g = gradient(rank, step)
        if step == 1 and rank == 1:
            g[3] = float("nan")
        out = g.clone()
        bellows_torch.hook(state, FakeBucket(out, SHAPES)).wait()
        inputs.append(g)
        outputs.append(out)
    telemetry = state.telemetry()
    skipped = [telemetry[name]["skipped"] for name in NAMES]
    return dist_util.gather(dict(inputs=inputs, outputs=outputs, skipped=skipped,
                                 non_finite_steps=state.non_finite_steps))


class NonFiniteThroughHook(unittest.TestCase):
    def test_nan_on_one_rank(self):
        per_rank = dist_util.run(body)
        weight = SHAPES[0][0] * SHAPES[0][1]
        cfg = bellows_torch.config("powersgd", low=2, seed=5)
        # bellows directly on steps 0 and 2 only: the skipped step must have changed nothing
        expected = bellows_torch.reference(cfg, NAMES, SHAPES, [[r["inputs"][0], r["inputs"][2]] for r in per_rank])
        for rank, r in enumerate(per_rank):
            self.assertEqual(r["non_finite_steps"], 1)
            self.assertEqual(r["skipped"], [1, 0])
            left = torch.allclose(r["outputs"][1][:weight], r["inputs"][1][:weight], rtol=0, atol=0, equal_nan=True)
            self.assertTrue(left, f"rank {rank}: the layer with the NaN was changed")
            mean_bias = (per_rank[0]["inputs"][1][weight:] + per_rank[1]["inputs"][1][weight:]) / 2
            self.assertTrue(torch.equal(r["outputs"][1][weight:], mean_bias))
            self.assertTrue(torch.equal(r["outputs"][2], expected[rank][1]))


if __name__ == "__main__":
    unittest.main()
