"""Diagrams of the deck slides/08_pipeline (section pipeline): planned pipeline schedules and
the bubble, all from plscale.predict.pipeline (the plan `plscale viz pipeline` draws: a
forward takes 1 unit, a backward 2, communication is free). Colours as the lab's timelines
(plscale.charts.timeline)."""

from pathlib import Path

from matplotlib.patches import Patch
from matplotlib.ticker import PercentFormatter

from plscale.predict import pipeline
from plscale.slides.diagrams.style import BLUE, GREY, NAVY, RED, SAND, figure, rect, save
from plscale.charts.timeline import COLOURS

FONT = 12


def _timeline(ax, ops, title: str, span: float, held: dict | None = None) -> None:
    """One planned step: a row per stage, a box per forward/backward with its micro-batch."""
    p = max(op.rank for op in ops) + 1
    for op in ops:
        y = p - 1 - op.rank
        rect(ax, op.start, y - 0.38, op.end - op.start, 0.76, COLOURS[op.kind], edge="white", lw=1.0)
        ax.text((op.start + op.end) / 2, y, str(op.micro), ha="center", va="center", fontsize=FONT - 1,
                color="white", weight="bold")
    if held:
        for rank, n in held.items():
            ax.text(span + 0.4, p - 1 - rank, f"holds {n}", va="center", fontsize=FONT, color=NAVY)
    ax.set_xlim(0, span + (4.2 if held else 0.2))
    ax.set_xticks(range(0, int(span) + 1, 5 if span > 15 else 2))
    ax.set_ylim(-0.6, p - 0.4)
    ax.set_yticks(range(p), [f"stage {r}" for r in reversed(range(p))], fontsize=FONT)
    ax.tick_params(axis="y", length=0)
    ax.spines["left"].set_visible(False)
    ax.set_title(title, fontsize=FONT + 1, loc="left", weight="bold", color=NAVY)


def _legend(ax, below: float) -> None:
    """Under the axes' x label (save's tight_layout keeps an axes legend inside the figure)."""
    handles = [Patch(color=COLOURS["F"], label="forward (1 unit)"), Patch(color=COLOURS["B"], label="backward (2 units)"),
               Patch(facecolor="white", edgecolor=GREY, label="idle: the bubble")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -below), ncol=3, fontsize=FONT, frameon=False)


def one_micro_batch(out: Path) -> Path:
    """p = 4, m = 1: the whole batch at once, one stage busy at a time."""
    ops = pipeline.simulate("gpipe", 4, 1)
    span = max(op.end for op in ops)
    fig, ax = figure(11, 3.3)
    bubble = pipeline.bubble_of(ops)
    _timeline(ax, ops, f"p = 4 stages, m = 1 micro-batch: every stage idles {bubble:.0%} of the step", span)
    ax.set_xlabel("time (units of one forward)", fontsize=FONT)
    _legend(ax, 0.32)
    return save(fig, out, "one_micro_batch.png")


def schedules(out: Path) -> Path:
    """GPipe against 1F1B, p = 4, m = 8: the same bubble, different activations held."""
    p, m = 4, 8
    fig, axes = figure(11, 5.2, nrows=2, sharex=True)
    runs = [(s, pipeline.simulate(s, p, m)) for s in ("gpipe", "1f1b")]
    span = max(op.end for _, ops in runs for op in ops)
    names = {"gpipe": "GPipe: all forwards, then all backwards", "1f1b": "1F1B: warm-up, one forward one backward"}
    for ax, (schedule, ops) in zip(axes, runs):
        held = {r: pipeline.in_flight(schedule, p, m, r) for r in range(p)}
        _timeline(ax, ops, f"{names[schedule]}  (bubble {pipeline.bubble_of(ops):.1%})", span, held)
    axes[1].set_xlabel("time (units of one forward); \"holds\": most micro-batches of activations at once",
                       fontsize=FONT)
    _legend(axes[1], 0.3)
    return save(fig, out, "schedules.png")


def bubble_curves(out: Path) -> Path:
    """(p-1)/(m+p-1) against m for p = 2, 4, 8, and interleaved 1F1B with v = 2 at p = 4."""
    ms = [1, 2, 4, 8, 16, 32, 64]
    fig, ax = figure(11, 4.6)
    for p, colour in ((2, BLUE), (4, SAND), (8, RED)):
        ax.plot(ms, [pipeline.bubble_fraction(p, m) for m in ms], "o-", color=colour, lw=2, label=f"p = {p}")
    inter = [m for m in ms if m % 4 == 0]
    ax.plot(inter, [pipeline.bubble_fraction(4, m, v=2) for m in inter], "s--", color=SAND, lw=1.6,
            label="p = 4, interleaved v = 2")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_xlabel("micro-batches per step (m)")
    ax.set_ylabel("bubble: idle share of the step")
    ax.set_ylim(0, 0.92)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=FONT + 1)
    return save(fig, out, "bubble_curves.png")


def draw(out: Path) -> list[Path]:
    return [one_micro_batch(out), schedules(out), bubble_curves(out)]
