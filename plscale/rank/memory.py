"""Memory per rank: allocator peaks on GPUs, resident set size on CPUs (MiB)."""

import resource

import torch
import torch.distributed as dist

from plscale.predict.units import MiB


def local_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MiB
    with open("/proc/self/statm") as statm:  # resident pages now
        return int(statm.read().split()[1]) * resource.getpagesize() / MiB


def per_rank_mib(device: torch.device) -> list[float]:
    """Every rank's figure, gathered (one small all-gather)."""
    mine = torch.tensor([local_mib(device)], dtype=torch.float64, device=device)
    if not dist.is_initialized():
        return [mine.item()]
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [round(t.item(), 1) for t in out]
