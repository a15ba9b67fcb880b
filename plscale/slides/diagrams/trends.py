"""Diagrams of slides/12_advanced/deck.md: ring attention and the zig-zag split (hands-on part),
then the trends: context length, mixture of experts, fp8, zero-bubble pipelines, failures at
scale, compute. Predictions come from plscale.predict; literature numbers carry their source
in a comment here and on the slide."""

from pathlib import Path

from matplotlib.patches import Polygon

from plscale.predict.checkpoint import job_mtbf_hours, waste_fraction, young_interval
from plscale.predict.published import LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_INTERRUPTIONS
from plscale.predict.cluster import GPUS
from plscale.predict.context_parallel import attention_work, chunks
from plscale.predict.experts import active_params, expert_params
from plscale.predict.formats import FORMATS
from plscale.predict.memory import Setup, estimate, gib
from plscale.predict.pipeline import bubble_of, simulate
from plscale.predict.presets import ModelConfig, flops_per_token, param_count
from plscale.predict.published import SHAPES
from plscale.slides.diagrams.style import (BLUE, GREEN, NAVY, PALETTE, RED, SAND, SKY, arrow, box, canvas,
                                           figure, rect, save)

RANKS = [BLUE, SAND, GREEN, RED]   # one colour per cp rank


def ring(out: Path) -> Path:
    """Four ranks on a ring; which key/value block each computes against at each step."""
    fig, (left, right) = figure(11, 4.6, ncols=2, width_ratios=[1, 1.25])
    left.set_xlim(0, 5), left.set_ylim(0, 4.6), left.axis("off")
    spots = [(0.3, 2.9), (3.0, 2.9), (3.0, 0.4), (0.3, 0.4)]
    for r, (x, y) in enumerate(spots):
        box(left, x, y, 1.7, 1.1, f"rank {r}\nQ{r} (its own)", RANKS[r], size=13,
            text_color="white" if r in (0, 2, 3) else "black")
    for r in range(4):
        (x0, y0), (x1, y1) = spots[r], spots[(r + 1) % 4]
        start, end = [(x0 + 1.7, y0 + 0.55), (x0 + 0.85, y0), (x0, y0 + 0.55), (x0 + 0.85, y0 + 1.1)][r], \
                     [(x1, y1 + 0.55), (x1 + 0.85, y1 + 1.1), (x1 + 1.7, y1 + 0.55), (x1 + 0.85, y1)][r]
        arrow(left, start, end, NAVY)
    left.text(2.5, 2.2, "k, v blocks\nmove on\neach step", ha="center", va="center", fontsize=13, color=NAVY)
    for step in range(4):
        for r in range(4):
            block = (r - step) % 4   # at step t rank r holds the block of rank r - t
            _cell(right, step, r, RANKS[block])
            right.text(step + 0.5, r + 0.5, f"K{block} V{block}", ha="center", va="center", fontsize=13,
                       color="black" if block == 1 else "white")
    right.set_xlim(0, 4), right.set_ylim(4, 0)
    right.set_xticks([s + 0.5 for s in range(4)], [f"step {s}" for s in range(4)])
    right.set_yticks([r + 0.5 for r in range(4)], [f"rank {r}" for r in range(4)])
    right.tick_params(length=0)
    for side in ("left", "bottom"):
        right.spines[side].set_visible(False)
    right.set_title("block each rank holds: rank r - step", fontsize=14)
    return save(fig, out, "ring.png")


def _cell(ax, x, y, color, w=1.0, h=1.0):
    """A grid cell with a white gap round it."""
    rect(ax, x + 0.03, y + 0.03, w - 0.06, h - 0.06, color, edge="white")


def zigzag(out: Path) -> Path:
    """Causal attention, queries by keys, cut in chunks: plain against zig-zag, cp 4, and the work per rank."""
    cp, seq = 4, 2048
    fig, axes = figure(11, 4.5, ncols=3, width_ratios=[1, 1, 1.1])
    for ax, split in zip(axes, ("plain", "zigzag")):
        n = 2 * cp if split == "zigzag" else cp
        owner = {c: r for r in range(cp) for c in chunks(cp, r, split)}
        for i in range(n):          # query chunk i sees key chunks 0..i (the diagonal one half)
            for j in range(i):
                _cell(ax, j, i, RANKS[owner[i]])
            ax.add_patch(Polygon([(i + 0.03, i + 0.1), (i + 0.03, i + 0.97), (i + 0.9, i + 0.97)],
                                 facecolor=RANKS[owner[i]]))
        ax.set_xlim(0, n), ax.set_ylim(n, 0), ax.set_aspect("equal")
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_xlabel("keys (colour: the queries' rank)", fontsize=12), ax.set_ylabel("queries")
        for side in ("left", "bottom"):
            ax.spines[side].set_visible(False)
        ax.set_title(f"{split}: {n} chunks", fontsize=14)
    work = {s: attention_work(seq, cp, s) for s in ("plain", "zigzag")}
    for k, (split, hatch) in enumerate((("plain", ""), ("zigzag", "//"))):
        axes[2].bar([r + (k - 0.5) * 0.4 for r in range(cp)], [w / 1e6 for w in work[split]], 0.38,
                    color=RANKS, hatch=hatch, edgecolor="white", label=split)
    axes[2].set_xticks(range(cp), [f"rank {r}" for r in range(cp)], fontsize=12)
    axes[2].set_ylabel("M query-key scores")
    axes[2].set_title(f"work per rank, {seq:,} tokens", fontsize=14)
    axes[2].legend(fontsize=12)
    return save(fig, out, "zigzag.png")


def context(out: Path) -> Path:
    """Published context lengths by year; activations per GPU of Llama 3 8B against the sequence."""
    published = [  # model, year, context tokens: each model's paper or release note (named on the slide)
        ("GPT-2", 2019.1, 1024),                      # Radford et al. 2019 (February)
        ("GPT-3", 2020.4, 2048),                      # Brown et al. 2020 (May)
        ("Llama 2", 2023.5, 4096),                    # Touvron et al. 2023 (July)
        ("Llama 3", 2024.3, 8192),                    # Meta's Llama 3 release, April 2024
        ("Llama 3.1", 2024.55, 131072),               # Grattafiori et al. 2024 (Llama 3.1 release, July)
        ("Gemini 1.5", 2024.15, 1_000_000),           # Gemini Team, Google 2024 (February): 1M in production
        ("Llama 4 Scout", 2025.3, 10_000_000)]        # Meta's Llama 4 release, April 2025
    fig, (left, right) = figure(11, 4.6, ncols=2)
    for name, year, tokens in published:
        left.scatter(year, tokens, s=60, color=NAVY, zorder=3)
        left.annotate(name, (year, tokens), xytext=(-8, 6), textcoords="offset points", fontsize=12, ha="right")
    left.set_yscale("log"), left.set_xlim(2018, 2025.8), left.set_ylim(500, 3e7)
    left.set_xlabel("release (year)"), left.set_ylabel("context length (tokens)")
    left.set_title("context length at release", fontsize=13)
    left.grid(alpha=0.3)
    model, gpu, seqs = SHAPES["llama3-8b"], GPUS["H100"], [2**k for k in range(12, 18)]
    for cp, color in zip((1, 4, 16), (RED, SAND, GREEN)):
        acts = [gib(estimate(Setup(params=param_count(model), model=model, seq=s, cp=cp, dp=cp,
                                   recompute="selective")).term("activations").device) for s in seqs]
        right.plot(seqs, acts, "o-", color=color, label=f"cp {cp}")
    right.axhline(gib(gpu.memory), color=NAVY, ls="--", lw=1.5)
    right.text(seqs[0], gib(gpu.memory) * 1.15, gpu.name, fontsize=12, color=NAVY)
    right.set_xscale("log", base=2), right.set_yscale("log")
    right.set_xticks(seqs, [f"{s // 1024}K" for s in seqs])
    right.set_xlabel("sequence length (tokens)"), right.set_ylabel("activations per GPU (GiB)")
    right.set_title("Llama 3 8B, one sequence (predicted)", fontsize=13)
    right.legend(fontsize=12), right.grid(alpha=0.3)
    return save(fig, out, "context.png")


def moe(out: Path) -> Path:
    """Total against active parameters of published mixture-of-experts models (one dense model beside them)."""
    mixtral = ModelConfig(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, max_seq=32768,
                          tie_embeddings=False)   # Mixtral 8x7B's shape (Jiang et al. 2024): 8 experts, top-2
    models = [  # name, total, active parameters (billions); sources named on the slide
        ("Mixtral 8x7B (2023)", expert_params(mixtral, 8).total / 1e9, active_params(mixtral, 8, 2) / 1e9),
        ("DBRX (2024)", 132, 36),                     # Databricks, "Introducing DBRX", March 2024
        ("DeepSeek-V3 (2024)", 671, 37),              # DeepSeek-AI 2024, technical report
        ("Qwen3-235B-A22B (2025)", 235, 22),          # Qwen Team 2025, Qwen3 release / technical report
        ("Llama 4 Maverick (2025)", 400, 17),         # Meta's Llama 4 release, April 2025
        ("Llama 3 405B, dense (2024)", 405, 405)]     # Grattafiori et al. 2024
    fig, ax = figure(11, 4.5)
    for i, (name, total, active) in enumerate(models):
        ax.barh(i, total, color=SKY, height=0.6, label="total" if i == 0 else None)
        ax.barh(i, active, color=NAVY, height=0.6, label="active per token" if i == 0 else None)
        ax.text(total + 8, i, f"{total:.3g}B total, {active:.3g}B active ({100 * active / total:.0f}%)",
                va="center", fontsize=12)
    ax.set_yticks(range(len(models)), [m[0] for m in models], fontsize=12)
    ax.invert_yaxis()
    ax.set_xlim(0, 1000), ax.set_xlabel("parameters (billions)")
    ax.legend(loc="lower right", fontsize=12)
    return save(fig, out, "moe.png")


def fp8(out: Path) -> Path:
    """The bits of each format (sign, exponent, mantissa) with its largest value and its epsilon."""
    fig, ax = canvas(11, 4.4, xlim=(0, 11), ylim=(0, 4.4))
    cell = 0.165
    for x, head in ((7.0, "largest"), (8.9, "step after 1.0")):
        ax.text(x, 4.15, head, fontsize=13, color=NAVY, weight="bold")
    for row, name in enumerate(("fp32", "bf16", "fp16", "e4m3", "e5m2")):
        f, y = FORMATS[name], 3.45 - row * 0.72
        ax.text(0.1, y + 0.2, "fp8 " + name if name.startswith("e") else name, fontsize=14, weight="bold",
                va="center")
        colors = [RED] + [SAND] * f.exponent_bits + [BLUE] * f.mantissa_bits
        for k, color in enumerate(colors):
            rect(ax, 1.3 + k * cell, y, cell - 0.02, 0.4, color)
        big = f"{f.max:,.0f}" if f.max < 1e6 else f"{f.max:.2e}"
        ax.text(7.0, y + 0.2, big, fontsize=13, va="center")
        ax.text(8.9, y + 0.2, f"$2^{{-{f.mantissa_bits}}}$ = {f.epsilon:.2g}", fontsize=13, va="center")
    for x, label, color in ((1.3, "sign", RED), (2.6, "exponent: range", SAND), (5.0, "mantissa: precision", BLUE)):
        rect(ax, x, 0.05, 0.3, 0.3, color)
        ax.text(x + 0.4, 0.2, label, fontsize=12, va="center")
    return save(fig, out, "fp8.png")


def bubbles(out: Path) -> Path:
    """1F1B against zero bubble (ZB-H1), p = 4, m = 8, from plscale.predict.pipeline.simulate."""
    colors = {"F": SKY, "B": SAND, "W": GREEN}
    fig, axes = figure(11, 4.6, nrows=2, sharex=True)
    for ax, schedule, title in zip(axes, ("1f1b", "zb"), ("1F1B", "zero bubble (ZB-H1): backward split in B (input gradients) and W (weights)")):
        ops = simulate(schedule, 4, 8)
        for op in ops:
            ax.barh(op.rank, op.end - op.start, left=op.start, color=colors[op.kind], edgecolor="white", height=0.8)
            ax.text((op.start + op.end) / 2, op.rank, f"{op.kind}{op.micro}", ha="center", va="center", fontsize=11)
        ax.set_yticks(range(4), [f"rank {r}" for r in range(4)], fontsize=12)
        ax.invert_yaxis()
        ax.set_title(f"{title}: bubble {bubble_of(ops):.0%}", fontsize=13, loc="left")
    axes[1].set_xlabel("time (units of one forward; backward = 2, zero bubble: B = W = 1)")
    return save(fig, out, "zero_bubble.png")


def failures(out: Path) -> Path:
    """Job MTBF against GPUs at Llama 3's failure rate per GPU; time lost at Young's interval."""
    gpus = [2**k for k in range(10, 17)]
    mtbf_h = [job_mtbf_hours(n, LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS) for n in gpus]
    fig, (left, right) = figure(11, 4.5, ncols=2)
    left.loglog(gpus, mtbf_h, "o-", color=NAVY)
    at = job_mtbf_hours(LLAMA3_GPUS, LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS)
    left.scatter([LLAMA3_GPUS], [at], s=120, color=RED, zorder=3)
    left.annotate(f"Llama 3: {at:.1f} h", (LLAMA3_GPUS, at),
                  xytext=(10, 10), textcoords="offset points", fontsize=12, color=RED)
    left.set_xlabel("GPUs in the job"), left.set_ylabel("mean time between failures (h)")
    left.set_yticks([0.5, 1, 2, 5, 10, 20, 50], ["0.5", "1", "2", "5", "10", "20", "50"])
    left.set_title("at Llama 3's failure rate per GPU", fontsize=13)
    right.set_title("lost at Young's interval, by checkpoint stall", fontsize=13)
    left.grid(alpha=0.3, which="both")
    for stall, color in ((10, GREEN), (60, SAND), (300, RED)):
        lost = [100 * waste_fraction(young_interval(stall, m * 3600), stall, m * 3600) for m in mtbf_h]
        right.semilogx(gpus, lost, "o-", color=color, label=f"stall {stall} s")
    right.set_xlabel("GPUs in the job"), right.set_ylabel("time lost at the best interval (%)")
    right.legend(fontsize=12), right.grid(alpha=0.3, which="both")
    for ax in (left, right):
        ax.set_xticks(gpus[::2], [f"{n // 1024}K" for n in gpus[::2]])
    return save(fig, out, "failures.png")


def compute(out: Path) -> Path:
    """Training compute and GPUs (accelerators) of one job, published runs by year."""
    # each paper's own figure (named on the slide): Brown et al. 2020, Hoffmann et al. 2022, Chowdhery et al. 2022,
    # Grattafiori et al. 2024; chips: Narayanan et al. 2021, BigScience 2022, Zhang et al. 2022, Chowdhery et al.
    # 2022, DeepSeek-AI 2024, Grattafiori et al. 2024
    flops = [("GPT-3", 2020.4, 3.14e23), ("Chinchilla", 2022.2, 5.76e23), ("PaLM", 2022.3, 2.56e24),
             ("Llama 3 405B", 2024.5, 3.8e25)]
    chips = [("Megatron-LM 1T", 2021.3, 3072), ("BLOOM", 2022.5, 384), ("OPT-175B", 2022.4, 992),
             ("PaLM (TPU v4)", 2022.3, 6144), ("DeepSeek-V3", 2024.95, 2048), ("Llama 3 405B", 2024.5, 16384)]
    llama = SHAPES["llama3-405b"]
    ours = flops_per_token(llama, 8192) * 15.6e12    # 15.6T tokens (Llama 3 paper)
    fig, (left, right) = figure(11, 4.5, ncols=2)
    for ax, rows, color in ((left, flops, NAVY), (right, chips, PALETTE[0])):
        for name, year, value in rows:
            ax.scatter(year, value, s=60, color=color, zorder=3)
            ax.annotate(name, (year, value), xytext=(-6, 7), textcoords="offset points", fontsize=12, ha="right")
        ax.set_yscale("log"), ax.set_xlim(2019.3, 2025.4), ax.grid(alpha=0.3, which="both")
        ax.set_xlabel("year")
    left.scatter(2024.5, ours, s=160, facecolors="none", edgecolors=RED, linewidths=2, zorder=4,
                 label="plscale: FLOPs/token x 15.6T tokens")
    left.set_ylabel("training compute (FLOP)"), left.legend(fontsize=12, loc="upper left")
    left.set_ylim(1e23, 2e26), left.set_title("compute of one training run", fontsize=13)
    right.set_ylabel("accelerators in one job"), right.set_ylim(200, 40000)
    right.set_title("GPUs or TPUs of one run", fontsize=13)
    return save(fig, out, "compute.png")


def draw(out: Path) -> list[Path]:
    return [ring(out), zigzag(out), context(out), moe(out), fp8(out), bubbles(out), failures(out), compute(out)]
