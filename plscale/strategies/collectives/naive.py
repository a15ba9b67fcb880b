"""The naive all-reduce: everyone sends everything to rank 0, rank 0 adds and sends the sum
back to everyone. Same result as the ring, but rank 0 sends and receives (N-1) * S bytes,
so its link is the bottleneck and the time grows with N; the ring's does not."""

import torch
import torch.distributed as dist

from plscale.strategies.collectives.ring import receive_buffer


def naive_all_reduce(tensor: torch.Tensor) -> int:
    """Sum `tensor` over all ranks, in place, through rank 0. Returns the bytes this rank sent."""
    n, rank = dist.get_world_size(), dist.get_rank()
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    size = work.numel() * work.element_size()
    if rank == 0:
        inbox = receive_buffer(work, work.numel()).view_as(work)
        for src in range(1, n):      # reduce: one full tensor from every rank
            dist.recv(inbox, src)
            work.add_(inbox)
        for dst in range(1, n):      # broadcast: the full sum to every rank
            dist.send(work, dst)
        sent = (n - 1) * size
    else:
        dist.send(work, 0)
        dist.recv(work, 0)
        sent = size
    if work.data_ptr() != tensor.data_ptr():
        tensor.copy_(work)
    return sent
