#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS (default 20),
# starting from and adding to its corpus under tests/corpus/<target>/. Before fuzzing, every
# corpus file (including the crash regressions kept there) is run once. Exits non-zero on the
# first crash; the crashing input is left in build/fuzz/crashes/.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-20}
build=${FUZZ_BUILD_DIR:-$root/build/fuzz}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DBELLOWS_BUILD_FUZZERS=ON -DBELLOWS_BUILD_TESTS=OFF -DBELLOWS_BUILD_BENCHMARKS=OFF \
  -DBELLOWS_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" -j "$(nproc)"
mkdir -p "$build/crashes"
for exe in "$build"/fuzz/fuzz_*; do
  [ -x "$exe" ] || continue
  name=$(basename "$exe")
  corpus="$root/tests/corpus/${name#fuzz_}"
  work="$build/corpus/${name#fuzz_}"
  mkdir -p "$corpus" "$work"
  echo "== $name: replay $(find "$corpus" -type f | wc -l) corpus files, then fuzz ${seconds}s"
  if [ -n "$(ls -A "$corpus")" ]; then "$exe" -runs=0 "$corpus" 2>&1 | tail -n 1; fi
  "$exe" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$build/crashes/$name-" -print_final_stats=1 "$work" "$corpus" 2>&1 |
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY)" || true
  if ls "$build/crashes/$name-"* >/dev/null 2>&1; then
    echo "$name: crash found, input kept in $build/crashes/ (add it to $corpus as a regression)"
    exit 1
  fi
done
echo "fuzzing: no crash in any target"
