"""Distributed init that works under the deepspeed launcher and torchrun, on GPUs (NCCL)
and on CPUs (gloo, DS_ACCELERATOR=cpu)."""

import importlib
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


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
