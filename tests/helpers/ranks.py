"""Tests on real processes: gloo ranks on this machine, each rank's results back as JSON.

    def _cases(rank, world):             # module level: spawned processes import it
        ...                              # collectives over the default group
        return {"gap": 0.0}

    results = run_ranks(_cases, (2, 4), tmp_path)    # {(world, rank): {"gap": 0.0}}

One spawn of max(worlds) processes; for each world size the ranks below it join a fresh gloo
group, run `setup()` (if given) and the cases, write their JSON, and leave the group.
"""

import json
import os
import socket
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank, cases, worlds, ports, out_dir, setup):
    os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    for world, port in zip(worlds, ports):
        if rank < world:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=timedelta(seconds=120))
            if setup:
                setup()
            (Path(out_dir) / f"world{world}_rank{rank}.json").write_text(json.dumps(cases(rank, world)))
            dist.barrier()
            dist.destroy_process_group()


def run_ranks(cases, worlds, out_dir, setup=None) -> dict:
    ports = [free_port() for _ in worlds]
    mp.start_processes(_worker, args=(cases, worlds, ports, str(out_dir), setup), nprocs=max(worlds),
                       start_method="spawn")
    return {(w, r): json.loads((Path(out_dir) / f"world{w}_rank{r}.json").read_text())
            for w in worlds for r in range(w)}
