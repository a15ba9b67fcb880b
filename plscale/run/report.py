"""Render runs as rich tables: one run's figures beside predictions and its lab's reference
(`show`), or several runs side by side with their loss curves in one PNG (`compare`).
The comparison itself: plscale/run/compare.py."""

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from plscale.errors import UserError
from plscale.figures import fmt
from plscale.files import read_json_object

FLAG_STYLE = {"ok": "green", "outside": "bold red", "hardware": "yellow"}


def flag(word: str) -> str:
    return f"[{FLAG_STYLE[word]}]{word}[/]" if word in FLAG_STYLE else word


def summary_table(summary: dict, judgement=None) -> Table:
    """Each figure: measured, unit, predicted, note; with a judgement (a reference found),
    the reference's value and ok / outside / hardware too."""
    flags = judgement.flags if judgement is not None and judgement.entry else None
    table = Table(title=f"{summary.get('lab', '?')} / {summary.get('variant', '?')}: summary",
                  title_justify="left")
    columns = ["figure", "measured", "unit", "predicted"] + (["reference", "vs ref"] if flags is not None else [])
    for column in columns + ["note"]:
        table.add_column(column, justify="right" if column in ("measured", "predicted", "reference") else "left")
    for row in summary.get("figures", []):
        cells = [escape(row["name"]), fmt(row.get("value")), escape(row.get("unit", "")), fmt(row.get("predicted"))]
        if flags is not None:
            word, ref = flags.get(row["name"], ("", None))
            cells += [fmt(ref["value"]) if ref else "", flag(word)]
        table.add_row(*cells, escape(row.get("note", "")))
    return table


def show(run_dir: Path, console: Console, reference: bool = False) -> None:
    """A finished run's summary; with reference=True, beside its lab's reference results."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise UserError(f"{run_dir} has no summary.json: the run did not finish. See its rank_0.log.")
    if reference:
        from plscale.run.compare import judge, load_run
        run = load_run(run_dir)
        judgement, summary = judge(run), run.summary
    else:
        summary = read_json_object(path, "the run's summary is damaged: run the lab again.")
    console.print(summary_table(summary, judgement if reference else None))
    data = summary.get("data")
    if data:
        console.print(f"data: {escape(str(data))}")
    if reference:
        for line in reference_lines(judgement):
            console.print(line, highlight=False, soft_wrap=True)
    for plot in summary.get("plots", []):
        console.print(f"plot: {Path(run_dir) / plot}")
    console.print(f"run directory: {run_dir}")


def reference_lines(judgement, label: str = "") -> list[str]:
    """Where the reference came from, and what is outside it and why."""
    who = f"{label}: " if label else ""
    entry = judgement.entry
    if entry is None:
        return [f"{who}reference: none ({escape(judgement.note)})"]
    lines = [*entry_lines(entry, who)] + ([f"{who}({escape(judgement.note)})"] if judgement.note else [])
    counts = {w: sum(f == w for f, _ in judgement.flags.values()) for w in FLAG_STYLE}
    lines.append(f"{who}vs reference: {counts['ok']} ok, {counts['outside']} outside, {counts['hardware']} hardware"
                 f" (of {len(judgement.flags)} figures with a reference value)")
    if judgement.outside:
        lines.append(f"{who}[bold red]outside[/]: {escape(', '.join(judgement.outside))}; likely "
                     f"cause{'s' if len(judgement.causes) > 1 else ''}: {escape(judgement.cause)}")
    if counts["hardware"]:
        lines.append(f"{who}[yellow]hardware[/]: another system ({escape(judgement.system)}): times and rates "
                     f"are not comparable with the reference's machine")
    return lines


def entry_lines(entry: dict, who: str = "", title: str = "reference") -> list[str]:
    """A reference entry's command, machine and data source: what reproduces it."""
    from plscale.run.compare import hardware

    data = entry.get("data")
    source = ("no dataset" if not data else f"{data} (real data: a run on synthetic or fallback data will not "
              f"match its losses and accuracy)" if entry.get("real_data") else str(data))
    where = (f"{who}{title}: {escape(entry.get('command', '?'))}, measured {entry.get('measured', '?')} on "
             f"{escape(hardware(entry.get('system') or {}))}, {entry.get('world_size')} ranks over "
             f"{entry.get('backend')}")
    return [where, f"{who}{title} data: {escape(source)}"]


def compare(runs: list, console: Console, plot: Path | None) -> None:
    """Settings that differ, figures and checks side by side, each run against its reference,
    and the loss curves in one PNG."""
    from plscale.run.compare import check_rows, differing, figure_rows, judge

    for run in runs:
        passed = (run.summary or {}).get("passed")
        state = "passed" if passed else "FAILED" if passed is False else "?"
        console.print(f"[bold]{run.label}[/]: {escape(str(run.path))} ({escape(run.lab)} / {escape(run.variant)}, "
                      f"{state})", highlight=False)
    for line in same_directories(runs):
        console.print(line, highlight=False)
    labels = [r.label for r in runs]
    diff = Table("setting", *labels, title="settings that differ", title_justify="left")
    for key, values in differing(runs):
        diff.add_row(escape(key), *("-" if v is None else escape(fmt(v)) for v in values))
    console.print(diff if diff.row_count else "settings: the same in every run")

    judgements = [judge(r) for r in runs]
    entries = list({(j.entry["variant"], j.entry.get("command")): j for j in judgements if j.entry}.values())
    ref_labels = ["reference"] if len(entries) == 1 else [f"ref {j.entry['variant']}" for j in entries]
    figures = Table("figure", "unit", *labels, *ref_labels, title="figures (vs the reference: ok, outside, hardware)",
                    title_justify="left")
    for column in figures.columns[2:]:
        column.justify = "right"
    for name, unit, figs in figure_rows(runs):
        cells = []
        for fig, j in zip(figs, judgements):
            word = j.flags.get(name, ("", None))[0]
            cells.append("-" if fig is None else fmt(fig.get("value")) + (f" {flag(word)}" if word else ""))
        refs = [next((f["value"] for f in j.entry["figures"] if f["name"] == name), None) for j in entries]
        figures.add_row(escape(name), escape(unit), *cells, *(fmt(v) for v in refs))
    console.print(figures)

    checks = Table("check", *labels, title="checks", title_justify="left")
    words = {True: "[green]passed[/]", False: "[bold red]FAILED[/]", None: "-"}
    for name, oks in check_rows(runs):
        checks.add_row(escape(name), *(words[ok] for ok in oks))
    console.print(checks if checks.row_count else "checks: none recorded")
    for label, j in zip(ref_labels, entries):
        for line in entry_lines(j.entry, title=label):
            console.print(line, highlight=False, soft_wrap=True)
    for run, j in zip(runs, judgements):
        for line in reference_lines(j, run.label)[2 if j.entry else 0:]:
            console.print(line, highlight=False, soft_wrap=True)
    if plot is not None:
        for line in plot_curves(runs, plot):
            console.print(line, highlight=False, soft_wrap=True)


def same_directories(runs: list) -> list[str]:
    """A note for each run given twice (a comparison with itself)."""
    seen: dict = {}
    for run in runs:
        seen.setdefault(run.path.resolve(), []).append(run.label)
    return [f"note: {' and '.join(labels)} are the same run directory" for labels in seen.values() if len(labels) > 1]


def plot_curves(runs: list, path: Path) -> list[str]:
    """Every run's loss curves in one PNG: a colour per run, a line style per series. Returns
    the lines to print: the PNG's path, and each run without a loss curve."""
    from plscale.charts.plots import line_plot
    from plscale.run.compare import curves, differing

    shown = [(k, vals) for k, vals in differing(runs) if k not in ("hardware", "data")][:2] if len(runs) > 1 else []
    lines, styles, said = {}, {}, []
    for i, run in enumerate(runs):
        names = ", ".join(f"{k}={fmt(vals[i])}" for k, vals in shown) or run.variant
        found = curves(run)
        if not found:
            why = "no metrics.jsonl" if not (run.path / "metrics.jsonl").is_file() else "no step/loss rows in metrics.jsonl"
            said.append(f"no loss curve in {run.path} ({why})")
        for j, (series, xy) in enumerate(found.items()):
            label = f"{run.label}: {names}" + (f", {series}" if series else "")
            lines[label] = xy
            styles[label] = f"C{i % 10}" + ("-", "--", ":", "-.")[j % 4]
    if not lines:
        return [*said, "loss curves: none to plot"]
    line_plot(path, lines, "loss: " + ", ".join(dict.fromkeys(r.lab for r in runs)), styles=styles)
    return [*said, f"loss curves: {path}"]
