# SPDX-License-Identifier: Apache-2.0
"""The hook with overlap (its worker thread averages the buckets while DDP goes on with the
backward pass) on 2 gloo processes: DDP with several buckets, momentum SGD, an Accordion epoch end
between steps. The hook returns futures that are not complete yet, and the run ends with the
weights, bit for bit, of the same run with overlap=False (the hook averaging before it returns),
which test_hook_vs_direct compares with bellows called directly."""
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import bellows_torch
import dist_util

STEPS = 6


def train(rank, overlap):
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(30, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 10))
    dist._DEFAULT_FIRST_BUCKET_BYTES = 2000
    ddp = DDP(net, bucket_cap_mb=0.002)  # 500 floats a bucket: one in the first iteration, then two
    state = bellows_torch.State("powersgd", low=2, high=1, accordion=True, interval=1, model=ddp, overlap=overlap)
    pending = []

    def watching_hook(st, bucket):
        fut = bellows_torch.hook(st, bucket)
        pending.append(not fut.done())
        return fut

    ddp.register_comm_hook(state, watching_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        x = torch.randn(16, 30, generator=gen)
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
        if step == 2:
            state.end_epoch(0.05)
    return dist_util.gather(dict(weights=[p.detach().clone() for p in net.parameters()], pending=sum(pending),
                                 calls=len(pending)))


def both(rank):
    return train(rank, True), train(rank, False)


class Overlap(unittest.TestCase):
    def test_overlap_equals_synchronous(self):
        with_overlap, without = dist_util.run(both)
        for a, b in zip(with_overlap, without):
            self.assertGreater(a["calls"], STEPS, "the model should span several buckets")
            self.assertGreater(a["pending"], 0, "the hook with overlap always returned a completed future")
            self.assertEqual(b["pending"], 0)
            for wa, wb in zip(a["weights"], b["weights"]):
                self.assertTrue(torch.equal(wa, wb), "overlap changed the result")


if __name__ == "__main__":
    unittest.main()
