"""`plscale config new|check|diff|sync`: DeepSpeed JSON from the typed spec, checked and explained."""

from pathlib import Path

import typer
from rich.table import Table

from plscale.dsconfig import standard
from plscale.dsconfig.check import check as check_config, load
from plscale.dsconfig.explain import diff as diff_configs
from plscale.dsconfig.spec import DSSpec, build
from plscale.cli.output import console
from plscale.errors import UserError
from plscale.files import write_atomic

app = typer.Typer(help="Generate, check, compare and sync DeepSpeed configs.", no_args_is_help=True)


@app.command("new")
def new(
    output: Path = typer.Argument(..., help="Where to write the JSON."),
    stage: int = typer.Option(2, help="ZeRO stage 0-3."),
    precision: str = typer.Option("fp32", help="fp32, bf16 or fp16."),
    offload_optimizer: bool = typer.Option(False, help="Optimizer states on the CPU (stage 1-3)."),
    offload_param: bool = typer.Option(False, help="Parameters on the CPU (stage 3)."),
    micro_batch: int = typer.Option(8, help="Samples per rank per step."),
    grad_accum: int = typer.Option(1, help="Gradient accumulation steps."),
    gpus: int = typer.Option(0, help="World size; when given, train_batch_size is written."),
    lr: float = typer.Option(1e-3, help="Learning rate."),
    grad_clip: float = typer.Option(1.0, help="Gradient clipping (0 = off)."),
    activation_checkpointing: bool = typer.Option(False, help="Recompute activations in backward."),
    comms_logger: bool = typer.Option(False, help="Log every collective."),
    flops_profiler: bool = typer.Option(False, help="Profile one step's FLOPs."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file."),
) -> None:
    """Write a DeepSpeed config from the typed spec."""
    if output.exists() and not force:
        raise UserError(f"{output} exists: pass --force to replace it, or choose another path.")
    spec = DSSpec(stage=stage, precision=precision, offload_optimizer=offload_optimizer,
                  offload_param=offload_param, micro_batch=micro_batch, grad_accum=grad_accum,
                  world_size=gpus, lr=lr, grad_clip=grad_clip, activation_checkpointing=activation_checkpointing,
                  comms_logger=comms_logger, flops_profiler=flops_profiler)
    write_atomic(output, standard.render(build(spec)))
    console.print(f"wrote {output}")


@app.command("check")
def check(path: Path = typer.Argument(..., help="A DeepSpeed JSON file."),
          gpus: int = typer.Option(1, "--gpus", help="World size to check the batch sizes against.")) -> None:
    """Validate with plscale's rules and DeepSpeed's own parser; exit 2 on any problem."""
    if gpus < 1:
        raise UserError(f"--gpus {gpus}: the world size is at least 1.")
    problems = check_config(load(path), gpus)
    if problems:
        for problem in problems:
            console.print(f"[red]problem:[/] {problem}", highlight=False)
        raise typer.Exit(2)
    console.print(f"[green]ok[/]: {path} is a valid DeepSpeed config for {gpus} rank(s).")


@app.command("diff")
def diff(a: Path = typer.Argument(..., help="First config."), b: Path = typer.Argument(..., help="Second config.")) -> None:
    """Each key that differs, and what the change does to memory, communication and speed."""
    rows = diff_configs(load(a), load(b))
    if not rows:
        console.print("The two configs are the same.")
        return
    table = Table("key", str(a), str(b), "what it does", title="config diff", title_justify="left")
    previous = None
    for key, va, vb, text in rows:
        table.add_row(key, str(va), str(vb), "(as above)" if text == previous else text)
        previous = text
    console.print(table)


@app.command("sync")
def sync(check_only: bool = typer.Option(False, "--check", help="Only report drift; exit 1 if any.")) -> None:
    """Rewrite ds_configs/ from the builder (the standard set)."""
    if check_only:
        drift = standard.drifted()
        for name in drift:
            console.print(f"drifted: ds_configs/{name}")
        raise typer.Exit(1 if drift else 0)
    changed = standard.sync()
    console.print(f"ds_configs/: {len(changed)} file(s) written: {', '.join(changed) or 'none'}")
