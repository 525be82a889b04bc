# SPDX-License-Identifier: Apache-2.0
"""The hook with overlap (its worker thread averages the buckets while DDP goes on with the
backward pass) on 2 gloo processes: DDP with several buckets, momentum SGD, an Accordion epoch end
between steps. The hook returns futures that are not complete yet, and the run ends with the
weights, bit for bit, of the same run with overlap=False (the hook averaging before it returns),
which test_hook_vs_direct compares with bellows called directly."""
import os
import subprocess
import sys
import tempfile
import textwrap
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

    def test_exit_right_after_the_hook(self):
        """A script that returns right after handing a bucket to the worker still gets it averaged
        (the worker is closed at exit, before the interpreter finalizes) and exits cleanly."""
        script = textwrap.dedent("""
            import sys, torch, torch.distributed as dist, bellows_torch
            store, done = sys.argv[1], sys.argv[2]
            dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)

            class Bucket:
                def __init__(self, buf): self.buf = buf
                def buffer(self): return self.buf
                def index(self): return 0
                def gradients(self): return [self.buf[:600].view(20, 30), self.buf[600:]]

            state = bellows_torch.State("powersgd", low=2)
            fut = bellows_torch.hook(state, Bucket(torch.randn(640)))
            fut.then(lambda f: open(done, "w").write("averaged"))
            """)
        with tempfile.TemporaryDirectory() as tmp:
            done = os.path.join(tmp, "done")
            run = subprocess.run([sys.executable, "-c", script, os.path.join(tmp, "store"), done],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertTrue(os.path.exists(done), "the bucket handed over before exit was not averaged")


if __name__ == "__main__":
    unittest.main()
