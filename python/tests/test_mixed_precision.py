# SPDX-License-Identifier: Apache-2.0
"""bf16 and fp16 buckets on 2 gloo processes. The hook averages a float32 copy of each gradient
(the error memory stays float32) and writes the result back in the bucket's dtype, so its output
equals bellows run directly on the float32 values of the inputs, rounded once to the dtype:
- bf16: a DDP model held in bfloat16 and run under torch.autocast("cpu", torch.bfloat16), several
  buckets, SGD steps between. gloo in PyTorch 1.13 cannot broadcast bfloat16 ("Invalid scalar
  type"), which DDP does once at construction to give every rank rank 0's weights; both ranks
  build the same weights from one seed here, and the test skips that broadcast;
- fp16: a bucket built by hand (gloo's CPU allreduce of float16 is not needed: the hook exchanges
  float32)."""
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import bellows_torch
import dist_util
from test_powersgd_vs_torch import FakeBucket

OPTIONS = dict(compressor="powersgd", low=2, seed=4)
STEPS = 4


def bf16_body(rank):
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    net = net.to(torch.bfloat16)
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1000
    torch.nn.parallel.distributed._sync_module_states = lambda **_: None  # see the top of the file
    ddp = DDP(net, bucket_cap_mb=0.001)
    state = bellows_torch.State(model=ddp, **OPTIONS)
    recorder = dist_util.recorder()
    ddp.register_comm_hook(state, recorder)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        recorder.step = step
        x = torch.randn(8, 20, generator=gen)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ddp(x).float().pow(2).mean()
        loss.backward()
        opt.step()
    shapes = {n: list(p.shape) for n, p in net.named_parameters()}
    return dist_util.gather(dict(events=recorder.events, shapes=shapes,
                                 dtypes={str(ev[4].dtype) for ev in recorder.events}))


def fp16_body(rank):
    state = bellows_torch.State(**OPTIONS)
    inputs, outputs = [], []
    n = sum(torch.Size(s).numel() for s in SHAPES16)
    for step in range(STEPS):
        g = torch.randn(n, generator=torch.Generator().manual_seed(10 * rank + step)).half()
        out = g.clone()
        bellows_torch.hook(state, FakeBucket(out, SHAPES16)).wait()
        inputs.append(g)
        outputs.append(out)
    return dist_util.gather(dict(inputs=inputs, outputs=outputs))


SHAPES16 = [(12, 10), (12,), (6, 2, 3)]


class MixedPrecision(unittest.TestCase):
    def test_bf16_under_autocast(self):
        per_rank = dist_util.run(bf16_body)
        shapes = per_rank[0]["shapes"]
        names = sorted(shapes)
        self.assertEqual(per_rank[0]["dtypes"], {"torch.bfloat16"})
        grads = [dist_util.per_step(r["events"])[0] for r in per_rank]
        self.assertGreaterEqual(len(grads[0][0]), 2)
        inputs = [[torch.cat([g[s][n][0] for n in names]) for s in range(STEPS)] for g in grads]
        expected = bellows_torch.reference(bellows_torch.config(**OPTIONS), names, [shapes[n] for n in names],
                                           inputs)
        for r, g in enumerate(grads):
            for s in range(STEPS):
                got = torch.cat([g[s][n][1] for n in names])
                self.assertTrue(torch.equal(got, expected[r][s].bfloat16()), f"rank {r} step {s}")
        mean = ((inputs[0][-1].float() + inputs[1][-1].float()) / 2).bfloat16()
        self.assertFalse(torch.equal(expected[0][-1].bfloat16(), mean), "PowerSGD should have compressed")

    def test_fp16_bucket(self):
        per_rank = dist_util.run(fp16_body)
        names = [f"bucket0.grad{j}" for j in range(len(SHAPES16))]
        cfg = bellows_torch.config(**OPTIONS)
        expected = bellows_torch.reference(cfg, names, SHAPES16, [r["inputs"] for r in per_rank])
        for r, res in enumerate(per_rank):
            for s in range(STEPS):
                self.assertEqual(res["outputs"][s].dtype, torch.float16)
                self.assertTrue(torch.equal(res["outputs"][s], expected[r][s].half()), f"rank {r} step {s}")


if __name__ == "__main__":
    unittest.main()
