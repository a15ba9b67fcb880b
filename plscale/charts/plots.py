"""PNG plots of runs (matplotlib, headless)."""

from pathlib import Path


def _parts(style: str) -> tuple:
    """A format string's colour ("C3", or None) and line style ("-", "--", ":", "-." or None)."""
    import re

    colour = re.match(r"C\d+|[bgrcmykw](?![a-z])", style)
    return (colour[0] if colour else None), next((ls for ls in ("--", "-.", ":", "-") if ls in style), None)


def line_plot(path: Path, curves: dict, title: str, xlabel: str = "step", ylabel: str = "loss",
              styles: dict | None = None, marks: dict | None = None) -> None:
    """curves: label -> (xs, ys); steps on the x axis are whole numbers. A curve without a
    style of its own and with 3 to 30 points gets a marker on each point. Dashed and dotted
    lines are drawn above the solid ones; a solid line that shares its colour with a dashed one
    (one run's two series, say) is drawn as a wide pale band under it, so where the two are
    equal both still show. marks: legend label -> (curve label, xs): those points of that
    curve marked with a cross (fp16's skipped steps, say)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    styles = styles or {}
    dashed = {_parts(s)[0] for s in styles.values() if _parts(s)[1] in ("--", ":", "-.")} - {None}
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = {}
    for label, (xs, ys) in curves.items():
        xs, ys = list(xs), list(ys)
        style, kw = styles.get(label), {"linewidth": 1.5}
        if style is None:
            style = "-"
            if 3 <= len(xs) <= 30:
                kw.update(marker="o", markersize=4)
        colour, linestyle = _parts(style)
        if linestyle in ("--", ":", "-."):
            kw["zorder"] = 3
        elif linestyle == "-" and colour in dashed:
            kw.update(linewidth=4.5, alpha=0.35)
        (drawn[label],) = ax.plot(xs, ys, style, label=label, **kw)
    for name, (label, at) in (marks or {}).items():
        xs, ys = (list(v) for v in curves[label])
        points = [(x, ys[xs.index(x)]) for x in at if x in xs]
        if points:
            ax.plot(*zip(*points), "x", color=drawn[label].get_color(), markersize=8, mew=2, zorder=4,
                    label=f"{name} ({len(points)})")
    if xlabel == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_and_gaps(path: Path, curves: dict, reference: str, title: str, styles: dict | None = None,
                    note: str | None = None) -> None:
    """Top: the curves (label -> (xs, ys)). Bottom: |curve - reference| on a log scale, where
    agreement to float precision is visible and not just 'the lines overlap'. `note`: a line
    written across the bottom panel (say, that every gap is exactly 0 and sits on the floor)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=[3, 2])
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ref_xs, ref_ys = curves[reference]
    for label, (xs, ys) in curves.items():
        style = (styles or {}).get(label, "-")
        [line] = top.plot(xs, ys, style, label=label, linewidth=1.5)
        if label != reference:  # in the curve's colour, so the panels read together
            gaps = [max(abs(a - b), 1e-10) for a, b in zip(ys, ref_ys)]
            bottom.semilogy(xs, gaps, style, label=f"|{label} - {reference}|", linewidth=1.2, color=line.get_color())
    top.set_title(title)
    top.set_ylabel("loss")
    bottom.set_ylabel("|gap| (floor 1e-10)")
    bottom.set_xlabel("step")
    if note:
        bottom.text(0.5, 0.06, note, transform=bottom.transAxes, ha="center", va="bottom", fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "0.6", "boxstyle": "round"})
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def interval_chart(rows, mtbf_s: float, path: Path, title: str = "checkpoint interval against time lost",
                   restart_s: float = 0.0, every: int | None = None) -> None:
    """Waste (%) against the checkpoint interval in steps (log, 1..10000), one curve per
    strategy; rows: (name, stall_s, step_time_s). Each curve's Young optimum, sqrt(2δM), is
    marked with a dot; `every`: the interval a run used, marked on each curve with a square
    and as a dotted line. The numbers sit in the legend below the axes, off the curves; the
    y axis reaches from below the lowest optimum to above the run's own waste, on a log scale
    where that spans more than a decade. The model:
    plscale/predict/checkpoint.py."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from plscale.predict.checkpoint import waste_fraction, young_interval

    steps = [10 ** (i / 50) for i in range(201)]                      # 1 .. 10000, log-spaced
    fig, ax = plt.subplots(figsize=(7, 4.4 + 0.3 * len(rows)))
    lows, highs = [], []
    for name, stall_s, step_s in rows:
        waste = [100 * waste_fraction(k * step_s, stall_s, mtbf_s, restart_s) for k in steps]
        best = young_interval(stall_s, mtbf_s) / step_s
        best_waste = 100 * waste_fraction(best * step_s, stall_s, mtbf_s, restart_s)
        label = f"{name} (stall {stall_s:.3g} s, step {step_s:.3g} s): best every {best:,.0f} steps, {best_waste:.2f} %"
        lows.append(best_waste)
        highs.append(4 * best_waste)
        if every:
            ours = 100 * waste_fraction(every * step_s, stall_s, mtbf_s, restart_s)
            highs.append(1.4 * ours)
            label += f"; every {every}: {ours:.1f} %"
        (line,) = ax.plot(steps, waste, label=label, linewidth=1.5)
        ax.plot([best], [best_waste], "o", color=line.get_color())
        if every:
            ax.plot([every], [ours], "s", color=line.get_color())
    if every:
        ax.axvline(every, color="0.4", linestyle=":", linewidth=1)
        ax.text(every * 1.1, 0.03, f"this run: every {every} steps", transform=ax.get_xaxis_transform(),
                ha="left", va="bottom", fontsize=8, color="0.3")
    ax.set_xscale("log")
    low, high = 0.5 * min(lows, default=1.0), min(100.0, max(highs, default=25.0))
    logy = high / low > 10                                            # optima and a far-off interval both in view
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlim(1, 10_000)
    ax.set_ylim(low if logy else 0, high)
    ax.set_title(f"{title} (MTBF {mtbf_s / 3600:g} h)")
    ax.set_xlabel("checkpoint every k steps")
    ax.set_ylabel("time lost (%, log)" if logy else "time lost (%)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False,
              title="dot: Young's optimum" + ("; square: this run's interval" if every else ""), title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def mesh_grid(layout, path: Path) -> None:
    """One panel per pipeline stage; inside, a row per (dp, cp) and a column per tp rank,
    so a row is a tensor-parallel group (one colour each, the same in every stage), a
    column a data-parallel one, and the same box in every panel a pipeline group."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    rows, cols, pp = layout.dp * layout.cp, layout.tp, layout.pp
    across = min(pp, 4)  # stages per row of panels
    down = -(-pp // across)
    width, height = across * (cols + 1.2), down * (rows * 0.6 + 1.2)
    scale = min(1.0, 24 / width, 24 / height)
    fig, panels = plt.subplots(down, across, squeeze=False,
                               figsize=(max(3.5, width * scale), max(2.5, height * scale)))
    for ax in panels.flat[pp:]:
        ax.set_visible(False)
    colours = plt.get_cmap("tab20" if rows > 10 else "tab10")
    font = max(3.0, 9 * scale)
    for rank in range(layout.world):
        c = layout.coords(rank)
        ax, row = panels.flat[c["pp"]], c["dp"] * layout.cp + c["cp"]
        ax.add_patch(FancyBboxPatch((c["tp"] + 0.06, rows - row - 0.94), 0.88, 0.84,
                                    boxstyle="round,pad=0,rounding_size=0.08",
                                    facecolor=colours(row % colours.N), alpha=0.85, edgecolor="black"))
        experts = f"\nep{c['ep']} edp{c['edp']}" if layout.ep > 1 and layout.world <= 256 else ""
        ax.text(c["tp"] + 0.5, rows - row - 0.52, f"{rank}{experts}", ha="center", va="center",
                fontsize=font, fontweight="bold")
    for stage, ax in enumerate(panels.flat[:pp]):
        ax.set_xlim(0, cols)
        ax.set_ylim(0, rows)
        ax.set_xticks([t + 0.5 for t in range(cols)], [f"tp{t}" for t in range(cols)], fontsize=font)
        ylabels = [f"dp{r // layout.cp}" + (f" cp{r % layout.cp}" if layout.cp > 1 else "") for r in range(rows)]
        ax.set_yticks([rows - r - 0.5 for r in range(rows)], ylabels if stage % across == 0 else [], fontsize=font)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_title(f"pipeline stage pp{stage}", fontsize=font + 1)
    notes = ["row = a tensor-parallel group (one colour, the same in every stage)",
             "column = a data-parallel group" if layout.cp == 1 else
             "column = a dp-cp group; in it, rows of one cp index form a dp group, of one dp index a cp group"]
    notes += ["the same box in every stage = a pipeline group"] * (pp > 1)
    notes += ["epN edpN = the rank's place in its expert-parallel and expert-data-parallel groups"] * (layout.ep > 1)
    fig.suptitle(str(layout).replace("; ", "\n") + "\n" + "\n".join(notes), fontsize=font)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def measured_vs_predicted(path: Path, panels: dict, title: str, unit: str | dict = "MiB",
                          grid: tuple[int, int] | None = None) -> None:
    """One panel per entry of `panels` (panel title -> {bar label: (measured, predicted)}):
    each label's measured bar (solid) beside its predicted one (hatched); None: not measured,
    or not predicted. `unit`: one for every panel, or panel title -> unit. `grid`: (rows,
    columns), the panels filled row by row, sharing the x axis and, down each column, the y
    axis (one quantity per column, say; the bar labels then stand once, under the last row);
    default: one row, each panel its own y axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    styles = {"measured": {}, "predicted": {"alpha": 0.45, "hatch": "//"}}
    down, across = grid or (1, len(panels))
    fig, axes = plt.subplots(down, across, figsize=(4.2 * across, 0.3 + 3.5 * down), squeeze=False,
                             **({"sharex": True, "sharey": "col"} if grid else {}))
    for ax, (name, rows) in zip(axes.flat, panels.items()):
        for i, (label, (got, want)) in enumerate(rows.items()):
            both = got is not None and want is not None
            for dx, value, style in ((-0.2 * both, got, styles["measured"]), (0.2 * both, want, styles["predicted"])):
                if value is None:
                    continue
                ax.bar(i + dx, value, 0.38, color="#4c72b0", edgecolor="white", **style)
                if value is got or not both or abs(want - got) > 0.01 * abs(got):  # one label where they agree
                    ax.text(i + dx, value, f"{value:.3g}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(rows)), list(rows), fontsize=8)
        ax.set_ylabel(unit[name] if isinstance(unit, dict) else unit)
        ax.set_title(name, fontsize=9)
    fig.legend(handles=[Patch(facecolor="#4c72b0", edgecolor="white", label=k, **v) for k, v in styles.items()],
               loc="upper right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.92, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def routing_chart(path: Path, counts: dict, capacity: int, sweep: list, title: str) -> None:
    """Left: routes each expert received (counts: label -> [per expert]), the capacity C as a
    line. Right: routes dropped (%) against the capacity factor; sweep: (factor, measured %,
    % an even router would drop)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / len(counts)
    for i, (label, per_expert) in enumerate(counts.items()):
        left.bar([e + (i - (len(counts) - 1) / 2) * width for e in range(len(per_expert))], per_expert, width,
                 label=label)
    left.axhline(capacity, color="black", linestyle="--", linewidth=1, label=f"capacity C = {capacity}")
    left.set_xticks(range(len(next(iter(counts.values())))))
    left.set_xlabel("expert")
    left.set_ylabel("routes")
    left.set_title("routes per expert (beyond the line: dropped)", fontsize=9)
    left.legend(fontsize=7)
    factors = [f for f, _, _ in sweep]
    right.plot(factors, [m for _, m, _ in sweep], "C0o-", label="measured")
    right.plot(factors, [e for _, _, e in sweep], "C1--", label="an even router")
    right.set_xlabel("capacity factor")
    right.set_ylabel("routes dropped, %")
    right.set_title("dropped routes against the capacity factor", fontsize=9)
    right.legend(fontsize=7)
    right.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measured_and_predicted(path: Path, xs: list, series: dict, title: str, xlabel: str, ylabel: str) -> None:
    """Each of `series` (name -> (measured ys, predicted ys)) in its own colour: the measured
    points as markers, the prediction as a line through them ("name, measured", "name, predicted")."""
    curves, styles = {}, {}
    for i, (name, (measured, predicted)) in enumerate(series.items()):
        curves[f"{name}, measured"], styles[f"{name}, measured"] = (xs, measured), f"C{i}{'os^v'[i % 4]}"
        curves[f"{name}, predicted"], styles[f"{name}, predicted"] = (xs, predicted), f"C{i}{['-', '--'][i % 2]}"
    line_plot(path, curves, title, xlabel, ylabel, styles=styles)
