"""Diagrams of deck 03, deep learning and transformer basics (slides/03_transformer_basics).

Parameter counts come from plscale.predict.presets (param_count of the shape with a part removed:
the part's parameters, no formula re-typed) and tensor_parallel.params_per_rank (the norms); FLOPs
from presets.flops_per_token and recompute.step_flops; activations from activations.layer_parts.
"""

from dataclasses import replace
from pathlib import Path

from plscale.predict.activations import layer_parts
from plscale.predict.presets import flops_per_token, param_count, preset
from plscale.predict.published import SHAPES
from plscale.predict.recompute import step_flops
from plscale.predict.setup import Setup
from plscale.predict.tensor_parallel import params_per_rank
from plscale.predict.units import MiB
from plscale.slides.diagrams.style import BLUE, GREEN, GREY, NAVY, RED, SAND, SKY, arrow, box, canvas, figure, save

SEVEN_B = preset("7b")


def training_loop(out: Path) -> Path:
    """Forward, loss, backward, optimizer step: what each one reads and leaves behind."""
    fig, ax = canvas(11, 3.9, ylim=(0.2, 4.1))
    steps = [("a batch", "of tokens", "#f4f1ea", "black", ""),
             ("forward", "layer by layer", BLUE, "white", "keeps activations\nfor backward"),
             ("loss", "cross-entropy", SAND, "black", "one number"),
             ("backward", "layers in reverse", RED, "white", "a gradient for\nevery weight"),
             ("optimizer step", "Adam", GREEN, "white", "moments m, v\n+ fp32 master")]
    w, gap = 1.75, 0.5
    for i, (name, sub, color, tc, note) in enumerate(steps):
        x = 0.12 + i * (w + gap)
        box(ax, x, 2.2, w, 0.9, "", color=color)
        ax.text(x + w / 2, 2.8, name, ha="center", va="center", fontsize=14, weight="bold", color=tc)
        ax.text(x + w / 2, 2.45, sub, ha="center", va="center", fontsize=12, color=tc)
        ax.text(x + w / 2, 3.3, note, ha="center", va="bottom", fontsize=12, color=NAVY)
        if i:
            arrow(ax, (x - gap + 0.03, 2.65), (x - 0.03, 2.65))
    arrow(ax, (0.12 + 4 * (w + gap) + w / 2, 2.15), (0.12 + (w + gap) + w / 2, 2.15), rad=-0.3, color=GREY)
    ax.text(5.5, 0.8, "updated weights: the next step's forward", ha="center", fontsize=12, color=GREY)
    return save(fig, out, "training_loop.png")


def decoder(out: Path) -> Path:
    """A decoder-only transformer, tokens to loss."""
    fig, ax = canvas(11, 2.5, ylim=(0.1, 2.6))
    parts = [("tokens", "#f4f1ea", "black", 0.95), ("embedding\nV x d", SAND, "black", 1.2),
             ("block 1", BLUE, "white", 1.0), ("block 2", BLUE, "white", 1.0), ("...", "white", "black", 0.5),
             ("block L", BLUE, "white", 1.0), ("RMSNorm", SKY, "black", 1.15), ("output head\nd x V", SAND, "black", 1.3),
             ("softmax,\nloss", RED, "white", 1.1)]
    gap, x, spans = 0.2, 0.1, []
    for i, (text, color, tc, w) in enumerate(parts):
        if text == "...":
            ax.text(x + w / 2, 1.3, "...", ha="center", va="center", fontsize=20, color=NAVY)
        else:
            box(ax, x, 0.85, w, 0.9, text, color=color, text_color=tc, size=12, weight="bold")
        if i:
            arrow(ax, (x - gap - 0.01, 1.3), (x + 0.01, 1.3))
        spans.append((x, x + w))
        x += w + gap
    left, right = spans[2][0], spans[5][1]
    ax.plot([left, left, right, right], [1.85, 1.95, 1.95, 1.85], color=NAVY, lw=1.5)
    ax.text((left + right) / 2, 2.05, "L identical blocks: almost all the parameters and FLOPs", ha="center",
            fontsize=12, color=NAVY)
    ax.text(5.5, 0.4, "every position predicts the next token; the loss averages over all of them", ha="center",
            fontsize=12, color=GREY)
    return save(fig, out, "decoder.png")


def block(out: Path) -> Path:
    """One Llama block: pre-norm attention and a SwiGLU MLP, each around a residual connection."""
    fig, ax = canvas(11, 4.4, ylim=(0.15, 4.55))
    rows = [(3.0, "attention", [("RMSNorm", SKY, "black", 1.1), ("q, k, v\nlinears", SAND, "black", 1.3),
                                ("RoPE on q, k; causal\nsoftmax(q kᵀ / √(d/a)) v", BLUE, "white", 2.6),
                                ("o\nlinear", SAND, "black", 1.0)]),
            (0.9, "MLP", [("RMSNorm", SKY, "black", 1.1), ("gate, up\nlinears", SAND, "black", 1.3),
                          ("SwiGLU:\nSiLU(gate) × up", GREEN, "white", 2.6), ("down\nlinear", SAND, "black", 1.0)])]
    for y, name, boxes in rows:
        x = 1.0
        ax.text(0.5, y + 0.35, "x" if y > 2 else "", ha="center", va="center", fontsize=16, weight="bold")
        for text, color, tc, w in boxes:
            arrow(ax, (x - 0.3 if x > 1.5 else 0.65, y + 0.35), (x, y + 0.35))
            box(ax, x, y, w, 0.7, text, color=color, text_color=tc, size=12, weight="bold")
            x += w + 0.35
        plus = x + 0.05
        arrow(ax, (x - 0.35, y + 0.35), (plus - 0.22, y + 0.35))
        ax.add_patch(_circle(plus, y + 0.35))
        ax.text(plus, y + 0.35, "+", ha="center", va="center", fontsize=16, weight="bold", color=NAVY)
        skip = 1.05 if y > 2 else -0.6
        ax.plot([0.75, 0.75, plus, plus], [y + 0.35, y + 0.35 + skip, y + 0.35 + skip, y + 0.35 + 0.22 * (1 if skip > 0
                else -1)], color=GREY, lw=1.6)
        ax.text((0.75 + plus) / 2, y + 0.35 + skip + (0.08 if skip > 0 else -0.3), f"residual: x + {name}(x)",
                ha="center", fontsize=12, color=GREY)
    ax.plot([plus + 0.22, plus + 0.55, plus + 0.55, 0.75, 0.75], [3.35, 3.35, 2.2, 2.2, 1.25], color=NAVY, lw=1.6)
    arrow(ax, (plus + 0.22, 1.25), (plus + 0.9, 1.25))
    ax.text(plus + 1.0, 1.25, "out", va="center", fontsize=14, weight="bold")
    return save(fig, out, "block.png")


def _circle(x, y):
    from matplotlib.patches import Circle
    return Circle((x, y), 0.22, facecolor="white", edgecolor=NAVY, linewidth=1.6)


def parts(c) -> dict:
    """Parameters by part, from param_count of the shape without that part (and the replicated norms)."""
    n = param_count(c)
    emb = n - param_count(replace(c, vocab=0))
    mlp = n - param_count(replace(c, ffn=0))
    norms = params_per_rank(c, 1).replicated
    return {"embedding + head": emb, "attention": n - emb - mlp - norms, "MLP": mlp, "norms": norms}


def params_by_part(out: Path) -> Path:
    """Where the parameters are, for a small and a large shape: the MLP and attention take over."""
    models = [("124M (GPT-2 width)", preset("124m")), ("1B (Llama 3.2 shape)", preset("1b")),
              ("7B (Llama 2 shape)", SEVEN_B), ("70B (Llama 3 shape)", SHAPES["llama3-70b"]),
              ("405B (Llama 3 shape)", SHAPES["llama3-405b"])]
    colors = {"embedding + head": SAND, "attention": BLUE, "MLP": GREEN, "norms": RED}
    most = max(100 * parts(c)["norms"] / param_count(c) for _, c in models)
    fig, ax = figure(h=4.6)
    for i, (name, c) in enumerate(models[::-1]):
        p, n, left = parts(c), param_count(c), 0.0
        for part, count in p.items():
            share = 100 * count / n
            label = f"norms ({most:.2f} % at most)" if part == "norms" else part
            ax.barh([i], [share], left=left, color=colors[part], label=label if i == 0 else None, height=0.65)
            if share > 6:
                ax.text(left + share / 2, i, f"{share:.0f} %", ha="center", va="center", fontsize=12,
                        color="white" if part != "embedding + head" else "black")
            left += share
        ax.text(101.5, i, f"{n / 1e9:,.2f}B" if n < 1e10 else f"{n / 1e9:,.0f}B", va="center", fontsize=13)
    ax.set_yticks(range(len(models)), [m[0] for m in models[::-1]], fontsize=13)
    ax.set_xlim(0, 112)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("share of the parameters (%)")
    ax.legend(ncol=4, loc="lower center", bbox_to_anchor=(0.45, 1.0), fontsize=12)
    return save(fig, out, "params_by_part.png")


def flops_vs_seq(out: Path) -> Path:
    """Training FLOPs per token of the 7B shape: the weights' 6 per weight, plus attention's, by sequence."""
    seqs = [1024, 4096, 16384, 32768, 131072]
    weights = flops_per_token(SEVEN_B, 0) / 1e9
    fig, ax = figure(h=4.6)
    for i, s in enumerate(seqs):
        total = flops_per_token(SEVEN_B, s) / 1e9
        ax.bar([i], [weights], color=BLUE, label="matmuls with the weights (≈ 6N)" if not i else None)
        ax.bar([i], [total - weights], bottom=[weights], color=RED,
               label="attention: q kᵀ and probabilities × v" if not i else None)
        fwd = step_flops(SEVEN_B, s).forward / 1e9
        ax.text(i, total + 3, f"{total:.0f}\n(forward {fwd:.0f})", ha="center", va="bottom", fontsize=12)
    ax.set_xticks(range(len(seqs)), [f"{s // 1024}K" for s in seqs])
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("GFLOPs per token (training)")
    ax.set_ylim(0, flops_per_token(SEVEN_B, seqs[-1]) / 1e9 * 1.25)
    ax.legend(loc="upper left", fontsize=12)
    return save(fig, out, "flops_vs_seq.png")


def activations_vs_seq(out: Path) -> Path:
    """Bytes one 7B layer keeps for backward (bf16, one sequence), by part and by attention core."""
    seqs = [1024, 2048, 4096, 8192, 16384]
    colors = {"norms": SKY, "attention": SAND, "core": RED, "mlp": GREEN}
    names = {"norms": "norms (fp32 inside)", "attention": "q, k, v and o's input", "core": "attention core",
             "mlp": "MLP"}
    fig, (ax, ax2) = figure(ncols=2)

    def kept(core: str, s: int) -> dict:
        c = replace(SEVEN_B, attention=core)
        return layer_parts(Setup(params=param_count(c), model=c, seq=s, micro_batch=1, precision="bf16"))

    for i, s in enumerate(seqs):
        bottom = 0.0
        for part, size in kept("fused", s).items():
            ax.bar([i], [size / MiB], bottom=[bottom], color=colors[part], label=names[part] if not i else None)
            bottom += size / MiB
    ax.set_xticks(range(len(seqs)), [f"{s // 1024}K" for s in seqs])
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("MiB per layer")
    ax.set_title("fused (flash) attention: linear in s", fontsize=14)
    ax.legend(fontsize=11, loc="upper left")
    for core, color, label in (("fused", BLUE, "fused: s"), ("math", RED, "math (scores kept): s²")):
        sizes = [sum(kept(core, s).values()) / MiB for s in seqs]
        ax2.plot(seqs, sizes, "o-", color=color, lw=2.5, label=label)
        ax2.annotate(f"{sizes[-1] / 1024:.1f} GiB", (seqs[-1], sizes[-1]), textcoords="offset points",
                     xytext=(-70, 4), fontsize=12, color=color)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xticks(seqs, [f"{s // 1024}K" for s in seqs])
    ax2.set_xlabel("sequence length (tokens)")
    ax2.set_ylabel("MiB per layer (log)")
    ax2.set_title("keeping the attention scores: quadratic", fontsize=14)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=12, loc="upper left")
    return save(fig, out, "activations_vs_seq.png")


def draw(out: Path) -> list[Path]:
    return [training_loop(out), decoder(out), block(out), params_by_part(out), flops_vs_seq(out),
            activations_vs_seq(out)]
