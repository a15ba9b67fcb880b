"""Diagrams of the deck slides/07_multi_gpu_runpod (section multi-gpu-runpod): DDP's gradient
buckets against one all-reduce and one per parameter, `no_sync` over accumulated
micro-batches, and the life of a `plscale runpod` session. Schematic: no time is measured or
predicted here, the boxes show order and overlap only (lab 02 counts the calls for real)."""

from pathlib import Path

from plscale.slides.diagrams.style import (
    BLUE,
    GREEN,
    GREY,
    NAVY,
    RED,
    SAND,
    SKY,
    arrow,
    box,
    canvas,
    save,
)

LAYERS = ["head", "layer 4", "layer 3", "layer 2", "layer 1", "embed"]


def buckets(out: Path) -> Path:
    """Backward runs last layer first; where the gradient all-reduces can run beside it."""
    fig, ax = canvas(11, 4.4, xlim=(0, 11), ylim=(0, 4.4))
    x0, w = 2.3, 1.0                                     # one layer's backward: w wide
    rows = {"backward": 3.55, "one bucket": 2.6, "4 buckets": 1.65, "per parameter": 0.7}
    for name, y in rows.items():
        ax.text(x0 - 0.15, y + 0.25, name, ha="right", va="center", fontsize=13, color=NAVY, weight="bold")
    for i, layer in enumerate(LAYERS):
        box(ax, x0 + i * w, rows["backward"], w - 0.04, 0.5, layer, SKY, size=11)
    end = x0 + len(LAYERS) * w
    ax.plot([end, end], [0.45, 4.2], color=GREY, ls=":", lw=1.2)
    ax.text(end, 4.25, "backward ends", ha="center", fontsize=11, color=GREY)
    box(ax, end + 0.05, rows["one bucket"], 2.5, 0.5, "all-reduce everything", RED, "white", size=11)
    ax.text(end + 2.65, rows["one bucket"] + 0.25, "nothing hidden", va="center", fontsize=11, color=RED)
    for k in range(4):                                   # a bucket closes after 1.5 layers' gradients
        start = x0 + (k + 1) * 1.5 * w
        box(ax, start + 0.05, rows["4 buckets"], 0.68, 0.5, f"b{k + 1}", GREEN, "white", size=11)
    ax.text(x0 + 6 * w + 0.85, rows["4 buckets"] + 0.25, "mostly under backward", va="center", fontsize=11,
            color=GREEN)
    for j in range(18):                                  # one small call per parameter, each paying latency
        box(ax, x0 + 0.35 + j * 0.36, rows["per parameter"], 0.2, 0.5, "", SAND, edge=SAND)
    ax.text(x0 + 0.35 + 18 * 0.36 + 0.1, rows["per parameter"] + 0.25, "latency x every parameter",
            va="center", fontsize=11, color=SAND)
    arrow(ax, (x0, 0.25), (10.8, 0.25), color=GREY)
    ax.text(10.8, 0.02, "time", ha="right", fontsize=11, color=GREY)
    return save(fig, out, "buckets.png")


def no_sync(out: Path) -> Path:
    """k = 4 micro-batches per step: without no_sync every backward all-reduces; with it only
    the last one does, and the sum of the four local gradients travels once."""
    fig, ax = canvas(11, 3.0, xlim=(0, 11), ylim=(0, 3.0))
    ax.text(0.1, 2.75, "one optimizer step = 4 micro-batches per rank", fontsize=13, color=GREY)
    for y, title, every in ((1.6, "plain loop", True), (0.3, "with no_sync()", False)):
        ax.text(1.9, y + 0.42, title, ha="right", va="center", fontsize=13, weight="bold", color=NAVY)
        ax.text(1.9, y + 0.12, "4 all-reduces" if every else "1 all-reduce", ha="right", va="center",
                fontsize=13, color=RED, weight="bold")
        x = 2.05
        for i in range(4):
            box(ax, x, y, 0.5, 0.6, f"F{i}", BLUE, "white", size=11)
            box(ax, x + 0.53, y, 0.8, 0.6, f"B{i}", GREEN, "white", size=11)
            x += 1.38
            if every or i == 3:
                box(ax, x, y, 0.55, 0.6, "AR", RED, "white", size=11, weight="bold")
                x += 0.6
        box(ax, x + 0.05, y, 0.8, 0.6, "step", SAND, size=11)
    return save(fig, out, "no_sync.png")


def runpod_flow(out: Path) -> Path:
    """plscale runpod from a laptop: the commands in order, what each does, the cost guard."""
    fig, ax = canvas(11, 3.8, xlim=(0, 11), ylim=(0, 3.8))
    steps = [("login", "API key, mode 600\n(or RUNPOD_API_KEY)"), ("gpus", "types, $/GPU-hour,\nstock"),
             ("up", "shows the cost, asks,\nwaits for SSH"), ("run LAB", "sync, install, run;\nstreams the log"),
             ("fetch", "runs/ back here;\nplscale report"), ("down", "delete, check\nnothing billing")]
    w, gap = 1.6, 0.22
    for i, (cmd, what) in enumerate(steps):
        x = 0.15 + i * (w + gap)
        box(ax, x, 2.45, w, 0.7, cmd, NAVY if cmd in ("up", "down") else BLUE, "white", size=13, weight="bold")
        ax.text(x + w / 2, 2.2, what, ha="center", va="top", fontsize=11, color=NAVY)
        if i:
            arrow(ax, (x - gap, 2.8), (x, 2.8))
    ax.text(0.15, 3.4, "on your laptop: plscale runpod ...", fontsize=13, color=GREY)
    left, right = 0.15 + 2 * (w + gap), 0.15 + 5 * (w + gap) + w
    box(ax, left, 0.75, right - left, 0.55, "pods exist and bill per second", SAND, size=12)
    box(ax, left, 0.1, right - left, 0.5, "a watchdog on each pod ends it at --max-hours (armed at up)", RED,
        "white", size=12)
    ax.text(left - 0.15, 0.7, "cost guard", ha="right", va="center", fontsize=13, weight="bold", color=RED)
    return save(fig, out, "runpod_flow.png")


def draw(out: Path) -> list[Path]:
    return [buckets(out), no_sync(out), runpod_flow(out)]
