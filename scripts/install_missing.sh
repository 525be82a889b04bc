# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by the scripts that set up a Debian 12 machine: install_missing PACKAGE... installs, with
# apt-get, those of the packages that are not installed yet (through sudo when not root).
# release_packages: what configuring the release preset needs (it configures the tests, benchmarks
# and tools too), the Fashion-MNIST data of the examples among them.

# shellcheck disable=SC2034  # used by the scripts that source this file
release_packages=(cmake ninja-build g++ doctest-dev libbenchmark-dev zlib1g-dev dataset-fashion-mnist
                  libcli11-dev nlohmann-json3-dev)

install_missing() {
  local missing=() p sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "== installing: ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
