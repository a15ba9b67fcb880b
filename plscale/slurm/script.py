"""The sbatch script of a lab run: what `plscale slurm submit` writes into the run directory
and submits, and what `--dry-run` prints.

One task per node, and that task is torchrun, which starts the node's ranks (the layout
torchtitan's multinode_trainer.slurm uses):

    #SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 ...
    head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)   # the job's first node
    port=$(( 20000 + SLURM_JOB_ID % 20000 ))                            # a port of this job's own
    srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "$head:$port" ...

The nodes find each other through torchrun's c10d rendezvous on the first node, so the same
command runs on every node: no node rank to pass. The ranks read everything else from the run
directory, which every node must see (a shared filesystem), as the lab's code must.
"""

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from plscale.run.launch import Plan
from plscale.run.launchers import bin_path

# The job's rendezvous port, PORT_BASE + job id % PORT_SPAN: below Linux's ephemeral ports (32768 and up), where
# no outgoing connection on the first node can hold it.
PORT_BASE, PORT_SPAN = 10000, 20000
THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class Job:
    """What Slurm is asked for, beside the lab's ranks and nodes (the plan's)."""
    name: str
    time: str                     # Slurm's --time: minutes, MM:SS, HH:MM:SS or D-HH:MM
    cpus_per_node: int            # --cpus-per-task of the one task per node: torchrun and its ranks
    partition: str | None = None
    account: str | None = None
    sbatch: list = field(default_factory=list)  # more sbatch options, as given: ["--qos=high", "--mem=64G"]
    preamble: str = ""            # shell lines run first: `module load cuda/12.4`, ...
    venv: str | None = None       # a virtualenv to activate
    conda: str | None = None      # or a conda environment
    gpu_type: str | None = None   # a GRES type (a100, h100, ...): --gpus-per-node=TYPE:N


def output_file(run_dir: Path, job: str = "%j") -> Path:
    """Where Slurm writes the job's output: every node's torchrun, rank 0's lines among them (%j: the
    job id, as sbatch's --output writes it)."""
    return Path(run_dir) / f"slurm-{job}.out"


def render(plan: Plan, job: Job) -> str:
    """The sbatch script for a plan bound to its run directory."""
    gpu = plan.device == "cuda"
    directives = [f"--job-name={job.name}", f"--nodes={plan.nodes}",
                  "--ntasks-per-node=1          # one torchrun per node; it starts the node's ranks",
                  *([f"--gpus-per-node={job.gpu_type + ':' if job.gpu_type else ''}{plan.ranks}"] if gpu else []),
                  f"--cpus-per-task={job.cpus_per_node}", f"--time={job.time}",
                  *([f"--partition={job.partition}"] if job.partition else []),
                  *([f"--account={job.account}"] if job.account else []),
                  f"--chdir={Path.cwd()}", f"--output={output_file(plan.run_dir)}",
                  "--no-requeue                 # a run again is a new run directory", *job.sbatch]
    lines = ["#!/bin/bash",
             f"# {job.name}: {plan.nodes} node(s), {plan.world_size} ranks in all. {plan.notice}",
             "# Written by `plscale slurm submit` into the run directory; command.txt has the command.",
             *(f"#SBATCH {d}" for d in directives),
             "set -euo pipefail", ""]
    # The user's lines and the environment's activation run without `set -u`: many conda and module scripts
    # read variables that may be unset.
    if job.preamble.strip():
        lines += ["# --preamble", "set +u", job.preamble.rstrip("\n"), "set -u", ""]
    comment, _, activate = _environment(job).partition("\n")
    lines += [comment, *(["set +u", activate, "set -u"] if activate else []), ""]
    env = {k: v for k, v in sorted(plan.env.items()) if k not in THREADS}
    lines += ["# The ranks' environment: what `plscale lab run` sets (compute nodes seldom reach the hub).",
              "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())]
    if not gpu:  # the job's CPUs, shared by the node's ranks
        lines += [f"export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / {plan.ranks} > 0 ? "
                  f"SLURM_CPUS_PER_TASK / {plan.ranks} : 1 ))", "export MKL_NUM_THREADS=$OMP_NUM_THREADS"]
    torchrun = ["torchrun", "--nnodes", str(plan.nodes), "--nproc_per_node", str(plan.ranks),
                "--rdzv_backend", "c10d", "--rdzv_endpoint", '"$head:$port"', "--rdzv_id", '"$SLURM_JOB_ID"']
    torchrun += ["--max-restarts", str(plan.max_restarts)] if plan.max_restarts else []
    script = [shlex.quote(str(plan.entry)), "--run-dir", shlex.quote(str(plan.run_dir))]
    lines += ["",
              "# The rendezvous: torchrun's c10d store on the job's first node, on a port of this job's own.",
              'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"port=$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))",
              'echo "plscale: job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s) ($SLURM_JOB_NODELIST), '
              'rendezvous at $head:$port"', "",
              "# srun: one torchrun on every node; --kill-on-bad-exit stops the others when one fails. The steps get",
              "# this environment even where the site's sbatch exports none (SBATCH_EXPORT=NONE).",
              "export SLURM_EXPORT_ENV=ALL",
              'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1 \\',
              "    " + " ".join(torchrun) + " \\",
              "    " + " ".join(script) + " || code=$?", "",
              "# The ranks' node-local scratch (lab 06's fast checkpoint tier, in /dev/shm) does not outlive the run.",
              "srun --ntasks-per-node=1 python -c 'import sys; from plscale.lab.rundir import clear_node_scratch; "
              "clear_node_scratch(sys.argv[1])' " + shlex.quote(str(plan.run_dir)) + " || true",
              'exit "${code:-0}"', ""]
    return "\n".join(lines)


def _environment(job: Job) -> str:
    """The lines that put torchrun and plscale on PATH: --venv, --conda, else the environment this
    command runs in."""
    if job.conda:
        return ("# --conda\n" 'eval "$(conda shell.bash hook)"\n' f"conda activate {shlex.quote(job.conda)}")
    venv = job.venv or (sys.prefix if sys.prefix != sys.base_prefix else None)
    if venv:
        return f"# {'--venv' if job.venv else 'the virtualenv plscale runs in'}\nsource {shlex.quote(str(Path(venv).resolve() / 'bin' / 'activate'))}"
    found = bin_path("torchrun")
    return f"# no --venv or --conda: torchrun from PATH\nexport PATH={shlex.quote(str(Path(found).parent))}:\"$PATH\"" \
        if os.path.isabs(found) else "# no --venv or --conda: torchrun from PATH"
