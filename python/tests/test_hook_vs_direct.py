# SPDX-License-Identifier: Apache-2.0
"""Every compressor through the DDP hook (2 gloo processes, a real DDP model with several buckets,
SGD steps between) gives, bucket by bucket and step by step, the same averaged gradients as bellows
called directly (its synchronizer on its own threads collective) on the inputs the hook received.
Both sides run the same float arithmetic on the same inputs and gloo sums two ranks as a + b, as
bellows' local collective does, so the comparison is exact."""
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import bellows_torch
import dist_util

STEPS = 6
EPOCH_STEPS = 2        # end_epoch after every second step
LRS = (0.1, 0.1, 0.01)  # learning rate of epochs 1, 2, 3 (a decrease at the last boundary)

CONFIGS = {
    "identity": dict(compressor="identity"),
    "topk": dict(compressor="topk", low=0.1),
    "randk": dict(compressor="randk", low=0.2),
    "powersgd": dict(compressor="powersgd", low=2),
    "qsgd": dict(compressor="qsgd", low=4),
    "powersgd_accordion": dict(compressor="powersgd", low=4, high=1, accordion=True, interval=1),
    "topk_accordion": dict(compressor="topk", low=0.5, high=0.05, accordion=True, interval=1),
}


def model():
    torch.manual_seed(7)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 32),
                         nn.ReLU(), nn.Linear(32, 10))


def layout(bucket):
    base = bucket.buffer().data_ptr()
    return tuple(((g.data_ptr() - base) // 4, tuple(g.shape)) for g in bucket.gradients())


def train(rank, name):
    state = bellows_torch.State(seed=11, **CONFIGS[name])
    events = []

    def recording_hook(st, bucket):
        before = bucket.buffer().clone()
        fut = bellows_torch.hook(st, bucket)
        events.append(("step", bucket.index(), layout(bucket), before, fut.wait().clone()))
        return fut

    dist._DEFAULT_FIRST_BUCKET_BYTES = 4000  # DDP's first bucket, 1 MiB by default, held them all
    net = DDP(model(), bucket_cap_mb=0.004)  # about 1000 floats a bucket: several buckets
    net.register_comm_hook(state, recording_hook)
    opt = torch.optim.SGD(net.parameters(), lr=LRS[0])
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        x = torch.randn(16, 1, 8, 8, generator=gen)
        y = torch.randint(0, 10, (16,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if (step + 1) % EPOCH_STEPS == 0:
            lr = LRS[min((step + 1) // EPOCH_STEPS, len(LRS) - 1)]
            state.end_epoch(lr)
            events.append(("epoch", lr))
            for g in opt.param_groups:
                g["lr"] = lr
    return dist_util.gather(events)


def segments(events):
    """Splits one rank's events into runs of one bucket with one layout (the hook starts a new
    synchronizer when the layout changes): {(index, layout, n): (inputs, outputs, end_epoch_lr)}."""
    current, out, seen = {}, {}, {}
    for ev in events:
        if ev[0] == "epoch":
            for key in current.values():
                out[key][2][-1] = ev[1]
            continue
        _, index, lay, before, after = ev
        if index not in current or current[index][1] != lay:
            seen[(index, lay)] = seen.get((index, lay), 0) + 1
            current[index] = (index, lay, seen[(index, lay)])
            out[current[index]] = ([], [], [])
        ins, outs, lrs = out[current[index]]
        ins.append(before)
        outs.append(after)
        lrs.append(0.0)
    return out


class HookMatchesDirect(unittest.TestCase):
    def check(self, name):
        per_rank = dist_util.run(train, name)
        segs = [segments(events) for events in per_rank]
        self.assertEqual(segs[0].keys(), segs[1].keys())
        self.assertGreaterEqual(len({key[0] for key in segs[0]}), 2, "the model should span several buckets")
        cfg = bellows_torch.config(seed=11, **CONFIGS[name])
        compared = 0
        for key, (ins0, outs0, lrs) in segs[0].items():
            index, lay, _ = key
            shapes = [shape for _, shape in lay]
            inputs = [segs[r][key][0] for r in range(dist_util.WORLD)]
            expected = bellows_torch.reference(cfg, index, shapes, inputs, lrs)
            for r in range(dist_util.WORLD):
                for step, (got, want) in enumerate(zip(segs[r][key][1], expected[r])):
                    self.assertTrue(torch.equal(got, want),
                                    f"{name}: bucket {index} rank {r} step {step}: max difference "
                                    f"{(got - want).abs().max().item()}")
                    compared += 1
            if name == "identity":  # the reference itself: the plain mean over ranks
                for step in range(len(ins0)):
                    mean = (inputs[0][step] + inputs[1][step]) / 2
                    self.assertTrue(torch.equal(expected[0][step], mean))
            if name != "identity" and index == 0 and len(ins0) > 2:
                # a compressor that changes nothing would pass the comparison: make sure it did
                mean = (inputs[0][-1] + inputs[1][-1]) / 2
                self.assertFalse(torch.allclose(outs0[-1], mean))
        self.assertGreater(compared, STEPS)

    def test_identity(self):
        self.check("identity")

    def test_topk(self):
        self.check("topk")

    def test_randk(self):
        self.check("randk")

    def test_powersgd(self):
        self.check("powersgd")

    def test_qsgd(self):
        self.check("qsgd")

    def test_powersgd_accordion(self):
        self.check("powersgd_accordion")

    def test_topk_accordion(self):
        self.check("topk_accordion")


if __name__ == "__main__":
    unittest.main()
