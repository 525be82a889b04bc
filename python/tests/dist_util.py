# SPDX-License-Identifier: Apache-2.0
"""Runs a test body on 2 gloo processes (torch.multiprocessing) and brings back rank 0's result."""
import os
import sys
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
    # Leave without Python's finalization. A gloo thread may still drop the last callback of a
    # torch future (PyTorch's powerSGD_hook chains them), which takes the GIL in a C++ destructor;
    # once the interpreter finalizes, that stops the thread inside a noexcept frame and aborts the
    # process, though every result is in. A failed body still returns through spawn's reporting.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


def recorder():
    """A communication hook: bellows_torch.hook, waited for, recording per parameter the gradient
    before and after averaging as ("grad", step, bucket index, name, before, after) in its
    `events` (set its `step` before each backward pass; a test may add ("epoch", step, lr))."""
    import bellows_torch

    def recording_hook(state, bucket):
        before = bucket.buffer().clone()
        names = state.names(bucket)
        fut = bellows_torch.hook(state, bucket)
        after = fut.wait().clone()
        at = 0
        for name, g in zip(names, bucket.gradients()):
            n = g.numel()
            recording_hook.events.append(("grad", recording_hook.step, bucket.index(), name, before[at:at + n],
                                          after[at:at + n]))
            at += n
        return fut

    recording_hook.events, recording_hook.step = [], 0
    return recording_hook


def per_step(events):
    """Recorder events of one rank as {step: {name: (input, output)}}, {step: lr} of the epoch
    ends, and {step: {bucket index: names}}."""
    grads, lrs, buckets = {}, {}, {}
    for ev in events:
        if ev[0] == "epoch":
            lrs[ev[1]] = ev[2]
            continue
        _, step, index, name, before, after = ev
        grads.setdefault(step, {})[name] = (before, after)
        buckets.setdefault(step, {}).setdefault(index, []).append(name)
    return grads, lrs, buckets
