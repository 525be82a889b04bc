#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Accordion on a convolutional network through bellows_torch, beside PyTorch's own PowerSGD hook.

A narrow ResNet-8 with batch norm trains on a fixed subset of Fashion-MNIST on 2 gloo processes
(DDP), once per run and seed:

  allreduce                 DDP's own allreduce (no hook)
  torch-powersgd-low/high   PyTorch's powerSGD_hook at the low / high rank (start_powerSGD_iter = 2)
  powersgd-low/high         bellows PowerSGD at the low / high rank always
  powersgd-accordion-keep   bellows PowerSGD switched per layer by Accordion, low <-> high, a
                            switched layer keeping its error memory and query (level_change keep)
  powersgd-accordion-reset  the same, a switched layer starting afresh (level_change reset)
  topk-low/high             bellows top-k at the low / high ratio always
  topk-accordion            bellows top-k switched by Accordion, low <-> high

Every run uses the same schedule (fixed before the first run): SGD momentum 0.9, weight decay
5e-4, x0.1 decays at 50% and 75% of the epochs, a fresh shuffle of the subset every epoch.
Each finished run (one run, one seed) is written to OUT/runs/<run>.seed<S>.json; a rerun skips the
runs found there, so an interrupted command resumes by running it again. At the end OUT holds
results.json, results.md and the SVG plots (accordion_cnn_report.py writes them).
Needs python3-torch, Debian's dataset-fashion-mnist and bellows_torch (scripts/demo.sh torch-cnn
installs and builds what is missing). Usage: accordion_cnn.py [--out DIR] [--seeds 1,2] [--runs ...]
"""
import argparse
import json
import os
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
from train import load, spawned, torch_powersgd_waiting  # noqa: E402  (the MLP comparison's data, hook, entry)
import accordion_cnn_report  # noqa: E402

RUNS = accordion_cnn_report.RUNS


class Block(nn.Module):
    """A residual block: two 3x3 convolutions with batch norm, a 1x1 projection where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.short is None else self.short(x)))


def resnet8(width):
    """ResNet-8: a 3x3 stem, three residual blocks of width w, 2w, 4w (the last two halve the
    image), global average pooling and a linear classifier."""
    return nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                         Block(width, width, 1), Block(width, 2 * width, 2), Block(2 * width, 4 * width, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10))


def describe(key, args):
    """(label, method, policy, level names, how) of a run: how is None (allreduce), ("torch", rank)
    or ("bellows", State options)."""
    lo, hi, klo, khi = args.rank_low, args.rank_high, args.topk_low, args.topk_high
    acc = dict(accordion=True, interval=args.interval, eta=args.eta)
    table = {
        "allreduce": ("allreduce (no hook)", "uncompressed", "none", {}, None),
        "torch-powersgd-low": (f"torch PowerSGD rank {lo}", "torch-powersgd", "static low", {"low": lo},
                               ("torch", lo)),
        "torch-powersgd-high": (f"torch PowerSGD rank {hi}", "torch-powersgd", "static high", {"high": hi},
                                ("torch", hi)),
        "powersgd-low": (f"PowerSGD rank {lo} (static low)", "powersgd", "static low", {"low": lo},
                         ("bellows", dict(compressor="powersgd", low=lo))),
        "powersgd-high": (f"PowerSGD rank {hi} (static high)", "powersgd", "static high", {"high": hi},
                          ("bellows", dict(compressor="powersgd", low=hi))),
        "powersgd-accordion-keep": (f"PowerSGD Accordion rank {lo} <-> {hi}, keep", "powersgd", "accordion",
                                    {"low": lo, "high": hi},
                                    ("bellows", dict(compressor="powersgd", low=lo, high=hi, **acc))),
        "powersgd-accordion-reset": (f"PowerSGD Accordion rank {lo} <-> {hi}, reset", "powersgd", "accordion reset",
                                     {"low": lo, "high": hi},
                                     ("bellows", dict(compressor="powersgd", low=lo, high=hi, level_change="reset",
                                                      **acc))),
        "topk-low": (f"top-k {100 * klo:g}% (static low)", "topk", "static low", {"low": klo},
                     ("bellows", dict(compressor="topk", low=klo))),
        "topk-high": (f"top-k {100 * khi:g}% (static high)", "topk", "static high", {"high": khi},
                      ("bellows", dict(compressor="topk", low=khi))),
        "topk-accordion": (f"top-k Accordion {100 * klo:g}% <-> {100 * khi:g}%", "topk", "accordion",
                           {"low": klo, "high": khi}, ("bellows", dict(compressor="topk", low=klo, high=khi, **acc))),
    }
    return table[key]


def lr_at(args, epoch):
    """The schedule: lr, x0.1 from 50% of the epochs, x0.01 from 75%."""
    return args.lr * (0.1 ** sum(epoch >= m for m in milestones(args)))


def milestones(args):
    return [args.epochs // 2, (3 * args.epochs) // 4]


def run_file(out, key, seed):
    return os.path.join(out, "runs", f"{key}.seed{seed}.json")


def train_one(rank, world, args, key, seed, data, progress):
    (xtr, ytr), (xte, yte) = data
    label, method, policy, levels, how = describe(key, args)
    torch.manual_seed(seed)
    net = DDP(resnet8(args.width))
    names = [n for n, _ in net.module.named_parameters()]
    shapes = [list(p.shape) for p in net.module.parameters()]
    params = sum(p.numel() for p in net.parameters())
    state = None
    if how is not None and how[0] == "torch":
        state = torch_psgd.PowerSGDState(process_group=None, matrix_approximation_rank=how[1],
                                         start_powerSGD_iter=2, random_seed=seed)
        net.register_comm_hook(state, torch_powersgd_waiting)
    elif how is not None:
        state = bellows_torch.State(seed=seed, model=net, **how[1])
        net.register_comm_hook(state, bellows_torch.hook)
    opt = torch.optim.SGD(net.parameters(), lr=lr_at(args, 0), momentum=0.9, weight_decay=args.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    epochs, steps, start = [], 0, time.perf_counter()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        order = torch.randperm(len(xtr), generator=gen)
        mine = order[rank::world]
        usable = len(mine) // args.batch * args.batch
        net.train()
        loss_sum = torch.zeros(2, dtype=torch.float64)
        for at in range(0, usable, args.batch):
            idx = mine[at:at + args.batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            loss_sum += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
            steps += 1
        lr = lr_at(args, epoch)
        next_lr = lr_at(args, epoch + 1)
        norms = None
        if isinstance(state, bellows_torch.State):
            tele = state.telemetry()  # the levels in force during this epoch
            layer_levels = [tele[n]["level"] if tele[n]["compressed"] else "dense" for n in names]
            state.end_epoch(next_lr)
            tele = state.telemetry()  # the norms this epoch's check found
            norms = [tele[n]["norm"] for n in names]  # None where Accordion has not checked the parameter
            floats = state.floats_sent()
        else:
            name = next(iter(levels), None)
            layer_levels = ["dense" if name is None or not compressed(s, levels[name]) else name for s in shapes]
            floats = params * steps if state is None else (state.total_numel_after_compression +
                                                          params * min(steps, state.start_powerSGD_iter))
        for g in opt.param_groups:
            g["lr"] = next_lr
        # Test accuracy: each worker scores its share of the test images, then one allreduce.
        net.eval()
        with torch.no_grad():
            xs, ys = xte[rank::world], yte[rank::world]
            logits = torch.cat([net.module(xs[i:i + 1000]) for i in range(0, len(xs), 1000)])
            tally = torch.tensor([(logits.argmax(1) == ys).sum().item(),
                                  nn.functional.cross_entropy(logits, ys, reduction="sum").item(), len(ys)],
                                 dtype=torch.float64)
        dist.all_reduce(tally)
        dist.all_reduce(loss_sum)
        epochs.append(dict(epoch=epoch, lr=lr, test_accuracy=tally[0].item() / tally[2].item(),
                           test_loss=tally[1].item() / tally[2].item(),
                           train_loss=loss_sum[0].item() / loss_sum[1].item(), floats=floats, steps=steps,
                           seconds=time.perf_counter() - t0, levels=layer_levels, norms=norms))
        if rank == 0:
            shown = " ".join(f"{v} {layer_levels.count(v)}" for v in ("low", "high", "dense") if v in layer_levels)
            print(f"{progress} {key} seed {seed}: epoch {epoch + 1}/{args.epochs} test {100 * epochs[-1]['test_accuracy']:.2f}% "
                  f"loss {epochs[-1]['train_loss']:.3f} layers [{shown}] {epochs[-1]['seconds']:.1f} s", flush=True)
    if isinstance(state, bellows_torch.State):
        state.close()
    return dict(run=key, label=label, method=method, policy=policy, seed=seed, levels=levels,
                seconds=time.perf_counter() - start, params=params, epochs=epochs)


def compressed(shape, rank):
    """Whether PyTorch's hook compresses a parameter of this shape at this rank (_should_compress)."""
    n = shape[0]
    m = 1
    for d in shape[1:]:
        m *= d
    r = min(n, m, rank)
    return (n + m) * r * 2.0 < n * m


def worker(rank, world, init_method, args, todo):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    xtr, ytr = load("train", args.train_images)
    xte, yte = load("t10k", args.test_images)
    if args.image_size != 28:
        xtr = nn.functional.interpolate(xtr, size=args.image_size, mode="area")
        xte = nn.functional.interpolate(xte, size=args.image_size, mode="area")
    started = time.time()
    for i, (key, seed) in enumerate(todo):
        progress = f"[{i + 1}/{len(todo)}]"
        result = train_one(rank, world, args, key, seed, ((xtr, ytr), (xte, yte)), progress)
        if rank == 0:
            path = run_file(args.out, key, seed)
            with open(path + ".tmp", "w") as f:
                json.dump(result, f)
            os.replace(path + ".tmp", path)
            elapsed = time.time() - started
            left = elapsed / (i + 1) * (len(todo) - i - 1)
            print(f"{progress} {key} seed {seed}: final test {100 * result['epochs'][-1]['test_accuracy']:.2f}% "
                  f"in {result['seconds']:.0f} s; about {left / 60:.0f} min left", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="demo-results/torch-cnn", help="results folder")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated, of: " + ", ".join(RUNS))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--train-images", type=int, default=8192, help="the fixed subset: the package's first N")
    p.add_argument("--test-images", type=int, default=10000)
    p.add_argument("--image-size", type=int, default=14, help="images scaled (area) to this side")
    p.add_argument("--width", type=int, default=16, help="ResNet-8's first width (then 2x, 4x)")
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--interval", type=int, default=1, help="Accordion checks every this many epochs")
    p.add_argument("--eta", type=float, default=0.5)
    p.add_argument("--rank-low", type=int, default=2, help="PowerSGD rank of the low-compression level")
    p.add_argument("--rank-high", type=int, default=1)
    p.add_argument("--topk-low", type=float, default=0.1, help="top-k ratio of the low-compression level")
    p.add_argument("--topk-high", type=float, default=0.01)
    p.add_argument("--report-only", action="store_true", help="write the report from OUT/runs, train nothing")
    args = p.parse_args()
    keys = args.runs.split(",")
    unknown = [k for k in keys if k not in RUNS]
    if unknown:
        p.error(f"unknown runs {unknown}; known: {', '.join(RUNS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    settings = os.path.join(args.out, "runs", "settings.json")
    mine = {k: v for k, v in vars(args).items() if k not in ("out", "runs", "seeds", "report_only")}
    if os.path.exists(settings):
        with open(settings) as f:
            saved = json.load(f)
        if saved != mine:
            differ = ", ".join(f"{k}: {saved.get(k)} there, {v} here" for k, v in mine.items() if saved.get(k) != v)
            p.error(f"{args.out} holds runs of other settings ({differ}); use another --out")
    else:
        with open(settings, "w") as f:
            json.dump(mine, f, indent=1)
    todo = [(k, s) for s in seeds for k in keys if not os.path.exists(run_file(args.out, k, s))]
    done = len(keys) * len(seeds) - len(todo)
    if not args.report_only and todo:
        print(f"accordion_cnn: {len(todo)} runs to train ({done} found in {args.out}/runs)", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(spawned, args=(worker, args.workers, "file://" + os.path.join(tmp, "store"), args, todo),
                     nprocs=args.workers)
    accordion_cnn_report.write(args.out, mine, [(n, list(w.shape)) for n, w in resnet8(args.width).named_parameters()],
                               {k: describe(k, args)[0] for k in RUNS})


if __name__ == "__main__":
    main()
