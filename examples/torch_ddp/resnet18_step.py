#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Milliseconds per training step of torchvision's ResNet-18 under DDP, with each averaging:

  allreduce          DDP's own fp32 allreduce (no hook)
  torch-powersgd     PyTorch's powerSGD_hook at rank 2 (waited per bucket, as train.py does)
  powersgd           bellows' hook at PowerSGD rank 2
  topk               bellows' hook at top-k 1%

on 2 gloo processes on this machine (loopback), one thread each: 10 classes, 3x32x32 inputs,
batch 16 per process, SGD with momentum, random data (a step's time does not depend on it). Each
run times --steps steps after --warmup, and rank 0 prints the median time per step and, for
bellows, the process-group calls per step (State.collective_calls). Progress goes to stderr.

Usage: PYTHONPATH=build-py/site /usr/bin/python3 examples/torch_ddp/resnet18_step.py
           [--runs allreduce,torch-powersgd,powersgd,topk] [--steps 30] [--warmup 5] [--no-overlap]
           [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import bellows_torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import spawned, torch_powersgd_waiting  # noqa: E402

RUNS = ("allreduce", "torch-powersgd", "powersgd", "topk")
WORLD = 2


def attach(run, net, overlap):
    """Registers the run's hook on `net`; returns bellows' State (None for the others)."""
    if run == "allreduce":
        return None
    if run == "torch-powersgd":
        state = torch_psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
        net.register_comm_hook(state, torch_powersgd_waiting)
        return None
    options = dict(compressor="powersgd", low=2) if run == "powersgd" else dict(compressor="topk", low=0.01)
    state = bellows_torch.State(model=net, overlap=overlap, **options)
    net.register_comm_hook(state, bellows_torch.hook)
    return state


def time_run(rank, run, args):
    torch.manual_seed(0)
    import torchvision  # here, so that --help works without it

    net = DDP(torchvision.models.resnet18(num_classes=10))
    state = attach(run, net, not args.no_overlap)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(16, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    times, calls = [], None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            calls = state.collective_calls() if state is not None else None
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    result = dict(run=run, ms_per_step=1000 * statistics.median(times), steps=args.steps)
    if state is not None:
        result["calls_per_step"] = (state.collective_calls() - calls) / args.steps
        result["parameters"] = len(state.telemetry())
        state.close()
    return result


def worker(rank, init_method, out, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
    results = []
    for i, run in enumerate(args.runs):
        results.append(time_run(rank, run, args))
        if rank == 0:
            print(f"[{i + 1}/{len(args.runs)}] {run}: {results[-1]['ms_per_step']:.1f} ms per step", file=sys.stderr,
                  flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated, of " + ", ".join(RUNS))
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (DDP rebuilds its buckets after one)")
    p.add_argument("--no-overlap", action="store_true", help="bellows' hook averages before it returns")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    args.runs = args.runs.split(",")
    unknown = [r for r in args.runs if r not in RUNS]
    if unknown:
        p.error(f"unknown runs {unknown}; known: {', '.join(RUNS)}")
    if args.steps < 1 or args.warmup < 2:
        p.error("--steps must be >= 1 and --warmup >= 2 (PyTorch's PowerSGD starts compressing at step 2)")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        mp.spawn(spawned, args=(worker, "file://" + os.path.join(tmp, "store"), out, args), nprocs=WORLD)
        with open(out) as f:
            results = json.load(f)
    print("| averaging | ms per step (median) | process-group calls per step |")
    print("|---|---:|---:|")
    for r in results:
        calls = f"{r['calls_per_step']:.0f}" if "calls_per_step" in r else "-"
        print(f"| {r['run']} | {r['ms_per_step']:.1f} | {calls} |")
    print(f"ResNet-18, {WORLD} gloo processes, batch 16, {results[0]['steps']} steps per run; load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
