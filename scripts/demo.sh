#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the release preset and runs the flagship example.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command -v cmake >/dev/null && command -v ninja >/dev/null && dpkg -s doctest-dev libbenchmark-dev >/dev/null 2>&1 || {
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends cmake ninja-build g++ doctest-dev libbenchmark-dev
}
cd "$root"
cmake --preset release >/dev/null
cmake --build --preset release --target quickstart
./build/release/examples/quickstart
