# Sourced by the scripts here: `container_env NAME...` exports each variable that is unset in this
# shell from the container's own environment. RunPod sets its variables (RUNPOD_POD_ID, an Instant
# Cluster's NODE_RANK, PRIMARY_ADDR, ...) there, and an ssh session does not inherit them.
container_env() {
  local file=${PLSCALE_CONTAINER_ENV:-/proc/1/environ} entry name
  [[ -r $file ]] || return 0
  while IFS= read -r -d '' entry; do
    for name; do if [[ $entry == "$name="* && -z ${!name:-} ]]; then export "$entry"; fi; done
  done 2>/dev/null < "$file" || true
}
