"""`plscale exercise list|start NAME|check NAME`: write the core of a strategy yourself, and let
hidden checks on CPU ranks say whether it is right (plscale/exercises)."""

import shutil
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli.output import Progress, console
from plscale.errors import UserError
from plscale.exercises import EXERCISES, find, progress
from plscale.lab.labs import labs_root

app = typer.Typer(help="Exercises: write a strategy's core yourself; hidden checks on CPU ranks grade it.",
                  no_args_is_help=True)

DEFAULT_DIR = Path("exercises")
STATUS_STYLE = {"not started": "dim", "started": "yellow", "failing": "red", "passing": "green"}


def _shown(path: Path) -> Path:
    """`path` as the student can open it from here: relative to the cwd when inside it, else absolute."""
    path = path.resolve()
    try:
        return path.relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def _folder(folder: Path) -> Path:
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--dir {folder} is a file, not a folder: give a folder (default: exercises/).")
    return folder


@app.command("list")
def list_exercises(folder: Annotated[Path, typer.Option("--dir", help="Where your exercise files are.")] = DEFAULT_DIR
                   ) -> None:
    """Every exercise: topic, ranks its checks run on, its lab, and your status in --dir."""
    folder = _folder(folder)
    table = Table(title=f"plscale exercises (your files: {folder}/NAME.py)", title_justify="left")
    for column in ("exercise", "topic", "ranks", "lab", "status"):
        table.add_column(column)
    for e in EXERCISES.values():
        state = progress.status(e, folder)
        table.add_row(f"[bold]{e.name}[/]", e.topic, e.ranks, e.lab, f"[{STATUS_STYLE[state]}]{state}[/]")
    console.print(table)
    console.print("Start one: plscale exercise start NAME; grade it: plscale exercise check NAME")


@app.command("start")
def start(name: Annotated[str, typer.Argument(help="The exercise (plscale exercise list).")],
          folder: Annotated[Path, typer.Option("--dir", help="Folder to write NAME.py into (created if needed).")]
          = DEFAULT_DIR,
          force: Annotated[bool, typer.Option("--force", help="Overwrite your file with a fresh skeleton.")] = False
          ) -> None:
    """Copy an exercise's skeleton to DIR/NAME.py: the task in its docstring, the core left as TODO."""
    exercise = find(name)
    target = _folder(folder) / f"{exercise.name}.py"
    if target.exists() and not force:
        raise UserError(f"{target} already exists (your work?): edit it, or start afresh with --force "
                        f"(overwrites it).")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(exercise.skeleton, target)
    console.print(f"[bold]{exercise.name}[/]: {escape(exercise.topic)}")
    console.print(f"wrote {escape(str(target))}: the task is its docstring; replace each TODO "
                  f"(raise NotImplementedError) with your code.")
    console.print(f"lesson: {escape(str(_shown(labs_root() / exercise.lab / 'README.md')))}")
    check = f"plscale exercise check {exercise.name}" + (f" --dir {folder}" if folder != DEFAULT_DIR else "")
    console.print(f"grade it: {escape(check)}")


@app.command("check")
def check(name: Annotated[str, typer.Argument(help="The exercise (plscale exercise list).")],
          file: Annotated[Path | None, typer.Option("--file", help="Your file (default: DIR/NAME.py).")] = None,
          folder: Annotated[Path, typer.Option("--dir", help="Where `start` put your file.")] = DEFAULT_DIR,
          timeout: Annotated[float, typer.Option("--timeout", help="Seconds before a hung (deadlocked) run is "
                                                 "stopped.")] = 60.0,
          ) -> None:
    """Run an exercise's checks against your file on CPU ranks over gloo: each property pass or FAIL with a hint.
    Exit 0 when all pass, 1 when one fails."""
    from plscale.exercises.runner import run_checks

    exercise = find(name)
    file = file or _folder(folder) / f"{exercise.name}.py"
    if file.is_dir():
        raise UserError(f"{file} is a folder: give your exercise file, e.g. --file {file / (exercise.name + '.py')}.")
    if not file.exists():
        how = f"plscale exercise start {exercise.name}" + (f" --dir {folder}" if folder != DEFAULT_DIR else "")
        raise UserError(f"{file} does not exist: start the exercise first ({how}) or give --file PATH.")
    if file.suffix != ".py":
        raise UserError(f"--file {file} is not a Python file (.py): give the file `start` wrote.")
    if timeout <= 0:
        raise UserError(f"--timeout {timeout:g}: give a number of seconds above 0 (default 60).")
    *first, last = map(str, exercise.worlds)
    where = "1 CPU process" if exercise.worlds == (1,) else f"{', '.join(first)} and {last} CPU ranks (gloo)"
    console.print(f"[bold]{exercise.name}[/]: checking {escape(str(file))} on {where}")
    try:
        with Progress() as show:
            result = run_checks([(exercise, file)], timeout=timeout, progress=show)[0]
    except KeyboardInterrupt:  # the ranks are already stopped (run_checks kills them on the way out)
        console.print("[yellow]stopped (Ctrl-C)[/]: no check result recorded.")
        raise typer.Exit(130) from None
    show_result(result)
    progress.record(exercise, file, result.passed)
    if not result.passed:
        raise typer.Exit(1)


def show_result(result) -> None:
    """Each check as pass / FAIL / TODO / skip (not run), a failure's detail and hint; then the count."""
    for c in result.checks:
        if c.passed:
            console.print(f"  [green]pass[/]  {escape(c.name)}", highlight=False)
        elif c.status == "skipped":
            console.print(f"  [dim]skip  {escape(c.name)}[/]", highlight=False)
        elif c.status == "not run":
            console.print(f"  [yellow]skip[/]  {escape(c.name)}: [yellow]{escape(c.detail)}[/]", highlight=False,
                          soft_wrap=True)
        elif c.status == "todo":
            console.print(f"  [yellow]TODO[/]  {escape(c.name)}: [yellow]{escape(c.detail)}[/]", highlight=False)
        else:
            console.print(f"  [bold red]FAIL[/]  {escape(c.name)}", highlight=False)
            console.print(f"        {escape(c.detail)}", highlight=False, soft_wrap=True)
            if c.hint:
                console.print(f"        [dim]hint:[/] {escape(c.hint)}", highlight=False, soft_wrap=True)
    if result.problem:
        console.print(f"[bold red]stopped:[/] {escape(result.problem)}", highlight=False, soft_wrap=True)
    passed = sum(c.passed for c in result.checks)
    if result.problem and not result.checks:
        console.print("No check ran: fix that, then check again.")
    elif result.problem:
        console.print(f"{passed} of {len(result.checks)} checks pass on every rank count: fix what stopped the run, "
                      f"then check again.")
    elif result.passed:
        console.print(f"[bold green]All {passed} checks pass[/]: {result.exercise.name} is done.")
    elif result.not_implemented and passed == 0:
        console.print(f"0 of {len(result.checks)} checks pass: not implemented yet: "
                      f"{', '.join(result.not_implemented)}.")
    else:
        console.print(f"{passed} of {len(result.checks)} checks pass: fix the first FAIL, then check again.")
