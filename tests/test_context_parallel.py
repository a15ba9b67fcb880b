"""Context parallelism against dense attention, on real processes over gloo at cp 2 and cp 4.

Ring attention (plain and zig-zag splits, causal or not, grouped-query heads) and
DeepSpeed-Ulysses give the output and gradients of full attention on the whole sequence; the
context-parallel Llama gives the dense loss and gradients. All in float64, so only the order
of summation differs (tolerance 1e-10). Ring attention's tally is checked against the lab's
predictions: the work per rank against `attention_work` (the zig-zag balance), the bytes
against the block count, and the saved activations against the dense model at s/cp tokens."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.ranks import run_ranks
from plscale.predict.context_parallel import attention_work
from plscale.predict.presets import ModelConfig

WORLDS = (2, 4)
B, S, D = 2, 16, 8          # S cuts into 2 cp chunks at cp 4
CONFIG = ModelConfig(vocab=96, hidden=32, layers=2, heads=8, kv_heads=4, ffn=48, max_seq=32)
RING_CASES = {  # name: (split, causal, heads, kv_heads, kernel of each chunk pair)
    "plain causal gqa": ("plain", True, 4, 2, "fused"),
    "zigzag causal gqa": ("zigzag", True, 4, 2, "fused"),
    "zigzag full gqa": ("zigzag", False, 4, 2, "fused"),
    "zigzag causal mha": ("zigzag", True, 4, 4, "fused"),
    "plain causal gqa, math": ("plain", True, 4, 2, "math"),
    "zigzag causal gqa, math": ("zigzag", True, 4, 2, "math"),
}
MODEL_CASES = {"ring zigzag": ("ring", "zigzag"), "ring plain": ("ring", "plain"), "ulysses": ("ulysses", "plain")}
TOL = 1e-10


def _gap(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def _attention_gaps(attend, local, heads, kv_heads, causal, seed) -> list[float]:
    """Largest gaps of (out, dq, dk, dv) between `attend` on this rank's tokens `local` and
    SDPA on the whole sequence, under a random output gradient."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, heads, S, D, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, kv_heads, S, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in "kv")
    grad = torch.randn(B, heads, S, D, generator=g, dtype=torch.float64)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads != kv_heads)
    full.backward(grad)
    mine = [t.detach()[:, :, local].clone().requires_grad_() for t in (q, k, v)]
    out = attend(*mine)
    out.backward(grad[:, :, local])
    return [_gap(out, full.detach()[:, :, local])] + [_gap(m.grad, t.grad[:, :, local]) for m, t in zip(mine, (q, k, v))]


def _cases(rank, world):
    from plscale.predict.context_parallel import positions
    from plscale.rank.census import saved_activations
    from plscale.strategies.context_parallel import ring_attention as ring, ulysses
    from plscale.strategies.context_parallel.llama import ContextParallelLlama, split_batch
    from plscale.rank.mesh import Mesh
    from plscale.rank.models.llama import Llama

    mesh = Mesh.build(cp=world, dims=("cp",))
    group, out = mesh.group("cp"), {}

    for name, (split, causal, heads, kv_heads, kernel) in RING_CASES.items():
        pos = positions(S, world, rank, split)
        ring.TALLY.reset()
        out[f"ring {name}"] = _attention_gaps(lambda q, k, v: ring.ring_attention(q, k, v, group, pos, causal, kernel),
                                              torch.tensor(pos), heads, kv_heads, causal, seed=len(name))
        out[f"ring {name} tally"] = ring.TALLY.rows()

    plain = torch.tensor(positions(S, world, rank, "plain"))
    ulysses.TALLY.reset()
    out["ulysses"] = _attention_gaps(lambda q, k, v: ulysses.ulysses_attention(q, k, v, group),
                                     plain, 8, 4, True, seed=1)
    out["ulysses tally"] = {phase: list(v) for (_, phase), v in ulysses.TALLY.rows().items()}
    try:
        ulysses.ulysses_attention(*(torch.zeros(B, h, S // world, D) for h in (8, 1, 1)), group)
        out["ulysses indivisible heads"] = "no error"
    except ValueError as error:
        out["ulysses indivisible heads"] = str(error)

    # The whole model against the dense one: loss, gradients, saved activations
    torch.manual_seed(0)
    dense = Llama(CONFIG).double()
    batch = torch.randint(0, CONFIG.vocab, (B, S + 1), generator=torch.Generator().manual_seed(2))
    tokens, targets = batch[:, :-1], batch[:, 1:]
    dense(tokens, targets).backward()
    with saved_activations() as saved:  # own tensors, as split_batch gives: a slice would count the whole batch
        dense(tokens[:, :S // world].clone(), targets[:, :S // world].clone())
    out["dense saved bytes at s/cp"] = saved.bytes
    for name, (attention, split) in MODEL_CASES.items():
        model = ContextParallelLlama(CONFIG, group, attention, split).double()
        model.load_state_dict(dense.state_dict())
        ring.TALLY.reset()
        with saved_activations() as saved:
            loss = model(*split_batch(tokens, targets, world, rank, split))
        out[f"model {name} saved bytes"] = saved.bytes
        loss.backward()
        out[f"model {name} forward bytes"] = ring.TALLY.sent_bytes["forward"]
        total = loss.detach().clone()  # the ranks' shares add up to the loss
        dist.all_reduce(total, group=group)
        out[f"model {name} loss"] = abs(total.item() - dense(tokens, targets).item())
        gaps = []
        for p, want in zip(model.parameters(), dense.parameters()):
            dist.all_reduce(p.grad, group=group)
            gaps.append(_gap(p.grad, want.grad))
        out[f"model {name} grads"] = max(gaps)
    return out


def _setup():
    import deepspeed

    from plscale.rank.distributed import _skip_shm_build

    _skip_shm_build()
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)  # Ulysses talks through it


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(_cases, WORLDS, tmp_path_factory.mktemp("context_parallel"), _setup)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", [f"ring {name}" for name in RING_CASES] + ["ulysses"])
def test_attention_equals_full_attention(results, world, case):
    for r in range(world):
        gaps = dict(zip(("output", "dq", "dk", "dv"), results[(world, r)][case]))
        assert max(gaps.values()) <= TOL, f"{case} at cp {world}, rank {r}: {gaps}"


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", RING_CASES)
def test_ring_work_is_the_predicted_triangle(results, world, name):
    """Scores evaluated, counted from the blocks and masks computed, per sequence and head:
    attention_work's, forward and again in the backward's recomputation. Zig-zag: all equal."""
    split, causal, *_ = RING_CASES[name]
    want = attention_work(S, world, split, causal)
    for phase in ("forward", "backward"):
        got = [results[(world, r)][f"ring {name} tally"][phase]["scores"] for r in range(world)]
        assert got == want, phase
    if split == "zigzag":
        assert len(set(want)) == 1


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", RING_CASES)
def test_ring_bytes_are_the_block_count(results, world, name):
    """Forward (cp - 1) x k, v; backward (cp - 1) x k, v, dk, dv plus dk, dv home: in blocks of
    batch x s/cp x kv_heads x head_dim x 8 bytes (float64)."""
    kv_heads = RING_CASES[name][3]
    block = B * S // world * kv_heads * D * 8
    for r in range(world):
        tally = results[(world, r)][f"ring {name} tally"]
        assert (tally["forward"]["sends"], tally["forward"]["sent_bytes"]) == (2 * (world - 1), 2 * (world - 1) * block)
        assert (tally["backward"]["sends"], tally["backward"]["sent_bytes"]) == (4 * world - 2, (4 * world - 2) * block)


@pytest.mark.parametrize("world", WORLDS)
def test_ulysses_tally_and_heads(results, world):
    """Four all-to-alls each way (q, k, v in; the output back), each the whole local tensor;
    heads that do not divide by P are refused with a clear message."""
    q_bytes, kv_bytes = B * S // world * 8 * D * 8, B * S // world * 4 * D * 8
    want = [4, 2 * q_bytes + 2 * kv_bytes]
    for r in range(world):
        assert results[(world, r)]["ulysses tally"] == {"backward": want, "forward": want}
        assert "divisible by" in results[(world, r)]["ulysses indivisible heads"]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", MODEL_CASES)
def test_model_equals_dense(results, world, name):
    for r in range(world):
        got = results[(world, r)]
        assert got[f"model {name} loss"] <= TOL and got[f"model {name} grads"] <= TOL, (r, got)
        if name.startswith("ring"):
            block = B * S // world * CONFIG.kv_heads * CONFIG.head_dim * 8
            assert got[f"model {name} forward bytes"] == CONFIG.layers * 2 * (world - 1) * block


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", MODEL_CASES)
def test_saved_activations_are_dense_at_s_over_cp(results, world, name):
    """The memory model's claim: a cp rank saves what the dense model saves at s/cp tokens."""
    for r in range(world):
        got = results[(world, r)]
        assert got[f"model {name} saved bytes"] == got["dense saved bytes at s/cp"], r
