"""Distributed init that works under the deepspeed launcher and torchrun, on GPUs (NCCL)
and on CPUs (gloo, DS_ACCELERATOR=cpu)."""

import importlib
import os
import random
import sys
import types
from dataclasses import dataclass
from datetime import timedelta

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


MUON = ("deepspeed.runtime.zero.muon.original_muon", "deepspeed.runtime.zero.muon.muon_optimizer")


class _Deferred(types.ModuleType):
    """A stand-in for one of DeepSpeed's Muon modules (MUON) until something uses Muon: its optimizer
    class is one no optimizer is an instance of, and building one, or calling any of the module's
    functions, imports the real modules first (and hands the call to them)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "MuonWithAuxAdam":
            return _NotLoadedMuon
        return lambda *args, **kwargs: getattr(_load_muon(self.__name__), name)(*args, **kwargs)


class _NotLoadedMuon:
    """Never an optimizer's class (DeepSpeed asks isinstance(optimizer, MuonWithAuxAdam)); building
    one builds the real MuonWithAuxAdam."""

    def __new__(cls, *args, **kwargs):
        return _load_muon(MUON[1]).MuonWithAuxAdam(*args, **kwargs)


def _load_muon(name: str):
    for module in MUON:
        if isinstance(sys.modules.get(module), _Deferred):
            del sys.modules[module]
    return importlib.import_module(name)


def _defer_muon() -> None:
    """DeepSpeed's ZeRO optimizers import its Muon optimizer at their first step (to ask whether the
    optimizer is Muon), and that import compiles Muon's kernels with torch.compile: 2.2 s a rank at
    every launch on this machine's CPUs, before the first step's work. The labs train with AdamW:
    Muon's modules are stand-ins until something uses Muon (_Deferred), which then loads them."""
    for name in MUON:
        sys.modules.setdefault(name, _Deferred(name))


def device_type() -> str:
    """"cuda" when a GPU is visible and DeepSpeed is not told to use the CPU, else "cpu"."""
    cuda = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu"
    return "cuda" if cuda else "cpu"


def restart_count() -> int:
    """How many times torchrun has restarted the worker group before this attempt (0 when
    not under torchrun, or on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0) or 0)


def _init_elastic(backend: str, cuda: bool, timeout: timedelta) -> None:
    """Under torchrun, the default process group over fresh store keys for each attempt.

    torchrun's agent hosts one TCPStore at MASTER_ADDR:MASTER_PORT and keeps it across
    `--max-restarts` restarts: a restarted group reads the dead attempt's keys (gloo's peer
    addresses) and fails or hangs in connectFullMesh. A PrefixStore named after
    TORCHELASTIC_RESTART_COUNT gives each attempt its own keys; deepspeed.init_distributed
    then adopts the group. The store is made as torch's env:// rendezvous makes it.
    """
    from deepspeed.constants import default_pg_timeout  # the store waits for slow starters as DeepSpeed would

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
                            timeout=timeout, **kwargs)


FLIGHT_RECORDER_ENTRIES = "2000"  # collectives each process group remembers (torchtitan keeps 20000 on GPUs)


def init(timeout_s: float | None = None, debug: str | None = None) -> Dist:
    """The default process group. `timeout_s`: how long a collective may wait for the other
    ranks before it raises (DeepSpeed's 30 minutes unless told); `debug`: torch's
    TORCH_DISTRIBUTED_DEBUG level (DETAIL checks every collective's type and shapes across the
    ranks before running it). The Flight Recorder is on: each group keeps a ring of its last
    collectives (sequence number, op, sizes, Python stack), which plscale.rank.logs dumps when a
    rank fails and `plscale stacks` asks for (plscale.rank.flight)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)
    if debug is False:  # `--set dist.debug=OFF`: YAML reads OFF as false
        debug = "OFF"
    if debug:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = str(debug).upper()
        dist.set_debug_level_from_env()
    cuda = device_type() == "cuda"
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
        if threads:
            torch.set_num_threads(threads)
    import deepspeed
    from deepspeed.constants import default_pg_timeout

    timeout = timedelta(seconds=timeout_s) if timeout_s else default_pg_timeout
    backend = "nccl" if cuda else "gloo"
    if not cuda:
        _skip_shm_build()
    _defer_muon()
    if "TORCHELASTIC_RESTART_COUNT" in os.environ and not dist.is_initialized():
        _init_elastic(backend, cuda, timeout)
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
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
