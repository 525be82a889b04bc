#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Formats the tracked C++ and CUDA sources (*.hpp *.cpp *.cuh *.cu *.h) with clang-format-14 and
# the repository's .clang-format. Skipped: data folders (tests/corpus) and generated files (a
# "do not edit" line in their first five lines).
# Usage: scripts/format.sh           rewrites the files in place
#        scripts/format.sh --check   changes nothing; lists the files that are not formatted and
#                                    exits 1 if there are any
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
formatter=clang-format-14

mode=fix
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac
command -v "$formatter" >/dev/null ||
  { echo "format.sh: $formatter not found (Debian: apt-get install clang-format-14)" >&2; exit 2; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
  { echo "format.sh: $root is not a git checkout; the files to format are the tracked ones" >&2; exit 2; }

files=()
while IFS= read -r -d '' f; do
  case "$f" in tests/corpus/*) continue ;; esac
  head -n 5 "$f" | grep -qi 'do not edit' && continue
  files+=("$f")
done < <(git ls-files -z -- '*.hpp' '*.cpp' '*.cuh' '*.cu' '*.h')
[ "${#files[@]}" -gt 0 ] || { echo "format.sh: no C++ or CUDA files tracked"; exit 0; }

if [ "$mode" = fix ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -r -n 32 "$formatter" -i --style=file
  echo "format.sh: ${#files[@]} files formatted"
  exit 0
fi

# --dry-run --Werror reports a file's first difference as "FILE:LINE:COL: error: code should be
# clang-formatted"; any other failure (a bad .clang-format, a crash) lists no file and stops here.
status=0
report=$(printf '%s\0' "${files[@]}" |
  xargs -0 -r -n 32 "$formatter" --dry-run --Werror --ferror-limit=1 --style=file 2>&1) || status=$?
mapfile -t unformatted < <(sed -nE 's/^(.+):[0-9]+:[0-9]+: error: code should be clang-formatted.*/\1/p' \
  <<<"$report" | sort -u)
if [ "${#unformatted[@]}" -eq 0 ]; then
  [ "$status" -eq 0 ] || { echo "$report" >&2; echo "format.sh: $formatter failed (exit $status)" >&2; exit 2; }
  echo "format.sh: all ${#files[@]} files formatted"
  exit 0
fi
echo "format.sh: ${#unformatted[@]} of ${#files[@]} files are not formatted:"
printf '  %s\n' "${unformatted[@]}"
echo "run scripts/format.sh to format them"
exit 1
