"""The Flight Recorder's record of this rank, written into the run directory.

torch keeps, in every process group, a ring of its last collectives (TORCH_FR_BUFFER_SIZE
entries, set by plscale.rank.distributed.init): each one's sequence number in its group, op,
tensor sizes, state and the Python stack that issued it. A hang is ranks disagreeing on that
sequence: one rank waits in collective #7 while another never issued it, or issued a barrier
as its #7. The record says which, where NCCL and gloo only say "timed out".

    flight/rank_N.pkl     this rank's record, as torch dumps it (a pickle of plain data), written
                          when the rank fails (plscale.rank.logs)
    flight/live/rank_N.pkl  the same, each time `plscale stacks` asks
    issued_between(a, b)  the collectives of a profiled step, whose group the trace's events lack
                          (plscale.rank.profile, plscale.rank.trace)
    ask_rank_N            a FIFO in the temporary directory (plscale.lab.rundir.asking_dir: a run
                          directory holds plain files only, it is copied and synced): whoever
                          writes to it gets a fresh flight/live/rank_N.pkl

The host reads them (plscale/run/diagnose.py) and runs torch's own analyser on them
(python -m torch.distributed.flight_recorder.fr_trace, as torchtitan's docs/debugging.md does).
Asking through a FIFO, answered by a thread, works while the main thread is blocked inside a
collective, where a Python signal handler would never run.
"""

import os
import pickle
import threading
from pathlib import Path


def _record() -> bytes | None:
    """This rank's record as torch dumps it (a pickle of plain data); None without a process group
    or a torch without the dump. NCCL keeps its own recorder (the one its watchdog dumps on a
    timeout), gloo the generic one."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    name = "_dump_nccl_trace" if dist.get_backend() == "nccl" else "_dump_fr_trace"
    dumper = getattr(torch._C._distributed_c10d, name, None)
    return None if dumper is None else dumper(includeCollectives=True, onlyActive=False)


def dump(run_dir: Path, rank: int, folder: str = "flight") -> bool:
    """Write this rank's record into `folder` of the run directory (flight/ when it fails,
    flight/live/ when asked); False when there is none (no process group, or a torch without the
    recorder's dump: it is private API, checked on torch 2.13)."""
    record = _record()
    if record is None:
        return False
    folder = Path(run_dir) / folder
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".rank_{rank}.pkl"
    tmp.write_bytes(record)
    tmp.replace(folder / f"rank_{rank}.pkl")  # whole or not at all: the host may be reading
    return True


def issued_between(start_ns: int, end_ns: int) -> list[dict] | None:
    """This rank's collectives issued between two wall-clock times (time.time_ns(), the recorder's
    clock), in the order issued: op, group, sequence number, sizes. None without a recorder.
    Checked on gloo; the NCCL recorder's dump is read the same way, not yet run here."""
    record = _record()
    if record is None:
        return None
    entries = pickle.loads(record).get("entries", [])
    return [{"op": e["profiling_name"], "group": list(e["process_group"]), "seq": e["collective_seq_id"],
             "sizes": e["input_sizes"]} for e in sorted(entries, key=lambda e: e["record_id"])
            if start_ns <= e["time_created_ns"] <= end_ns]


def answer_requests(run_dir: Path, rank: int) -> Path | None:
    """A daemon thread that dumps the record each time someone writes to this rank's FIFO; the FIFO."""
    from plscale.lab.rundir import asking_dir

    fifo = asking_dir(run_dir) / f"ask_rank_{rank}"
    try:
        fifo.parent.mkdir(parents=True, exist_ok=True)
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
    except OSError:  # no FIFOs here: the record is still dumped when the rank fails
        return None

    def serve() -> None:
        while True:
            with open(fifo, "rb") as asked:  # blocks (without the GIL) until a writer comes
                asked.read()
            try:
                dump(run_dir, rank, "flight/live")
            except Exception:  # a dump must never take the rank down
                pass

    threading.Thread(target=serve, name="plscale-flight-recorder", daemon=True).start()
    return fifo
