"""Diagrams for the deck of section 9, tensor and sequence parallelism (slides/09_tensor_sequence).

    megatron_mlp.png       the MLP split by columns then rows over 2 ranks, glued by f and g
    sequence_parallel.png  one layer's regions under tp and tp + sp: what is whole, what is split
    tp_links.png           a 7B layer stack's TP collectives per micro-batch over NVLink and over
                           the network, beside its compute at peak (plscale.predict)
"""

from pathlib import Path

from plscale.predict import cluster, recompute, step_time, tensor_parallel
from plscale.predict.presets import preset
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
    figure,
    save,
)

LIGHT = "#eef2f5"


def megatron_mlp(out: Path) -> Path:
    """Y = X A by columns, Z = Y B by rows: the halves of Y never meet; f and g glue the ends."""
    fig, ax = canvas(11, 4.8, ylim=(0, 4.8))
    rows = {0: 2.75, 1: 0.95}          # rank -> lower edge of its row
    hgt = 0.95
    for rank, y in rows.items():
        ax.text(0.05, y + hgt / 2, f"rank {rank}", ha="left", va="center", fontsize=13, weight="bold",
                color=NAVY)
        box(ax, 0.85, y, 1.0, hgt, "X\nwhole", color=LIGHT, size=12)
        box(ax, 3.0, y, 1.5, hgt, f"X A$_{rank + 1}$\ncolumns", color=SKY, size=13)
        box(ax, 5.0, y, 1.25, hgt, f"SiLU\nY$_{rank + 1}$", color=LIGHT, size=12)
        box(ax, 6.75, y, 1.5, hgt, f"Y$_{rank + 1}$ B$_{rank + 1}$\nrows", color=SKY, size=13)
        box(ax, 9.85, y, 1.05, hgt, "Z\nwhole", color=LIGHT, size=12)
        for x0, x1 in ((1.85, 2.15), (2.75, 3.0), (4.5, 5.0), (6.25, 6.75), (8.25, 8.6), (9.5, 9.85)):
            arrow(ax, (x0, y + hgt / 2), (x1, y + hgt / 2))
    # f and g span both ranks
    box(ax, 2.15, 0.95, 0.6, 2.75, "f", color=SAND, size=20, weight="bold")
    box(ax, 8.6, 0.95, 0.9, 2.75, "g", color=RED, text_color="white", size=20, weight="bold")
    ax.text(2.45, 0.8, "f: forward identity\nbackward all-reduce", ha="center", va="top", fontsize=12,
            color=NAVY)
    ax.text(9.05, 0.8, "g: forward all-reduce\nbackward identity", ha="center", va="top", fontsize=12,
            color=NAVY)
    ax.text(3.75, 3.85, "column-parallel\n(gate, up; q, k, v)", ha="center", va="bottom", fontsize=12.5,
            color=BLUE, weight="bold")
    ax.text(7.5, 3.85, "row-parallel\n(down; o)", ha="center", va="bottom", fontsize=12.5, color=BLUE,
            weight="bold")
    ax.text(5.6, 2.32, "no communication in between: each rank keeps its half of Y",
            ha="center", va="center", fontsize=12, color=GREY, style="italic")
    return save(fig, out, "megatron_mlp.png")


def sequence_parallel(out: Path) -> Path:
    """One decoder layer, left to right: the regions and the collectives between them."""
    fig, ax = canvas(11, 4.3, ylim=(0, 4.3))
    whole, split_h, split_s = "#d9dde3", SKY, "#b7e4c7"
    lanes = {"tp": (2.3, ("f", "g"), "[b, s, h]", whole),
             "tp + sp": (0.45, ("all-\ngather", "reduce-\nscatter"), "[b, s/t, h]", split_s)}
    for name, (y, (op_in, op_out), shape, norm_color) in lanes.items():
        ax.text(0.05, y + 0.5, name, ha="left", va="center", fontsize=14, weight="bold", color=NAVY)
        x = 1.15
        for i in range(4):
            is_norm = i % 2 == 0
            if is_norm:
                box(ax, x, y, 1.3, 1.0, f"residual,\nRMSNorm\n{shape}", color=norm_color, size=11)
                x += 1.3
            else:
                box(ax, x, y, 1.5, 1.0, "attention\nheads / t" if i == 1 else "MLP\nffn / t", color=split_h,
                    size=12)
                x += 1.5
            op = op_in if is_norm else op_out
            box(ax, x + 0.06, y + 0.15, 0.88, 0.7, op, color=SAND if is_norm else RED,
                size=15 if len(op) == 1 else 10.5, text_color="black" if is_norm else "white", weight="bold")
            x += 1.0
    ax.text(5.5, 1.9, "between the blocks, tp keeps every token on every rank; sp keeps s/t of them",
            ha="center", va="center", fontsize=12.5, color=GREY, style="italic")
    for i, (label, color) in enumerate((("whole on every rank", whole), ("split by heads / ffn", split_h),
                                        ("split by sequence", split_s))):
        box(ax, 1.15 + 3.2 * i, 3.7, 0.35, 0.35, color=color)
        ax.text(1.6 + 3.2 * i, 3.87, label, ha="left", va="center", fontsize=12.5)
    return save(fig, out, "sequence_parallel.png")


def tp_links(out: Path) -> Path:
    """Why tensor parallelism stays inside a node: its collectives per micro-batch, on two links."""
    c, tp, seq, mb, precision = preset("7b"), 8, 4096, 1, "bf16"
    gpu = cluster.find_gpu("H100")
    rows = tensor_parallel.collectives(c, tp, seq, mb, precision)

    def comm(link) -> float:
        return sum(step_time.collective_seconds(r.op, r.total, tp, link, r.calls) for r in rows)

    flops = recompute.step_flops(c, seq)
    compute = step_time.compute_seconds((flops.forward + flops.backward) * seq * mb, tp, gpu, precision)  # at peak
    bars = [("compute per rank,\nat bf16 peak", compute, BLUE),
            ("TP collectives,\n8 GPUs of one node\n(NVLink)", comm(step_time.link(gpu, tp, 1)), GREEN),
            ("TP collectives,\n8 GPUs on 8 nodes\n(network)", comm(step_time.link(gpu, tp, gpu.gpus_per_node)), RED)]
    fig, ax = figure(11, 4.3)
    ys = range(len(bars))[::-1]
    ax.barh(list(ys), [b[1] * 1e3 for b in bars], color=[b[2] for b in bars], height=0.6)
    ax.set_yticks(list(ys), [b[0] for b in bars], fontsize=13)
    for y, (_, s, _) in zip(ys, bars):
        ax.text(s * 1e3 + 1.5, y, f"{s * 1e3:.0f} ms", va="center", fontsize=13)
    ax.set_xlabel("ms per micro-batch of 4096 tokens (forward + backward)")
    ax.set_xlim(0, max(b[1] for b in bars) * 1e3 * 1.15)
    ax.set_title(f"Llama-7B shape, tp {tp}, {precision}, {gpu.name} (plscale.predict)", fontsize=14)
    return save(fig, out, "tp_links.png")


def draw(out: Path) -> list[Path]:
    out = Path(out)
    return [megatron_mlp(out), sequence_parallel(out), tp_links(out)]
