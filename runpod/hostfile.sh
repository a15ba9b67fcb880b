#!/usr/bin/env bash
# Writes a DeepSpeed hostfile (`host slots=N`, node 0 first) for the cluster, to OUT (default ./hostfile),
# and prints it: `bash runpod/hostfile.sh [OUT]`, by hand on node 0 of an Instant Cluster (on pods of
# `plscale runpod up --nodes K`, export NODE_ADDRS, NUM_NODES and NUM_TRAINERS first), for
# `plscale lab run LAB --nodes K --hostfile hostfile` over ssh.
# NUM_NODES lines of NUM_TRAINERS slots. Hosts: NODE_ADDRS ("addr0 addr1 ...") when set; else
# PRIMARY_ADDR (or MASTER_ADDR) for node 0 and node-R for the others, the host names Instant Clusters
# give their nodes (check they resolve on node 0: getent hosts node-1).
set -euo pipefail
die() { echo "hostfile.sh: $*" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/container_env.sh"

out=${1:-hostfile}
container_env NODE_ADDRS PRIMARY_ADDR MASTER_ADDR NUM_NODES NUM_TRAINERS
[[ ${NUM_NODES:-} =~ ^[1-9][0-9]*$ ]] || die "NUM_NODES='${NUM_NODES:-}': export NUM_NODES=<number of nodes>"
[[ ${NUM_TRAINERS:-} =~ ^[1-9][0-9]*$ ]] || die "NUM_TRAINERS='${NUM_TRAINERS:-}': export NUM_TRAINERS=<GPUs per node>"
if [[ -n ${NODE_ADDRS:-} ]]; then
  read -ra hosts <<< "$NODE_ADDRS"
  [[ ${#hosts[@]} -eq $NUM_NODES ]] || die "NODE_ADDRS lists ${#hosts[@]} host(s) but NUM_NODES is $NUM_NODES: give one address per node, node 0 first"
else
  hosts=("${PRIMARY_ADDR:-${MASTER_ADDR:-node-0}}")
  for ((rank = 1; rank < NUM_NODES; rank++)); do hosts+=("node-$rank"); done
fi
for host in "${hosts[@]}"; do echo "$host slots=$NUM_TRAINERS"; done > "$out"
cat "$out"
