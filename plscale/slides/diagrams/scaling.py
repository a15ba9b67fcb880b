"""Diagrams of deck 04, parallel computing, collectives and scaling laws (slides/04_parallel_computing).

Collective bytes, schedules and times come from plscale.predict.busbw and plscale.predict.step_time,
compute from plscale.predict.presets.flops_per_token and step_time.compute_seconds at published.LLAMA3_MFU,
GPUs from plscale.predict.cluster. Amdahl's law and the Chinchilla fit are literature, their sources in
comments here and on the slides.
"""

from pathlib import Path

from plscale.predict.busbw import bandwidths, bus_factor, naive_bytes_sent, ring_bytes_sent, ring_schedule
from plscale.predict.cluster import GPUS
from plscale.predict.memory import BYTES
from plscale.predict.presets import flops_per_token, param_count, preset
from plscale.predict.published import LLAMA3_MFU
from plscale.predict.step_time import collective_seconds, compute_seconds, link
from plscale.slides.diagrams.style import (BLUE, GREEN, GREY, NAVY, RED, SAND, SKY, arrow, box, canvas, figure, rect,
                                           save)

RANKS = [BLUE, SAND, GREEN, RED]
H100 = GPUS["H100"]
# Chinchilla's parametric fit (Hoffmann et al. 2022, approach 3): L(N, D) = E + A / N^a + B / D^b
E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28


def amdahl(out: Path) -> Path:
    """Speedup and efficiency against GPUs for a few parallel fractions (Amdahl 1967: S = 1 / (s + p / n))."""
    fig, (ax, ax2) = figure(ncols=2)
    ns = [2**k for k in range(13)]
    for p, color in ((1.0, GREY), (0.999, GREEN), (0.99, BLUE), (0.95, SAND), (0.9, RED)):
        speed = [1 / ((1 - p) + p / n) for n in ns]
        label = "perfect" if p == 1 else f"{100 * p:g} % parallel"
        ax.plot(ns, speed, "o-" if p < 1 else "--", color=color, lw=2, ms=4, label=label)
        if p < 1:
            ax.text(ns[-1] * 1.25, speed[-1], f"→ {1 / (1 - p):,.0f}", va="center", fontsize=12, color=color)
        ax2.plot(ns, [100 * s / n for s, n in zip(speed, ns)], "o-" if p < 1 else "--", color=color, lw=2, ms=4)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks(ns[::2], [str(n) for n in ns[::2]])
        a.set_xlabel("GPUs")
        a.grid(alpha=0.3)
    ax.set_yscale("log", base=2)
    ax.set_yticks(ns[::2], [str(n) for n in ns[::2]])
    ax.set_xlim(0.7, ns[-1] * 4)
    ax.set_ylabel("speedup (log)")
    ax.legend(fontsize=12)
    ax2.set_ylabel("efficiency = speedup / GPUs (%)")
    ax2.set_ylim(0, 105)
    return save(fig, out, "amdahl.png")


def comm_vs_compute(out: Path) -> Path:
    """Data parallelism with a fixed batch: compute per GPU shrinks, the gradient all-reduce does not."""
    c, tokens = preset("7b"), 2**20                # 7B shape, a batch of 1M tokens (256 sequences of 4K)
    grads = BYTES["bf16"] * param_count(c)         # bf16 gradients, bytes
    ns = [2**k for k in range(9)]                  # MFU as deck 01: published.LLAMA3_MFU (Llama 3 paper, table 4)
    compute = [compute_seconds(flops_per_token(c, 4096) * tokens, n, H100, "bf16", LLAMA3_MFU) for n in ns]
    layouts = [("8 GPUs a node", 1, BLUE), ("1 GPU a node", 8, RED)]
    fig, (ax, ax2) = figure(ncols=2)
    ax.plot(ns, compute, "o-", color=GREEN, lw=2.5, label="compute per step, per GPU")
    for k, (name, stride, color) in enumerate(layouts):
        comm = [collective_seconds("all_reduce", grads, n, link(H100, n, stride)) if n > 1 else 0 for n in ns]
        ax.plot(ns[1:], comm[1:], "s-", color=color, lw=2.5, label=f"all-reduce, {name}")
        eff = [100 * t / (t + m) for t, m in zip(compute, comm)]
        ax2.bar([i + (k - 0.5) * 0.4 for i in range(len(ns))], eff, 0.4, color=color, label=name)
        ax2.text(len(ns) - 1 + (k - 0.5) * 0.4, eff[-1] + 1.5, f"{eff[-1]:.0f}", ha="center", fontsize=12,
                 color=color, weight="bold")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylabel("seconds per step (log)")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.legend(fontsize=12)
    ax2.set_xticks(range(len(ns)), [str(n) for n in ns])
    ax2.set_ylim(0, 115)
    ax2.set_ylabel("efficiency without overlap (%)")
    ax2.legend(fontsize=12, loc="upper right", ncol=2)
    for a in (ax, ax2):
        a.set_xlabel("H100 GPUs")
    return save(fig, out, "comm_vs_compute.png")


def _panel(ax, x0, title, use, before, after):
    """One collective on 4 ranks: each rank's cells before and after. A cell is (text, colour)."""
    ax.text(x0 + 1.75, 4.65, title, ha="center", fontsize=15, weight="bold", color=NAVY)
    ax.text(x0 + 1.75, 4.3, use, ha="center", fontsize=12, color=GREY)
    for col, rows, dx in (("before", before, 0.35), ("after", after, 2.05)):
        ax.text(x0 + dx + 0.6, 3.85, col, ha="center", fontsize=12, color=GREY)
        for r, cells in enumerate(rows):
            y = 3.2 - r * 0.8
            if col == "before":
                ax.text(x0 + 0.15, y + 0.25, f"r{r}", ha="center", va="center", fontsize=12, weight="bold")
            w = 1.2 / max(len(cells), 1)
            for k, (text, color) in enumerate(cells):
                box(ax, x0 + dx + k * w, y, w - 0.04, 0.5, text, color=color, size=11 if w > 0.5 else 10,
                    text_color="white" if color in (NAVY, BLUE, GREEN, RED) else "black",
                    edge=NAVY if color != "white" else "#c8ccd2")
    arrow(ax, (x0 + 1.62, 2.2), (x0 + 2.0, 2.2))


def collectives(out: Path) -> list[Path]:
    """The six collectives on 4 ranks, in two figures of three."""
    data = [(t, RANKS[r]) for r, t in enumerate("ABCD")]
    empty = ("", "white")
    total = ("A+B+C+D", NAVY)
    slots = [[data[j] if j == r else empty for j in range(4)] for r in range(4)]
    figs = [[("broadcast", "rank 0's weights to all", [[data[0]], [empty], [empty], [empty]], [[data[0]]] * 4),
             ("reduce", "a sum onto one rank", [[d] for d in data], [[total], [empty], [empty], [empty]]),
             ("all-reduce", "data parallel: gradients", [[d] for d in data], [[total]] * 4)],
            [("all-gather", "ZeRO-3: gather the weights", slots, [data] * 4),
             ("reduce-scatter", "ZeRO-2: a gradient shard each",
              [[(f"{p}{r}", RANKS[r]) for p in "abcd"] for r in range(4)], [[(f"Σ{p}", NAVY) if j == r else empty for j, p in enumerate("abcd")] for r in range(4)]),
             ("all-to-all", "experts: tokens to their expert",
              [[(f"{r}{j}", RANKS[r]) for j in range(4)] for r in range(4)],
              [[(f"{i}{j}", RANKS[i]) for i in range(4)] for j in range(4)])]]
    paths = []
    for k, panels in enumerate(figs):
        fig, ax = canvas(11, 4.9, ylim=(0.5, 4.9))
        for i, (title, use, before, after) in enumerate(panels):
            _panel(ax, 0.1 + i * 3.7, title, use, before, after)
        paths.append(save(fig, out, f"collectives_{'ab'[k]}.png"))
    return paths


def ring(out: Path) -> Path:
    """The ring all-reduce on 4 ranks: rank r adds 10^r to every chunk, so the digits say whose parts a
    partial sum holds (the lab's ring variant prints the same table). Red edge: the chunk just received."""
    n = 4
    state = [[{r} for _ in range(n)] for r in range(n)]
    rows = [("start", [[set(s) for s in rank] for rank in state], set())]
    for phase, t, sends in ring_schedule(n):         # rank r sends chunk sends[r] to rank r + 1
        got = {((r + 1) % n, chunk, frozenset(state[r][chunk])) for r, chunk in enumerate(sends)}  # all at once
        for dst, chunk, parts in got:
            state[dst][chunk] = state[dst][chunk] | parts if phase == "reduce-scatter" else set(parts)
        rows.append((f"{phase} {t + 1}", [[set(s) for s in rank] for rank in state], {(d, c) for d, c, _ in got}))
    fig, ax = canvas(11, 5, ylim=(-0.1, 5))
    shades = {1: "#f1f4f8", 2: SKY, 3: BLUE, 4: NAVY}
    for r in range(n):
        ax.text(2.2 + r * 2.2 + 0.95, 4.7, f"rank {r}", ha="center", fontsize=13, weight="bold", color=RANKS[r])
    for i, (label, ranks, fresh) in enumerate(rows):
        y = 4.05 - i * 0.6
        ax.text(0.05, y + 0.22, label, va="center", fontsize=12, color=RED if "scatter" in label else NAVY)
        for r, chunks in enumerate(ranks):
            for c, parts in enumerate(chunks):
                value = sum(10**p for p in parts)
                color = shades[len(parts)]
                x = 2.2 + r * 2.2 + c * 0.48
                box(ax, x, y, 0.45, 0.45, str(value), color=color, size=10,
                    text_color="white" if len(parts) > 2 else "black")
                if (r, c) in fresh:
                    rect(ax, x - 0.03, y - 0.03, 0.51, 0.51, "none", edge=RED, lw=2.5)
    ax.text(5.5, -0.05, "every step, every rank sends one chunk (S/N bytes) to its right neighbour; "
            "red: the chunk just received", ha="center", fontsize=12, color=GREY)
    return save(fig, out, "ring.png")


def bytes_per_rank(out: Path) -> Path:
    """Bytes each rank sends, as a multiple of the buffer S: the ring stays under 2, the naive scheme grows."""
    ns = list(range(2, 65))
    numel = 2**20 * 3 * 4                           # any size: the ratio does not depend on it
    fig, ax = figure(h=4.6)
    ring_ = [sum(ring_bytes_sent(numel, 1, n)) / n / numel for n in ns]
    ax.plot(ns, ring_, color=BLUE, lw=3, label="ring all-reduce, every rank: 2(N-1)/N")
    ax.plot(ns, [bus_factor("all_gather", n) for n in ns], color=GREEN, lw=3,
            label="all-gather or reduce-scatter: (N-1)/N")
    # the naive all-reduce (plscale/strategies/collectives/naive.py, labs/03_collectives/README.md): rank 0 sends (N-1) S
    ax.plot(ns, [naive_bytes_sent(numel, n)[0] / numel for n in ns], color=RED, lw=3, ls="--",
            label="naive all-reduce, rank 0: N-1")
    ax.set_yscale("log", base=2)
    ax.set_yticks([0.5, 1, 2, 4, 8, 16, 32, 64], ["0.5", "1", "2", "4", "8", "16", "32", "64"])
    ax.set_xlabel("ranks N")
    ax.set_ylabel("bytes sent per rank / S (log)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=12, loc="upper left")
    return save(fig, out, "bytes_per_rank.png")


def alpha_beta(out: Path) -> Path:
    """All-reduce time and bus bandwidth against message size: latency-bound, then bandwidth-bound."""
    sizes = [2**k for k in range(10, 31)]
    cases = [("8 GPUs, one node (NVLink)", 8, 1, BLUE), ("64 GPUs, 8 nodes (network)", 64, 1, RED)]
    fig, (ax, ax2) = figure(ncols=2)
    for label, n, stride, color in cases:
        bw, lat = link(H100, n, stride)
        times = [collective_seconds("all_reduce", s, n, (bw, lat)) for s in sizes]
        ax.plot(sizes, [t * 1e6 for t in times], color=color, lw=2.5, label=label)
        ax.plot(sizes, [collective_seconds("all_reduce", s, n, (bw, 0)) * 1e6 for s in sizes], color=color, ls=":",
                lw=1.5)                                 # the bandwidth term alone: no latency
        ax2.plot(sizes, [bandwidths("all_reduce", s, t, n)[1] for s, t in zip(sizes, times)], color=color,
                 lw=2.5, label=f"{label}: peak {bw / 1e9:.0f} GB/s")
    ax.text(2**10.3, 400, "dotted: bandwidth term alone", fontsize=12, color=GREY)
    ticks = [2**10, 2**20, 2**30]
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks(ticks, ["1 KiB", "1 MiB", "1 GiB"])
        a.set_xlabel("message size S")
        a.grid(alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("all-reduce time (µs, log)")
    ax.legend(fontsize=11, loc="upper left")
    ax2.set_yscale("log")
    ax2.set_ylabel("bus bandwidth (GB/s, log)")
    ax2.legend(fontsize=11, loc="lower right")
    return save(fig, out, "alpha_beta.png")


def loss(n: float, d: float) -> float:
    return E + A / n**ALPHA + B / d**BETA


def chinchilla(out: Path) -> Path:
    """Iso-FLOP curves of Chinchilla's fit, and where real models sit against 20 tokens per parameter."""
    fig, (ax, ax2) = figure(ncols=2)
    ns = [10 ** (6 + k / 40) for k in range(241)]
    best = []
    for k, flops in enumerate([1e19, 1e20, 1e21, 1e22, 1e23, 1e24]):
        ls = [loss(n, flops / (6 * n)) for n in ns]      # C = 6 N D (Kaplan et al. 2020)
        i = min(range(len(ns)), key=ls.__getitem__)
        best.append((ns[i], flops / (6 * ns[i])))
        color = [SKY, BLUE, GREEN, SAND, RED, NAVY][k]
        ax.plot(ns, ls, color=color, lw=2)
        ax.scatter([ns[i]], [ls[i]], color=color, s=50, zorder=3)
        ax.annotate(f"$10^{{{19 + k}}}$", (ns[i], ls[i]), textcoords="offset points",
                    xytext=(0, 5 if k < 5 else -18), ha="center", va="bottom", fontsize=12, color=color, weight="bold")
    ax.set_xscale("log")
    ax.set_ylim(1.8, 4.0)
    ax.set_xlim(1e7, 1e12)
    ax.set_xlabel("parameters N")
    ax.set_ylabel("predicted loss L(N, C / 6N)")
    ax.text(2e7, 3.9, "a curve per compute budget C,\nits minimum marked", fontsize=12, color=GREY, va="top")
    ax.grid(alpha=0.3)
    line = [1e8, 1e12]
    ax2.plot(line, [20 * n for n in line], color=GREEN, lw=2.5, label="20 tokens per parameter")
    ax2.plot([b[0] for b in best], [b[1] for b in best], "o--", color=GREY, lw=1.5, label="optimum of the fit")
    # (name, parameters, training tokens): Brown et al. 2020; Rae et al. 2021; Hoffmann et al. 2022;
    # Touvron et al. 2023; Grattafiori et al. 2024
    for name, n, d in (("GPT-3", 175e9, 300e9), ("Gopher", 280e9, 300e9), ("Chinchilla", 70e9, 1.4e12),
                       ("Llama 2 7B", 7e9, 2e12), ("Llama 3 8B", 8e9, 15e12), ("Llama 3 405B", 405e9, 15.6e12)):
        ax2.scatter([n], [d], color=RED, s=60, zorder=3)
        ax2.annotate(name, (n, d), textcoords="offset points", xytext=(6, -14 if name == "Gopher" else 4),
                     fontsize=11)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlim(1e8, 2e12)
    ax2.set_ylim(1e9, 1e14)
    ax2.set_xlabel("parameters N")
    ax2.set_ylabel("training tokens D")
    ax2.legend(fontsize=11, loc="upper left")
    ax2.grid(alpha=0.3)
    return save(fig, out, "chinchilla.png")


def draw(out: Path) -> list[Path]:
    return [amdahl(out), comm_vs_compute(out), *collectives(out), ring(out), bytes_per_rank(out), alpha_beta(out),
            chinchilla(out)]
