"""`plscale doctor`: can the labs run here? Exit 1 when they cannot."""

import os
import platform
from pathlib import Path

import typer
from rich.table import Table

from plscale import labs
from plscale.cli.output import console
from plscale.hardware import cpu_cores, hub_reachable


def doctor() -> None:
    """Check torch, DeepSpeed, GPUs or gloo, the JIT op cache, cores, the hub and the labs."""
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
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    built = sorted({p.name for p in cache.glob("*/*") if p.is_dir()}) if cache.is_dir() else []
    row("JIT op cache", None, f"{cache}: {', '.join(built) or 'empty (ops compile on first use, ~30-40 s each)'}")
    row("hub", None, "reachable" if hub_reachable() else "unreachable: offline data paths are used")
    found = labs.all_labs()
    row("labs", bool(found), f"{len(found)} found in {labs.labs_root()}")
    ok &= bool(found)
    console.print(table)
    if not ok:
        raise typer.Exit(1)
