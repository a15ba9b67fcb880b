"""The sharded sampler loses and duplicates nothing across ranks, reshuffles per epoch, and
evaluation gathered over 2 real gloo ranks counts each sample once."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from plscale.errors import UserError
from plscale.strategies.data_parallel.sampler import ShardedSampler


@pytest.mark.parametrize("n,world", [(10, 2), (11, 2), (7, 4), (8, 8), (9, 8), (1000, 3)])
def test_every_sample_once_across_ranks(n, world):
    for epoch in range(3):
        shards = []
        for rank in range(world):
            sampler = ShardedSampler(n, world, rank, seed=5)
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
        assert len({len(s) for s in shards}) == 1                 # the ranks stay in step
        seen = [i for shard in shards for i in shard]
        assert set(seen) == set(range(n))                         # nothing lost
        assert len(seen) - n == (-n) % world < world              # only the padding repeats
        if n % world == 0:
            assert sorted(seen) == list(range(n))                 # nothing duplicated


def test_reshuffles_each_epoch_identically_on_every_rank():
    a, b = ShardedSampler(100, 2, 0, seed=1), ShardedSampler(100, 2, 0, seed=1)
    first = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != first                            # same seed and epoch, same shard
    a.set_epoch(0)
    assert list(a) == first                                       # an epoch's order is reproducible
    assert list(ShardedSampler(100, 2, 0, seed=2)) != first


def test_no_shuffle_is_strided():
    assert list(ShardedSampler(5, 2, 1, shuffle=False)) == [1, 3, 0]


def test_more_ranks_than_samples():
    with pytest.raises(UserError, match="3 samples cannot be shared by 4 ranks"):
        ShardedSampler(3, 4, 0)


def _gather_worker(rank, world, init_file, results):
    import torch.distributed as dist

    from plscale.strategies.data_parallel import gather

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    n = 5
    labels = torch.tensor([1, 0, 1, 1, 0])
    rows = ShardedSampler(n, world, rank, shuffle=False).indices()   # rank 0: 0 2 4, rank 1: 1 3 0
    predictions = torch.tensor([1, 1, 1, 1, 1])[rows]                # right on 0 2 3, wrong on 1 4
    gathered = gather.gather_predictions(rows, predictions, n)
    acc = gather.accuracy(rows, predictions, labels)
    naive = torch.tensor([(predictions == labels[rows]).sum().item(), len(rows)])
    dist.all_reduce(naive)                                           # summing per-rank counts: wrong
    try:
        gather.gather_predictions(rows[:1], predictions[:1], n)      # samples scored by no rank
        lost = "no error"
    except RuntimeError as exc:
        lost = str(exc)
    results[rank] = (gathered.tolist(), acc, naive.tolist(), lost)
    dist.destroy_process_group()


def test_eval_gather_counts_padding_once(tmp_path):
    results = mp.Manager().dict()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_gather_worker, args=(2, str(tmp_path / "init"), results), nprocs=2)
    for rank in range(2):
        gathered, acc, naive, lost = results[rank]
        assert gathered == [1, 1, 1, 1, 1]
        assert acc == pytest.approx(3 / 5)                           # 3 right of 5 reviews
        assert naive == [4, 6]                                       # sample 0 counted twice: 4/6
        assert "of 5 samples were scored by no rank" in lost
