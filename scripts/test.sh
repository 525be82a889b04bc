#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what is missing (Debian 12 packages), checks the formatting of the C++ and CUDA sources
# (scripts/format.sh --check), configures, builds and runs the tests that need an unsanitized build
# (CUDA, MPI, the demos, packaging), then the CPU tests and the emulated CUDA tests under
# AddressSanitizer + UndefinedBehaviorSanitizer (each test executable is built once), the threaded
# tests (collectives, executor, synchronizer) under ThreadSanitizer, and a short fuzzing run of
# every decoder of untrusted bytes. CUDA code is compiled when nvcc exists (its tests skip without
# a GPU). The PyTorch DDP hook's tests (python/test.sh) run beside the sanitizer stages. Exits
# non-zero on any failure; prints each stage's time.
# Usage: scripts/test.sh   BUILD_DIR=... to build elsewhere (default build/test);
#        BELLOWS_QUICK=1 runs the main and python stages only; FUZZ_SECONDS=N per target (default 20).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build/test}
jobs=$(nproc)

packages=(cmake ninja-build g++ clang libclang-rt-14-dev doctest-dev libbenchmark-dev
          libopenmpi-dev openmpi-bin zlib1g-dev dataset-fashion-mnist libcli11-dev nlohmann-json3-dev
          python3-torch libtorch-dev pybind11-dev python3-pip python3-setuptools clang-format-14)
# shellcheck source=SCRIPTDIR/install_missing.sh
source "$root/scripts/install_missing.sh"
install_missing "${packages[@]}"

cuda_args=()
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } || true
if [ -n "$nvcc" ]; then
  # One architecture keeps the build short: sm_80, whose limits (shared memory, registers) are the
  # tighter, so what compiles here compiles for sm_90 too; bench/device_check.sh builds sm_90 on
  # the GPU machine, and users get CMake's default of 80;90.
  echo "== CUDA: $nvcc (architecture 80)"
  cuda_args=(-DBELLOWS_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" "-DCMAKE_CUDA_ARCHITECTURES=80")
else
  echo "== CUDA: no nvcc, CUDA code not built"
fi

stage() { echo "== $1 ($(( $(date +%s) - start ))s so far)"; }
start=$(date +%s)

# The sanitizer builds compile at -O1, but for the tests of the library's logic (compressors, the
# Synchronizer, collectives, the detector, error feedback, bellows-bench's pieces): their compiling
# is most of a sanitizer build and their running a few seconds, so -O0 halves the first and
# costs little of the second. The kernels' tests (cpu, emulated CUDA) and the demo's training
# steps keep -O1, since they run long.
unoptimized="^test_(compressors|sync|collectives|regime|feedback|tools)_"
sanitizer_configure() {  # name, flags
  cmake -S "$root" -B "$root/build/$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBELLOWS_BUILD_BENCHMARKS=OFF \
    -DBELLOWS_BUILD_EXAMPLES=OFF "-DCMAKE_CXX_FLAGS=$2 -fno-omit-frame-pointer" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DBELLOWS_TESTS_UNOPTIMIZED=$unoptimized" >/dev/null
}
sanitizer_tests() {  # name, ctest regex, ctest exclusion regex: the tests its stage builds and runs
  # MPI tests stay out: Open MPI's own allocations would read as leaks.
  ctest --test-dir "$root/build/$1" -N -LE "packaging|mpi" -R "$2" -E "$3" | sed -n 's/^ *Test *#[0-9]*: //p'
}
# Out of the ASan stage, to keep it short: the demos' training runs (fmnist_demo, fmnist_resume,
# memsgd; 160 s of compiling and 70 s of running under ASan; and fmnist_demo --backend cuda's
# against the emulation, fmnist_device: 165 s and 43 s), which the main stage runs, whose library
# code the library's tests run under ASan (the device Synchronizer's: emulated synchronizer) and
# whose own parsing (IDX files, checkpoints) fmnist_idx and the checkpoint tests cover.
# UBSan's vptr and null checks stay out: bellows has no virtual function (include/ and tests/
# declare none), and ASan reports a read or write through a null pointer as a SEGV with its
# backtrace; together they were a fifth of the compiling of the largest ASan test (230 -> 186 s).
asan_flags="-fsanitize=address,undefined -fno-sanitize=vptr,null -fno-sanitize-recover=all"
asan_only="^test_" asan_not="^test_(examples_(fmnist_demo|fmnist_resume|memsgd)|emulated_cuda_fmnist_device)$"

stage "format (scripts/format.sh --check)"
"$root/scripts/format.sh" --check

# Every test executable is built and run once: those the ASan stage runs (the emulated CUDA tests,
# which it checks down to each kernel's access, and the CPU tests but the demos) build there only,
# and the main build takes the rest: the CUDA tests (nvcc), MPI, the demos (the emulated one
# too), packaging, and bellows-bench's, which needs the examples that the sanitizer builds leave
# out. With BELLOWS_QUICK (no sanitizer stages) the main build takes every test.
elsewhere=""
if [ -z "${BELLOWS_QUICK:-}" ]; then
  stage "asan: configure (its tests leave the main build)"
  sanitizer_configure asan "$asan_flags"
  elsewhere=$(sanitizer_tests asan "$asan_only" "$asan_not" | paste -sd ';')
fi
stage "configure ($build)"
# -g1 (line tables: what a backtrace and the sanitizers print) builds faster than -g; for nvcc,
# whose -g hands the host compiler full debug info, by about a quarter of a translation unit.
# nvcc's -O sets the host code's level only: -O0 takes a fifth off its time, and the kernels keep
# their device optimization. The CUDA code's host side here is tests, benchmarks and the demo's
# device path, which CI, without a GPU, compiles and never runs (bench/device_check.sh builds its
# own on a GPU).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O0 -Xcompiler=-g1 -DNDEBUG" \
  -DBELLOWS_WARNINGS_AS_ERRORS=ON -DBELLOWS_ENABLE_MPI=ON -DBELLOWS_EMULATED_TESTS=ON \
  "-DBELLOWS_TESTS_ELSEWHERE=$elsewhere" "${cuda_args[@]}"
stage "build"
cmake --build "$build" -j "$jobs"
stage "test"
ctest --test-dir "$build" -j "$jobs" --output-on-failure
if [ -n "${BELLOWS_QUICK:-}" ]; then
  stage "python: the DDP hook (python/test.sh)"
  "$root/python/test.sh"
  stage "done (BELLOWS_QUICK: sanitizers and fuzzing skipped)"
  exit 0
fi

# The DDP hook's build compiles one translation unit for about 100 s, on one core: it runs beside
# the sanitizer stages (its report is printed after them), which use the other.
stage "python: the DDP hook (python/test.sh), in the background"
python_log="$build/python_test.log"
(
  py_start=$(date +%s)
  "$root/python/test.sh"
  echo "python/test.sh took $(( $(date +%s) - py_start ))s"
) >"$python_log" 2>&1 &
python_pid=$!
trap 'pkill -P "$python_pid" 2>/dev/null; kill "$python_pid" 2>/dev/null || true' EXIT

sanitize() {  # name, flags, ctest regex, ctest exclusion regex
  stage "$1: configure and build"
  sanitizer_configure "$1" "$2"
  local targets
  targets=$(sanitizer_tests "$1" "$3" "$4")
  # shellcheck disable=SC2086
  cmake --build "$root/build/$1" -j "$jobs" --target $targets
  stage "$1: test"
  ctest --test-dir "$root/build/$1" -j "$jobs" --output-on-failure -LE "packaging|mpi" -R "$3" -E "$4"
}
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
# The emulated CUDA tests run under ASan (their fibers tell it when they switch stacks), so a
# kernel's read or write past a device buffer is caught here.
sanitize asan "$asan_flags" "$asan_only" "$asan_not"
sanitize tsan "-fsanitize=thread" "^test_(collectives|cpu_executor|sync|regime)" "^$"

stage "python: waiting for the DDP hook's tests ($python_log)"
python_rc=0
wait "$python_pid" || python_rc=$?
trap - EXIT
cat "$python_log"
[ "$python_rc" -eq 0 ] || { echo "python/test.sh failed (exit $python_rc)"; exit 1; }

stage "fuzz (${FUZZ_SECONDS:-20}s per target)"
"$root/scripts/fuzz.sh" "${FUZZ_SECONDS:-20}"
stage "done"
