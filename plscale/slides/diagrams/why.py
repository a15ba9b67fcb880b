"""Diagrams of deck 01, why parallelism matters (slides/01_why_parallelism).

Memory comes from plscale.predict.memory (model states and activations), compute from
plscale.predict.presets.flops_per_token and plscale.predict.step_time.compute_seconds at the MFU
plscale.predict.published.LLAMA3_MFU, GPU memory and peak FLOP/s from plscale.predict.cluster.
Literature constants carry their source in a comment here and on the slide.
"""

from pathlib import Path

from plscale.predict.cluster import GPUS
from plscale.predict.memory import LABELS, Setup, estimate
from plscale.predict.presets import flops_per_token, param_count, preset
from plscale.predict.published import LLAMA3_MFU, SHAPES
from plscale.predict.step_time import compute_seconds
from plscale.predict.units import BYTES, GiB, gib
from plscale.slides.diagrams.style import BLUE, GREEN, GREY, NAVY, RED, SAND, SKY, box, canvas, figure, save

# Models, literature: GPT-2 (Radford et al. 2019), GPT-3 (Brown et al. 2020), PaLM (Chowdhery et al. 2022),
# Llama 3 (Grattafiori et al. 2024). (name, year, parameters)
MODELS = [("GPT-2 1.5B", 2019, 1.5e9), ("GPT-3 175B", 2020, 175e9), ("PaLM 540B", 2022, 540e9),
          ("Llama 3 405B", 2024, 405e9)]
# GPUs: V100 32 GB (NVIDIA V100 datasheet, 2018) is not in plscale.predict.cluster; the others are, with
# the total nvidia-smi shows. Every GPU is drawn and labelled in GiB, as the models are: the datasheets'
# "80 GB" and "141 GB" are binary, nvidia-smi's 81,559 MiB (79.6 GiB) on an H100 and 143,771 MiB
# (140.4 GiB) on an H200; the V100's 32 GiB is its 4 x 8 GiB of HBM2 (nvidia-smi shows a little less).
# Years, as NVIDIA announced them: V100 32GB GTC March 2018, A100 80GB November 2020, H100 GTC March 2022,
# H200 shipping 2024 (announced November 2023).
V100_BYTES = 32 * GiB
GPU_YEARS = [("V100", 2018, V100_BYTES), ("A100", 2020, GPUS["A100"].memory),
             ("H100", 2022, GPUS["H100"].memory), ("H200", 2024, GPUS["H200"].memory)]
# Training runs, literature: Llama 2 7B on 2T tokens (Touvron et al. 2023), Llama 3 70B on 15T tokens
# (Grattafiori et al. 2024). MFU: plscale.predict.published.LLAMA3_MFU, 40 % (Llama 3 paper, table 4: 38-43 %).
RUNS = [("7B (Llama 2 shape), 2T tokens", preset("7b"), 2e12),
        ("70B (Llama 3 shape), 15T tokens", SHAPES["llama3-70b"], 15e12)]
SEQ = 4096
DAY = 86400


def _gib_text(nbytes: float) -> str:
    """81,559 MiB -> '79.6 GiB', 80 GiB -> '80 GiB'."""
    return f"{gib(nbytes):.1f}".removesuffix(".0") + " GiB"


def model_vs_gpu(out: Path) -> Path:
    """Memory to train each model (model states) and to hold its weights, against one GPU's memory."""
    fig, ax = figure()
    for i, (name, year, n) in enumerate(MODELS):
        est = estimate(Setup(params=int(n), precision="bf16"))
        states, weights = gib(est.model_states), gib(est.term("parameters").total)
        ax.plot([year, year], [weights, states], color=GREY, lw=1.2, zorder=1)
        per = est.model_states / n
        ax.scatter([year], [states], s=120, color=RED, zorder=3,
                   label=f"training: weights, grads, Adam ({per:.0f} bytes a parameter)" if not i else None)
        ax.scatter([year], [weights], s=90, color=SAND, marker="s", zorder=3,
                   label=f"weights alone (bf16, {BYTES['bf16']} bytes)" if not i else None)
        ax.annotate(f"{name}\n{states:,.0f} GiB", (year, states), textcoords="offset points",
                    xytext=(12, -38 if states < 100 else -6),
                    fontsize=12, color=NAVY)
    xs = [y for _, y, _ in GPU_YEARS] + [2025]
    ys = [gib(b) for _, _, b in GPU_YEARS]
    ax.step(xs, ys + ys[-1:], where="post", color=BLUE, lw=3, label="one GPU's memory")
    for name, year, b in GPU_YEARS:
        ax.annotate(f"{name} {_gib_text(b)}", (year, gib(b)), textcoords="offset points", xytext=(4, -18), fontsize=12, color=BLUE)
    ax.set_yscale("log")
    ax.set_ylim(1, 3e4)
    ax.set_xlim(2017.8, 2025.6)
    ax.set_xticks(range(2018, 2026))
    ax.set_xlabel("year")
    ax.set_ylabel("memory (GiB, log scale)")
    ax.grid(alpha=0.3, which="major")
    ax.legend(loc="upper left", fontsize=12)
    return save(fig, out, "model_vs_gpu.png")


def memory_by_role(out: Path) -> Path:
    """Memory to train 7B and 70B on one GPU, by role, against an H100 and an H200."""
    fig, axes = figure(h=4.6, nrows=2)
    names = ["parameters", "gradients", "master", "moments", "activations"]
    colors = [BLUE, SKY, SAND, GREEN, RED]
    for ax, (label, c, _) in zip(axes, RUNS):
        est = estimate(Setup(params=param_count(c), model=c, seq=SEQ, micro_batch=1, precision="bf16"))
        left = 0.0
        for name, color in zip(names, colors):
            size = gib(est.term(name).total)
            ax.barh([0], [size], left=left, color=color, edgecolor="white", height=0.6,
                    label=f"{LABELS[name]}" if ax is axes[0] else None)
            if size / gib(est.total()) > 0.07:
                ax.text(left + size / 2, 0, f"{size:,.0f}", ha="center", va="center", fontsize=12, zorder=4,
                        bbox=dict(facecolor="white", alpha=0.75, edgecolor="none", pad=1.5))
            left += size
        ax.text(left, 0.33, f"total {left:,.0f} GiB", va="bottom", ha="right", fontsize=13, weight="bold",
                color=NAVY)
        for g, style, side in (("H100", "-", "right"), ("H200", "--", "left")):
            mem = gib(GPUS[g].memory)
            ax.axvline(mem, color=NAVY, ls=style, lw=2)
            text = f"one {g}, {_gib_text(GPUS[g].memory)}"
            ax.text(mem, 0.36, f" {text} " if side == "left" else f"{text} ", fontsize=12, color=NAVY,
                    va="bottom", ha=side)
        ax.set_yticks([0], [label.split(" (")[0]], fontsize=15, weight="bold")
        ax.set_ylim(-0.4, 0.7)
        ax.set_xlim(0, max(left, gib(GPUS["H200"].memory)) * 1.2)
        ax.set_xlabel("GiB")
    axes[0].legend(ncol=5, fontsize=11, loc="lower center", bbox_to_anchor=(0.5, 1.02))
    return save(fig, out, "memory_by_role.png")


def compute_days(out: Path) -> Path:
    """Days to train on H100s at Llama 3's MFU (40 %), perfect scaling: one GPU against thousands."""
    fig, ax = figure()
    gpu = GPUS["H100"]
    counts = [1, 8, 64, 512, 4096, 16384]
    for (label, c, tokens), color in zip(RUNS, [BLUE, RED]):
        flops = flops_per_token(c, SEQ) * tokens
        days = [compute_seconds(flops, n, gpu, "bf16", LLAMA3_MFU) / DAY for n in counts]
        ax.plot(counts, days, "o-", color=color, lw=2.5, ms=8, label=f"{label}: {_sci(flops)} FLOPs")
        ax.annotate(f"{days[0] / 365:,.1f} years", (1, days[0]), textcoords="offset points", xytext=(12, 4),
                    fontsize=13, color=color, weight="bold")
        last = f"{days[-1]:.0f} days" if days[-1] >= 1 else f"{days[-1] * 24:.0f} hours"
        ax.annotate(last, (counts[-1], days[-1]), textcoords="offset points",
                    xytext=(-30, 10), fontsize=13, color=color, weight="bold")
    for days, text in ((1, "a day"), (30, "a month"), (365, "a year"), (3650, "ten years")):
        ax.axhline(days, color=GREY, lw=1, ls=":")
        ax.text(20, days * 1.1, text, fontsize=12, color=GREY, ha="center")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [f"{n:,}" for n in counts])
    ax.set_xlim(0.7, 30000)
    ax.set_xlabel("H100 GPUs (perfect scaling)")
    ax.set_ylabel("days of training (log scale)")
    ax.legend(loc="upper right", fontsize=12)
    return save(fig, out, "compute_days.png")


def _sci(x: float) -> str:
    """9.2e22 -> 9.2 x 10^22 in mathtext."""
    exp = len(str(int(x))) - 1
    return f"${x / 10**exp:.1f} \\times 10^{{{exp}}}$"


def what_splits(out: Path) -> Path:
    """What each strategy cuts into pieces, on two GPUs, and what it sends in return."""
    fig, ax = canvas(11, 5)
    rows = [("data parallel", "the batch (model copied)", "all-reduce of gradients", "batch"),
            ("ZeRO / FSDP", "optimizer states, grads, weights", "reduce-scatter, all-gather", "states"),
            ("pipeline", "the layers", "activations, stage to stage", "layers"),
            ("tensor", "each weight matrix", "all-reduce in every layer", "matrix"),
            ("sequence / context", "the tokens of a sequence", "keys and values, all-to-all", "tokens"),
            ("expert", "the experts (MoE layers)", "tokens, all-to-all", "experts")]
    gpu = [BLUE, SAND]
    ax.text(0.1, 4.75, "strategy", fontsize=13, weight="bold", color=NAVY)
    ax.text(2.45, 4.75, "GPU 0", fontsize=13, weight="bold", color=BLUE)
    ax.text(3.6, 4.75, "GPU 1", fontsize=13, weight="bold", color="#b7791f")
    ax.text(4.85, 4.75, "what is split", fontsize=13, weight="bold", color=NAVY)
    ax.text(8.2, 4.75, "what is sent", fontsize=13, weight="bold", color=NAVY)
    for i, (name, what, sends, kind) in enumerate(rows):
        y = 4.0 - i * 0.74
        ax.text(0.1, y + 0.22, name, fontsize=14, weight="bold", color=NAVY, va="center")
        _pieces(ax, 2.45, y, kind, gpu)
        ax.text(4.85, y + 0.22, what, fontsize=13, va="center")
        ax.text(8.2, y + 0.22, sends, fontsize=13, va="center", color=RED)
    return save(fig, out, "what_splits.png")


def _pieces(ax, x: float, y: float, kind: str, gpu: list) -> None:
    """A small picture of the thing split: 8 cells, coloured by the GPU that holds them."""
    if kind == "matrix":  # a weight matrix cut into column halves
        box(ax, x, y, 1.05, 0.44, "W[:, :n/2]", color=gpu[0], size=10)
        box(ax, x + 1.1, y, 1.05, 0.44, "W[:, n/2:]", color=gpu[1], size=10)
        return
    if kind == "states":  # three stacked bars, each cut in half
        for j in range(3):
            for g in range(2):
                box(ax, x + g * 1.1, y + j * 0.155, 1.05, 0.12, color=gpu[g])
        return
    labels = {"batch": "s", "layers": "L", "tokens": "t", "experts": "E"}[kind]
    for j in range(8):
        box(ax, x + j * 0.275, y, 0.24, 0.44, text=f"{labels}{j + 1}", color=gpu[j // 4], size=10)


def draw(out: Path) -> list[Path]:
    return [model_vs_gpu(out), memory_by_role(out), compute_days(out), what_splits(out)]
