"""Distributed init that works under the deepspeed launcher and torchrun, on GPUs (NCCL)
and on CPUs (gloo, DS_ACCELERATOR=cpu)."""

import importlib
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


# torch 2.13 renamed the tensor forms of all-gather and reduce-scatter (the old names warn)
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def _skip_shm_build() -> None:
    """DeepSpeed builds its shared-memory op (~30 s) at start-up, but only inference
    all-reduce uses it: training on CPU does not need it."""
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    if hasattr(comm_torch, "build_shm_op"):
        comm_torch.build_shm_op = lambda: None


def device_type() -> str:
    """"cuda" when a GPU is visible and DeepSpeed is not told to use the CPU, else "cpu"."""
    cuda = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu"
    return "cuda" if cuda else "cpu"


def restart_count() -> int:
    """How many times torchrun has restarted the worker group before this attempt (0 when
    not under torchrun, or on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0) or 0)


def _init_elastic(backend: str, cuda: bool) -> None:
    """Under torchrun, the default process group over fresh store keys for each attempt.

    torchrun's agent hosts one TCPStore at MASTER_ADDR:MASTER_PORT and keeps it across
    `--max-restarts` restarts: a restarted group reads the dead attempt's keys (gloo's peer
    addresses) and fails or hangs in connectFullMesh. A PrefixStore named after
    TORCHELASTIC_RESTART_COUNT gives each attempt its own keys; deepspeed.init_distributed
    then adopts the group. The store is made as torch's env:// rendezvous makes it.
    """
    from deepspeed.constants import default_pg_timeout  # deepspeed's timeout, as it would use

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):  # the agent hosts the store
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=default_pg_timeout)
    else:
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=default_pg_timeout,
                              multi_tenant=True)
    store = dist.PrefixStore(f"plscale_attempt_{restart_count()}", store)
    kwargs = {}
    if cuda and world_size > 1:  # as DeepSpeed binds the device for NCCL
        kwargs["device_id"] = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=default_pg_timeout, **kwargs)


def init() -> Dist:
    cuda = device_type() == "cuda"
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
        if threads:
            torch.set_num_threads(threads)
    import deepspeed

    backend = "nccl" if cuda else "gloo"
    if not cuda:
        _skip_shm_build()
    if "TORCHELASTIC_RESTART_COUNT" in os.environ and not dist.is_initialized():
        _init_elastic(backend, cuda)
    deepspeed.init_distributed(dist_backend=backend)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def gathered(mine, group=None) -> list:
    """Every rank's `mine` (anything picklable), in rank order, on every rank of `group`."""
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return everyone
