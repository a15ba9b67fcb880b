"""Which samples each rank sees: shard the dataset across ranks, reshuffle every epoch.

    epoch e:  order = permutation(n, seed + e), padded to a multiple of N by repeating
              its first samples, then rank r takes order[r], order[r + N], order[r + 2N], ...

Every sample lands on exactly one rank, except the few padding repeats (at most N - 1)
that keep the ranks in step: with unequal shards one rank would wait forever in an
all-reduce the others never join. Evaluation must not count those repeats twice
(plscale/strategies/data_parallel/gather.py). The same contract as torch.utils.data.DistributedSampler.
"""

import torch

from plscale.errors import UserError


class ShardedSampler:
    def __init__(self, n: int, world_size: int, rank: int, seed: int = 0, shuffle: bool = True):
        if n < world_size:
            raise UserError(f"{n} samples cannot be shared by {world_size} ranks (each rank needs at least "
                            f"one): use more samples or fewer ranks (--gpus).")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self.n, self.world_size, self.rank, self.seed, self.shuffle = n, world_size, rank, seed, shuffle
        self.epoch = 0
        self.per_rank = -(-n // world_size)           # ceil(n / N): every rank the same count
        self.padding = self.per_rank * world_size - n

    def set_epoch(self, epoch: int) -> None:
        """A new permutation each epoch, the same one on every rank (same seed)."""
        self.epoch = epoch

    def order(self) -> torch.Tensor:
        """The epoch's global order (all ranks), padding included."""
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(self.n)
        return torch.cat([order, order[:self.padding]])

    def indices(self) -> torch.Tensor:
        return self.order()[self.rank::self.world_size]

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.per_rank
