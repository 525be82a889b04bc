#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs bellows_torch with the command docs/pytorch.md gives (into build-py/site, not the system's
# Python) and runs its tests on 2 gloo processes. Skips, and passes, when the Python in use cannot
# import torch (Debian: python3-torch; the extension also needs libtorch-dev and pybind11-dev).
# Usage: python/test.sh      PYTHON=... picks the interpreter (default /usr/bin/python3).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-/usr/bin/python3}
site=$root/build-py/site

if ! "$py" -c "import torch" 2>/dev/null; then
  echo "bellows_torch: skipped, $py cannot import torch"
  exit 0
fi
rm -rf "$site"
"$py" -m pip install --quiet --no-build-isolation --no-index --no-deps --root-user-action=ignore --target "$site" "$root/python"
cd "$root/python/tests"
PYTHONPATH=$site "$py" -m unittest -v test_hook_vs_direct test_powersgd_vs_torch test_hook_non_finite \
  test_state_dict test_mixed_precision test_overlap test_resume test_cnn_floor \
  test_cnn_quick test_process_group_alltoall
