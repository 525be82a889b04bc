#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what is missing (Debian 12 packages), configures, builds and runs every test.
# CUDA code is compiled when nvcc exists (its tests skip without a GPU). Exits non-zero on any
# failure. Usage: scripts/test.sh   (BUILD_DIR=... to build elsewhere; default build/test)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build/test}
jobs=$(nproc)

packages=(cmake ninja-build g++ clang doctest-dev libbenchmark-dev libopenmpi-dev openmpi-bin
          zlib1g-dev dataset-fashion-mnist libcli11-dev nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cuda_args=()
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } || true
if [ -n "$nvcc" ]; then
  echo "== CUDA: $nvcc (architectures 80;90)"
  cuda_args=(-DBELLOWS_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" "-DCMAKE_CUDA_ARCHITECTURES=80;90")
else
  echo "== CUDA: no nvcc, CUDA code not built"
fi

echo "== configure ($build)"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBELLOWS_WARNINGS_AS_ERRORS=ON -DBELLOWS_ENABLE_MPI=ON "${cuda_args[@]}"
echo "== build"
cmake --build "$build" -j "$jobs"
echo "== test"
ctest --test-dir "$build" -j "$jobs" --output-on-failure
