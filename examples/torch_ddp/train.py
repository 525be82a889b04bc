#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fashion-MNIST on PyTorch DistributedDataParallel (gloo, CPU), the same training averaged several
ways, one after the other (--runs picks them, in this order by default):

  allreduce          no hook: DDP's own allreduce
  torch-powersgd     PyTorch's powerSGD_hook at rank R (start_powerSGD_iter = 2, its least)
  powersgd-low       bellows_torch.hook, PowerSGD at rank R always
  powersgd-high      the same at the high-compression rank r
  accordion          bellows PowerSGD switched per layer by Accordion, R <-> r (checked every epoch)
  powersgd-low-sync  powersgd-low with overlap=False: the hook averages before it returns
                     (not run by default)

and prints a table of test accuracy, floats each worker sent per step and time per step.
Needs: python3-torch, bellows_torch installed (pip install --no-build-isolation ./python), and
Debian's dataset-fashion-mnist. Usage: train.py [--epochs 6] [--train-limit 20000] [--out DIR]

--checkpoint DIR saves, after every epoch, each worker's model, optimizer, data-order generator
and hook state to DIR/<run>/epoch<E>.rank<R>.pt; --resume continues each run from the last epoch
that every worker saved. --dist tcp://HOST:PORT --rank R runs one worker in this process (one
per machine or network namespace, as examples/torch_ddp/netns.sh does) instead of spawning all."""
import argparse
import gzip
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import bellows_torch

DATA = "/usr/share/datasets/fashion-mnist"  # dpkg -L dataset-fashion-mnist


def read_idx(name):
    """An IDX file of the package as a numpy array (images: n x 28 x 28 uint8; labels: n)."""
    with gzip.open(os.path.join(DATA, name)) as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(prefix, limit):
    x = torch.from_numpy(read_idx(f"{prefix}-images-idx3-ubyte.gz")[:limit].astype(np.float32) / 255.0)
    y = torch.from_numpy(read_idx(f"{prefix}-labels-idx1-ubyte.gz")[:limit].astype(np.int64))
    return ((x - 0.2860) / 0.3530).unsqueeze(1), y  # the training set's mean and deviation


def model(kind):
    """mlp: the MLP 784-256-128-10 of the C++ demo (examples/fmnist), 235,146 parameters; deep:
    784-512-512-512-512-10, 1,195,018 parameters (four buckets of DDP's at --bucket-cap-mb 1)."""
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    layers, width = [nn.Flatten()], 784
    for _ in range(4):
        layers += [nn.Linear(width, 512), nn.ReLU()]
        width = 512
    return nn.Sequential(*layers, nn.Linear(width, 10))


def torch_powersgd_waiting(state, bucket):
    """PyTorch's powerSGD_hook, waited for before DDP moves to the next bucket. Unwaited, on gloo
    with several buckets, its chained allreduces (issued from completion callbacks) reach the two
    processes in different orders and gloo aborts (pair.cc: op.preamble.length <= op.nbytes).
    Waiting also puts it on the footing of bellows' hook, which is synchronous."""
    fut = torch_psgd.powerSGD_hook(state, bucket)
    fut.wait()
    return fut


def spawned(rank, work, *args):
    """mp.spawn's entry: work(rank, *args), then leave without Python's finalization. A gloo thread
    may still drop the last callback of a torch future (powerSGD_hook chains them), which takes the
    GIL in a C++ destructor; once the interpreter finalizes, that stops the thread inside a noexcept
    frame and aborts the process, though every result is written. A failed run raises as before."""
    work(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def runs(args):
    """[(key, label, how)] of the runs --runs names."""
    high, low = args.rank_high, args.rank_low
    known = {
        "allreduce": ("no hook", None),
        "torch-powersgd": (f"torch PowerSGD rank {low}", ("torch", low)),
        "powersgd-low": (f"bellows PowerSGD rank {low}", ("bellows", dict(compressor="powersgd", low=low))),
        "powersgd-high": (f"bellows PowerSGD rank {high}", ("bellows", dict(compressor="powersgd", low=high))),
        "accordion": (f"bellows Accordion rank {low} <-> {high}",
                      ("bellows", dict(compressor="powersgd", low=low, high=high, accordion=True, interval=1))),
        "powersgd-low-sync": (f"bellows PowerSGD rank {low}, no overlap",
                              ("bellows", dict(compressor="powersgd", low=low, overlap=False))),
    }
    keys = args.runs.split(",")
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise SystemExit(f"train.py: unknown runs {unknown}; known: {', '.join(known)}")
    if args.checkpoint and "torch-powersgd" in keys:
        raise SystemExit("train.py: --checkpoint cannot save PyTorch 1.13's PowerSGDState; leave out torch-powersgd")
    return [(k, *known[k]) for k in keys]


# PyTorch 1.13's weights_only loader reads no pickled float: a checkpoint holds each float (the
# optimizer's learning rate, the accuracies) as a 0-dim float64 tensor, which nothing else is.
def floats_as_tensors(obj):
    if isinstance(obj, float):
        return torch.tensor(obj, dtype=torch.float64)
    if isinstance(obj, dict):
        return {k: floats_as_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(floats_as_tensors(v) for v in obj)
    return obj


def tensors_as_floats(obj):
    if isinstance(obj, torch.Tensor) and obj.dim() == 0 and obj.dtype == torch.float64:
        return obj.item()
    if isinstance(obj, dict):
        return {k: tensors_as_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(tensors_as_floats(v) for v in obj)
    return obj


def checkpoint_path(folder, epoch, rank):
    return os.path.join(folder, f"epoch{epoch}.rank{rank}.pt")


def last_complete_epoch(folder, world):
    """The last epoch every worker saved (0: none)."""
    epoch = 0
    while all(os.path.exists(checkpoint_path(folder, epoch + 1, r)) for r in range(world)):
        epoch += 1
    return epoch


def save_checkpoint(path, content):
    """torch.save through a temporary file and a rename: a worker killed while saving leaves the
    previous epoch's file, never half of one."""
    tmp = path + ".tmp"
    torch.save(floats_as_tensors(content), tmp)
    os.replace(tmp, path)


def lr_at(args, epoch):
    return args.lr * (0.1 if epoch >= args.decay_epoch else 1.0)


def train_one(rank, world, args, key, how, data):
    (xtr, ytr), (xte, yte) = data
    torch.manual_seed(args.seed)
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.bucket_cap_mb * 1024 * 1024)  # in this process
    net = DDP(model(args.model), bucket_cap_mb=args.bucket_cap_mb)
    params = sum(p.numel() for p in net.parameters())
    state = None
    if how is not None and how[0] == "torch":
        state = torch_psgd.PowerSGDState(process_group=None, matrix_approximation_rank=how[1],
                                         start_powerSGD_iter=2, random_seed=args.seed)
        net.register_comm_hook(state, torch_powersgd_waiting)
    elif how is not None:
        state = bellows_torch.State(seed=args.seed, model=net, **how[1])
        net.register_comm_hook(state, bellows_torch.hook)
    opt = torch.optim.SGD(net.parameters(), lr=lr_at(args, 0), momentum=0.9)
    gen = torch.Generator().manual_seed(args.seed)
    steps, seconds, history, start_epoch = 0, 0.0, [], 0
    folder = os.path.join(args.checkpoint, key) if args.checkpoint else None
    if folder and args.resume:
        start_epoch = last_complete_epoch(folder, world)
        if start_epoch > 0:
            ck = tensors_as_floats(torch.load(checkpoint_path(folder, start_epoch, rank), weights_only=True))
            net.module.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            gen.set_state(ck["generator"])
            if state is not None:
                state.load_state_dict(ck["hook"])
            steps, seconds, history = ck["steps"], ck["seconds"], ck["history"]
        if rank == 0:
            print(f"{key}: resumed after epoch {start_epoch}" if start_epoch
                  else f"{key}: no checkpoint, from the start", flush=True)
    if folder:
        os.makedirs(folder, exist_ok=True)
    for epoch in range(start_epoch, args.epochs):
        order = torch.randperm(len(xtr), generator=gen)
        mine = order[rank::world]  # each worker its share of the epoch
        usable = len(mine) // args.batch * args.batch
        net.train()
        start = time.perf_counter()
        for at in range(0, usable, args.batch):
            idx = mine[at:at + args.batch]
            opt.zero_grad()
            nn.functional.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
            opt.step()
            steps += 1
        seconds += time.perf_counter() - start
        next_lr = lr_at(args, epoch + 1)
        if isinstance(state, bellows_torch.State):
            state.end_epoch(next_lr)
        for g in opt.param_groups:
            g["lr"] = next_lr
        net.eval()
        with torch.no_grad():
            accuracy = (net.module(xte).argmax(1) == yte).float().mean().item()
        levels = None
        if isinstance(state, bellows_torch.State):
            levels = sorted({layer["level"] for layer in state.telemetry().values() if layer["compressed"]})
        history.append(dict(epoch=epoch + 1, accuracy=accuracy, levels=levels))
        if folder:
            save_checkpoint(checkpoint_path(folder, epoch + 1, rank), dict(
                model=net.module.state_dict(), optimizer=opt.state_dict(), generator=gen.get_state(),
                hook=state.state_dict() if state is not None else None, steps=steps, seconds=seconds,
                history=history))
        if rank == 0:
            print(f"{key}: epoch {epoch + 1}/{args.epochs} accuracy {100 * accuracy:.2f}%", flush=True)
    if how is None:
        floats = params * steps  # DDP allreduces every gradient every step
    elif how[0] == "torch":
        # PyTorch counts what its compressed steps sent; its first two steps are plain allreduces.
        floats = state.total_numel_after_compression + params * state.start_powerSGD_iter
    else:
        floats = state.floats_sent()
    return dict(accuracy=history[-1]["accuracy"], floats_per_step=floats / steps,
                ms_per_step=1000.0 * seconds / steps, steps=steps, params=params, history=history)


def worker(rank, world, init_method, out, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    data = load("train", args.train_limit), load("t10k", args.test_limit)
    results = []
    for key, label, how in runs(args):
        r = train_one(rank, world, args, key, how, data)
        r["run"], r["label"] = key, label
        if rank == 0:
            print(f"{label}: accuracy {100 * r['accuracy']:.2f}%, {r['floats_per_step']:.0f} floats/step, "
                  f"{r['ms_per_step']:.1f} ms/step", flush=True)
        results.append(r)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def table(results):
    lines = ["| averaging | test accuracy | floats sent per step (per worker) | vs. no hook | time per step |",
             "|---|---:|---:|---:|---:|"]
    for r in results:
        fewer = "baseline" if r["run"] == "allreduce" else f"{r['params'] / r['floats_per_step']:.1f}x fewer"
        lines.append(f"| {r['label']} | {100 * r['accuracy']:.2f}% | {r['floats_per_step']:,.0f} | {fewer} | "
                     f"{r['ms_per_step']:.1f} ms |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--train-limit", type=int, default=20000, help="training images used (60000: all)")
    p.add_argument("--test-limit", type=int, default=10000)
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--decay-epoch", type=int, default=4, help="lr x0.1 from this (0-based) epoch on")
    p.add_argument("--rank-low", type=int, default=4, help="PowerSGD rank of the low-compression level")
    p.add_argument("--rank-high", type=int, default=1, help="PowerSGD rank of the high-compression level")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", default="allreduce,torch-powersgd,powersgd-low,powersgd-high,accordion",
                   help="comma-separated: allreduce, torch-powersgd, powersgd-low, powersgd-high, accordion, "
                        "powersgd-low-sync")
    p.add_argument("--model", choices=("mlp", "deep"), default="mlp")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="DDP's bucket size (its first bucket too); 25 (DDP's default) holds either model in one")
    p.add_argument("--checkpoint", help="directory: save every worker's state after each epoch")
    p.add_argument("--resume", action="store_true", help="continue from the last epoch saved in --checkpoint")
    p.add_argument("--dist", help="tcp://HOST:PORT of rank 0: run one worker here, of rank --rank")
    p.add_argument("--rank", type=int, default=0, help="with --dist: this worker's rank")
    p.add_argument("--out", help="directory for results.json and results.md")
    args = p.parse_args()
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint")
    runs(args)  # refuse unknown runs before starting workers
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        if args.dist:
            worker(args.rank, args.workers, args.dist, out, args)
            if args.rank != 0:
                return
        else:
            mp.spawn(spawned, args=(worker, args.workers, "file://" + os.path.join(tmp, "store"), out, args),
                     nprocs=args.workers)
        with open(out) as f:
            results = json.load(f)
    text = table(results)
    for r in results:
        if "Accordion" in r["label"]:
            # the levels in force after each epoch's end_epoch, i.e. during the next epoch
            text += (f"\n\n{r['label']}: compressed layers' levels decided after each epoch: "
                     + ", ".join("/".join(h["levels"]) for h in r["history"]) + ".")
    setting = (f"{args.workers} gloo workers, model {args.model} in DDP buckets of {args.bucket_cap_mb} MB, "
               f"{args.epochs} epochs of {args.train_limit} training images "
               f"(batch {args.batch} per worker, SGD lr {args.lr} momentum 0.9, x0.1 from epoch "
               f"{args.decay_epoch + 1}), test accuracy on {args.test_limit} images; "
               f"{time.time() - start:.0f} s in all, load average {os.getloadavg()[0]:.1f} at the end")
    print(text)
    print(setting)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(setting=vars(args), results=results), f, indent=1)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(f"{text}\n\n{setting}.\n")


if __name__ == "__main__":
    main()
