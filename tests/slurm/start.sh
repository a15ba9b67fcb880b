#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for the `plscale slurm` tests: munge, slurmctld and
# slurmd (Debian's slurm-wlm) with a generated slurm.conf in DIR (default /tmp/plscale-slurm).
# Idempotent: a controller that already answers is kept. Prints the SLURM_CONF to use; exits non-zero,
# saying why, when Slurm is not installed or does not start.
#   apt-get install -y slurm-wlm munge && tests/slurm/start.sh && export SLURM_CONF=/tmp/plscale-slurm/slurm.conf
set -euo pipefail
dir=${1:-/tmp/plscale-slurm}
conf="$dir/slurm.conf"
for bin in munged slurmctld slurmd sbatch scontrol; do
    command -v "$bin" >/dev/null || PATH="$PATH:/usr/sbin" command -v "$bin" >/dev/null \
        || { echo "$bin is not installed: apt-get install slurm-wlm munge" >&2; exit 3; }
done
export PATH="$PATH:/usr/sbin" SLURM_CONF="$conf"
if [ -f "$conf" ] && scontrol ping 2>/dev/null | grep -q UP; then echo "$conf"; exit 0; fi

mkdir -p "$dir"/{state,spool,log} /run/munge /var/log/munge /var/lib/munge
host=$(hostname -s)
cpus=$(nproc)
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
cat > "$conf" <<CONF
ClusterName=plscale
SlurmctldHost=$host
SlurmUser=root
SlurmctldPort=6917
SlurmdPort=6918
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
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
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

if ! pgrep -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chmod 400 /etc/munge/munge.key; }
    chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    if id munge >/dev/null 2>&1; then su -s /bin/sh munge -c munged 2>/dev/null || munged --force; else munged --force; fi
fi
pkill -x slurmctld 2>/dev/null || true
pkill -x slurmd 2>/dev/null || true
sleep 0.5
slurmctld -c   # -c: a clean state, no jobs left from an earlier cluster
slurmd
for _ in $(seq 50); do
    if scontrol ping 2>/dev/null | grep -q UP && sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
        echo "$conf"; exit 0
    fi
    sleep 0.2
done
echo "Slurm did not start: see $dir/log/slurmctld.log and $dir/log/slurmd.log" >&2
tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
exit 4
