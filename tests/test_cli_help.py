"""Every command's --help: a boolean flag is shown bare, an option that takes a value with its type."""

from typer.main import get_command
from typer.testing import CliRunner

from plscale.cli.main import app


def _commands(command, path=()):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_flags_take_no_value_in_help():
    runner = CliRunner()
    paths = list(_commands(get_command(app)))
    assert len(paths) > 20
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, f"plscale {' '.join(path)} --help shows a flag with a value"
    shown = runner.invoke(app, ["lab", "run", "--help"], env={"COLUMNS": "200"}).output
    dry_run = next(line for line in shown.splitlines() if "--dry-run" in line and "Print" in line)
    steps = next(line for line in shown.splitlines() if "--steps" in line)
    assert "<" not in dry_run and "<int>" in steps
