"""`plscale ckpt`: list, verify and convert the checkpoints a run wrote.

Host side: listing and verifying read manifests and checksums only (plscale.ckpt.store);
torch and DeepSpeed are imported by `convert`, and only when it runs.
"""

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from plscale.ckpt import store
from plscale.cli.output import console
from plscale.errors import UserError, did_you_mean

app = typer.Typer(help="List, verify and convert checkpoints.", no_args_is_help=True)

TARGETS = ("universal", "fp32")
PATH_HELP = "A checkpoint folder (the one holding `latest`), or a run directory with checkpoints/ in it."


def checkpoint_root(path: Path) -> Path:
    """The checkpoint folder a user pointed at: PATH itself, or PATH/checkpoints in a run directory."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} does not exist: give a checkpoint folder (the one holding `latest`) "
                        f"or a run directory with checkpoints/ in it.")
    if not path.is_dir():
        raise UserError(f"{path} is a file: give the checkpoint folder that holds `latest`.")
    if not (path / store.LATEST).is_file() and (path / "checkpoints").is_dir():
        return path / "checkpoints"
    return path


def _state(entry: store.Entry) -> str:
    if entry.valid:
        return "[green]valid[/]"
    more = f" (+{len(entry.problems) - 1} more)" if len(entry.problems) > 1 else ""
    return f"[red]{escape(entry.problems[0])}{more}[/]"


def _kind(manifest: dict) -> str:
    kind = manifest.get("kind", "?")
    return f"delta of {manifest['base']}" if kind == "delta" and manifest.get("base") else kind


@app.command("ls")
def ls(path: Path = typer.Argument(..., help=PATH_HELP)) -> None:
    """List the checkpoints in a folder, newest first: what each is, its size, and whether it is whole."""
    root = checkpoint_root(path)
    items, latest = store.entries(root), store.latest_tag(root)
    if latest is None and not any(e.manifest for e in items):  # e.g. a run directory without checkpoints
        raise UserError(f"{root} holds no checkpoints: give the folder that holds `latest` "
                        f"(a run's checkpoints/ folder).")
    table = Table(title=f"checkpoints in {escape(str(root))}", title_justify="left")
    for column in ("", "tag", "step", "kind", "tier", "strategy", "ranks", "stage", "MiB", "state"):
        table.add_column(column, justify="right" if column in ("step", "ranks", "stage", "MiB") else "left",
                         overflow="fold")
    for e in items:
        m = e.manifest or {}
        table.add_row("[bold]latest[/]" if e.tag == latest else "", e.tag, str(e.step), _kind(m),
                      str(m.get("tier", "")), str(m.get("strategy", "")), str(m.get("world_size", "")),
                      str(m.get("stage", "")), f"{e.bytes / 2**20:,.1f}", _state(e))
    console.print(table)
    tags = {e.tag for e in items}
    if latest is None:
        console.print(f"[yellow]no `latest` file in {root}[/]: nothing here would be resumed from.")
    elif latest not in tags:
        console.print(f"[red]`latest` names {latest}, which is not here.[/]")
    else:
        _fallback(items, latest)


def _fallback(items: list[store.Entry], latest: str) -> None:
    """When `latest` is damaged, say which checkpoint a restore would use instead."""
    newest = next(e for e in items if e.tag == latest)
    if newest.valid:
        return
    good = next((e for e in items if e.valid and e.step <= newest.step), None)
    console.print(f"[yellow]{latest} is damaged[/]: a restore uses "
                  + (f"{good.tag}, the newest whole checkpoint." if good else "none: no checkpoint is whole."))


@app.command("verify")
def verify(
    path: Path = typer.Argument(..., help=PATH_HELP),
    tag: str = typer.Option(None, help="Check this checkpoint only (default: all of them)."),
) -> None:
    """Check every file of every checkpoint against its manifest's size and SHA-256.

    Exit 0 when all are whole, 1 when any is not (each problem printed), 2 on bad input.
    """
    root = checkpoint_root(path)
    items = store.open_root(root)
    latest = store.latest_tag(root)
    if tag is not None:
        found = {e.tag for e in items}
        if tag not in found:
            raise UserError(f"No checkpoint {tag!r} in {root}.{did_you_mean(tag, found)} "
                            f"It has: {', '.join(sorted(found)) or 'none'}.")
        items = [e for e in items if e.tag == tag]
    bad = 0
    for e in items:
        if e.valid:
            files = len((e.manifest or {}).get("files", {}))
            console.print(f"[green]ok[/]  {e.tag}: {files} files match their manifest")
            continue
        bad += 1
        for problem in e.problems:
            console.print(f"[red]BAD[/] {e.tag}: {escape(problem)}", soft_wrap=True)
    if tag is None and latest not in {e.tag for e in items}:
        bad += 1
        console.print(f"[red]BAD[/] latest: names {latest}, which is not here")
    elif tag is None:
        _fallback(items, latest)
    whole = sum(e.valid for e in items)
    console.print(f"{whole} of {len(items)} checkpoint(s) whole in {escape(str(root))}")
    if bad:
        raise typer.Exit(1)


@app.command("convert")
def convert(
    path: Path = typer.Argument(..., help=PATH_HELP),
    to: str = typer.Option(..., "--to", help="universal: DeepSpeed's universal checkpoint (load it at any rank "
                                             "count with DSSpec(load_universal=True)); fp32: one state dict."),
    tag: str = typer.Option(None, help="The checkpoint to convert (default: the one `latest` names)."),
    out: Path = typer.Option(None, help="universal: the folder to write (default PATH-universal); fp32: the file "
                                        "(default PATH-TAG-fp32.pt beside the checkpoint folder)."),
    safetensors: bool = typer.Option(False, "--safetensors", help="fp32: write .safetensors, not torch.save."),
) -> None:
    """Convert a checkpoint: to DeepSpeed's universal format, or to one consolidated fp32 state dict."""
    if to not in TARGETS:
        raise UserError(f"--to {to!r}: use universal or fp32.{did_you_mean(to, TARGETS)}")
    if safetensors and to != "fp32":
        raise UserError("--safetensors is for --to fp32: a universal checkpoint is DeepSpeed's own files.")
    root = checkpoint_root(path)
    from plscale.ckpt import convert as converter  # torch and DeepSpeed, only now

    if to == "universal":
        written = converter.to_universal(root, tag, out)
        size = store.folder_bytes(written)
        console.print(f"wrote {escape(str(written))} ({size / 2**20:,.1f} MiB, sealed with a manifest; `latest` and "
                      f"`latest_universal` name it). Load it at any rank count with "
                      f'"checkpoint": {{"load_universal": true}} (DSSpec(load_universal=True)).', soft_wrap=True)
    else:
        written = converter.to_fp32(root, tag, out, safetensors)
        mib = written.stat().st_size / 2**20
        console.print(f"wrote {escape(str(written))} ({mib:,.1f} MiB): the model's fp32 state dict from "
                      f"{escape(str(root))}/{tag or store.latest_tag(root)}.", soft_wrap=True)
