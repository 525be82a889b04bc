#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times PyTorch's own operations for what bellows' CPU benchmarks time, on one thread, and
prints them beside bellows' figures with the ratio.

PowerSGD: one step of the arithmetic of PyTorch's PowerSGD communication hook on one rank, with
error feedback: M = g + e, the hook's own _orthogonalize on Q, P = M Q, _orthogonalize on P,
Q = M^T P, out = P Q^T, e = M - out (the allreduces of one rank are no-ops).
QSGD: the same quantisation written with torch operations (bucket L2 norms, torch.rand noise,
floor, sign-magnitude codes packed into bytes with shifts), and its decoding.

bellows' figures come from the Google Benchmark executables (bench_cpu_powersgd, bench_cpu_qsgd)
when --build points at a build folder that holds them; otherwise only torch's times are printed.
Without an importable torch the script says so and exits 0.

Usage: compare_torch.py [--build BUILD_DIR] [--quick]
(Debian's python3-torch installs into the system python: run it with /usr/bin/python3.)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

POWERSGD_SHAPES = [(1024, 1024), (4096, 4096), (8192, 8192), (4096, 9 * 512)]
RANKS = [1, 2, 4, 8]
QSGD_N = 1 << 24
QSGD_BITS = [2, 4, 8]
BUCKET = 512


def median_seconds(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_powersgd_step(torch, orthogonalize, n, m, rank, repeats):
    g = torch.randn(n, m)
    e = torch.zeros(n, m)
    q = torch.randn(1, m, rank)

    def step():
        nonlocal e, q
        mat = (g + e).unsqueeze(0)
        orthogonalize(q)
        p = torch.bmm(mat, q)
        orthogonalize(p)
        q = torch.bmm(mat.transpose(1, 2), p)
        out = torch.bmm(p, q.transpose(1, 2))
        e = (mat - out).squeeze(0)

    return median_seconds(step, repeats)


def torch_qsgd(torch, bits, repeats):
    s = (1 << (bits - 1)) - 1
    per_byte = 8 // bits
    v = torch.randn(QSGD_N)
    gen = torch.Generator().manual_seed(0)
    shifts = torch.arange(per_byte, dtype=torch.int32) * bits
    state = {}

    def encode():
        buckets = v.view(-1, BUCKET)
        scale = buckets.norm(dim=1, keepdim=True)
        level = torch.floor(buckets.abs() * (s / scale) + torch.rand(buckets.shape, generator=gen))
        level = torch.clamp(level, max=s).to(torch.int32)
        code = level | ((buckets < 0) & (level > 0)).to(torch.int32) << (bits - 1)
        packed = (code.view(-1, per_byte) << shifts).sum(dim=1).to(torch.uint8)
        state["scale"], state["packed"] = scale, packed

    def decode():
        code = (state["packed"].to(torch.int32).unsqueeze(1) >> shifts) & ((1 << bits) - 1)
        code = code.view(-1, BUCKET)
        mag = (code & s).to(torch.float32) * (state["scale"] / s)
        return torch.where(code >> (bits - 1) != 0, -mag, mag).view(-1)

    encode()
    return median_seconds(encode, repeats), median_seconds(decode, repeats)


def bellows_figures(build, name, filt):
    """Median real time (ms) per benchmark name from a Google Benchmark executable."""
    exe = os.path.join(build, "bench", name)
    if not build or not os.access(exe, os.X_OK):
        return {}
    out = subprocess.run([exe, f"--benchmark_filter={filt}", "--benchmark_repetitions=3",
                          "--benchmark_report_aggregates_only=true", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    figures = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            figures[b["run_name"]] = b["real_time"]  # the benchmarks report milliseconds
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="", help="bellows build folder with bench/ executables")
    parser.add_argument("--quick", action="store_true", help="only 1024^2 and 4096^2, ranks 1 and 4")
    args = parser.parse_args()
    try:
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    except ImportError as exc:
        print(f"compare_torch.py: skipped, torch is not importable ({exc})")
        return 0
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = POWERSGD_SHAPES[:2] if args.quick else POWERSGD_SHAPES
    ranks = [1, 4] if args.quick else RANKS
    repeats = 3

    ours = bellows_figures(args.build, "bench_cpu_powersgd", "powersgd_step")
    print(f"torch {torch.__version__}, one thread; times in ms (medians)")
    print()
    print("| PowerSGD step with EF | rank | torch (hook arithmetic) | bellows | torch / bellows |")
    print("|---|---:|---:|---:|---:|")
    for n, m in shapes:
        for r in ranks:
            t = torch_powersgd_step(torch, powerSGD_hook._orthogonalize, n, m, r, repeats) * 1e3
            b = ours.get(f"powersgd_step/n:{n}/m:{m}/rank:{r}/real_time")
            ratio = f"{t / b:.1f}" if b else "-"
            print(f"| {n} x {m} | {r} | {t:.1f} | {b:.1f} | {ratio} |" if b else
                  f"| {n} x {m} | {r} | {t:.1f} | - | - |")
    ours = bellows_figures(args.build, "bench_cpu_qsgd", "qsgd_encode|qsgd_decode_add")
    print()
    print("| QSGD, 2^24 floats, bucket 512 | bits | torch | bellows | torch / bellows |")
    print("|---|---:|---:|---:|---:|")
    for bits in QSGD_BITS:
        enc, dec = torch_qsgd(torch, bits, repeats)
        for what, t in (("encode", enc), ("decode_add", dec)):  # torch decodes into a new tensor
            b = ours.get(f"qsgd_{what}/n:{QSGD_N}/bits:{bits}/real_time")
            t *= 1e3
            print(f"| {what} | {bits} | {t:.1f} | {b:.1f} | {t / b:.1f} |" if b else
                  f"| {what} | {bits} | {t:.1f} | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
