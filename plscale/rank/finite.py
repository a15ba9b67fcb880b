"""A NaN caught before it reaches the weights, with the rank it came from.

One rank's bad sample (a corrupted image, a token id past the vocabulary, a division by zero in
its loss) makes its gradient NaN; the all-reduce then averages that NaN into every rank's
gradient and the optimizer writes it into every replica's weights, from where no rank can
tell whose it was. Checked on each rank before the all-reduce and agreed on by all (one tiny
all-gather), the step is skipped everywhere together, so no rank hangs waiting for the others,
and the report names the rank and the step.
"""

import torch
import torch.distributed as dist


def nonfinite(*tensors: torch.Tensor) -> int:
    """How many entries of these tensors are NaN or infinite."""
    return int(sum((~torch.isfinite(t)).sum().item() for t in tensors))


def ranks_with_nonfinite(*tensors: torch.Tensor, group=None) -> dict[int, int]:
    """On every rank: rank -> its count of NaN or infinite entries, for the ranks that have any."""
    mine = torch.tensor([nonfinite(*tensors)], dtype=torch.int64, device=tensors[0].device)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    return {rank: int(n.item()) for rank, n in enumerate(everyone) if n.item()}
