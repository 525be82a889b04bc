#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Accordion's claim on real data, with one command: installs what is missing (Debian 12 packages,
# the Fashion-MNIST data among them), builds the release preset's quickstart and fmnist_demo, runs
# the quickstart, then trains the comparison of examples/fmnist (uncompressed; PowerSGD at rank
# pairs 4 <-> 1 and 2 <-> 1 and top-k, each static low, static high and Accordion; two seeds; 48
# epochs of 10000 images) and writes results.json, results.md and three SVG plots into the
# results folder.
# Usage: scripts/demo.sh [--quick] [--out DIR] [fmnist_demo options...]
#        scripts/demo.sh ablation [--out DIR] [fmnist_demo options...]
#   --quick    one seed, 6 epochs of 4800 images: under 2 minutes with the build
#   --out DIR  results folder (default demo-results/ in the repository, ignored by git;
#              demo-results/ablation for the ablation)
#   ablation   PowerSGD Accordion at lr 0.05 and 0.025, level change keep and reset, both rank
#              pairs, two seeds, beside static low (fmnist_demo --ablation): a table in DIR/results.md
#   anything else goes to fmnist_demo (build/release/examples/fmnist_demo --help)
#        scripts/demo.sh torch-cnn [accordion_cnn.py options...]
#              Accordion through bellows_torch on a residual CNN beside PyTorch's PowerSGD hook
#              (examples/torch_ddp/accordion_cnn.py; results in demo-results/torch-cnn unless --out
#              names another folder). Rerun the same command to resume after an interruption.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# `scripts/demo.sh memsgd [options]`: the "Sparsified SGD with Memory" reproduction instead
# (scripts/memsgd.sh, examples/memsgd).
if [ "${1:-}" = memsgd ]; then
  shift
  exec "$root/scripts/memsgd.sh" "$@"
fi

# `scripts/demo.sh torch-cnn [options]`: installs python3-torch and what building bellows_torch
# needs, builds it into build-py/site, and runs examples/torch_ddp/accordion_cnn.py.
if [ "${1:-}" = torch-cnn ]; then
  shift
  # shellcheck source=SCRIPTDIR/install_missing.sh
  source "$root/scripts/install_missing.sh"
  install_missing python3-torch libtorch-dev pybind11-dev python3-pip python3-setuptools dataset-fashion-mnist
  cd "$root"
  start=$(date +%s)
  /usr/bin/python3 -m pip install --quiet --no-build-isolation --no-index --no-deps --root-user-action=ignore \
    --upgrade --target build-py/site ./python
  echo "== bellows_torch built in $(($(date +%s) - start)) s"
  start=$(date +%s)
  PYTHONPATH="$root/build-py/site" /usr/bin/python3 examples/torch_ddp/accordion_cnn.py "$@"
  echo "== torch-cnn took $(($(date +%s) - start)) s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
fi

out="$root/demo-results"
args=()
if [ "${1:-}" = ablation ]; then
  shift
  out="$root/demo-results/ablation"
  args+=(--ablation)
fi
while (($#)); do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "demo.sh: --out needs a folder" >&2; exit 2; }; out=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

# shellcheck source=SCRIPTDIR/install_missing.sh
source "$root/scripts/install_missing.sh"
install_missing "${release_packages[@]}"

cd "$root"
start=$(date +%s)
cmake --preset release >/dev/null
cmake --build --preset release --target quickstart fmnist_demo
echo "== built in $(($(date +%s) - start)) s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
./build/release/examples/quickstart
run_start=$(date +%s)
./build/release/examples/fmnist_demo --out "$out" ${args[@]+"${args[@]}"}
what=comparison
[ "${args[0]:-}" = --ablation ] && what=ablation
echo "== $what took $(($(date +%s) - run_start)) s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
