#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS (default 20),
# starting from and adding to its corpus under tests/corpus/<target>/. Before fuzzing, every
# corpus file (including the crash regressions kept there) is run once. Targets run side by side,
# one per core. Exits non-zero when any target crashed; the crashing inputs are left in
# build/fuzz/crashes/.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-20}
build=${FUZZ_BUILD_DIR:-$root/build/fuzz}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DBELLOWS_BUILD_FUZZERS=ON -DBELLOWS_BUILD_TESTS=OFF -DBELLOWS_BUILD_BENCHMARKS=OFF \
  -DBELLOWS_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" -j "$(nproc)"
rm -rf "$build/logs"
mkdir -p "$build/crashes" "$build/logs"
# One target per core at a time: each fuzzer is single-threaded.
fuzz_one() {  # executable; its report goes to build/fuzz/logs/<name>.log
  local exe=$1 name corpus work
  name=$(basename "$exe")
  corpus="$root/tests/corpus/${name#fuzz_}"
  work="$build/corpus/${name#fuzz_}"
  mkdir -p "$corpus" "$work"
  {
    echo "== $name: replay $(find "$corpus" -type f | wc -l) corpus files, then fuzz ${seconds}s"
    if [ -n "$(ls -A "$corpus")" ]; then "$exe" -runs=0 "$corpus" 2>&1 | tail -n 1; fi
    "$exe" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$build/crashes/$name-" -print_final_stats=1 "$work" "$corpus" 2>&1 |
      grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY)" || true
  } >"$build/logs/$name.log"
}
targets=()
for exe in "$build"/fuzz/fuzz_*; do [ -x "$exe" ] && targets+=("$exe"); done
running=0
for exe in "${targets[@]}"; do
  if [ "$running" -ge "$(nproc)" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  { fuzz_one "$exe" || echo "$(basename "$exe") failed (exit $?)" >"$build/logs/$(basename "$exe").failed"; } &
  running=$((running + 1))
done
wait || true
failed=0
for exe in "${targets[@]}"; do
  name=$(basename "$exe")
  cat "$build/logs/$name.log"
  if [ -f "$build/logs/$name.failed" ]; then
    cat "$build/logs/$name.failed"
    failed=1
  fi
  if ls "$build/crashes/$name-"* >/dev/null 2>&1; then
    echo "$name: crash found, input kept in $build/crashes/ (add it to tests/corpus/${name#fuzz_}/ as a regression)"
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1
echo "fuzzing: no crash in any of the ${#targets[@]} targets"
