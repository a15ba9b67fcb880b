"""One log per rank: rank 0 writes to the console and rank_0.log, the others only to their
log (so the console stays readable). A crash leaves rank_N.error for the launcher (a
restarted attempt renames the earlier one attemptK_rank_N.error) and the Flight Recorder's
record, flight/rank_N.pkl; a rank the launcher terminates (SIGTERM, after another rank failed)
or that crashes leaves its Python stack in stacks/rank_N.exit.txt. plscale/run/diagnose.py
reads them all."""

import faulthandler
import logging
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

from plscale.errors import UserError


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()

    def isatty(self):
        return False


def setup(run_dir: Path, rank: int) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 1) or 1) - 1
    for stale in (run_dir / f"rank_{rank}.error", run_dir / "flight" / f"rank_{rank}.pkl",
                  run_dir / "stacks" / f"rank_{rank}.exit.txt"):
        if stale.exists():  # an earlier attempt's (torchrun --max-restarts): kept, under another name
            stale.replace(stale.with_name(f"attempt{attempt}_{stale.name}"))
    log = open(run_dir / f"rank_{rank}.log", "a", buffering=1)
    if rank == 0:
        sys.stdout = _Tee(sys.__stdout__, log)
        sys.stderr = _Tee(sys.__stderr__, log)
    else:  # at the file-descriptor level, so C++ and library output lands there too
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    stacks_on_signal(run_dir, rank)

    def excepthook(kind, value, tb):
        text = "".join(traceback.format_exception(kind, value, tb))
        (run_dir / f"rank_{rank}.error").write_text(text)
        if "torch.distributed" in sys.modules and not issubclass(kind, UserError):
            try:  # which collectives this rank had issued: the other half of a timeout's story
                from plscale.rank import flight

                flight.dump(run_dir, rank)
            except Exception:
                pass
        if issubclass(kind, UserError):
            print(f"error: {value}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(value.exit_code)
        sys.__excepthook__(kind, value, tb)
        sys.stderr.flush()
        os._exit(1)  # do not hang in collectives the other ranks will never join

    sys.excepthook = excepthook


STACKS_SIGNAL = signal.SIGUSR1


def stacks_on_signal(run_dir: Path, rank: int) -> None:
    """`plscale stacks RUN`: on SIGUSR1 this rank appends every thread's Python stack to
    stacks/rank_N.txt (faulthandler: C-level, so it answers even inside a hung collective);
    pids/rank_N says where to send it."""
    for folder in ("stacks", "pids"):
        (run_dir / folder).mkdir(exist_ok=True)
    out = open(run_dir / "stacks" / f"rank_{rank}.txt", "a", buffering=1)
    faulthandler.register(STACKS_SIGNAL, file=out, all_threads=True, chain=False)
    # where the rank was when it ended: terminated by the launcher after another rank failed (then it
    # dies as before), or crashed (SIGABRT, SIGSEGV...); plscale/run/diagnose.py reads it
    at_exit = open(run_dir / "stacks" / f"rank_{rank}.exit.txt", "w", buffering=1)
    faulthandler.register(signal.SIGTERM, file=at_exit, all_threads=True, chain=True)
    faulthandler.enable(file=at_exit, all_threads=True)
    (run_dir / "pids" / f"rank_{rank}").write_text(f"{os.getpid()} {socket.gethostname()}\n")
