#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The "Sparsified SGD with Memory" reproduction (examples/memsgd) with one command: installs the
# Debian 12 packages the release preset needs when missing (the Fashion-MNIST data among them),
# builds memsgd_demo and runs it; it writes results.json, results.md and SVG plots into the results
# folder and prints which of the paper's four claims held. About 4 minutes on 2 busy cores.
# Usage: scripts/memsgd.sh [--quick] [--out DIR] [memsgd_demo options...]
#    or: scripts/demo.sh memsgd [the same options]
#   --quick    smaller data, fewer epochs: under a minute after the build
#   --out DIR  results folder (default memsgd-results/ in the repository, ignored by git)
#   anything else goes to memsgd_demo (build/release/examples/memsgd_demo --help)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/memsgd-results"
pass=()
while (($#)); do
  if [ "$1" = "--out" ]; then
    [ $# -ge 2 ] || { echo "memsgd.sh: --out needs a folder" >&2; exit 2; }
    out=$2
    shift 2
  else
    pass+=("$1")
    shift
  fi
done

# shellcheck source=SCRIPTDIR/install_missing.sh
source "$root/scripts/install_missing.sh"
install_missing "${release_packages[@]}"

cd "$root"
cmake --preset release >/dev/null
cmake --build --preset release --target memsgd_demo
echo "== load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
./build/release/examples/memsgd_demo --out "$out" ${pass[@]+"${pass[@]}"}
