"""The recomputation lab's two pictures (matplotlib, headless), drawn from measurement: the
allocator's history of one step (plscale.rank.allocations) and what it says per layer
(plscale.strategies.recompute.llama.measured_layers).

    memory_over_step   bytes allocated against time through one step, one panel per strategy:
                       forward, backward and optimizer step shaded, the reruns of recomputed
                       layers marked, the predicted kept level drawn
    layer_picture      one row per strategy: the forward left to right, layer by layer, each
                       bar what that layer kept (what it dropped against no recomputation,
                       hatched above it); then the backward right to left, each layer's bar what
                       its backward reads back (what the forward kept) with, stacked on it, what
                       the rerun of its forward rebuilt. "emb+head": what the forward kept outside
                       the layers' own runs (the embedding's output, the final norm, the
                       log-softmax, the loss)
"""

from pathlib import Path

from plscale.predict.units import MiB

PHASES = {"forward": "C0", "backward": "C1", "step": "C2"}
KEPT, DROPPED, REBUILT, READ = "#4C72B0", "#C44E52", "#DD8452", "#A6BDDB"


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _reruns(history) -> list:
    """The outermost labelled regions that ran again in the backward (a layer, or its core)."""
    back = history.phase("backward")
    runs = [i for i in history.labels if back.holds(i.start) and i.name.startswith(("layer", "core"))]
    return [r for r in runs if not any(o is not r and o.start <= r.start and r.end <= o.end for o in runs)]


def memory_over_step(path: Path, histories: dict, predicted: dict, title: str) -> None:
    """histories: strategy -> History of one step; predicted: strategy -> bytes kept at the
    end of the forward."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(histories), 1, figsize=(9, 1.9 * len(histories) + 1), sharex=True, sharey=True,
                             squeeze=False)
    for ax, (strategy, h) in zip(axes[:, 0], histories.items()):
        seconds, level = h.live()
        ax.step([1e3 * t for t in [0.0] + seconds], [0.0] + [b / MiB for b in level], where="post", color="k",
                linewidth=1.0, label="allocated since the step began")
        for p in h.phases:
            if p.name in PHASES:
                ax.axvspan(p.start / 1e6, p.end / 1e6, color=PHASES[p.name], alpha=0.12, linewidth=0,
                           label=p.name if ax is axes[0, 0] else None)
        for i, r in enumerate(_reruns(h)):
            ax.axvspan(r.start / 1e6, r.end / 1e6, ymin=0.92, ymax=1.0, color=REBUILT, linewidth=0,
                       label="recomputed (forward run again)" if i == 0 else None)
        fwd = h.phase("forward")
        ax.axhline(predicted[strategy] / MiB, color=KEPT, linestyle="--", linewidth=1.0, label="kept, predicted")
        ax.plot([fwd.end / 1e6], [h.kept() / MiB], "o", color=KEPT, label="kept at the forward's end")
        ax.set_ylabel(f"{strategy}\nMiB")
        ax.grid(alpha=0.3)
    axes[0, 0].set_title(title, fontsize=10)
    axes[-1, 0].set_xlabel("ms since the step began")
    _save(fig, axes, path, columns=3)


def layer_picture(path: Path, histories: dict, layers: dict, title: str) -> None:
    """histories: strategy -> History; layers: strategy -> measured_layers(...) rows."""
    plt = _pyplot()
    n = len(next(iter(layers.values())))
    plain = layers.get("none")
    fig, axes = plt.subplots(len(layers), 1, figsize=(max(8, 1.1 * (2 * n + 3)), 2.3 * len(layers) + 0.8),
                             sharey=True, squeeze=False)
    forward = list(range(n + 1))                  # layer 0 .. n-1, then the head
    backward = [n + 2 + j for j in range(n + 1)]  # the head, then layer n-1 .. 0
    for ax, (strategy, rows) in zip(axes[:, 0], layers.items()):
        head = histories[strategy].kept() - sum(r["kept"] for r in rows)
        for x, r in zip(forward, rows):
            dropped = plain[r["layer"]]["kept"] - r["kept"] if plain else 0
            ax.bar(x, r["kept"] / MiB, color=KEPT, label="kept for backward")
            if dropped > 0:
                ax.bar(x, dropped / MiB, bottom=r["kept"] / MiB, color="none", edgecolor=DROPPED, hatch="///",
                       linewidth=0.8, label="dropped (kept by none, not here)")
            _notes(ax, x, [(r["kept"], "kept", KEPT, "")] + [(dropped, "dropped", DROPPED, "")] * (dropped > 0))
        ax.bar(forward[-1], head / MiB, color=KEPT)
        _notes(ax, forward[-1], [(head, "kept", KEPT, "")])
        ax.bar(backward[0], head / MiB, color=READ, label="read back in backward (what the forward kept)")
        _notes(ax, backward[0], [(head, "read back", KEPT, "")])
        for x, r in zip(backward[1:], reversed(rows)):
            ax.bar(x, r["kept"] / MiB, color=READ)
            if r["recomputed"]:
                ax.bar(x, r["rebuilt"] / MiB, bottom=r["kept"] / MiB, color=REBUILT,
                       label="recomputed in backward (its forward run again)")
            _notes(ax, x, [(r["kept"], "read back", KEPT, "")]
                   + [(r["rebuilt"], f"{r['recomputed']} rerun", REBUILT, "+")] * bool(r["recomputed"]))
        ax.axvline(n + 1, color="k", linewidth=0.8)
        ax.set_ylabel(f"{strategy}\nMiB")
        ax.set_xticks(forward + backward, [f"L{i}" for i in range(n)] + ["emb+head"]
                      + ["emb+head"] + [f"L{i}" for i in reversed(range(n))], fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    axes[0, 0].set_ylim(0, 1.3 * axes[0, 0].get_ylim()[1])  # room for the notes above the bars
    axes[0, 0].set_title(f"{title}\nforward  →  |  ←  backward", fontsize=10)
    _save(fig, axes, path, columns=2)


def _save(fig, axes, path: Path, columns: int) -> None:
    """One legend for every panel, under them; then the PNG."""
    import matplotlib.pyplot as plt

    handles = {}
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), fontsize=8, loc="lower center", ncol=columns, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * (len(handles) // columns), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _notes(ax, x, parts) -> None:
    """Above a bar's stack, one line per part (bytes, what, colour, sign), the bottom part lowest:
    never under another part's fill or hatching."""
    top = sum(part[0] for part in parts) / MiB
    for i, (nbytes, what, colour, sign) in enumerate(parts):
        ax.annotate(f"{sign}{nbytes / MiB:.1f} {what}", (x, top), xytext=(0, 1 + 7 * i),
                    textcoords="offset points", ha="center", va="bottom", fontsize=6, color=colour)
