"""The launch plan: which launcher, which argv and environment start a lab's ranks.

Building a plan runs nothing and checks everything a user can get wrong about the
topology (ranks, nodes, node rank, hostfile, port, launcher), so `--dry-run` and the
tests see exactly what would run. It is built once per run; the two facts known only at
launch, the run directory and (unless `--master-port` was given) a free port, are bound
by `Plan.at(run_dir)` just before the ranks start.

A JAX lab (`launcher: jax`) runs one process holding N devices instead of N ranks: N GPUs,
or N CPU devices XLA simulates (XLA_FLAGS=--xla_force_host_platform_device_count=N).
"""

import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from plscale.errors import UserError
from plscale.hardware import cpu_cores, cuda_gpus, free_port, hub_reachable, port_in_use
from plscale.lab.jaxenv import (
    DEVICE_COUNT,
    has_cuda_plugin,
    jax_problem,
    with_device_count,
)
from plscale.lab.labs import Lab, Variant
from plscale.run import launchers
from plscale.run.hostfile import read_hostfile


@dataclass
class Options:
    gpus: int | None = None          # ranks per node; None = the lab's default
    launcher: str | None = None      # None = the variant's, else the lab's, else deepspeed
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
    max_restarts: int | None = None  # torchrun restarts of the whole group; None = the variant's, else 0
    profile: int | None = None       # a step to record with torch.profiler on every rank (plscale.rank.profile)
    scheduler: str | None = None     # "slurm": the job starts torchrun on every node itself (plscale/slurm)


@dataclass
class Plan:
    entry: Path
    launcher: str
    ranks: int           # per node; under jax, the devices of the one process
    nodes: int
    node_rank: int | None
    world_size: int
    device: str          # "cuda" or "cpu"
    master_addr: str
    master_port: int | None  # None: a free port, picked by at()
    hostfile: str | None     # the user's; None: plscale writes one when deepspeed needs it
    env: dict            # the variables plscale sets, on top of the caller's environment
    notice: str          # one line that says how the ranks run
    run_dir: Path | None = None
    max_restarts: int = 0    # torchrun restarts the whole group this many times after a failure

    def at(self, run_dir: Path) -> "Plan":
        """This plan, bound to its run directory and a port."""
        return replace(self, run_dir=Path(run_dir), master_port=self.master_port or free_port())

    @property
    def argv(self) -> list:
        script = [str(self.entry), "--run-dir", str(self.run_dir)]
        return launchers.BUILDERS[self.launcher](self) + script

    @property
    def files(self) -> dict:
        """name -> text, written into the run directory before launching."""
        return launchers.files(self)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}"


def plan(lab: Lab, variant: Variant, opts: Options, gpus_present: list | None = None) -> Plan:
    launcher = _launcher(lab, variant, opts)
    unit = "device" if launcher == "jax" else "rank"
    ranks = (variant.ranks or lab.default_ranks) if opts.gpus is None else opts.gpus
    if ranks < 1:
        raise UserError(f"--gpus {ranks}: a run needs at least 1 {unit}; try --gpus {lab.default_ranks}.")
    if ranks not in lab.allowed_ranks:
        raise UserError(f"Lab {lab.id} runs with {', '.join(map(str, lab.allowed_ranks))} {unit}s, "
                        f"not {ranks}: pick one of those with --gpus.")
    if launcher == "jax":
        _check_one_process(opts)
    else:
        _check_nodes(opts, launcher)
    restarts = 0 if launcher == "jax" else _max_restarts(opts, variant, launcher)
    port = opts.master_port
    if port is not None and not 1 <= port <= 65535:
        raise UserError(f"--master-port {port}: use a port from 1 to 65535 (29500 is the usual one).")
    if port is not None and opts.nodes == 1 and port_in_use(port):  # the store would fail with EADDRINUSE
        raise UserError(f"--master-port {port} is in use on this machine (see `ss -ltnp 'sport = :{port}'`: often "
                        f"an earlier run's launcher): leave --master-port out and plscale picks a free port.")
    if not opts.master_addr.strip() or any(c.isspace() for c in opts.master_addr):
        raise UserError(f"--master-addr {opts.master_addr!r}: give node 0's host name or IP address.")
    if opts.scheduler and gpus_present is None:  # the job's nodes, not this one, hold the GPUs
        gpus_present = ["the job's GPUs"] * ranks
    gpus = cuda_gpus() if gpus_present is None else gpus_present
    device = "cpu" if opts.cpu or not gpus else "cuda"
    why_cpu = " (--cpu)" if opts.cpu and gpus else ""
    if launcher == "jax" and device == "cuda" and not has_cuda_plugin():
        device, why_cpu = "cpu", (f": JAX has no CUDA plugin here, so the {len(gpus)} GPU(s) stay idle; "
                                  f"pip install 'jax[cuda12]' to use them")
    if lab.gpu_required and device == "cpu":
        raise UserError(f"Lab {lab.id} needs CUDA GPUs and none is available: run it on a GPU machine.")
    if device == "cuda" and ranks > len(gpus):
        instead = "simulated CPU devices" if launcher == "jax" else "CPU ranks over gloo"
        raise UserError(f"Asked for {ranks} GPUs but this machine has {len(gpus)}: use --gpus {len(gpus)}, "
                        f"or --cpu to run {ranks} {instead}.")

    env = {"PYTHONUNBUFFERED": "1", "PLSCALE_CLI": "1"}
    if launcher == "jax":
        env.update(_jax_env(ranks, device))
        notice = (f"A JAX lab: one process with {ranks} CUDA GPU(s) ({gpus[0]})." if device == "cuda" else
                  f"A JAX lab: one process with {ranks} simulated CPU devices "
                  f"(XLA_FLAGS={DEVICE_COUNT}={ranks}){why_cpu}.")
    elif device == "cpu":
        threads = str(max(1, cpu_cores() // ranks))
        env.update({"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "",
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads),
                    "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS", threads)})
        each = "the job's CPUs shared among them" if opts.scheduler else f"{env['OMP_NUM_THREADS']} threads each"
        notice = (f"No CUDA GPU{' used (--cpu)' if opts.cpu and gpus else ' found'}: running {ranks} CPU "
                  f"ranks over gloo (DS_ACCELERATOR=cpu, {each}).")
    else:
        notice = f"Running {ranks} ranks on {ranks} CUDA GPU(s) over NCCL ({gpus[0]})."
    if opts.data_dir:
        env["PLSCALE_DATA_DIR"] = str(Path(opts.data_dir).resolve())
    if opts.scheduler or not hub_reachable():  # a cluster's compute nodes seldom reach the internet
        env["HF_HUB_OFFLINE"] = "1"
        env["HF_DATASETS_OFFLINE"] = "1"
    if restarts:
        notice += f" torchrun restarts every rank up to {restarts} time(s) if one fails."
    if opts.nodes > 1 and port is None:
        port = 29500  # every node must agree on it
    return Plan(lab.entry_of(variant), launcher, ranks, opts.nodes, opts.node_rank, ranks * opts.nodes, device,
                opts.master_addr, port, opts.hostfile, env, notice, max_restarts=restarts)


def _launcher(lab: Lab, variant: Variant, opts: Options) -> str:
    """--launcher, else the variant's, else the lab's, else deepspeed; a lab or variant that
    names one runs under it only."""
    required = variant.launcher or lab.launcher
    launcher = opts.launcher or required or ("torchrun" if opts.scheduler else "deepspeed")
    if launcher == "slurm":
        raise UserError("--launcher slurm: submit the lab to Slurm with `plscale slurm submit LAB` (the same flags, "
                        "plus --partition, --time, ...); see docs/slurm.md.")
    if launcher not in launchers.BUILDERS:
        names = [name for name in launchers.BUILDERS if name != "jax"]
        raise UserError(f"Unknown launcher {launcher!r}: use {', '.join(names[:-1])} or {names[-1]} "
                        f"(jax runs a JAX lab; `plscale slurm submit` runs a lab on Slurm).")
    if opts.scheduler and launcher != "torchrun":
        who = f"variant {variant.name!r}" if variant.launcher else f"lab {lab.id}" if required else "--launcher"
        raise UserError(f"A Slurm job starts torchrun on every node, and {who} asks for {launcher}: "
                        + ("drop --launcher." if who == "--launcher" else
                           "pick another variant, or run it with `plscale lab run` inside `salloc`."))
    if required and required != launcher:
        who = f"Variant {variant.name!r}" if variant.launcher else f"Lab {lab.id}"
        raise UserError(f"{who} runs under {required}, not {launcher}: drop --launcher or use --launcher {required}.")
    if launcher == "jax" and required != "jax":
        raise UserError(f"Lab {lab.id} is a PyTorch lab: --launcher jax runs JAX labs only (launcher: jax in their "
                        f"lab.yaml); drop --launcher.")
    if launcher == "jax" and (problem := jax_problem(lab.id)):
        raise UserError(problem)
    return launcher


def _check_one_process(opts: Options) -> None:
    """A JAX lab is one process on this machine: nothing to spread over nodes or restart."""
    given = [("--nodes", opts.nodes, opts.nodes != 1), ("--hostfile", opts.hostfile, opts.hostfile),
             ("--node-rank", opts.node_rank, opts.node_rank is not None),
             ("--max-restarts", opts.max_restarts, opts.max_restarts is not None)]
    for flag, value, used in given:
        if used:
            raise UserError(f"{flag} {value}: a JAX lab runs one process holding this machine's devices (no nodes, "
                            f"no restarts); drop {flag}.")


def _jax_env(n: int, device: str) -> dict:
    """The environment of a JAX lab's one process with n devices: n GPUs, or n simulated CPU devices."""
    if device == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # the user's choice of GPUs, if any
        ids = [i.strip() for i in visible.split(",")] if visible else [str(i) for i in range(n)]
        return {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": ",".join(ids[:n]),
                "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # else XLA takes 75% of each GPU; torch shares them
    threads = str(cpu_cores())  # one process: every core
    return {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": with_device_count(os.environ.get("XLA_FLAGS", ""), n),
            "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads),
            "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS", threads)}


def _max_restarts(opts: Options, variant: Variant, launcher: str) -> int:
    """--max-restarts, else the variant's `restarts`, else 0; only torchrun restarts ranks."""
    if opts.max_restarts is not None:
        restarts, source = opts.max_restarts, f"--max-restarts {opts.max_restarts}"
    else:
        restarts, source = int(variant.restarts or 0), f"Variant {variant.name!r} (restarts: {variant.restarts})"
    if restarts < 0:
        raise UserError(f"{source}: use 0 (no restart) or more.")
    if restarts and launcher != "torchrun":
        raise UserError(f"{source}: the {launcher} launcher does not restart failed ranks; use --launcher torchrun"
                        f"{'' if opts.max_restarts is not None else ', or --max-restarts 0'}.")
    return restarts


def _check_nodes(opts: Options, launcher: str) -> None:
    if opts.nodes < 1:
        raise UserError(f"--nodes {opts.nodes}: use 1 or more.")
    if opts.hostfile and opts.nodes == 1:
        raise UserError("--hostfile lists the nodes of a multi-node run: add --nodes N (N > 1), or drop it.")
    if opts.hostfile and launcher != "deepspeed":
        raise UserError(f"--hostfile is for the deepspeed launcher; under {launcher} start the same command on "
                        f"every node with --node-rank R --master-addr A.")
    if opts.node_rank is not None and not 0 <= opts.node_rank < opts.nodes:
        raise UserError(f"--node-rank {opts.node_rank} with --nodes {opts.nodes}: use 0 to {opts.nodes - 1} "
                        f"(0 on the node at --master-addr).")
    if opts.nodes > 1 and opts.node_rank is None and not opts.hostfile and not opts.scheduler:
        raise UserError("Several nodes need --hostfile F (launch from one node over ssh) or "
                        "--node-rank R with --master-addr A (launch on every node).")
    if opts.hostfile:
        hosts = read_hostfile(opts.hostfile)
        if len(hosts) < opts.nodes:
            raise UserError(f"Hostfile {opts.hostfile} lists {len(hosts)} host(s) but --nodes is {opts.nodes}: "
                            f"add one line 'host slots=N' per node, or lower --nodes.")
