"""`plscale doctor`: can the labs run here? Exit 1 when they cannot."""

import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from plscale.lab import labs
from plscale.cli.output import console
from plscale.errors import UserError
from plscale.hardware import cpu_cores, cuda_gpus, free_port, hub_reachable
from plscale.run.runner import stop


def doctor(
    distributed: bool = typer.Option(False, "--distributed", help="Launch N ranks: each all-reduces, "
                                     "all-gathers and reports rank, host, device, backend."),
    gpus: int = typer.Option(None, "--gpus", "-g", help="Ranks for --distributed (default: every GPU, or 2 CPU)."),
    timeout: float = typer.Option(60.0, help="Seconds a rank may take before it is reported as hanging."),
    cpu: bool = typer.Option(False, "--cpu", help="With --distributed: CPU ranks over gloo even when GPUs exist."),
) -> None:
    """Check torch, DeepSpeed, GPUs or gloo, the JIT op cache, cores, the hub and the labs;
    with --distributed, run N ranks and check that every one of them answers."""
    if distributed:
        return distributed_check(gpus, timeout, cpu)
    if gpus is not None or cpu:
        raise UserError("--gpus and --cpu choose the ranks of `plscale doctor --distributed`: add --distributed.")
    table = Table("check", "status", "detail", title="plscale doctor", title_justify="left")
    ok = True

    def row(name: str, good: bool | None, detail: str) -> None:
        mark = {True: "[green]ok[/]", False: "[red]FAIL[/]", None: "[yellow]note[/]"}[good]
        table.add_row(name, mark, detail)

    row("python", True, platform.python_version())
    row("cores", True, f"{cpu_cores()} usable")
    try:
        import torch
        import torch.distributed as dist
        row("torch", True, torch.__version__)
    except ImportError as exc:
        row("torch", False, f"not importable ({exc}); run `make setup`")
        console.print(table)
        raise typer.Exit(1)
    if torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else "missing"
        row("CUDA", True, f"{torch.version.cuda}, NCCL {nccl}")
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            row(f"GPU {i}", True, f"{p.name}, {p.total_memory / 2**30:.1f} GiB")
    else:
        row("CUDA", None, "no CUDA GPU: labs run as CPU ranks over gloo")
    row("gloo", dist.is_gloo_available(), "available" if dist.is_gloo_available() else "missing: CPU labs cannot run")
    ok &= dist.is_gloo_available()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # say it up front; DeepSpeed would warn while guessing
    try:
        import deepspeed
        row("deepspeed", True, deepspeed.__version__)
    except Exception as exc:  # deepspeed raises more than ImportError when half-installed
        row("deepspeed", False, f"not importable: {exc}")
        ok = False
    row("jax", None, _jax(torch.cuda.is_available()))
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    built = sorted({p.name for p in cache.glob("*/*") if p.is_dir()}) if cache.is_dir() else []
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    headers = Path(sysconfig.get_paths()["include"], "Python.h").is_file()
    row("C++ build", True if compiler and headers else None,
        f"{compiler}, Python.h found: DeepSpeed can build cpu_adam" if compiler and headers else
        f"{'no C++ compiler' if not compiler else 'no Python.h'}: the offload variants (zero2-offload, zero3-offload) "
        f"build DeepSpeed's cpu_adam and will fail; install g++ and the Python headers (apt install g++ python3-dev)")
    row("JIT op cache", None, f"{cache}: {', '.join(built) or 'empty (ops compile on first use, ~30-40 s each)'}")
    row("hub", None, "reachable" if hub_reachable() else "unreachable: offline data paths are used")
    from plscale.slurm import jobs
    row("slurm", None, escape(jobs.describe()))
    found = labs.all_labs()
    row("labs", bool(found), f"{len(found)} found in {labs.labs_root()}")
    ok &= bool(found)
    console.print(table)
    if not ok:
        raise typer.Exit(1)


def _jax(gpus: bool) -> str:
    """The optional JAX extra (lab 10), found without importing it."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    from plscale.lab.jaxenv import CUDA_PLUGINS, jax_install

    try:
        line = f"{version('jax')} (lab 10, jax-gspmd)"
    except PackageNotFoundError:
        return escape(f"not installed: lab 10 (jax-gspmd) needs it: {jax_install()}")
    if gpus and not any(find_spec(p) for p in CUDA_PLUGINS):
        line += escape(" on simulated CPU devices (no CUDA plugin: pip install 'jax[cuda12]' for the GPUs)")
    return line


def distributed_check(gpus: int | None, timeout: float, cpu: bool) -> None:
    """Launch plscale/rank/sanity.py on N ranks (torchrun), wait up to `timeout` seconds, and
    report every rank, naming the ones that did not answer. Exit 1 unless all passed."""
    from plscale.lab.rundir import new_run_dir

    names = [] if cpu else cuda_gpus()
    ranks = gpus if gpus is not None else (len(names) or 2)
    if ranks < 1:
        raise UserError(f"--gpus {ranks}: use 1 or more ranks.")
    if names and ranks > len(names):
        raise UserError(f"Asked for {ranks} GPUs but this machine has {len(names)}: use --gpus {len(names)}, "
                        f"or --cpu for CPU ranks.")
    if timeout <= 0:
        raise UserError(f"--timeout {timeout:g}: use a positive number of seconds.")
    run_dir = new_run_dir("doctor", "distributed")
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cpu_cores() // ranks)), "PYTHONUNBUFFERED": "1"}
    if not names:
        env["CUDA_VISIBLE_DEVICES"] = ""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr",
            "127.0.0.1", "--master_port", str(free_port()), "-m", "plscale.rank.sanity", "--out", str(run_dir),
            "--timeout", str(timeout)]
    console.print(f"launching {ranks} {'GPU' if names else 'CPU'} ranks over {'NCCL' if names else 'gloo'}, "
                  f"timeout {timeout:g} s: {run_dir}")
    start = time.time()
    with open(run_dir / "launcher.log", "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        statuses: dict = {}
        while time.time() - start < timeout:
            statuses = _read_statuses(run_dir)
            if proc.poll() is not None or (len(statuses) == ranks and
                                           all(s["stage"] == "done" for s in statuses.values())):
                break
            time.sleep(0.2)
        statuses = _read_statuses(run_dir)
        timed_out = proc.poll() is None
        stop(proc)
    ok = _report(statuses, ranks, time.time() - start, timeout if timed_out else None, run_dir)
    if not ok:
        raise typer.Exit(1)


def _read_statuses(run_dir: Path) -> dict:
    statuses = {}
    for path in run_dir.glob("rank_*.json"):
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):  # being replaced right now: read it next time
            continue
        statuses[status["rank"]] = status
    return statuses


def _report(statuses: dict, ranks: int, elapsed: float, timed_out: float | None, run_dir: Path) -> bool:
    from plscale.rank.sanity import STAGES

    table = Table("rank", "host", "device", "backend", "all_reduce", "all_gather", "stage", "last word (s)",
                  title=f"plscale doctor --distributed: {ranks} ranks", title_justify="left")
    mark = {True: "[green]ok[/]", False: "[red]WRONG[/]", None: "-"}
    for rank in range(ranks):
        s = statuses.get(rank)
        if s is None:
            table.add_row(str(rank), "?", "?", "?", "-", "-", "[red]never started[/]", "-")
            continue
        stage = "[green]done[/]" if s["stage"] == "done" else f"[red]{_where(s)}[/]"
        table.add_row(str(rank), s["host"], f"{s.get('device', '?')} {s.get('device_name', '')}".strip(),
                      s.get("backend", "?"), mark[s.get("all_reduce")], mark[s.get("all_gather")], stage,
                      f"{s['seconds']:.1f}")
    console.print(table)
    failed = [r for r in range(ranks) if statuses.get(r, {}).get("stage") != "done"
              or not statuses[r].get("all_reduce") or not statuses[r].get("all_gather")]
    if not failed:
        bw = statuses[0].get("busbw_gbps")
        console.print(f"[green]all {ranks} ranks answered[/] in {elapsed:.1f} s; all-reduce of 16 MiB: "
                      f"{bw} GB/s bus bandwidth")
        return True
    # The rank to look at stopped earliest, outside any collective; the others wait for it.
    order = {stage: i for i, stage in enumerate(STAGES)}

    def progress(r):
        s = statuses.get(r)
        return (-1, 0) if s is None else (order[s["stage"]], 1 if s.get("waiting_in") else 0)

    first = min(progress(r) for r in failed)
    culprits = [r for r in failed if progress(r) == first]
    why = f"no answer within {timed_out:g} s" if timed_out else "the ranks exited"
    console.print(f"[red]{len(failed)} of {ranks} ranks did not pass[/] ({why}). Look at rank(s) "
                  f"{', '.join(map(str, culprits))} first: {_where(statuses.get(culprits[0]))}.")
    for r in failed:
        if r in statuses and statuses[r].get("error"):
            console.print(f"  rank {r}: {statuses[r]['error']}", markup=False)
    console.print(f"logs: {run_dir / 'launcher.log'}")
    return False


def _where(status: dict | None) -> str:
    if status is None:
        return "never started"
    if status.get("waiting_in"):
        return f"inside {status['waiting_in']}" + (" (failed)" if status.get("error") else ", waiting")
    return f"stopped after {status['stage']}, outside any collective"
