"""Follow a submitted job from the login node: its state while it waits, rank 0's output once it
runs (the job's output file, shown as `plscale lab run` shows its ranks), and how it ended.

    final = follow(job_id, run_dir, console)   # returns when Slurm says the job ended
    exit_code = outcome(final, run_dir, console)  # the summary, or what failed; the command's exit code

Ctrl-C raises KeyboardInterrupt out of `follow` and leaves the job alone: the CLI asks whether
to scancel it.
"""

import time
from pathlib import Path

from rich.console import Console

from plscale.run import runner
from plscale.slurm import jobs

POLL_S = 1.0


class Watch:
    """The job's output file, read as it grows, while Slurm says the job is active."""

    def __init__(self, job: str, output: Path, console: Console, poll_s: float = POLL_S):
        self.job, self.output, self.console, self.poll_s = job, output, console, poll_s
        self.final: jobs.JobState | None = None

    def lines(self):
        offset, partial, said = 0, "", None
        while True:
            now = jobs.state(self.job)
            status = (now.state, now.reason) if now else None
            if status != said and now and not now.finished:
                where = f" on {now.nodes}" if now.nodes else ""
                why = f" ({now.reason})" if now.reason not in ("None", "") else ""
                self.console.print(f"job {self.job}: {now.state}{where}{why}", highlight=False)
                said = status
            if now is None or now.finished:
                time.sleep(self.poll_s)  # the file's last lines may reach a shared filesystem after the state does
            text, offset = _read_from(self.output, offset)
            partial += text
            *complete, partial = partial.split("\n")
            for line in complete:
                yield line + "\n"
            if now is None or now.finished:
                if partial:
                    yield partial + "\n"
                self.final = now
                return
            time.sleep(self.poll_s)


def _read_from(path: Path, offset: int) -> tuple[str, int]:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return "", offset
    return data.decode(errors="replace"), offset + len(data)


def output_of(job: str, run_dir: Path) -> Path:
    return Path(run_dir) / f"slurm-{job}.out"


def follow(job: str, run_dir: Path, console: Console, poll_s: float = POLL_S) -> jobs.JobState | None:
    """Show the job until it ends; its final state (None once Slurm has forgotten it)."""
    watch = Watch(job, output_of(job, run_dir), console, poll_s)
    runner.show(watch.lines(), console)
    return watch.final


def outcome(final: jobs.JobState | None, run_dir: Path, console: Console) -> int:
    """The summary of a job that completed, else how it ended and what failed; its exit code."""
    from plscale.run import flow

    if final is None:
        console.print(f"Slurm no longer knows this job; its run directory: {run_dir}")
        return 0 if (run_dir / "summary.json").is_file() else 1
    if final.state == "COMPLETED":
        flow.report(run_dir, console)
        return 0
    code = {"CANCELLED": 130, "TIMEOUT": 124}.get(final.state.split("+")[0], final.exit_code or 1)
    console.print(f"[bold red]job {final.id} ended {final.state}[/] (exit code {final.exit_code}"
                  + (f", signal {final.signal}" if final.signal else "") + f", after {final.elapsed})"
                  + (f": {final.reason}" if final.reason not in ("None", "") else ""), highlight=False)
    if final.state == "TIMEOUT":
        console.print("It ran past its --time: give it more (plscale slurm submit ... --time 2:00:00) or fewer --steps.")
    if final.state.startswith("CANCELLED"):
        return code
    if (run_dir / "summary.json").is_file():
        flow.report(run_dir, console)
    runner.report_failure(run_dir, code, console, output_of(final.id, run_dir).name)
    return code
