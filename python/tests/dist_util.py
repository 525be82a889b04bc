# SPDX-License-Identifier: Apache-2.0
"""Runs a test body on 2 gloo processes (torch.multiprocessing) and brings back rank 0's result."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _worker(rank, body, store, out, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        result = body(rank, *args)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def run(body, *args):
    """body(rank, *args) runs on every rank; returns what rank 0's call returned."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(_worker, args=(body, os.path.join(tmp, "store"), out, args), nprocs=WORLD, join=True)
        return torch.load(out)


def gather(obj):
    """Every rank's obj, in rank order (on every rank)."""
    objs = [None] * dist.get_world_size()
    dist.all_gather_object(objs, obj)
    return objs
