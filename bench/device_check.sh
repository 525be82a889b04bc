#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The one entry point of the CUDA backend's checks on a machine with a GPU: builds the CUDA tests
# and benchmarks (sm_90), runs every CUDA test, the benchmarks at 2^26 floats, torch.topk on the
# same sizes when PyTorch sees the GPU, and prints a summary table last. Meant to finish within
# 8 minutes on an H200.
#
# The device machine has no network and may lack the test and benchmark libraries, so they travel:
#   here:   bench/device_check.sh --pack      (copies doctest, Google Benchmark, nlohmann-json and
#                                               zlib from this machine's packages into build-device/deps)
#   there:  bench/device_check.sh [OUT_DIR]   (carry build-device/deps; logs and JSON go to OUT_DIR,
#                                               default build-device/out)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-device
deps=$build/deps

if [ "${1:-}" = "--pack" ]; then
  rm -rf "$deps" && mkdir -p "$deps"
  for pkg in doctest-dev libbenchmark-dev libbenchmark1debian nlohmann-json3-dev zlib1g-dev; do
    dpkg -L "$pkg" | grep -v -e '/share/doc' -e '/share/man' | while read -r f; do
      if [ -f "$f" ]; then cp -L --parents "$f" "$deps"; fi
    done
  done
  cp -L /lib/x86_64-linux-gnu/libz.so.1 "$deps/usr/lib/x86_64-linux-gnu/"
  # benchmark's exported targets name /usr itself: make them relative to where they now lie.
  sed -i 's#set(_IMPORT_PREFIX "/usr")#get_filename_component(_IMPORT_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)#' \
    "$deps"/usr/lib/x86_64-linux-gnu/cmake/benchmark/benchmarkTargets.cmake
  du -sh "$deps"
  exit 0
fi

out=${1:-$build/out}
mkdir -p "$out"
start=$(date +%s)
export PATH=/usr/local/cuda/bin:$PATH
prefix=$deps/usr
export LD_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader >"$out/gpu.txt" 2>/dev/null \
  || echo "no nvidia-smi" >"$out/gpu.txt"

echo "== configure and build (sm_90)"
nvcc=$(command -v nvcc)
# NCCL: the toolkit's, else the one of the nvidia-nccl wheel beside PyTorch (only a versioned .so).
nccl_args=()
if [ ! -e "$(dirname "$nvcc")/../include/nccl.h" ]; then
  wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
  if [ -n "$wheel" ] && [ -e "$wheel/include/nccl.h" ]; then
    nccl_args=(-DBELLOWS_NCCL_INCLUDE_DIR="$wheel/include" -DBELLOWS_NCCL_LIBRARY="$(ls "$wheel"/lib/libnccl.so* | head -1)")
    export LD_LIBRARY_PATH=$wheel/lib:$LD_LIBRARY_PATH
  fi
fi
cmake -S "$root" -B "$build/tree" -G Ninja -DCMAKE_BUILD_TYPE=Release "${nccl_args[@]}" \
  -DBELLOWS_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DBELLOWS_BUILD_TESTS=ON -DBELLOWS_BUILD_BENCHMARKS=ON -DBELLOWS_BUILD_EXAMPLES=OFF -DBELLOWS_INSTALL=OFF \
  -DCMAKE_PREFIX_PATH="$prefix" -DZLIB_ROOT="$prefix" >"$out/configure.log" 2>&1 \
  || { tail -30 "$out/configure.log"; exit 1; }
# The CUDA targets this configuration has (test_cuda_nccl only where NCCL was found).
mapfile -t tests < <(ninja -C "$build/tree" -t targets all | sed -n 's/^\(test_cuda_[a-z0-9_]*\): .*/\1/p' | sort -u)
mapfile -t benches < <(ninja -C "$build/tree" -t targets all | sed -n 's/^\(bench_cuda_[a-z0-9_]*\): .*/\1/p' | sort -u)
echo "   targets: ${tests[*]} ${benches[*]}"
cmake --build "$build/tree" -j "$(nproc)" --target "${tests[@]}" "${benches[@]}" >"$out/build.log" 2>&1 \
  || { grep -B2 -A12 -m3 'error' "$out/build.log"; exit 1; }
echo "   built in $(( $(date +%s) - start )) s"

echo "== CUDA tests"
(cd "$build/tree" && ctest -R '^test_cuda_' --output-on-failure --timeout 300) 2>&1 | tee "$out/ctest.log" || true
# A test without a device passes after saying it skipped: say which it was.
"$build/tree/tests/test_cuda_philox" >"$out/device_seen.log" 2>&1 || true

echo "== CUDA benchmarks"
for b in "${benches[@]}"; do
  "$build/tree/bench/$b" --benchmark_min_time=0.5 --benchmark_out="$out/$b.json" --benchmark_out_format=json \
    2>&1 | tee "$out/$b.log" || true
done

echo "== torch.topk"
python3 "$root/bench/cuda/compare_torch_topk.py" >"$out/torch_topk.json" 2>"$out/torch_topk.log" \
  || echo '{"skipped": "the script failed"}' >"$out/torch_topk.json"
cat "$out/torch_topk.json"

python3 - "$out" "$(( $(date +%s) - start ))" <<'PY'
import glob, json, os, re, sys
out, seconds = sys.argv[1], sys.argv[2]
rows = []
log = open(os.path.join(out, "ctest.log")).read()
m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", log)
skipped = "device test skipped" in open(os.path.join(out, "device_seen.log")).read()
rows.append(("CUDA tests (ctest -R test_cuda_)", (f"{int(m.group(3)) - int(m.group(2))}/{m.group(3)} passed" if m else "no result")
             + (" (SKIPPED: no device)" if skipped else " on the device"), "all pass"))
bench = {}
for path in glob.glob(os.path.join(out, "bench_cuda_*.json")):
    for b in json.load(open(path)).get("benchmarks", []):
        bench[b["name"]] = b
def fig(name):
    b = bench.get(name)
    if b is None or "x_floor" not in b:
        return None
    return b["real_time"], b["x_floor"]
targets = {
    "cuda_topk/n:67108864/k:671088/feedback:0/approximate:0/manual_time": "<= 2.5 x_floor",
    "cuda_topk/n:67108864/k:671088/feedback:1/approximate:0/manual_time": "",
    "cuda_topk/n:67108864/k:67108/feedback:0/approximate:0/manual_time": "",
    "cuda_topk/n:67108864/k:671088/feedback:0/approximate:1/manual_time": "",
    "cuda_topk/n:67108864/k:671088/feedback:1/approximate:1/manual_time": "",
    "cuda_qsgd_encode/n:67108864/bits:4/manual_time": "<= 1.5 x_floor",
    "cuda_qsgd_encode/n:67108864/bits:8/manual_time": "<= 1.5 x_floor",
    "cuda_qsgd_decode/n:67108864/bits:4/manual_time": "",
    "cuda_qsgd_decode/n:67108864/bits:8/manual_time": "",
    "cuda_qsgd_step/n:67108864/bits:4/manual_time": "",
    "cuda_qsgd_step/n:67108864/bits:8/manual_time": "",
    "cuda_randk/n:67108864/k:671088/manual_time": "",
    "cuda_randk_step/n:67108864/k:671088/manual_time": "",
    "cuda_topk_step/n:67108864/k:671088/manual_time": "",
    "cuda_randk/n:67108864/k:33554432/iterations:2/manual_time": "",
}
for name, target in targets.items():
    f = fig(name)
    rows.append((name.replace("/manual_time", ""), "missing" if f is None else f"{f[0]:.3f} ms, {f[1]:.2f} x_floor", target))
torch = json.load(open(os.path.join(out, "torch_topk.json")))
ours = fig("cuda_topk/n:67108864/k:671088/feedback:0/approximate:0/manual_time")
if "skipped" in torch or ours is None:
    rows.append(("torch.topk(x.abs(), 1%) / bellows", torch.get("skipped", "no bellows figure"), ">= 2x"))
else:
    rows.append((f"torch {torch['torch']} topk(abs) {torch['topk_abs_ms']:.3f} ms, topk {torch['topk_only_ms']:.3f} ms",
                 f"{torch['topk_abs_ms'] / ours[0]:.2f}x (abs+topk), {torch['topk_only_ms'] / ours[0]:.2f}x (topk)", ">= 2x"))
# PowerSGD: x_floor beside the step's 8 streams of n m floats (bench/cuda/bench_powersgd.cu counts them).
for name, rank in [(f"cuda_powersgd_step/n:8192/rank:{r}/manual_time", r) for r in (1, 2, 4)] + \
        [(f"cuda_powersgd_compressor_step/n:8192/rank:{r}/manual_time", r) for r in (1, 4)]:
    b = bench.get(name)
    result = "missing" if b is None or "x_streams" not in b else \
        f"{b['real_time']:.3f} ms, {b['x_floor']:.2f} x_floor = {b['x_streams']:.2f}x its {b['streams']:.0f} streams"
    rows.append((name.replace("/manual_time", ""), result, "<= 2x its M reads" if rank == 4 else ""))
# Every device compressor of compressors/list.hpp, each example configuration (bench/cuda/bench_compressors.cu).
for name in sorted(n for n in bench if n.startswith("cuda_step/")):
    b = bench[name]
    result = "skipped: " + b.get("error_message", "") if b.get("error_occurred") else \
        f"{b['real_time']:.3f} ms, {b.get('x_floor', float('nan')):.2f} x_floor"
    rows.append((name.replace("/manual_time", ""), result, ""))
# The device Synchronizer's step against its compressors alone (bench/cuda/bench_synchronizer.cu).
for name in sorted(n for n in bench if n.startswith("cuda_synchronizer")):
    b = bench[name]
    if b.get("error_occurred"):
        result = "skipped: " + b.get("error_message", "")
    elif "sync_ms" in b:
        result = (f"{b['sync_ms']:.3f} ms vs {b['direct_ms']:.3f} ms direct: {b['overhead_pct']:+.1f}%, "
                  f"{b['x_floor']:.2f} x_floor")
    else:
        result = f"{b['real_time']:.3f} ms"
    rows.append((name.replace("/manual_time", "").replace("/iterations:3", ""), result,
                 "overhead < 2% (plain)" if name.endswith("/plain/manual_time") else ""))
gpu = open(os.path.join(out, "gpu.txt")).read().strip()
w0 = max(len(r[0]) for r in rows); w1 = max(len(r[1]) for r in rows)
print(f"\n== summary ({gpu}; {seconds} s)")
print(f"| {'check':<{w0}} | {'result':<{w1}} | target |")
print(f"|{'-' * (w0 + 2)}|{'-' * (w1 + 2)}|--------|")
for r in rows:
    print(f"| {r[0]:<{w0}} | {r[1]:<{w1}} | {r[2]} |")
PY
