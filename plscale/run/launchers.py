"""The argv of each launcher for a plan: deepspeed, torchrun, accelerate, and jax (a JAX
lab's one process: this Python, no launcher).

Each builder returns the launcher's part of the command; the plan appends the lab's
script and `--run-dir`. The ranks take everything else from the run directory.
"""

import sys
from pathlib import Path

from plscale.run.hostfile import render


def bin_path(name: str) -> str:
    """A console script next to this Python (the venv's), else the bare name."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def _hostfile(plan) -> str | None:
    if plan.nodes == 1:
        return None
    return plan.hostfile or str(Path(plan.run_dir) / "hostfile")


def deepspeed(plan) -> list:
    argv = [bin_path("deepspeed")]
    if plan.nodes > 1:
        argv += ["--hostfile", _hostfile(plan), "--num_nodes", str(plan.nodes), "--master_addr", plan.master_addr]
        argv += ["--no_ssh", "--node_rank", str(plan.node_rank)] if plan.node_rank is not None else []
    return argv + ["--num_gpus", str(plan.ranks), "--master_port", str(plan.master_port)]


def torchrun(plan) -> list:
    """With --max-restarts N, torchrun stops every rank when one fails and starts the group
    again, up to N times (the ranks see TORCHELASTIC_RESTART_COUNT)."""
    argv = [bin_path("torchrun"), "--nnodes", str(plan.nodes), "--nproc_per_node", str(plan.ranks),
            "--node_rank", str(plan.node_rank or 0), "--master_addr", plan.master_addr,
            "--master_port", str(plan.master_port)]
    return argv + (["--max-restarts", str(plan.max_restarts)] if plan.max_restarts else [])


def accelerate(plan) -> list:
    """`accelerate launch` with its DeepSpeed launcher: torchrun underneath on one node and on
    each node of several (`standard`, started on every node like torchrun), on CPUs too.
    (`--multi_gpu` needs 2 or more processes; `--cpu` starts a single process.)
    --num_processes counts all nodes' ranks; the script gets the DeepSpeed config itself."""
    argv = [bin_path("accelerate"), "launch", "--use_deepspeed", "--num_processes", str(plan.world_size),
            "--num_machines", str(plan.nodes), "--machine_rank", str(plan.node_rank or 0),
            "--main_process_ip", plan.master_addr, "--main_process_port", str(plan.master_port),
            "--mixed_precision", "no", "--dynamo_backend", "no"]  # precision: the DeepSpeed config's
    if plan.nodes > 1:
        argv += ["--deepspeed_multinode_launcher", "standard", "--same_network"]
    return argv


def jax(plan) -> list:
    """A JAX lab is one process holding every device: this Python runs the script itself
    (the plan's environment gives it the devices)."""
    return [sys.executable]


BUILDERS = {"deepspeed": deepspeed, "torchrun": torchrun, "accelerate": accelerate, "jax": jax}


def files(plan) -> dict:
    """Files the launcher needs in the run directory: deepspeed's --no_ssh mode wants a
    hostfile listing every node even when none was given."""
    if plan.launcher == "deepspeed" and plan.nodes > 1 and plan.hostfile is None:
        return {"hostfile": render(plan.nodes, plan.ranks)}
    return {}
