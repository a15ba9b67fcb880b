"""Slurm's own commands, as plscale calls them: sbatch, scontrol, squeue, sacct and scancel.

    check(text)        sbatch --test-only: Slurm's refusal (a partition, an account, GPUs a node
                       lacks) as a UserError, before anything is written or submitted
    submit(path)       sbatch --parsable: the job id
    state(job)         the job as the controller knows it (scontrol, then sacct once it is purged)
    queue()            plscale's jobs in the queue (squeue --me)
    cancel(job)        scancel

No accounting database is needed: scontrol knows a finished job for MinJobAge (300 s by
default), sacct after that where the cluster keeps accounting; past both, `state` is None.
"""

import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

from plscale.errors import UserError
from plscale.files import read_json

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
PREFIX = "plscale-"  # every job plscale submits is named plscale-<lab>-<variant>


class Unreachable(UserError):
    """scontrol failed for another reason than an unknown job: the controller is down or busy."""


class JobState(NamedTuple):
    id: str
    state: str            # Slurm's JobState: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str           # why it waits, or why it ended (None: nothing to say)
    exit_code: int        # the batch script's exit status
    signal: int           # the signal that ended it, 0 if none
    nodes: str            # the node list, once it has nodes
    elapsed: str
    name: str
    stdout: str           # the output file (run_dir/slurm-<id>.out for plscale's jobs)

    @property
    def finished(self) -> bool:
        return self.state not in ACTIVE

    @property
    def run_dir(self) -> Path | None:
        return Path(self.stdout).parent if self.stdout and self.name.startswith(PREFIX) else None


def require(command: str = "sbatch") -> str:
    found = shutil.which(command)
    if not found:
        raise UserError(f"{command} is not on PATH: run plscale on the cluster's login node (or `module load slurm` "
                        f"first); --dry-run prints the script without Slurm.")
    return found


def _call(argv: list, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Unreachable(f"{argv[0]} did not answer in {timeout:.0f} s: is the Slurm controller up? (`scontrol ping`)")


def refusal(text: str) -> str:
    """Slurm's message, shortened to its first error line without the `sbatch: error: ` prefix."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines or ["(no message)"]
    return errors[0].split("error:", 1)[-1].strip()


def check(text: str) -> None:
    """Ask Slurm whether it would take this script (sbatch --test-only submits nothing)."""
    done = _call([require(), "--test-only"], stdin=text)
    if done.returncode != 0:
        why = refusal(done.stderr or done.stdout)
        hint = ("this partition has no such GPUs: pick a GPU partition with --partition (`sinfo -o \"%P %G\"`), "
                "name the GPU type with --gpu-type, or run CPU ranks with --cpu" if "gres" in why.lower() else
                "check --partition, --account, --gpus, --cpus-per-node and --time against `sinfo`; --dry-run shows "
                "the script")
        raise UserError(f"Slurm refuses the job: {why} ({hint}).")


def submit(path: Path) -> str:
    done = _call([require(), "--parsable", str(path)])
    if done.returncode != 0:
        raise UserError(f"Slurm refuses the job: {refusal(done.stderr or done.stdout)}")
    return done.stdout.strip().split(";")[0]  # "<id>" or "<id>;<cluster>"


def state(job: str) -> JobState | None:
    """The job as Slurm knows it; None once neither the controller nor accounting knows it."""
    done = _call([require("scontrol"), "show", "job", "-o", str(job)])
    if done.returncode != 0 and "invalid job id" not in (done.stderr + done.stdout).lower():
        raise Unreachable(f"scontrol show job {job}: {refusal(done.stderr or done.stdout)} (is the controller up? "
                          f"`scontrol ping`)")
    if done.returncode == 0 and done.stdout.strip():
        fields = dict(item.partition("=")[::2] for item in done.stdout.split())
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        return JobState(fields.get("JobId", str(job)), fields.get("JobState", "UNKNOWN"),
                        fields.get("Reason", "None"), int(code or 0), int(sig or 0),
                        _nodes(fields.get("NodeList", "")), fields.get("RunTime", ""), fields.get("JobName", ""),
                        fields.get("StdOut", ""))
    return _accounted(job)


def _nodes(text: str) -> str:
    return "" if text in ("(null)", "None") else text


def _accounted(job: str) -> JobState | None:
    """A job the controller has forgotten, from the accounting database, where there is one."""
    if not shutil.which("sacct"):
        return None
    done = _call(["sacct", "-j", str(job), "-X", "-n", "-P", "-o", "JobID,State,Reason,ExitCode,NodeList,Elapsed,JobName"])
    rows = [line.split("|") for line in done.stdout.splitlines() if line.count("|") == 6]
    if done.returncode != 0 or not rows:
        return None
    job_id, status, reason, exit_code, nodes, elapsed, name = rows[0]
    code, _, sig = exit_code.partition(":")
    return JobState(job_id, status.split()[0], reason, int(code or 0), int(sig or 0), _nodes(nodes), elapsed, name, "")


def queue() -> list:
    """plscale's jobs of this user in Slurm's queue: (id, name, state, elapsed, nodes, reason or node list)."""
    done = _call([require("squeue"), "--me", "-h", "-o", "%i|%j|%T|%M|%D|%R"])
    if done.returncode != 0:
        raise UserError(f"squeue failed: {refusal(done.stderr)}")
    rows = [line.split("|") for line in done.stdout.splitlines() if line.count("|") == 5]
    return [row for row in rows if row[1].startswith(PREFIX)]


def cancel(job: str) -> None:
    done = _call([require("scancel"), str(job)])
    if done.returncode != 0:
        raise UserError(f"scancel {job}: {refusal(done.stderr)}")


def find_run_dir(job: str, runs: Path) -> Path | None:
    """The run directory of a plscale job: from Slurm while it knows the job, else the slurm.json
    that `submit` left in a run directory under `runs`."""
    known = state(job)
    if known and known.run_dir:
        return known.run_dir
    for record in sorted(Path(runs).glob("*/slurm.json")):
        if str(read_json(record).get("job")) == str(job):
            return record.parent
    return None


def mount_type(path: Path) -> str:
    """The filesystem type of the mount holding `path` (/proc/mounts; "" where there is none)."""
    path = os.path.realpath(path)
    best, kind = "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3:
            point = parts[1].replace("\\040", " ")
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, parts[2]
    return kind


LOCAL = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "ramfs", "devtmpfs", "vfat",
         "exfat", "squashfs"}


def describe() -> str:
    """One line for `plscale doctor`: the Slurm here, and whether its controller answers."""
    if not shutil.which("sbatch"):
        return "no sbatch: `plscale slurm` runs on a Slurm cluster's login node (docs/slurm.md)"
    try:
        version = _call(["sbatch", "--version"], timeout=5).stdout.strip()
        ping = _call(["scontrol", "ping"], timeout=10).stdout
    except Unreachable:
        return "sbatch found, but Slurm does not answer in time (`scontrol ping`)"
    if " is UP" not in ping:
        return f"{version or 'sbatch found'}, but no controller answers (`scontrol ping`): check SLURM_CONF"
    return f"{version or 'sbatch found'}, controller up: plscale slurm submit LAB (docs/slurm.md)"
