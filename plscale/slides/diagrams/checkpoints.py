"""Diagrams for the deck of section 11, fault tolerance and checkpointing (slides/11_fault_tolerance).

    timelines.png          basic, incremental, asynchronous and multi-level checkpoints on a time line
    failures_at_scale.png  a job's mean time between failures against its GPU count (Llama 3's
                           failure rate), and Young's interval and the time lost at that interval
                           (plscale.predict.checkpoint)
"""

from pathlib import Path

import numpy as np

from plscale.predict.checkpoint import job_mtbf_hours, waste_fraction, young_interval
from plscale.predict.published import LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_INTERRUPTIONS
from plscale.slides.diagrams.style import (
    BLUE,
    GREEN,
    GREY,
    NAVY,
    RED,
    SAND,
    SKY,
    canvas,
    figure,
    save,
)

STALL_S = 30.0   # an assumed checkpoint stall, said on the slide


def _segments(ax, y, items, h=0.5):
    """items: (start, length, color, hatch) drawn as bars on the lane at height y."""
    for start, length, color, hatch in items:
        ax.barh(y, length, left=start, height=h, color=color, edgecolor="white" if not hatch else NAVY,
                hatch=hatch, linewidth=0.8)


def timelines(out: Path) -> Path:
    """The four strategies: when training stalls, and when the state is safe."""
    fig, ax = canvas(11, 4.6, xlim=(-2.4, 10.3), ylim=(-0.9, 4.3))
    train, stall, bg, fast, delta = SKY, RED, SAND, GREEN, "#f4a6ad"
    lanes = [
        ("basic", [(0, 2, train, ""), (2, 0.9, stall, ""), (2.9, 2.5, train, ""), (5.4, 0.9, stall, ""),
                   (6.3, 2.5, train, ""), (8.8, 0.9, stall, "")], []),
        ("incremental", [(0, 2, train, ""), (2, 0.9, stall, ""), (2.9, 2.5, train, ""), (5.4, 0.5, delta, ""),
                         (5.9, 2.5, train, ""), (8.4, 0.5, delta, ""), (8.9, 1.1, train, "")], []),
        ("async", [(0, 2, train, ""), (2, 0.3, fast, ""), (2.3, 2.5, train, ""), (4.8, 0.3, fast, ""),
                   (5.1, 2.5, train, ""), (7.6, 0.3, fast, ""), (7.9, 2.1, train, "")],
         [(2.3, 1.6, bg, "//"), (5.1, 1.6, bg, "//"), (7.9, 1.6, bg, "//")]),
        ("multi-level", [(0, 2, train, ""), (2, 0.3, fast, ""), (2.3, 2.5, train, ""), (4.8, 0.3, fast, ""),
                         (5.1, 2.5, train, ""), (7.6, 0.9, stall, ""), (8.5, 1.5, train, "")], []),
    ]
    for i, (name, main, background) in enumerate(lanes):
        y = 3.6 - i * 1.1
        ax.text(-0.2, y, name, ha="right", va="center", fontsize=14, weight="bold", color=NAVY)
        _segments(ax, y, main)
        _segments(ax, y - 0.42, background, h=0.25)
    legend = [("training", train), ("stall: full write", stall), ("stall: XOR delta", delta),
              ("stall: snapshot / fast tier", fast), ("background write", bg)]
    x = -2.3
    for label, color in legend:
        ax.barh(-0.6, 0.35, left=x, height=0.3, color=color, hatch="//" if color == bg else "",
                edgecolor=NAVY if color == bg else "white")
        ax.text(x + 0.45, -0.6, label, va="center", fontsize=12)
        x += 0.6 + 0.105 * len(label)
    ax.annotate("", xy=(10.2, -0.25), xytext=(0, -0.25), arrowprops={"arrowstyle": "-|>", "color": GREY})
    ax.text(10.2, -0.12, "time", ha="right", va="bottom", fontsize=12, color=GREY)
    return save(fig, out, "timelines.png")


def failures_at_scale(out: Path) -> Path:
    """Left: job MTBF against GPUs. Right: Young's interval and its time lost for a 30 s stall."""
    gpus = np.logspace(np.log10(8), np.log10(32_768), 60)
    mtbf_h = job_mtbf_hours(gpus, LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS)
    interval_min = [young_interval(STALL_S, m * 3600) / 60 for m in mtbf_h]
    lost = [100 * waste_fraction(young_interval(STALL_S, m * 3600), STALL_S, m * 3600) for m in mtbf_h]
    fig, (left, right) = figure(11, 4.3, ncols=2)
    left.loglog(gpus, mtbf_h, color=NAVY, linewidth=2.5)
    left.set_xlabel("GPUs in the job")
    left.set_ylabel("job MTBF (hours)")
    left.set_title("one failure every ...", fontsize=14)
    left.axvline(LLAMA3_GPUS, color=GREY, linestyle=":")
    at = job_mtbf_hours(LLAMA3_GPUS, LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS)
    left.plot([LLAMA3_GPUS], [at], "o", color=RED, markersize=8)
    left.text(LLAMA3_GPUS * 0.7, at * 0.8, f"Llama 3: 16K GPUs,\none every {at:.0f} h", ha="right", va="top",
              fontsize=12, color=RED)
    left.set_yticks([1, 10, 100, 1000], ["1", "10", "100", "1000"])
    left.set_ylim(0.3, mtbf_h[0] * 1.5)
    left.grid(True, which="major", alpha=0.3)
    right.semilogx(gpus, interval_min, color=BLUE, linewidth=2.5, label="Young's interval (min)")
    right.set_xlabel("GPUs in the job")
    right.set_ylabel("minutes between checkpoints", color=BLUE)
    twin = right.twinx()
    twin.semilogx(gpus, lost, color=RED, linewidth=2.5)
    twin.set_ylabel("time lost at that interval (%)", color=RED)
    twin.spines["top"].set_visible(False)
    right.set_title(f"checkpoint stall {STALL_S:.0f} s", fontsize=14)
    right.grid(True, which="major", alpha=0.3)
    for ax in (left, right):
        ax.set_xticks([8, 64, 512, 4096, 32768], ["8", "64", "512", "4K", "32K"])
    return save(fig, out, "failures_at_scale.png")


def draw(out: Path) -> list[Path]:
    out = Path(out)
    return [timelines(out), failures_at_scale(out)]
