#!/usr/bin/env bash
# One node of a multi-node lab run: `bash runpod/launch_multinode.sh LAB [lab args...]` on every node.
# Run by hand on each pod of a RunPod Instant Cluster, which sets the variables below, and by
# `plscale runpod run` on each of its pods, which sets them itself: one path for both.
#   PRIMARY_ADDR (or MASTER_ADDR)  node 0's address     NODE_RANK     this node: 0 .. NUM_NODES-1
#   PRIMARY_PORT (or MASTER_PORT)  default 29500        NUM_NODES     nodes in the run
#   NUM_TRAINERS                   GPUs per node
# Then execs `plscale lab run LAB --nodes --gpus --node-rank --master-addr --master-port` (deepspeed, --no_ssh).
set -euo pipefail
die() { echo "launch_multinode.sh: $*" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/container_env.sh"

[[ $# -ge 1 && $1 != -* ]] || die "usage: bash runpod/launch_multinode.sh LAB [lab args...], e.g. zero2"
lab=$1; shift
container_env PRIMARY_ADDR MASTER_ADDR PRIMARY_PORT MASTER_PORT NODE_RANK NUM_NODES NUM_TRAINERS NCCL_SOCKET_IFNAME \
  GLOO_SOCKET_IFNAME
addr=${PRIMARY_ADDR:-${MASTER_ADDR:-}}
port=${PRIMARY_PORT:-${MASTER_PORT:-29500}}
[[ -n $addr ]] || die "PRIMARY_ADDR is not set: export PRIMARY_ADDR=<node 0's address> (an Instant Cluster sets it; on separate pods run bash runpod/node_addr.sh on node 0)"
[[ -n ${NODE_RANK:-} ]] || die "NODE_RANK is not set: export NODE_RANK=0 on node 0, 1 on the next, and so on"
[[ -n ${NUM_NODES:-} ]] || die "NUM_NODES is not set: export NUM_NODES=<number of nodes>"
[[ -n ${NUM_TRAINERS:-} ]] || die "NUM_TRAINERS is not set: export NUM_TRAINERS=<GPUs per node> (nvidia-smi -L lists them)"
# Instant Clusters talk between nodes over ens1 (eth0 is for the internet only and times out);
# NCCL carries the GPUs' traffic, gloo torch's CPU-side groups.
if [[ -e /sys/class/net/ens1 ]]; then
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ens1} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-ens1}
fi
command -v plscale > /dev/null || die "plscale is not on the PATH: run bash runpod/bootstrap.sh in the project folder first"
echo "launch_multinode.sh: node $NODE_RANK of $NUM_NODES, $NUM_TRAINERS GPU(s) each, node 0 at $addr:$port," \
     "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-unset, NCCL picks}" >&2
exec plscale lab run "$lab" --nodes "$NUM_NODES" --gpus "$NUM_TRAINERS" --node-rank "$NODE_RANK" \
  --master-addr "$addr" --master-port "$port" "$@"
