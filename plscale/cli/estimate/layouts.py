"""`plscale estimate layouts`: lab 10's four layouts of one model on a mesh of devices (dp, fsdp,
fsdp_tp, pipeline): the mesh, parameters and Adam moments per device, and the collectives the
PyTorch twin of each issues per step. Registered on `plscale estimate` (plscale/cli/estimate/__init__.py)."""

import json
from dataclasses import asdict

import typer
from rich.table import Table

from plscale.cli.flags import speaks_flags
from plscale.cli.output import console
from plscale.errors import UserError
from plscale.predict import sharding
from plscale.predict.presets import PRESETS, param_count, preset
from plscale.predict.units import MiB


@speaks_flags()
def layouts(
    name: str = typer.Option("small", "--model", "--preset", "-m", help=f"A model preset: {', '.join(PRESETS)}."),
    devices: int = typer.Option(4, help="Devices of the mesh (lab 10: simulated CPU devices of one process)."),
    tp: int = typer.Option(2, help="The model axis of fsdp_tp."),
    stages: int = typer.Option(2, help="The stage axis of the pipeline."),
    seq: int = typer.Option(128, help="Tokens per sequence."),
    batch: int = typer.Option(8, help="Sequences per step, all devices together."),
    micro_batches: int = typer.Option(4, help="The pipeline's micro-batches per step."),
    as_json: bool = typer.Option(False, "--json", help="Print every layout's figures as JSON."),
) -> None:
    """Lab 10's layouts: bytes per device and the collectives of one step.

    fp32 weights and Adam's two moments (4Ψ and 8Ψ, no master copy),
    replicated (dp, pipeline) or sharded over the data axis as ZeRO-3 shards
    them (fsdp, fsdp_tp), Ψ being one tensor-parallel rank's (norms
    replicated) or one pipeline stage's parameters. The collectives are what
    the PyTorch twin issues per step: ZeRO-0's gradient all-reduce, ZeRO-3's
    gathers and reduce-scatter, Megatron's f and g, the pipeline's sends.
    See plscale/predict/sharding.py.
    """
    config = preset(name)
    if devices < 1 or seq < 1:
        raise UserError(f"--devices {devices} --seq {seq}: use 1 or more of each.")
    rows = []
    for layout in sharding.LAYOUTS:
        mesh = sharding.mesh(layout, devices, tp, stages)
        sharding.check(config, mesh, batch, micro_batches)
        rows.append({"layout": layout, "mesh": str(mesh), "twin": sharding.TWINS[layout],
                     **sharding.states_per_device(config, mesh), "formulas": sharding.formulas(config, mesh),
                     "collectives": [asdict(c) | {"total": c.total}
                                     for c in sharding.by_hand(config, mesh, seq, batch, micro_batches)]})
    if as_json:
        typer.echo(json.dumps({"preset": name, "params": param_count(config), "devices": devices, "seq": seq,
                               "batch": batch, "micro_batches": micro_batches, "layouts": rows}, indent=2))
        return
    table = Table(title=f"{name}: Ψ = {param_count(config):,} parameters on {devices} devices, fp32, Adam",
                  title_justify="left")
    for column in ("layout", "mesh", "parameters / device", "Adam moments / device", "PyTorch twin"):
        table.add_column(column, justify="right" if "/" in column else "left")
    for r in rows:
        table.add_row(r["layout"], r["mesh"], f"{r['parameters'] / MiB:.3f} MiB ({r['formulas']['parameters']})",
                      f"{r['moments'] / MiB:.3f} MiB ({r['formulas']['moments']})", r["twin"])
    console.print(table)
    comms = Table(title=f"collectives per step and device, by hand ({batch} x {seq} tokens)", title_justify="left")
    for column in ("layout", "pass", "op", "over", "calls", "MiB", "what"):
        comms.add_column(column, justify="right" if column in ("calls", "MiB") else "left")
    for r in rows:
        for c in r["collectives"]:
            comms.add_row(r["layout"], c["phase"], c["op"], c["axis"], str(c["calls"]), f"{c['total'] / MiB:.3f}",
                          c["where"])
    console.print(comms)
    console.print(f"The pipeline written as one SPMD program passes activations on at each of "
                  f"m + p - 1 = {sharding.gpipe_ticks(stages, micro_batches)} ticks. Measured beside XLA's own: "
                  f"plscale lab run jax --gpus {devices}.", highlight=False)
