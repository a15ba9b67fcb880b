"""Diagrams of slides/05_parallelism_strategies/deck.md: what each strategy splits and sends,
a device mesh, memory per GPU of a 70B model under several layouts, and the planner's choice
for a published run. Every number comes from plscale.predict (memory, plan) or plscale.predict.grid."""

from pathlib import Path

from plscale.predict.grid import Layout
from plscale.predict.cluster import GPUS
from plscale.predict.memory import Setup, estimate, gib
from plscale.predict.plan import LABELS, Job, plan
from plscale.predict.presets import param_count
from plscale.predict.published import PUBLISHED, SHAPES
from plscale.slides.diagrams.style import (BLUE, GREEN, GREY, NAVY, RED, SAND, SKY, arrow, box, canvas, figure, rect,
                                           save)

HELD, OFF = BLUE, "#e4e7eb"
STRATEGIES = [  # (title, what it splits, how each GPU's share is chosen)
    ("data (dp)", "the batch", "dp"), ("pipeline (pp)", "the layers", "pp"),
    ("tensor (tp)", "every weight matrix", "tp"), ("context (cp)", "the sequence", "cp"),
    ("expert (ep)", "the experts", "ep")]


def _model(ax, x, y, kind, gpu):
    """4 layers as bars (x, y: lower left); the part this GPU holds coloured."""
    for layer in range(4):
        ly = y + 0.64 - layer * 0.19
        if kind == "ep":  # attention whole, the MLP as 4 experts, one per GPU
            rect(ax, x, ly, 0.3, 0.14, HELD)
            for e in range(4):
                rect(ax, x + 0.36 + e * 0.13, ly, 0.1, 0.14, HELD if e == gpu else OFF)
        elif kind == "tp":
            for q in range(4):
                rect(ax, x + q * 0.22, ly, 0.2, 0.14, HELD if q == gpu else OFF)
        else:
            rect(ax, x, ly, 0.86, 0.14, HELD if kind != "pp" or layer == gpu else OFF)


def _data(ax, x, y, kind, gpu):
    """The batch: 4 sequences (rows) x 8 tokens (columns); this GPU's tokens coloured."""
    for row in range(4):
        for col in range(8):
            mine = {"dp": row == gpu, "ep": row == gpu, "cp": col // 2 == gpu}.get(kind, True)
            rect(ax, x + col * 0.1, y + 0.5 - row * 0.13, 0.085, 0.11, SAND if mine else OFF)


def splits(out: Path) -> Path:
    """Five columns, four GPUs each: the model (layers) and the batch, coloured where held."""
    fig, ax = canvas(11, 5.2, ylim=(0, 5.2))
    for gpu in range(4):
        ax.text(0.0, 3.88 - gpu * 0.98, f"GPU {gpu}", fontsize=12, va="center", color=NAVY)
    for c, (title, what, kind) in enumerate(STRATEGIES):
        x = 0.78 + c * 2.05
        ax.text(x + 0.95, 5.0, title, ha="center", fontsize=14, weight="bold", color=NAVY)
        ax.text(x + 0.95, 4.62, f"splits {what}", ha="center", fontsize=12, color=RED)
        for gpu in range(4):
            y = 3.45 - gpu * 0.98
            box(ax, x, y, 1.95, 0.86, color="white", edge=GREY)
            _model(ax, x + 0.06, y + 0.02, kind, gpu)
            _data(ax, x + 1.05, y + 0.13, kind, gpu)
    ax.text(5.5, 0.0, "blue: the model's 4 layers (ep: attention, then 4 experts)     sand: the batch, "
            "4 sequences x 8 tokens\ncoloured = held by this GPU; grey = held by another", ha="center",
            fontsize=12, color=GREY)
    return save(fig, out, "splits.png")


def comm(out: Path) -> Path:
    """One training step, forward then backward then the optimizer: when each strategy talks."""
    fig, ax = canvas(11, 4.8, ylim=(0, 4.8))
    steps = [f"F{i}" for i in range(1, 5)] + [f"B{i}" for i in range(4, 0, -1)] + ["opt"]
    x0, w = 0.9, 0.7
    for i, s in enumerate(steps):
        box(ax, x0 + i * w, 4.15, w - 0.06, 0.4, s, SKY if s[0] == "F" else (SAND if s[0] == "B" else GREEN), size=12)
    rows = [  # (label, colour, marks: (step index, fraction in the step), what it sends)
        ("dp", BLUE, [(i, 0.8) for i in range(4, 8)], "gradients: all-reduce (ZeRO: reduce-\n"
         "scatter), in buckets, behind the backward"),
        ("tp", RED, [(i, f) for i in range(8) for f in (0.3, 0.75)], "activations: 2 all-reduces per layer\n"
         "forward, 2 backward; blocking"),
        ("pp", GREEN, [(1, 0.98), (5, 0.98)], "activations forward, their gradients\n"
         "back: point-to-point at stage edges"),
        ("cp", SAND, [(i, f) for i in range(8) for f in (0.2, 0.45)], "keys and values round a ring inside\n"
         "attention (Ulysses: all-to-all)"),
        ("ep", "#9b5de5", [(i, f) for i in range(8) for f in (0.6, 0.9)], "tokens to their experts and back:\n"
         "2 all-to-alls per MoE layer each way")]
    for r, (label, color, marks, text) in enumerate(rows):
        y = 3.5 - r * 0.72
        ax.text(0.1, y, label, fontsize=15, weight="bold", color=color, va="center")
        ax.plot([x0, x0 + len(steps) * w - 0.06], [y, y], color="#d0d4da", lw=1, zorder=0)
        for i, f in marks:
            ax.plot([x0 + i * w + f * (w - 0.06)], [y], marker="o" if label == "dp" else "|",
                    ms=11 if label == "dp" else 22, mew=3, color=color)
        ax.text(x0 + len(steps) * w + 0.1, y, text, fontsize=12, va="center")
    ax.text(x0, 0.0, "pp 2 drawn as 2 stages of 2 layers, one micro-batch; ep: every layer an MoE layer",
            fontsize=12, color=GREY)
    return save(fig, out, "comm.png")


def mesh(out: Path) -> Path:
    """32 GPUs, 4 nodes of 8, tp 8 x dp 2 x pp 2 in Megatron's order (plscale.predict.grid.Layout)."""
    layout, gpu = Layout(32, tp=8, pp=2), GPUS["H100"]
    fig, ax = canvas(11, 5.2, ylim=(0, 5.2))
    top = {}
    for node in range(4):
        nx, ny = 0.3 + (node % 2) * 5.4, 3.05 - (node // 2) * 2.5
        box(ax, nx, ny, 4.9, 1.5, color="#f4f6f8", edge=GREY)
        for k in range(8):
            rank = node * 8 + k
            c = layout.coords(rank)
            gx = nx + 0.15 + k * 0.59
            top[rank] = (gx + 0.25, ny + 1.25)
            box(ax, gx, ny + 0.4, 0.5, 0.85, f"{rank}", [BLUE, SAND][c["pp"]], size=13,
                text_color="white" if c["pp"] == 0 else "black", weight="bold")
        c = layout.coords(node * 8)
        ax.text(nx + 2.45, ny + 0.12, f"node {node} = one tp group (dp{c['dp']}, pp{c['pp']})", ha="center",
                fontsize=12)
    dp, pp = layout.group_of("dp", 7), layout.group_of("pp", 7)
    arrow(ax, top[dp[0]], top[dp[1]], RED, both=True, rad=-0.12)
    ax.text(5.5, 5.0, f"dp group {dp}: gradients", ha="center", fontsize=12, color=RED)
    (px, py), (_, qy) = top[pp[0]], top[pp[1]]
    arrow(ax, (px, py - 0.85), (px, qy), GREEN, both=True)
    ax.text(px + 0.15, (py - 0.85 + qy) / 2, f"pp group {pp}: activations", fontsize=12, color=GREEN, va="center")
    ax.text(5.5, 0.02, f"tp inside a node: NVLink {gpu.intra_gbs:.0f} GB/s a GPU;  dp and pp across nodes: "
            f"{gpu.inter_gbs:.0f} GB/s a GPU ({gpu.name})", ha="center", fontsize=12, color=NAVY)
    return save(fig, out, "mesh.png")


LAYOUTS = [  # label, Setup keywords: 64 GPUs in all (dp here = the ranks ZeRO shards over, dp x cp)
    ("DP 64", dict(dp=64)), ("ZeRO-3\nDP 64", dict(dp=64, stage=3)),
    ("ZeRO-3\nDP 16 x CP 4", dict(dp=64, cp=4, stage=3)), ("TP 8\nx DP 8", dict(tp=8, dp=8)),
    ("TP 8 x PP 4\nx DP 2", dict(tp=8, pp=4, dp=2, grad_accum=8)),
    ("TP 8 x PP 4\nx DP 2, ZeRO-1", dict(tp=8, pp=4, dp=2, grad_accum=8, stage=1))]


def memory(out: Path) -> Path:
    """Memory per GPU of Llama 3 70B on 64 GPUs under six layouts (plscale.predict.memory)."""
    model, gpu, top = SHAPES["llama3-70b"], GPUS["H100"], 165
    parts = [("parameters", ("parameters",), BLUE), ("gradients", ("gradients",), SKY),
             ("optimizer (fp32 master, Adam)", ("master", "moments"), SAND), ("activations", ("activations",), RED)]
    fig, ax = figure(11, 4.9)
    for i, (label, kw) in enumerate(LAYOUTS):
        e = estimate(Setup(params=param_count(model), model=model, seq=4096, micro_batch=1, recompute="selective",
                           sp=kw.get("tp", 1) > 1, **kw))
        bottom = 0.0
        for name, terms, color in parts:
            height = gib(sum(e.term(t).device for t in terms))
            ax.bar(i, min(height, top - bottom), bottom=bottom, color=color, width=0.6, label=name if i == 0 else None)
            bottom = min(bottom + height, top)
        total = gib(e.total())
        ax.text(i, min(total, top) + 3, f"{total:,.0f} GiB" + (" (cut)" if total > top else ""), ha="center",
                fontsize=12, weight="bold")
    ax.axhline(gib(gpu.memory), color=NAVY, ls="--", lw=1.5)
    ax.text(5.45, gib(gpu.memory) + 3, f"{gpu.name}", ha="right", fontsize=12, color=NAVY)
    ax.set_xticks(range(len(LAYOUTS)), [label for label, _ in LAYOUTS], fontsize=12)
    ax.set_ylim(0, top + 35)
    ax.set_ylabel("GiB per GPU")
    ax.legend(loc="upper center", fontsize=12, ncol=4, bbox_to_anchor=(0.5, 1.02))
    return save(fig, out, "memory_70b.png")


def planner(out: Path) -> Path:
    """The planner's four best layouts for two published runs, step time by term; the published one marked."""
    colors = {"compute": BLUE, "bubble": GREY, "tp": RED, "dp": SAND, "pp": GREEN, "cp": SKY, "optimizer": NAVY}
    runs = [p for name in ("Megatron-LM GPT 145.6B", "Llama 3 405B, 16K GPUs") for p in PUBLISHED if p.name == name]
    plans = [plan(Job(SHAPES[r.model], r.gpus, r.seq, r.global_batch, fixed=r.fixed), GPUS[r.gpu]).best_per_layout()[:4]
             for r in runs]
    terms = [t for t in colors if any(c.terms[t] > 0 for best in plans for c in best)]
    fig, axes = figure(11, 4.9, ncols=2)
    for ax, run, best in zip(axes, runs, plans):
        for row, c in enumerate(best):
            left = 0.0
            for name in terms:
                ax.barh(row, c.terms[name], left=left, color=colors[name], height=0.6, label=LABELS[name] if row == 0 else None)
                left += c.terms[name]
            if c.layout == run.layout:
                ax.text(left * 1.02, row, "published", va="center", fontsize=12, color=RED, weight="bold")
        ax.set_yticks(range(len(best)), [f"#{i + 1}  dp {c.dp} tp {c.tp} pp {c.pp}\nZeRO-{c.zero}, {c.recompute}"
                                         for i, c in enumerate(best)], fontsize=12)
        ax.invert_yaxis()
        ax.set_xlim(0, max(c.step_s for c in best) * 1.35)
        ax.set_xlabel("predicted step time (s)\n\n")  # two blank lines: room for the legend below
        ax.set_title(f"{run.name}\n{run.gpus:,} x {run.gpu}, seq {run.seq:,}", fontsize=13)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(terms),
               fontsize=12 if len(terms) < 6 else 10)   # six terms in a row fit at 10 points
    return save(fig, out, "planner.png")


def draw(out: Path) -> list[Path]:
    return [splits(out), comm(out), mesh(out), memory(out), planner(out)]
