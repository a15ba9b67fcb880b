"""Versions and hardware of a run, for system.json."""

import os
import platform
import socket

import torch


def describe(backend: str, world_size: int) -> dict:
    info = {
        "host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
        "platform": platform.platform(), "cpu_cores": os.cpu_count(), "backend": backend,
        "world_size": world_size, "omp_threads": torch.get_num_threads(),
    }
    try:
        import deepspeed
        info["deepspeed"] = deepspeed.__version__
    except ImportError:
        info["deepspeed"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update({"cuda": torch.version.cuda, "gpu": props.name,
                     "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                     "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
    return info
