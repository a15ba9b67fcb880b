#!/usr/bin/env bash
# Prints the address other nodes reach this node at: NODE_ADDR (set on Instant Cluster nodes), else
# POD_ID.runpod.internal when it resolves (RunPod's global networking between pods), else the first
# address of `hostname -I`. `plscale runpod run` calls it on node 0 to get the others' master address.
set -euo pipefail
die() { echo "node_addr.sh: $*" >&2; exit 2; }
container_env() {  # NAME...: take each one unset here from the container's environment (RunPod sets
  # its variables there; an ssh session does not inherit them)
  local file=${PLSCALE_CONTAINER_ENV:-/proc/1/environ} entry name
  [[ -r $file ]] || return 0
  while IFS= read -r -d '' entry; do
    for name; do if [[ $entry == "$name="* && -z ${!name:-} ]]; then export "$entry"; fi; done
  done 2>/dev/null < "$file" || true
}

container_env NODE_ADDR RUNPOD_POD_ID
if [[ -n ${NODE_ADDR:-} ]]; then echo "$NODE_ADDR"; exit 0; fi
if [[ -n ${RUNPOD_POD_ID:-} ]] && getent hosts "$RUNPOD_POD_ID.runpod.internal" > /dev/null; then
  echo "$RUNPOD_POD_ID.runpod.internal"; exit 0
fi
read -r addr _ < <(hostname -I 2> /dev/null || true) || true
[[ -n ${addr:-} ]] || die "no address found: set NODE_ADDR to this node's address on the network the nodes share"
echo "$addr"
