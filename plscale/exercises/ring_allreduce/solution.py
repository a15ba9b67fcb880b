"""Reference solution of the ring-allreduce exercise (the task: skeleton.py). Not copied by
`plscale exercise start`; plscale/strategies/collectives/ring.py is the lab's version of the same ring."""

import torch
import torch.distributed as dist


def exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
    """Send `send` to rank `dst` while receiving into `recv` from rank `src`, and wait for both."""
    ops = [dist.P2POp(dist.isend, send.contiguous(), dst), dist.P2POp(dist.irecv, recv, src)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def ring_all_reduce(tensor: torch.Tensor) -> None:
    """Sum `tensor` over all ranks, in place: reduce-scatter, then all-gather, over `exchange`."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    chunks = tensor.view(-1).tensor_split(n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):  # reduce-scatter: add what arrives, pass the sum on
        out, into = (rank - step) % n, (rank - step - 1) % n
        arrived = torch.empty_like(chunks[into])
        exchange(chunks[out], right, arrived, left)
        chunks[into].add_(arrived)
    for step in range(n - 1):  # all-gather: pass the finished sums on, overwriting
        out, into = (rank + 1 - step) % n, (rank - step) % n
        exchange(chunks[out], right, chunks[into], left)
