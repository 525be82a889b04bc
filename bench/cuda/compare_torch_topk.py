#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times torch.topk for what bench_cuda_select times: the k = 1% largest magnitudes of 2^26
normal floats on the GPU (torch draws its own normals: the same size and distribution, not the
same bits), as torch.topk(x.abs(), k) and, for reference, torch.topk on x alone. CUDA events,
the median of 20 runs after 3 warm-ups. Prints one JSON object; without torch or a GPU, prints
{"skipped": reason} and exits 0."""
import json
import statistics
import sys


def main():
    try:
        import torch
    except ImportError:
        print(json.dumps({"skipped": "no torch"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch sees no GPU"}))
        return
    n = 1 << 26
    k = n // 100
    torch.manual_seed(1)
    x = torch.randn(n, device="cuda")

    def time_ms(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(20):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return statistics.median(times)

    result = {
        "torch": torch.__version__,
        "n": n,
        "k": k,
        "topk_abs_ms": time_ms(lambda: torch.topk(x.abs(), k, sorted=False)),
        "topk_only_ms": time_ms(lambda: torch.topk(x, k, sorted=False)),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
