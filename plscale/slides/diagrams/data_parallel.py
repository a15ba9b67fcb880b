"""Diagrams of the deck slides/06_data_parallel_hands_on (section data-parallel-hands-on):
the pseudo data parallelism of lab 01 beside gradient accumulation, and what ZeRO's stages
leave on each GPU for a 7B model (plscale.predict.memory, the model `plscale estimate memory`
prints; the GPU's memory from plscale.predict.cluster)."""

from pathlib import Path

from plscale.predict import cluster, memory, presets
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


def pseudo_dp(out: Path) -> Path:
    """Left: N = 2 workers, each its shard, gradients averaged, the same step everywhere.
    Right: the same sum on one device, one micro-batch at a time."""
    fig, ax = canvas(11, 4.6, ylim=(0, 4.6))
    ax.text(2.9, 4.35, "data parallelism: 2 workers", ha="center", fontsize=15, weight="bold", color=NAVY)
    box(ax, 0.3, 3.45, 2.5, 0.55, "shard 0 (64 samples)", SAND, size=12)
    box(ax, 3.0, 3.45, 2.5, 0.55, "shard 1 (64 samples)", SAND, size=12)
    ax.text(2.9, 3.02, "global batch B = 128", ha="center", fontsize=12, color=GREY)
    for x, r in ((0.3, 0), (3.0, 1)):
        arrow(ax, (x + 1.25, 3.45), (x + 1.25, 2.75))
        box(ax, x, 2.05, 2.5, 0.7, f"replica {r}\nforward, backward", SKY, size=12)
        arrow(ax, (x + 1.25, 2.05), (2.9 + (x - 1.65) * 0.35, 1.45), text="")
        ax.text(x + 1.25 + (0.55 if r else -0.55), 1.7, f"∇ shard {r}", ha="center", fontsize=12, color=NAVY)
    box(ax, 1.2, 0.85, 3.4, 0.6, "all-reduce: mean of the gradients", GREEN, "white", size=12, weight="bold")
    arrow(ax, (2.9, 0.85), (2.9, 0.5))
    ax.text(2.9, 0.2, "step() on every replica: the same update", ha="center", fontsize=12, color=NAVY)

    ax.plot([6.05, 6.05], [0.2, 4.4], color=GREY, lw=1, ls=":")
    ax.text(8.6, 4.35, "gradient accumulation: 1 device", ha="center", fontsize=15, weight="bold", color=NAVY)
    for i, y in enumerate((3.3, 2.2)):
        box(ax, 6.4, y, 2.2, 0.6, f"micro-batch {i} (64)", SAND, size=12)
        arrow(ax, (8.6, y + 0.3), (9.0, y + 0.3))
        box(ax, 9.0, y, 1.8, 0.6, "(loss / 2)\n.backward()", SKY, size=11)
    arrow(ax, (9.9, 3.3), (9.9, 2.8))
    arrow(ax, (9.9, 2.2), (9.9, 1.45))
    ax.text(9.75, 1.7, "grads add up in .grad", ha="right", fontsize=12, color=GREY)
    box(ax, 8.9, 0.85, 2.0, 0.6, "one step()", GREEN, "white", size=12, weight="bold")
    ax.text(8.6, 0.2, "the same gradient: the mean over all 128", ha="center", fontsize=12, color=NAVY)
    return save(fig, out, "pseudo_dp.png")


def zero_7b(out: Path) -> Path:
    """Model states per GPU of a 7B model on 8 GPUs in bf16 with Adam, accumulating 8
    micro-batches, at each ZeRO stage and ZeRO-2 with the optimizer offloaded to the host (its
    fp32 gradient partition, master copy and moments); the line is one H100's memory."""
    model = presets.preset("7b")
    psi = presets.param_count(model)
    cases = [("ZeRO-0\n(plain DP)", {"stage": 0}), ("ZeRO-1", {"stage": 1}), ("ZeRO-2", {"stage": 2}),
             ("ZeRO-3", {"stage": 3}), ("ZeRO-2 +\noffload", {"stage": 2, "offload_optimizer": True})]
    names = ["parameters", "gradients", "master", "moments"]
    colours = [BLUE, SAND, GREEN, RED]
    fig, ax = figure(11, 4.6)
    for i, (label, kw) in enumerate(cases):
        est = memory.estimate(memory.Setup(params=psi, dp=8, precision="bf16", grad_accum=8, **kw))
        bottom = 0.0
        for name, colour in zip(names, colours):
            gib = memory.gib(est.term(name).device)
            ax.bar(i, gib, bottom=bottom, color=colour, width=0.62, label=memory.LABELS[name] if i == 0 else None)
            bottom += gib
        host = memory.gib(est.total("host"))
        label = f"{bottom:.1f}" + (f"\n+ {host:.1f} in host RAM" if host else "")
        ax.text(i, bottom + 1.5, label, ha="center", va="bottom", fontsize=13, weight="bold", color=NAVY)
    h100 = cluster.find_gpu("H100")
    ax.axhline(memory.gib(h100.memory), color=NAVY, ls="--", lw=1.3)
    ax.text(2.0, memory.gib(h100.memory) + 1.5, f"one {h100.name}", ha="center", fontsize=12, color=NAVY)
    ax.set_xticks(range(len(cases)), [c[0] for c in cases])
    ax.set_ylabel("GiB per GPU (model states)")
    ax.set_ylim(0, memory.gib(max(h100.memory, 16 * psi)) * 1.4)
    ax.set_title(f"7B ({psi / 1e9:.2f}B parameters), 8 GPUs, bf16 + Adam, activations not counted",
                 fontsize=13, weight="normal")
    ax.legend(loc="upper right", fontsize=12)
    return save(fig, out, "zero_7b.png")


def draw(out: Path) -> list[Path]:
    return [pseudo_dp(out), zero_7b(out)]
