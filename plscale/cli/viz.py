"""`plscale viz`: pictures of parallelism on paper. Host side: no torch; matplotlib only to draw."""

from pathlib import Path

import typer

from plscale.cli.flags import speaks_flags
from plscale.cli.output import console, png_path
from plscale.predict import pipeline as pp

app = typer.Typer(help="Pictures of parallelism on paper, before anything runs.", no_args_is_help=True)

NAMES = {"gpipe": "GPipe (all forwards, all backwards)", "1f1b": "1F1B", "interleaved": "Interleaved 1F1B",
         "zb": "Zero bubble ZB-H1"}
FORMULAS = {"gpipe": "(p-1)/(m+p-1)", "1f1b": "(p-1)/(m+p-1)", "interleaved": "(p-1)/(v·m+p-1)",
            "zb": "(p-1)/(3m+p-1)"}
TEXT_WIDTH = 150  # columns up to which the timeline is also printed as text


def _png_path(out: Path | None, schedule: str, stages: int, micro: int) -> Path:
    return png_path("--out", Path(f"pipeline-{schedule}-p{stages}-m{micro}.png") if out is None else out)


def title(schedule: str, p: int, m: int, v: int, bubble: float) -> str:
    """'1F1B, p=4 stages, m=8 micro-batches: bubble 27.3% (theory (p-1)/(m+p-1) = 27.3%)'."""
    shape = f"p={p} stages x v={v} chunks" if schedule == "interleaved" else f"p={p} stages"
    text = f"{NAMES[schedule]}, {shape}, m={m} micro-batches: bubble {bubble:.1%}"
    if schedule == "zb":
        one_f_one_b = f"1F1B {pp.bubble_fraction(p, m):.1%}"
        if m < p:
            return f"{text} ({one_f_one_b}; the theory needs m >= p)"
        return f"{text} (theory {FORMULAS[schedule]} = {pp.bubble_theory('zb', p, m):.1%}; {one_f_one_b})"
    return f"{text} (theory {FORMULAS[schedule]} = {pp.bubble_theory(schedule, p, m, v):.1%})"


@app.command("pipeline")
@speaks_flags()
def pipeline(
    schedule: str = typer.Option("1f1b", help=f"One of {', '.join(pp.SCHEDULES)}."),
    stages: int = typer.Option(4, "--stages", "-p", help="Pipeline stages p (one rank each)."),
    micro: int = typer.Option(8, "--micro", "-m", help="Micro-batches m per step."),
    virtual: int = typer.Option(2, "--virtual", "-v", help="Model chunks v per rank (interleaved only)."),
    out: Path = typer.Option(None, help="The PNG to write (default: pipeline-SCHEDULE-pP-mM.png here)."),
) -> None:
    """Draw a pipeline schedule on paper: who runs which micro-batch when, and the bubble.

    A forward of one stage takes 1 unit, a backward 2 (zb: B and W 1 each); sending is free.
    Idle fraction: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v*m+p-1) interleaved,
    (p-1)/(3m+p-1) for ZB-H1 with m >= p. See plscale/predict/pipeline.py.
    """
    pp.check(schedule, stages, micro, virtual)         # a PredictionError, worded with these flags
    v = virtual if schedule == "interleaved" else 1
    path = _png_path(out, schedule, stages, micro)
    ops = pp.simulate(schedule, stages, micro, v)
    bubble = pp.bubble_of(ops)
    from plscale.charts import timeline

    timeline.draw(path, ops, title(schedule, stages, micro, v, bubble), unit="units of one forward")
    text = pp.text_timeline(ops)
    if len(text.splitlines()[0]) <= TEXT_WIDTH:
        console.print(text, highlight=False)
    held = pp.in_flight(schedule, stages, micro, 0, v)
    held_text = f"{held} (micro-batch, chunk) pairs, each 1/{v} of the rank's layers" if v > 1 \
        else f"{held} micro-batch{'es' if held > 1 else ''}"
    console.print(f"{title(schedule, stages, micro, v, bubble)}; rank 0 holds the activations of up to {held_text}",
                  highlight=False, soft_wrap=True)
    console.print(f"wrote {path}")
