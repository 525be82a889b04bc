#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Open MPI's launch agent for bench/cluster/run.sh, in place of ssh (--mca plm_rsh_agent): mpirun
# calls it as `netns_agent.sh HOST COMMAND...` to start its daemon on HOST; the host is the
# address 198.18.0.<i + 1> of namespace bellows-ns<i>, where the command then runs.
set -euo pipefail
host=$1
shift
case $host in
  198.18.0.[1-9]) ns=bellows-ns$(( ${host##*.} - 1 )) ;;
  *) echo "netns_agent.sh: $host is no host of the bellows cluster" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" sh -c "$*"
