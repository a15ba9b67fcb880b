"""Follow a submitted job from the login node: its state while it waits, rank 0's output once it
runs (the job's output file, shown as `plscale lab run` shows its ranks), and how it ended.

    final = follow(job_id, run_dir, console)   # returns when Slurm says the job ended
    exit_code = outcome(final, run_dir, console)  # the summary, or what failed; the command's exit code

Ctrl-C raises KeyboardInterrupt out of `follow` and leaves the job alone: the CLI asks whether
to scancel it.
"""

import os
import time
from pathlib import Path

from rich.console import Console

from plscale.run import runner
from plscale.slurm import jobs, script

POLL_S = 1.0          # while the job runs: rank 0's lines as they come
PENDING_POLL_S = 5.0  # while it has waited PATIENT_S: a shared controller is asked less often
PATIENT_S = 30.0      # (a job that starts at once is seen to run, however short it is)
PATIENCE_S = 120.0    # how long a controller that does not answer is waited for


class Watch:
    """The job's output file, read as it grows, while Slurm says the job is active."""

    def __init__(self, job: str, output: Path, console: Console, poll_s: float = POLL_S):
        self.job, self.output, self.console, self.poll_s = job, output, console, poll_s
        self.final: jobs.JobState | None = None

    def _state(self) -> jobs.JobState | None:
        """The job's state; a controller that does not answer is asked again for PATIENCE_S."""
        deadline = time.time() + PATIENCE_S
        while True:
            try:
                return jobs.state(self.job)
            except jobs.Unreachable:
                if time.time() > deadline:
                    raise
                time.sleep(self.poll_s)

    def lines(self):
        offset, partial, said, since = 0, "", None, time.time()
        while True:
            now = self._state()
            status = (now.state, now.reason) if now else None
            if status != said and now and not now.finished:
                where = f" on {now.nodes}" if now.nodes else ""
                why = f" ({now.reason})" if now.reason not in ("None", "") else ""
                self.console.print(f"job {self.job}: {now.state}{where}{why}", highlight=False)
                said = status
            ended = now is None or now.finished
            if ended:
                time.sleep(self.poll_s)  # the file's last lines may reach a shared filesystem after the state does
            text, offset = _read_from(self.output, offset)
            partial += text
            *complete, partial = partial.split("\n")
            for line in complete:
                yield line + "\n"
            if ended:
                if partial and not partial.startswith(runner.PROGRESS):  # a progress line cut short: dropped
                    yield partial + "\n"
                self.final = now
                return
            waited = now.state == "PENDING" and time.time() - since > PATIENT_S
            time.sleep(PENDING_POLL_S if waited else self.poll_s)


def _read_from(path: Path, offset: int) -> tuple[str, int]:
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size < offset:  # requeued, the file begun anew
                offset = 0
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return "", offset
    return data.decode(errors="replace"), offset + len(data)


def follow(job: str, run_dir: Path, console: Console, poll_s: float = POLL_S) -> jobs.JobState | None:
    """Show the job until it ends; its final state (None once Slurm has forgotten it)."""
    watch = Watch(job, script.output_file(run_dir, job), console, poll_s)
    runner.show(watch.lines(), console)
    return watch.final


HINTS = {
    "TIMEOUT": "It ran past its --time: give it more (plscale slurm submit ... --time 2:00:00), or fewer --steps.",
    "OUT_OF_MEMORY": "A node ran out of host memory for the job: ask for more with --sbatch=--mem=64G (or "
                     "--sbatch=--mem=0 for the whole node, where the cluster allows it).",
    "NODE_FAIL": "A node failed under the job: submit it again (`sinfo -R` shows why nodes are down).",
    "PREEMPTED": "A job of higher priority took its nodes: submit it again, or ask the admins for a QOS that is "
                 "not preempted.",
}


def outcome(final: jobs.JobState | None, run_dir: Path, console: Console) -> int:
    """The summary of a job that completed, else how it ended and what failed; its exit code."""
    from plscale.run import flow

    if final is None:
        console.print(f"Slurm no longer knows this job; its run directory: {run_dir}")
        return 0 if (run_dir / "summary.json").is_file() else 1
    if final.state == "COMPLETED":
        flow.report(run_dir, console)
        return 0
    state = final.state.split()[0]
    code = {"CANCELLED": 130, "TIMEOUT": 124}.get(state, final.exit_code or 1)
    signal = f", signal {final.signal}" if final.signal and state not in ("OUT_OF_MEMORY", "TIMEOUT") else ""
    console.print(f"[bold red]job {final.id} ended {final.state}[/] (exit code {final.exit_code}{signal}, "
                  f"after {final.elapsed})" + (f": {final.reason}" if final.reason not in ("None", "") else ""),
                  highlight=False)
    if state in HINTS:
        console.print(HINTS[state], highlight=False)
    if state == "CANCELLED":
        return code
    if (run_dir / "summary.json").is_file():
        flow.report(run_dir, console)
    runner.report_failure(run_dir, code, console, script.output_file(run_dir, final.id).name)
    return code
