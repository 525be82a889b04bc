#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An N-node cluster on this machine (4 by default): N network namespaces (bellows-ns0..N-1,
# addresses 198.18.0.1..N/24 of the benchmarking range, no route beyond that subnet) joined by veth links
# through one bridge (bellows-br0, no address of its own), each link shaped with tc in both
# directions. fmnist_mpi runs one rank per namespace over TCP (Open MPI: btl tcp,self; mpirun in
# bellows-ns0 starts its daemons in the other namespaces through netns_agent.sh instead of ssh),
# for every link speed and every run, and a table of wall-clock seconds per epoch and accuracy
# follows. Namespaces, links and bridge are removed on exit, also on failure or Ctrl-C.
#
# Usage (as root; not part of CI):
#   bench/cluster/run.sh [--build DIR] [--nodes 4] [--speeds "1gbit 100mbit"] [--delay 2ms]
#                        [--runs uncompressed,powersgd-low,...] [fmnist_mpi options...]
# DIR holds examples/fmnist_mpi (default build-mpi: cmake -DBELLOWS_ENABLE_MPI=ON
# -DBELLOWS_BUILD_EXAMPLES=ON, target fmnist_mpi). Other options go to fmnist_mpi; the default is
# --quick (6 epochs of 4800 images). The delay needs tc's netem; where the kernel lacks it, the
# links are shaped by rate only (tbf) and the script says so. results.txt is the output of
# `run.sh --speeds "1gbit 100mbit 10mbit"` on the machine of the table in docs/experiments/cluster.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-mpi
speeds="1gbit 100mbit"
delay=2ms
runs=uncompressed,powersgd-low,powersgd-high,powersgd-accordion,topk-high,topk-accordion
nodes=4
extra=()
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --speeds) speeds=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) extra+=("$1"); shift ;;
  esac
done
((${#extra[@]})) || extra=(--quick)
program=$build/examples/fmnist_mpi
[[ -x $program ]] || { echo "run.sh: no $program; build the target fmnist_mpi with -DBELLOWS_ENABLE_MPI=ON" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "run.sh: network namespaces need root" >&2; exit 1; }
[[ $nodes =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= 254)) || { echo "run.sh: --nodes: 1 to 254, not '$nodes'" >&2; exit 1; }

bridge=bellows-br0
subnet=198.18.0.0/24
agent=$root/bench/cluster/netns_agent.sh
work=

cleanup() {
  for ((i = 0; i < nodes; ++i)); do
    local ns=bellows-ns$i
    if ip netns list | grep -qw "$ns"; then
      local pids
      pids=$(ip netns pids "$ns" || true)
      [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
      ip netns del "$ns" || true  # its veth end goes with it, and the peer with that
    fi
    ip link del "bellows-h$i" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  [[ -z $work ]] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup  # leftovers of an earlier run that was killed hard
work=$(mktemp -d)

ip link add "$bridge" type bridge
ip link set "$bridge" up
for ((i = 0; i < nodes; ++i)); do
  ns=bellows-ns$i
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "bellows-h$i" type veth peer name eth0 netns "$ns"
  ip link set "bellows-h$i" master "$bridge" up
  ip -n "$ns" addr add "198.18.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
done

if tc qdisc add dev bellows-h0 root netem delay "$delay" rate 1gbit 2>/dev/null; then
  tc qdisc del dev bellows-h0 root
  shaper=netem
else
  shaper=tbf
  echo "run.sh: this kernel has no netem; links are shaped by rate only (tbf), without the $delay delay"
fi

# Both directions of every link: egress of the bridge side (towards the node) and of the node.
shape() {
  local rate=$1
  for ((i = 0; i < nodes; ++i)); do
    for dev in "bellows-h$i" "netns:bellows-ns$i"; do
      local run=() d=$dev
      if [[ $dev == netns:* ]]; then run=(ip netns exec "${dev#netns:}"); d=eth0; fi
      "${run[@]}" tc qdisc del dev "$d" root 2>/dev/null || true
      if [[ $shaper == netem ]]; then
        "${run[@]}" tc qdisc add dev "$d" root netem delay "$delay" rate "$rate" limit 10000
      else
        "${run[@]}" tc qdisc add dev "$d" root tbf rate "$rate" burst 256kb latency 100ms
      fi
    done
  done
}

hosts=$(for ((i = 1; i <= nodes; ++i)); do echo "198.18.0.$i"; done | paste -sd ,)
results=$work/results.tsv
start=$(date +%s)
for speed in $speeds; do
  shape "$speed"
  if [[ $shaper == netem ]]; then echo "== $speed links, $delay delay (netem)"; else echo "== $speed links (tbf)"; fi
  log=$work/$speed.log
  sent_before=$(cat /sys/class/net/bellows-h1/statistics/rx_bytes)
  # In the background, so that a signal reaches the trap at once rather than after mpirun; the
  # ranks yield the processor while they wait (4 ranks share this machine's cores).
  ip netns exec bellows-ns0 mpirun --allow-run-as-root --oversubscribe -np $nodes -host "$hosts" \
    --mca plm_rsh_agent "$agent" --mca btl tcp,self --mca btl_tcp_if_include "$subnet" \
    --mca oob_tcp_if_include "$subnet" --mca mpi_yield_when_idle 1 \
    "$program" --sum-order library --runs "$runs" --out "$work/out-$speed" "${extra[@]}" > "$log" 2>&1 &
  mpirun_pid=$!
  tail -n +1 -f --pid=$mpirun_pid "$log" &
  wait $mpirun_pid
  wait  # for tail, which ends within a second of mpirun
  # "<run> seed S  epoch e/N  loss L  acc A%  floats F  levels X  T s"
  awk -v speed="$speed" '$4 == "epoch" && $5 ~ /^[0-9]+\/[0-9]+$/ {
      run = $1; acc[run] = $9 + 0; secs[run] += $(NF - 1); n[run]++
      floats[run] = $11; if (!(run in order)) { order[run] = ++runs; name[runs] = run }
    }
    END { for (k = 1; k <= runs; ++k) { r = name[k]; printf "%s\t%s\t%.3f\t%.2f\t%s\n", speed, r, secs[r] / n[r], acc[r], floats[r] } }' \
    "$log" >> "$results"
  echo "node 1 sent $(( ($(cat /sys/class/net/bellows-h1/statistics/rx_bytes) - sent_before) / 1000000 )) MB over its link"
done
echo
echo "| link | run | s / epoch | speedup vs uncompressed | final accuracy | floats sent per rank |"
echo "|---|---|---:|---:|---:|---:|"
awk -F'\t' '{ if ($2 == "uncompressed") base[$1] = $3; row[NR] = $0 }
  END { for (i = 1; i <= NR; ++i) { split(row[i], f, "\t")
          printf "| %s | %s | %.2f | %s | %.2f%% | %s |\n", f[1], f[2], f[3],
                 (f[1] in base) ? sprintf("%.2fx", base[f[1]] / f[3]) : "-", f[4], f[5] } }' "$results"
echo
echo "$(date +%s) $start" | awk '{ printf "whole benchmark: %d s; ", $1 - $2 }'
uptime
