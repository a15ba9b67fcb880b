"""The `plscale` command. Host-side only: nothing here imports torch or deepspeed at start-up."""

import sys

import typer
from rich.markup import escape

from plscale import __version__
from plscale.cli import bench, ckpt, config, course, doctor, estimate, exercise, lab, mesh, plan, report, runpod, slides, slurm, stacks, viz
from plscale.cli.output import make_console
from plscale.errors import UserError

app = typer.Typer(help="Hands-on labs for LLM parallelism, backed by DeepSpeed.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(lab.app, name="lab")
app.add_typer(config.app, name="config")
app.add_typer(estimate.app, name="estimate")
app.add_typer(bench.app, name="bench")
app.add_typer(viz.app, name="viz")
app.add_typer(exercise.app, name="exercise")
app.add_typer(ckpt.app, name="ckpt")
app.add_typer(runpod.app, name="runpod")
app.add_typer(slurm.app, name="slurm")
app.add_typer(slides.app, name="slides")
app.command("doctor")(doctor.doctor)
app.command("report")(report.report)
app.command("mesh")(mesh.mesh)
app.command("plan")(plan.plan)
app.command("course")(course.course)
app.command("stacks")(stacks.stacks)


def _version(value: bool) -> None:
    if value:
        print(f"plscale {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                        help="Print the version and exit.")) -> None:
    """Hands-on labs for LLM parallelism, backed by DeepSpeed."""


def main() -> None:
    try:
        app()
    except UserError as exc:
        make_console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
