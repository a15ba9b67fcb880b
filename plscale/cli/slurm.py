"""`plscale slurm`: run the labs on a Slurm cluster from its login node.

`submit` resolves the lab as `plscale lab run` does, writes the run directory and its sbatch
script (plscale/slurm/script.py), asks Slurm whether it takes the job before anything is
written, submits it and follows it to its summary. `status`, `logs` and `cancel` find a job by
its id or its run directory. docs/slurm.md is the guide.
"""

import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli.output import console
from plscale.errors import UserError
from plscale.files import read_json, write_json
from plscale.lab.rundir import new_run_dir, runs_root, write_inputs
from plscale.run import flow, runner
from plscale.slurm import follow, jobs, script

app = typer.Typer(help="Run the labs on a Slurm cluster: submit, follow, status, logs, cancel.", no_args_is_help=True)
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
JOB_HELP = "A job id, or the run directory of a job plscale submitted."
# `plscale lab run` flags a Slurm job decides itself: its nodes find each other through the rendezvous.
DECIDED = {"hostfile": "--hostfile", "node_rank": "--node-rank", "master_port": "--master-port"}
# Slurm's --time forms (sbatch(1)): minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S; each count from 0 up.
TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite", re.IGNORECASE)
# sbatch options plscale sets itself, and how to change them instead.
_GPUS = "use --gpus (per node) and --gpu-type"
OWN = {"--output": "the job's output goes into the run directory", "--error": "the job's output goes into the run "
       "directory", "--job-name": "it names the job after the lab and variant", "--chdir": "the job starts in this "
       "folder", "--nodes": "use --nodes", "--ntasks": "one task a node: use --nodes", "--ntasks-per-node": "one task "
       "a node: use --nodes", "--gpus": _GPUS, "--gpus-per-node": _GPUS, "--gpus-per-task": _GPUS, "--gres": _GPUS,
       "--cpus-per-task": "use --cpus-per-node", "--partition": "use --partition", "--account": "use --account",
       "--time": "use --time", "--array": "one run a job: submit again for another", "--export": "the job keeps the "
       "environment plscale sets", "--clusters": "submit from that cluster's login node", "--requeue": "a run again "
       "is a new run directory: submit again", "--no-requeue": "a run again is a new run directory"}


@app.command(context_settings=PASS_THROUGH)
def submit(ctx: typer.Context, lab: str = typer.Argument(..., help="A lab, as for `plscale lab run`."),
           partition: str = typer.Option(None, help="Slurm partition (default: the cluster's)."),
           account: str = typer.Option(None, help="Slurm account to charge."),
           time_limit: str = typer.Option(None, "--time", help="Time limit, in Slurm's form (30, 1:00:00, 1-00:00); "
                                          "default: three times the lab's CPU minutes, at least 10 minutes."),
           gpu_type: str = typer.Option(None, "--gpu-type", help="The GPUs' type as the cluster names it (a100, h100; "
                                        "`sinfo -o \"%P %G\"`)."),
           cpus_per_node: int = typer.Option(None, "--cpus-per-node", help="CPUs for each node's ranks (default: one "
                                             "per CPU rank, four per GPU)."),
           venv: Path = typer.Option(None, help="Virtualenv to activate on the nodes (default: the one plscale runs in)."),
           conda: str = typer.Option(None, help="Or a conda environment to activate on the nodes."),
           preamble: Path = typer.Option(None, help="A file of shell lines the job runs first (module load ...)."),
           sbatch: list[str] = typer.Option([], "--sbatch", help="More sbatch options, e.g. --sbatch=--qos=high "
                                            "--sbatch=--mem=64G (repeatable)."),
           shared: bool = typer.Option(False, "--shared", help="The run directory, the labs and the environment are on "
                                       "a filesystem the nodes see, whatever its type says."),
           detach: bool = typer.Option(False, "--detach", help="Submit and return (`plscale slurm logs JOB -f` follows)."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print the sbatch script; submit nothing."),
           ) -> None:
    """Submit a lab: `plscale slurm submit zero2 --nodes 2 --gpus 8 --partition gpu --time 1:00:00`
    (`plscale lab run`'s flags pass through: --gpus, --nodes, --cpu, --steps, --set, --data-dir, ...)."""
    request = flow.parse(["lab", "run", lab, *ctx.args], prog="plscale slurm submit")
    _check_options(request, venv, conda, preamble, cpus_per_node, sbatch, time_limit)
    opts = request.opts
    opts.scheduler = "slurm"
    the_lab, chosen = flow.choose(request.name, request.variant, data_dir=opts.data_dir)
    plan, resolved = flow.prepare(the_lab, chosen, opts)
    job = script.Job(name=f"{jobs.PREFIX}{the_lab.id}-{chosen.name}",
                     time=time_limit or _default_time(the_lab.cpu_minutes),
                     cpus_per_node=cpus_per_node or plan.ranks * (4 if plan.device == "cuda" else 1),
                     partition=partition, account=account, sbatch=list(sbatch),
                     preamble=preamble.read_text() if preamble else "", venv=str(venv) if venv else None,
                     conda=conda, gpu_type=gpu_type)
    runs = runs_root()
    named = plan.at(new_run_dir(the_lab.id, chosen.name, runs, create=False))
    if dry_run:
        console.print(script.render(named, job), markup=False, highlight=False, soft_wrap=True)
        return
    jobs.require()
    _check_what_nodes_see(runs, plan, venv, shared)
    if plan.device == "cuda" and not conda:
        _check_cuda_torch(venv)
    jobs.check(script.render(named, job))
    run_dir = new_run_dir(the_lab.id, chosen.name, runs)
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C now could leave a job without its run directory
    try:
        plan = plan.at(run_dir)
        write_inputs(run_dir, plan, resolved, ["plscale", *sys.argv[1:]], started_by="sbatch job.sbatch  # "
                     "one torchrun a node: the script in this folder")
        (run_dir / "job.sbatch").write_text(script.render(plan, job))
        job_id = jobs.submit(run_dir / "job.sbatch")
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing submitted: no run directory left behind
        raise
    finally:
        signal.signal(signal.SIGINT, interrupt)
    write_json(run_dir / "slurm.json", {"job": job_id, "name": job.name, "nodes": plan.nodes, "ranks": plan.ranks,
                                        "device": plan.device, "script": "job.sbatch"})
    console.print(f"[bold]{the_lab.id}[/] / {chosen.name}: {escape(plan.notice)}")
    console.print(f"Submitted job {job_id}; run directory: {run_dir}", soft_wrap=True)
    if detach:
        console.print(f"Follow it with `plscale slurm logs {job_id} -f`; `plscale slurm status {job_id}`, "
                      f"`plscale slurm cancel {job_id}`.")
        return
    raise typer.Exit(_follow(job_id, run_dir))


def _check_options(request, venv, conda, preamble, cpus_per_node, sbatch, time_limit) -> None:
    """What `submit` refuses in the options themselves, before the lab is resolved."""
    opts = request.opts
    for dest, flag in DECIDED.items():
        if getattr(opts, dest) is not None:
            raise UserError(f"{flag}: a Slurm job picks its nodes and port itself (torchrun's rendezvous on the first "
                            f"node); drop {flag}.")
    if opts.master_addr != "127.0.0.1":
        raise UserError("--master-addr: a Slurm job's rendezvous is on its first node; drop --master-addr.")
    if request.sweep or request.layout:
        raise UserError("--sweep and --layout run on this machine's CPU ranks: submit one variant at a time.")
    if venv and conda:
        raise UserError("--venv and --conda: name one environment for the nodes.")
    if venv and not (venv / "bin" / "activate").is_file():
        raise UserError(f"--venv {venv}: no bin/activate there; give the virtualenv's folder (python -m venv DIR).")
    if preamble and not preamble.is_file():
        raise UserError(f"--preamble {preamble} is not a file: write the lines the job runs first into one.")
    if time_limit is not None and not TIME.fullmatch(time_limit.strip()):
        raise UserError(f"--time {time_limit!r}: give Slurm's form: minutes (30), MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                        f"D-HH:MM:SS (1-00:00) or UNLIMITED.")
    if cpus_per_node is not None and cpus_per_node < 1:
        raise UserError(f"--cpus-per-node {cpus_per_node}: use 1 or more.")
    for option in sbatch:
        name = option.split("=", 1)[0]
        if not option.startswith("--"):
            raise UserError(f"--sbatch {option!r}: give sbatch's long option with its value, e.g. --sbatch=--qos=high.")
        if name in OWN:
            raise UserError(f"--sbatch {option}: plscale sets {name} itself ({OWN[name]}).")


def _default_time(cpu_minutes: float) -> str:
    minutes = max(10, math.ceil(3 * cpu_minutes))
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _check_what_nodes_see(runs: Path, plan, venv: Path | None, shared: bool) -> None:
    """The compute nodes read the lab's code, the environment and the run directory from here: each must be
    on a filesystem they see, and its path one sbatch takes (no spaces, no %)."""
    runs.mkdir(parents=True, exist_ok=True)
    paths = {"the run directory's folder": runs.resolve(), "the labs": Path(plan.entry).resolve().parents[1],
             "the environment": (venv or Path(sys.prefix)).resolve(), "this folder (the job's --chdir)": Path.cwd()}
    for what, path in paths.items():
        if any(c.isspace() or c == "%" for c in str(path)):
            raise UserError(f"{what.capitalize()}, {path}, has a space or a % in its path, which sbatch's options "
                            f"split or expand: use a path without them.")
        kind = jobs.mount_type(path)
        if kind in jobs.LOCAL and not shared:
            raise UserError(f"{what.capitalize()}, {path}, is on this machine's own disk ({kind}), and the job runs "
                            f"on compute nodes that must read it: put it on a shared filesystem (NFS, Lustre, your "
                            f"cluster's home or scratch; PLSCALE_RUNS_DIR for runs), or add --shared if it is shared.")


def _check_cuda_torch(venv: Path | None) -> None:
    """GPU ranks need a CUDA build of torch in the environment the job activates."""
    python = str(venv / "bin" / "python") if venv else sys.executable
    try:
        done = subprocess.run([python, "-c", "import torch; print(torch.version.cuda or '')"], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"Could not ask {python} for its torch ({exc}): check --venv.")
    if done.returncode != 0:
        raise UserError(f"{python} has no torch: install plscale into it (make setup), or name another with --venv.")
    if not done.stdout.strip():
        raise UserError(f"The job's environment ({python}) has a CPU-only torch, so its GPU ranks would run on CPUs: "
                        f"install the CUDA build (make clean && make setup TORCH_INDEX="
                        f"https://download.pytorch.org/whl/cu126), or run CPU ranks with --cpu.")


def _follow(job_id: str, run_dir: Path) -> int:
    """Follow the job to its end; on Ctrl-C, ask whether to cancel it. The exit code to leave with."""
    try:
        return follow.outcome(follow.follow(job_id, run_dir, console), run_dir, console)
    except KeyboardInterrupt:
        console.print()
        try:
            cancel_it = typer.confirm(f"Cancel job {job_id} (scancel)?", default=False)
        except (typer.Abort, EOFError):
            cancel_it = False
        if not cancel_it:
            console.print(f"Job {job_id} goes on: `plscale slurm logs {job_id} -f` follows it again, "
                          f"`plscale slurm cancel {job_id}` stops it.")
            return 130
        jobs.cancel(job_id)
        final = _wait_ended(job_id)
        console.print(f"Job {job_id}: {final.state if final else 'cancelled'}.")
        return 130


def _wait_ended(job_id: str, wait_s: float = 60):
    deadline = time.time() + wait_s
    while True:
        now = jobs.state(job_id)
        if now is None or now.finished or time.time() > deadline:
            return now
        time.sleep(0.5)


def _job(ref: str) -> tuple[str, Path | None]:
    """A job id and its run directory, from either."""
    path = Path(ref)
    if (path / "slurm.json").is_file():
        return str(read_json(path / "slurm.json")["job"]), path.resolve()
    if not ref.isdigit():
        raise UserError(f"{ref!r} is neither a job id nor a run directory plscale submitted (one with slurm.json): "
                        f"see `plscale slurm status` for the jobs.")
    jobs.require("scontrol")
    return ref, jobs.find_run_dir(ref, runs_root())


@app.command()
def status(job: str = typer.Argument(None, help=JOB_HELP + " Default: every plscale job in the queue.")) -> None:
    """A job's state, where it runs, how far rank 0 is; without JOB, plscale's jobs in the queue."""
    if job is None:
        rows = jobs.queue()
        if not rows:
            console.print("No plscale job in Slurm's queue (a finished one: plscale slurm status JOB).")
            return
        table = Table("job", "name", "state", "elapsed", "nodes", "node list / reason", title="plscale's Slurm jobs",
                      title_justify="left")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    job_id, run_dir = _job(job)
    now = jobs.state(job_id)
    if now is None and run_dir is None:
        raise UserError(f"Slurm knows no job {job_id}, and no run directory under {runs_root()} names it: see "
                        f"`plscale slurm status` for the jobs in the queue.")
    if now is None:
        console.print(f"Slurm no longer knows job {job_id}. Its run directory: {run_dir}", soft_wrap=True)
    else:
        console.print(f"job {job_id} ({now.name}): [bold]{now.state}[/]"
                      + (f" on {now.nodes}" if now.nodes else "")
                      + (f" ({now.reason})" if now.reason not in ("None", "") else "")
                      + (f", {now.elapsed}" if now.elapsed else "")
                      + (f", exit code {now.exit_code}" if now.finished else ""), highlight=False)
    if run_dir:
        progress = _last_progress(script.output_file(run_dir, job_id))
        if progress:
            console.print(f"rank 0: {progress}", highlight=False)
        console.print(f"run directory: {run_dir}"
                      + ("  (plscale report reads it)" if (run_dir / "summary.json").is_file() else ""), soft_wrap=True)


def _last_progress(output: Path) -> str:
    try:
        lines = output.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for info in filter(None, map(runner.progress_of, reversed(lines))):
        return f"{info.get('phase', 'train')} {info['step']}/{info['total']} {info.get('text', '')}".rstrip()
    return ""


@app.command()
def logs(job: str = typer.Argument(..., help=JOB_HELP),
         follow_it: bool = typer.Option(False, "--follow", "-f", help="Keep following until the job ends."),
         lines: int = typer.Option(50, "--lines", "-n", min=1, help="How many of the last lines."),
         rank: int = typer.Option(None, help="This rank's log (rank_R.log) instead of the job's output.")) -> None:
    """The job's output (every node's torchrun and rank 0), or one rank's log; -f follows the job to its end."""
    job_id, run_dir = _job(job)
    if run_dir is None:
        raise UserError(f"No run directory found for job {job_id}: give the run directory instead (plscale slurm logs "
                        f"runs/...).")
    if follow_it:
        raise typer.Exit(_follow(job_id, run_dir))
    path = run_dir / f"rank_{rank}.log" if rank is not None else script.output_file(run_dir, job_id)
    if not path.is_file():
        raise UserError(f"{path} is not written yet: the job may still be pending (plscale slurm status {job_id}).")
    text = [line for line in path.read_text(errors="replace").splitlines() if not line.startswith(runner.PROGRESS)]
    console.print("\n".join(text[-lines:]), markup=False, highlight=False)


@app.command()
def cancel(job: str = typer.Argument(..., help=JOB_HELP)) -> None:
    """Cancel a job (scancel) and wait until Slurm says it ended."""
    job_id, _ = _job(job)
    now = jobs.state(job_id)
    if now is None:
        raise UserError(f"Slurm knows no job {job_id}: see `plscale slurm status` for the jobs in the queue.")
    if not now.name.startswith(jobs.PREFIX):
        raise UserError(f"Job {job_id} ({now.name}) is not one plscale submitted: cancel it with `scancel {job_id}` "
                        f"if you mean to.")
    jobs.cancel(job_id)
    final = _wait_ended(job_id)
    console.print(f"Job {job_id}: {final.state if final else 'ended'}.")
