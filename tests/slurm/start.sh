#!/usr/bin/env bash
# A real Slurm cluster on this machine, for the `plscale slurm` tests: munge, slurmctld and slurmd
# (Debian's slurm-wlm) with a generated slurm.conf in DIR (default /tmp/plscale-slurm).
#
# Two nodes where network namespaces can be made (root, iproute2): plsn1 and plsn2, each a slurmd in
# its own network and UTS namespace (10.77.0.2 and .3 on a bridge, names in /etc/hosts), so a
# two-node job's torchrun meet over a real network. Elsewhere one node, this machine.
# Each node has this machine's CPUs. Idempotent: a controller that already answers is kept.
# Prints the SLURM_CONF to use; exits non-zero, saying why, when Slurm is missing or does not start.
#   apt-get install -y slurm-wlm munge && export SLURM_CONF=$(tests/slurm/start.sh)
set -euo pipefail
dir=${1:-/tmp/plscale-slurm}
conf="$dir/slurm.conf"
export PATH="$PATH:/usr/sbin" SLURM_CONF="$conf"
for bin in munged slurmctld slurmd sbatch scontrol; do
    command -v "$bin" >/dev/null || { echo "$bin is not installed: apt-get install slurm-wlm munge" >&2; exit 3; }
done
if [ -f "$conf" ] && scontrol ping 2>/dev/null | grep -q UP; then echo "$conf"; exit 0; fi

# Two nodes in network namespaces, where they can be made.
make_nodes() {
    ip link show plsbr0 >/dev/null 2>&1 || { ip link add plsbr0 type bridge && ip addr add 10.77.0.1/24 dev plsbr0; } || return 1
    ip link set plsbr0 up || return 1
    for i in 1 2; do
        ip netns list 2>/dev/null | grep -qw "plsn$i" && continue
        ip netns add "plsn$i" && ip link add "plsv$i" type veth peer name eth0 netns "plsn$i" \
            && ip link set "plsv$i" master plsbr0 && ip link set "plsv$i" up \
            && ip netns exec "plsn$i" ip addr add "10.77.0.$((i + 1))/24" dev eth0 \
            && ip netns exec "plsn$i" ip link set eth0 up && ip netns exec "plsn$i" ip link set lo up || return 1
    done
    for i in 1 2; do grep -q " plsn$i\$" /etc/hosts || echo "10.77.0.$((i + 1)) plsn$i" >> /etc/hosts; done
}
nodes=() cpus=$(nproc)
if [ "${PLSCALE_SLURM_NODES:-2}" = 2 ] && command -v ip >/dev/null && make_nodes 2>/dev/null; then
    nodes=(plsn1 plsn2) controller="$(hostname -s)(10.77.0.1)"
else
    nodes=("$(hostname -s)") controller="$(hostname -s)"
fi

mkdir -p "$dir"/{state,spool,log} /run/munge /var/log/munge /var/lib/munge
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / ${#nodes[@]} - 1024 ))
{
    cat <<CONF
ClusterName=plscale
SlurmctldHost=$controller
SlurmUser=root
SlurmctldPort=6917
SlurmdPort=6918
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=5
CONF
    for i in "${!nodes[@]}"; do
        addr=$([ ${#nodes[@]} = 2 ] && echo "NodeAddr=10.77.0.$((i + 2)) " || true)
        echo "NodeName=${nodes[$i]} ${addr}CPUs=$cpus RealMemory=$memory State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP"
} > "$conf"

if ! pgrep -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chmod 400 /etc/munge/munge.key; }
    chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    if id munge >/dev/null 2>&1; then su -s /bin/sh munge -c munged 2>/dev/null || munged --force; else munged --force; fi
fi
# Only this cluster's daemons are stopped (their pid files in $dir); another Slurm on this machine is left alone.
for pidfile in "$dir"/slurmctld.pid "$dir"/slurmd*.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
done
sleep 0.5
slurmctld -c   # -c: a clean state, no jobs left from an earlier cluster
if [ ${#nodes[@]} = 2 ]; then
    for node in "${nodes[@]}"; do  # each slurmd with its node's network and host name; its jobs inherit both
        mkdir -p "$dir/spool/$node"
        nsenter --net="/run/netns/$node" unshare --uts sh -c "hostname $node && exec slurmd -N $node"
    done
else
    mkdir -p "$dir/spool/${nodes[0]}"
    slurmd
fi
for _ in $(seq 75); do
    up=$(sinfo -h -o "%T %D" 2>/dev/null | awk '$1 ~ /^(idle|mixed|allocated)/ {n += $2} END {print n + 0}')
    if scontrol ping 2>/dev/null | grep -q UP && [ "$up" = ${#nodes[@]} ]; then echo "$conf"; exit 0; fi
    sleep 0.2
done
echo "Slurm did not start: see $dir/log/slurmctld.log and $dir/log/slurmd-*.log" >&2
tail -5 "$dir"/log/*.log >&2 || true
exit 4
