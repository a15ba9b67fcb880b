"""Context parallelism through DeepSpeed gives the dense model's GRADIENTS, not only its loss:
cp 2 x dp 2 on 4 gloo ranks, two micro-batches a step, ZeRO stages 0-2, ring attention and
Ulysses. Under Adam a gradient scaled by a constant (summed over cp where it should not be,
or averaged where it should be summed) leaves the loss curve nearly unchanged, so this test
steps plain SGD at lr 1: each weight then moves by exactly its reduced gradient, which must be
the dense model's on the same four micro-batches."""

import pytest
import torch

from helpers.ranks import run_ranks
from plscale.predict.presets import ModelConfig

CP, WORLD, B, S, ACCUM = 2, 4, 2, 16, 2
CONFIG = ModelConfig(vocab=96, hidden=32, layers=2, heads=4, kv_heads=2, ffn=48, max_seq=32)
CASES = [(attention, split, stage) for attention, split in (("ring", "zigzag"), ("ulysses", "plain"))
         for stage in (0, 1, 2)]


def _one_step(mesh, attention, split, stage, data):
    """(largest gap of any weight's move to the dense gradient, relative to that gradient's
    largest entry; norm of all moves / norm of the dense gradient)."""
    import deepspeed

    from plscale.strategies.context_parallel.llama import ContextParallelLlama, split_batch
    from plscale.rank.mesh import MegatronMPU
    from plscale.rank.models.llama import Llama

    dp, replica, me = mesh.size("dp"), mesh.rank_in("dp"), mesh.rank_in("cp")
    torch.manual_seed(0)
    dense = Llama(CONFIG)
    (sum(dense(d[:, :-1], d[:, 1:]) for r in range(dp) for d in data[r]) / (dp * ACCUM)).backward()
    model = ContextParallelLlama(CONFIG, mesh.group("cp"), attention, split)
    model.load_state_dict(dense.state_dict())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ds = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": ACCUM,
          "train_batch_size": B * ACCUM * dp, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
          "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), config=ds,
                                      mpu=MegatronMPU(mesh))
    for d in data[replica]:
        engine.backward(engine(*split_batch(d[:, :-1], d[:, 1:], CP, me, split)))
        engine.step()
    gaps, moved, want = [], 0.0, 0.0
    for (name, p), q in zip(model.named_parameters(), dense.parameters()):
        step = before[name] - p.detach()
        gaps.append(((step - q.grad).abs().max() / q.grad.abs().max()).item())
        moved, want = moved + step.pow(2).sum().item(), want + q.grad.pow(2).sum().item()
    return max(gaps), (moved / want) ** 0.5


def _setup():
    import deepspeed

    from plscale.rank.distributed import _skip_shm_build

    _skip_shm_build()
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)


def _cases(rank, world):
    from plscale.rank.mesh import Mesh

    mesh = Mesh.build(cp=CP, dims=("tp", "cp", "dp", "dp-cp", "pp"))
    data = torch.randint(0, CONFIG.vocab, (mesh.size("dp"), ACCUM, B, S + 1), generator=torch.Generator().manual_seed(3))
    return {" ".join(map(str, case)): _one_step(mesh, *case, data) for case in CASES}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    got = run_ranks(_cases, (WORLD,), tmp_path_factory.mktemp("cp_deepspeed"), _setup)
    return [got[(WORLD, r)] for r in range(WORLD)]


@pytest.mark.parametrize("case", [" ".join(map(str, c)) for c in CASES])
def test_deepspeed_steps_with_the_dense_gradient(results, case):
    for rank, got in enumerate(results):
        gap, ratio = got[case]
        # float32 weights minus float32 steps: a few 1e-4 of rounding; a wrong scale is 0.5x or 2x
        assert abs(ratio - 1) <= 1e-4 and gap <= 5e-3, (case, rank, gap, ratio)
