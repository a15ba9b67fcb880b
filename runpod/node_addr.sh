#!/usr/bin/env bash
# Prints the address other nodes reach this node at: NODE_ADDR (set on Instant Cluster nodes), else on
# a pod POD_ID.runpod.internal (RunPod's global networking between pods; exit 2 when it does not
# resolve), else (not on RunPod) the first address of `hostname -I`. `plscale runpod run` calls it on node 0 to get the others' master address.
set -euo pipefail
die() { echo "node_addr.sh: $*" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/container_env.sh"

container_env NODE_ADDR RUNPOD_POD_ID
if [[ -n ${NODE_ADDR:-} ]]; then echo "$NODE_ADDR"; exit 0; fi
if [[ -n ${RUNPOD_POD_ID:-} ]]; then  # a pod, not an Instant Cluster: only the private network reaches it
  getent hosts "$RUNPOD_POD_ID.runpod.internal" > /dev/null \
    || die "$RUNPOD_POD_ID.runpod.internal does not resolve: this pod is not on RunPod's private network (global networking), so other pods cannot reach it; create the pods with plscale runpod up --nodes K (secure cloud), or set NODE_ADDR"
  echo "$RUNPOD_POD_ID.runpod.internal"; exit 0
fi
read -r addr _ < <(hostname -I 2> /dev/null || true) || true
[[ -n ${addr:-} ]] || die "no address found: set NODE_ADDR to this node's address on the network the nodes share"
echo "$addr"
