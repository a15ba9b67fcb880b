"""The launch plan: which launcher, which argv and environment start a lab's ranks.

Building a plan runs nothing, so `--dry-run` and the tests see exactly what would run.
"""

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from plscale.errors import UserError
from plscale.hardware import cpu_cores, cuda_gpus, free_port, hub_reachable
from plscale.run.labs import Lab, Variant

LAUNCHERS = ("deepspeed", "torchrun")


@dataclass
class Options:
    gpus: int | None = None          # ranks per node; None = the lab's default
    launcher: str | None = None      # None = the variant's, else deepspeed
    nodes: int = 1
    hostfile: str | None = None
    node_rank: int | None = None
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    cpu: bool = False
    steps: int | None = None
    sets: list = field(default_factory=list)
    ds_config: str | None = None
    data_dir: str | None = None


@dataclass
class Plan:
    argv: list
    env: dict            # the variables plscale sets, on top of the caller's environment
    ranks: int           # per node
    world_size: int
    device: str          # "cuda" or "cpu"
    launcher: str
    notice: str          # one line that says how the ranks run
    files: dict = field(default_factory=dict)  # name -> text, written into the run directory first

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}"


def _bin(name: str) -> str:
    """A console script next to this Python (the venv's), else the bare name."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def plan(lab: Lab, variant: Variant, opts: Options, run_dir: Path, gpus_present: list | None = None) -> Plan:
    launcher = opts.launcher or variant.launcher or "deepspeed"
    if launcher not in LAUNCHERS:
        raise UserError(f"Unknown launcher {launcher!r}: use deepspeed or torchrun.")
    if variant.launcher and variant.launcher != launcher:
        raise UserError(f"Variant {variant.name!r} runs under {variant.launcher}, not {launcher}: "
                        f"drop --launcher or use --launcher {variant.launcher}.")
    ranks = lab.default_ranks if opts.gpus is None else opts.gpus
    if ranks < 1:
        raise UserError(f"--gpus {ranks}: a run needs at least 1 rank; try --gpus {lab.default_ranks}.")
    if ranks not in lab.allowed_ranks:
        raise UserError(f"Lab {lab.id} runs with {', '.join(map(str, lab.allowed_ranks))} ranks, "
                        f"not {ranks}: pick one of those with --gpus.")
    if opts.nodes < 1:
        raise UserError(f"--nodes {opts.nodes}: use 1 or more.")
    if opts.nodes > 1 and opts.node_rank is None and not opts.hostfile:
        raise UserError("Several nodes need --hostfile F (launch from one node over ssh) or "
                        "--node-rank R with --master-addr A (launch on every node).")
    if opts.hostfile and not Path(opts.hostfile).is_file():
        raise UserError(f"Hostfile {opts.hostfile} does not exist: write one line per node, "
                        f"'host slots=N' (see runpod/ or the README).")
    gpus = cuda_gpus() if gpus_present is None else gpus_present
    device = "cpu" if opts.cpu or not gpus else "cuda"
    if lab.gpu_required and device == "cpu":
        raise UserError(f"Lab {lab.id} needs CUDA GPUs and none is available: run it on a GPU machine.")
    if device == "cuda" and ranks > len(gpus):
        raise UserError(f"Asked for {ranks} GPUs but this machine has {len(gpus)}: use --gpus {len(gpus)}, "
                        f"or --cpu to run {ranks} CPU ranks over gloo.")
    world = ranks * opts.nodes
    port = opts.master_port or (29500 if opts.nodes > 1 else free_port())

    env = {"PYTHONUNBUFFERED": "1", "PLSCALE_RUN_DIR": str(run_dir), "PLSCALE_CLI": "1"}
    if device == "cpu":
        threads = str(max(1, cpu_cores() // ranks))
        env.update({"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "",
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads),
                    "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS", threads)})
        notice = (f"No CUDA GPU{' used (--cpu)' if opts.cpu and gpus else ' found'}: running {ranks} CPU "
                  f"ranks over gloo (DS_ACCELERATOR=cpu, {env['OMP_NUM_THREADS']} threads each).")
    else:
        notice = f"Running {ranks} ranks on {ranks} CUDA GPU(s) over NCCL ({gpus[0]})."
    if opts.data_dir:
        env["PLSCALE_DATA_DIR"] = str(Path(opts.data_dir).resolve())
    if not hub_reachable():
        env["HF_HUB_OFFLINE"] = "1"
        env["HF_DATASETS_OFFLINE"] = "1"

    script = [str(lab.entry_path), "--variant", variant.name, "--run-dir", str(run_dir),
              "--ds-config", str(run_dir / "ds_config.json")]
    if opts.steps is not None:
        script += ["--steps", str(opts.steps)]
    for assignment in opts.sets:
        script += ["--set", assignment]

    files = {}
    if launcher == "deepspeed":
        argv = [_bin("deepspeed")]
        if opts.nodes > 1:
            hostfile = opts.hostfile
            if hostfile is None:  # --no_ssh still wants every node listed; the names only label them
                hostfile = str(run_dir / "hostfile")
                files["hostfile"] = "".join(f"node{i} slots={ranks}\n" for i in range(opts.nodes))
            argv += ["--hostfile", hostfile, "--num_nodes", str(opts.nodes), "--master_addr", opts.master_addr]
            argv += ["--no_ssh", "--node_rank", str(opts.node_rank)] if opts.node_rank is not None else []
        argv += ["--num_gpus", str(ranks), "--master_port", str(port)]
    else:
        argv = [_bin("torchrun"), "--nnodes", str(opts.nodes), "--nproc_per_node", str(ranks),
                "--node_rank", str(opts.node_rank or 0), "--master_addr", opts.master_addr,
                "--master_port", str(port)]
    return Plan(argv + script, env, ranks, world, device, launcher, notice, files)
