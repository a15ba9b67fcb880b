"""The hand-written ring and naive all-reduce against torch.distributed.all_reduce, on real
processes over gloo (world sizes 2, 3, 4), for sizes not divisible by N and every dtype gloo
all-reduces: float32, float64, float16, bfloat16, int8, uint8, int32, int64."""

import json
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from plscale.strategies.collectives.naive import naive_all_reduce
from plscale.strategies.collectives.ring import ring_all_reduce

WORLDS = (2, 3, 4)
DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
SHAPES = [(1,), (2,), (3,), (5,), (7,), (12,), (13,), (1001,), (4099,), (6, 7), (3, 5, 11)]  # float32
FEW_SHAPES = [(7,), (13,), (3, 5, 11)]  # the other dtypes (each message costs a round trip)
# Values small enough that every partial sum is exact in every dtype (bfloat16 holds integers
# up to 256 exactly): the ring, the naive scheme and gloo add in different orders, yet must agree
# bit for bit.
LIMIT = {"bfloat16": 60, "int8": 30, "uint8": 60}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _integers(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    limit = LIMIT.get(dtype, 500)
    low = 0 if dtype == "uint8" else -limit
    return torch.randint(low, limit + 1, shape, generator=g).to(getattr(torch, dtype))


def _worker(rank, ports, out_dir):
    """One set of 4 processes (process start-up is the slow part) runs worlds of 2, 3, 4 in turn."""
    torch.set_num_threads(1)
    for world, port in zip(WORLDS, ports):
        if rank < world:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world, timeout=timedelta(seconds=60))
            results = _cases(rank, world)
            (out_dir / f"world{world}_rank{rank}.json").write_text(json.dumps(results))
            dist.barrier()
            dist.destroy_process_group()


def _cases(rank, world):
    results = []
    for dtype in DTYPES:
        for shape in SHAPES if dtype == "float32" else FEW_SHAPES:
            x = _integers(shape, dtype, seed=1000 * rank + len(results))
            library = x.clone()
            dist.all_reduce(library)
            ring, naive = x.clone(), x.clone()
            ring_sent = ring_all_reduce(ring)
            naive_sent = naive_all_reduce(naive)
            results.append({"dtype": dtype, "shape": shape, "numel": x.numel(), "elsize": x.element_size(),
                            "ring_equal": torch.equal(ring, library), "naive_equal": torch.equal(naive, library),
                            "changed": not torch.equal(library, x), "ring_sent": ring_sent,
                            "naive_sent": naive_sent})
    # Gaussian floats: sums in different orders differ by rounding only.
    for dtype, tol in (("float32", 1e-5), ("float64", 1e-12)):
        x = torch.randn(4099, generator=torch.Generator().manual_seed(rank), dtype=getattr(torch, dtype))
        library, ring, naive = x.clone(), x.clone(), x.clone()
        dist.all_reduce(library)
        ring_all_reduce(ring)
        naive_all_reduce(naive)
        results.append({"dtype": dtype, "gauss": True, "tol": tol,
                        "ring_gap": (ring - library).abs().max().item(),
                        "naive_gap": (naive - library).abs().max().item()})
    # A non-contiguous view (a transposed matrix) is summed in place, like dist.all_reduce.
    base = _integers((9, 5), "float32", seed=rank)
    view, library = base.t(), base.t().clone()
    dist.all_reduce(library)
    ring_all_reduce(view)
    results.append({"non_contiguous_equal": torch.equal(view, library)})
    # The hook sees every one of the 2(N-1) steps.
    steps = []
    ring_all_reduce(torch.ones(10), on_step=lambda phase, step: steps.append((phase, step)))
    results.append({"steps": steps})
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """world size -> every rank's results."""
    out_dir = tmp_path_factory.mktemp("ring")
    mp.spawn(_worker, args=([_free_port() for _ in WORLDS], out_dir), nprocs=max(WORLDS), join=True)
    return {world: [json.loads((out_dir / f"world{world}_rank{r}.json").read_text()) for r in range(world)]
            for world in WORLDS}


@pytest.fixture(params=WORLDS, ids=lambda n: f"world{n}")
def parity(request, runs):
    return request.param, runs[request.param]


def test_ring_and_naive_equal_library_bit_for_bit(parity):
    world, ranks = parity
    cases = [c for results in ranks for c in results if "ring_equal" in c]
    assert len(cases) == world * (len(SHAPES) + (len(DTYPES) - 1) * len(FEW_SHAPES))
    assert all(c["changed"] for c in cases if c["numel"] > 0)  # the all-reduce did something
    wrong = [(c["dtype"], c["shape"]) for c in cases if not (c["ring_equal"] and c["naive_equal"])]
    assert not wrong, f"differs from dist.all_reduce for {wrong}"
    odd = {tuple(c["shape"]) for c in cases if c["numel"] % world}
    assert len(odd) >= 5  # most sizes are not divisible by the world size


def test_ring_matches_library_on_gaussian_floats(parity):
    _, ranks = parity
    for results in ranks:
        for c in (c for c in results if c.get("gauss")):
            assert c["ring_gap"] <= c["tol"] and c["naive_gap"] <= c["tol"], c


def test_ring_handles_non_contiguous_tensors_and_reports_each_step(parity):
    world, ranks = parity
    for results in ranks:
        assert next(c for c in results if "non_contiguous_equal" in c)["non_contiguous_equal"]
        steps = next(c for c in results if "steps" in c)["steps"]
        assert steps == [["reduce-scatter", s] for s in range(world - 1)] + \
                        [["all-gather", s] for s in range(world - 1)]


def test_traffic_ring_2_n_minus_1_over_n_naive_n_minus_1_on_rank_0(parity):
    """The lesson's arithmetic, counted: the ring sends 2(N-1)/N * S per rank, every rank alike;
    the naive scheme makes rank 0 send (N-1) * S."""
    world, ranks = parity
    for rank, results in enumerate(ranks):
        for c in (c for c in results if "ring_sent" in c):
            size = c["numel"] * c["elsize"]
            largest_chunk = -(-c["numel"] // world) * c["elsize"]
            if c["numel"] % world == 0:
                assert c["ring_sent"] * world == 2 * (world - 1) * size
            assert c["ring_sent"] <= 2 * (world - 1) * largest_chunk
            assert c["naive_sent"] == ((world - 1) * size if rank == 0 else size)
