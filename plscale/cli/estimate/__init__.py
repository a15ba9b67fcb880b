"""`plscale estimate ...`: what a training run needs before you rent it, one command a file.

    memory.py           memory per rank: model, ZeRO stage, parallel layout, recomputation
    tensor_parallel.py  `tp`: tensor (and sequence) parallelism's parameters and collectives per rank
    parallel.py         `cp` and `moe`: context and expert parallelism
    precision.py        number formats and bytes per parameter
    checkpoint.py       what a checkpoint writes, and how often to write one
    layouts.py          lab 10's layouts: bytes per device and collectives
"""

import typer

from plscale.cli.estimate import checkpoint, layouts, memory, parallel, precision, tensor_parallel

app = typer.Typer(help="Estimate what a training run needs before you rent it.", no_args_is_help=True)
app.command("memory")(memory.memory)
app.command("tp")(tensor_parallel.tensor_parallel)
app.command("cp")(parallel.context_parallel)
app.command("moe")(parallel.experts)
app.command("precision")(precision.precision)
app.command("checkpoint")(checkpoint.checkpoint)
app.command("layouts")(layouts.layouts)
