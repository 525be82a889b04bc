#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Time per step of train.py's DDP runs over a shaped link: two network namespaces (bellows-ddp0,
# bellows-ddp1; 198.18.1.1 and .2, of the benchmarking range, no route beyond) joined by one veth
# pair, both ends shaped with tc (netem: the delay and the rate; tbf, rate only, where the kernel
# has no netem), the approach of bench/cluster/run.sh with two nodes. One train.py worker runs in
# each namespace (--dist), for every link speed; rank 0 writes results/<speed>/results.{md,json}
# and the script gathers results/overlap.md. Namespaces and links go on exit, also on failure.
#
# Usage (as root; not part of CI; bellows_torch installed or on PYTHONPATH):
#   examples/torch_ddp/netns.sh [--speeds "100mbit 1gbit"] [--delay 1ms] [--out DIR] [train.py options]
# Default train.py options: --runs allreduce,powersgd-low-sync,powersgd-low --model deep
# --bucket-cap-mb 1 --epochs 1 --train-limit 8192 --test-limit 2000 (four buckets, 64 steps a run).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
speeds="100mbit 1gbit"
delay=1ms
out=$here/results
extra=()
while (($#)); do
  case $1 in
    --speeds) speeds=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) extra+=("$1"); shift ;;
  esac
done
((${#extra[@]})) || extra=(--runs allreduce,powersgd-low-sync,powersgd-low --model deep --bucket-cap-mb 1
                           --epochs 1 --train-limit 8192 --test-limit 2000)
[[ $(id -u) == 0 ]] || { echo "netns.sh: network namespaces need root" >&2; exit 1; }
py=${PYTHON:-/usr/bin/python3}

cleanup() {
  for i in 0 1; do
    if ip netns list | grep -qw "bellows-ddp$i"; then
      local pids
      pids=$(ip netns pids "bellows-ddp$i" || true)
      [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
      ip netns del "bellows-ddp$i" || true  # the veth end goes with it, and its peer with that
    fi
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup  # leftovers of an earlier run that was killed hard

for i in 0 1; do
  ip netns add "bellows-ddp$i"
  ip -n "bellows-ddp$i" link set lo up
done
ip link add bellows-ddpv0 netns bellows-ddp0 type veth peer name bellows-ddpv1 netns bellows-ddp1
for i in 0 1; do
  ip -n "bellows-ddp$i" link set "bellows-ddpv$i" name eth0
  ip -n "bellows-ddp$i" addr add "198.18.1.$((i + 1))/24" dev eth0
  ip -n "bellows-ddp$i" link set eth0 up
done

if ip netns exec bellows-ddp0 tc qdisc add dev eth0 root netem delay "$delay" rate 1gbit 2>/dev/null; then
  ip netns exec bellows-ddp0 tc qdisc del dev eth0 root
  shaper=netem
else
  shaper=tbf
  echo "netns.sh: this kernel has no netem; links are shaped by rate only (tbf), without the $delay delay"
fi

shape() {
  for i in 0 1; do
    ip netns exec "bellows-ddp$i" tc qdisc del dev eth0 root 2>/dev/null || true
    if [[ $shaper == netem ]]; then
      ip netns exec "bellows-ddp$i" tc qdisc add dev eth0 root netem delay "$delay" rate "$1" limit 10000
    else
      ip netns exec "bellows-ddp$i" tc qdisc add dev eth0 root tbf rate "$1" burst 256kb latency 100ms
    fi
  done
}

summary=$out/overlap.md
mkdir -p "$out"
: > "$summary.tmp"
for speed in $speeds; do
  shape "$speed"
  link="$speed links"
  [[ $shaper == netem ]] && link="$link, $delay delay each way (netem)"
  echo "== $link"
  pids=()
  for r in 1 0; do  # rank 1 waits for rank 0's store
    ip netns exec "bellows-ddp$r" env GLOO_SOCKET_IFNAME=eth0 "$py" "$here/train.py" --workers 2 \
      --dist tcp://198.18.1.1:29500 --rank "$r" --out "$out/$speed" "${extra[@]}" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  { echo "### $link"; echo; cat "$out/$speed/results.md"; echo; } >> "$summary.tmp"
done
mv "$summary.tmp" "$summary"
echo "netns.sh: $summary; load average $(cut -d' ' -f1-3 /proc/loadavg)"
