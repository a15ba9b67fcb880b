"""Mixture-of-experts with expert parallelism, on real processes over gloo: the router written by
hand against DeepSpeed's gates; the hand-written MoE layer at ep 2 and 4, and DeepSpeed's at
ep 2, against the unsharded layer (every expert on one rank, run on every rank's micro-batch);
capacity drops; the all-to-all tally; and DeepSpeed-engine training against the unsharded model.

Two spawns: 4 ranks (layers by hand at ep 2 and 4; engines at ep 2, edp 2, and ep 4), then 2 ranks
(the router against DeepSpeed's; both layers and both engines at ep 2 = world). Layers run in
float64 (the router in fp32, as DeepSpeed's), so only summation order differs; engines in fp32."""

import pytest
import torch
import torch.distributed as dist

from helpers.ranks import run_ranks
from plscale.predict.experts import capacity
from plscale.predict.presets import ModelConfig

CONFIG = ModelConfig(vocab=64, hidden=16, layers=2, heads=4, kv_heads=2, ffn=24, max_seq=16)
E, B, S = 4, 2, 16           # 4 experts; micro-batch of 2 x 16 = 32 tokens per rank
FACTORS = (0.5, 1.0, 2.0, float(E))  # the last gives C >= tokens: nothing dropped
TOL = 1e-12
STEPS, LR = 3, 1e-2
EPS = {4: (2, 4), 2: (2,)}  # world -> expert-parallel sizes


def _gap(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def _micro_batches(world, seed):
    """Every rank's layer input, and the weights of its sum(out * w) loss."""
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(world, B, S, CONFIG.hidden, generator=g, dtype=torch.float64)
    return xs, torch.randn(xs.shape, generator=g, dtype=torch.float64)


def _parts(layer):
    """(gate weight, local experts) of either MoE layer."""
    if hasattr(layer, "moe"):
        inner = layer.moe.deepspeed_moe
        return inner.gate.wg.weight, list(inner.experts.deepspeed_experts)
    return layer.gate.wg.weight, list(layer.experts)


def _run(layer, x, w):
    """Forward and backward of sum(out * w) + l_aux: output, input gradient, stats."""
    x = x.clone().requires_grad_()
    out, l_aux, stats = layer(x)
    ((out * w).sum() + l_aux).backward()
    return out.detach(), x.grad, stats


def _layer_case(layer, full, xs, ws, rank, first, ep_ranks):
    """The sharded layer on this rank's micro-batch against the unsharded layer on every rank's.
    An expert's gradient gathers the tokens of the ranks in its ep group (edp sums the rest later)."""
    from plscale.strategies.experts.dispatch import TALLY

    want = []
    for r in range(len(xs)):
        full.zero_grad()
        out, grad, stats = _run(full, xs[r], ws[r])
        gate, experts = _parts(full)
        want.append((out, grad, stats, gate.grad.clone(), [[p.grad.clone() for p in e.parameters()] for e in experts]))
    TALLY.reset()
    out, grad, stats = _run(layer, xs[rank], ws[rank])
    gate, experts = _parts(layer)
    expert_gap = max(_gap(p.grad, sum(want[r][4][first + i][j] for r in ep_ranks))
                     for i, e in enumerate(experts) for j, p in enumerate(e.parameters()))
    return {"output": _gap(out, want[rank][0]), "input grad": _gap(grad, want[rank][1]),
            "gate grad": _gap(gate.grad, want[rank][3]), "expert grads": expert_gap,
            "dropped": stats.dropped, "want dropped": want[rank][2].dropped, "counts": stats.counts,
            "capacity": stats.capacity, "tally": {phase: list(v) for (_, phase), v in TALLY.rows().items()}}


def _layers(mesh, world, rank, ep, impls):
    from plscale.strategies.experts.layer import MoEMLP, deepspeed_moe

    group, out = mesh.group("ep"), {}
    for k in (1, 2):
        for cf in FACTORS:
            torch.manual_seed(k)
            full = MoEMLP(CONFIG, E, k, cf).double()
            xs, ws = _micro_batches(world, seed=10 * k)
            for impl in impls:
                if impl == "hand":
                    layer = MoEMLP(CONFIG, E, k, cf, group).double()
                else:
                    layer = deepspeed_moe(CONFIG, E, k, cf, ep).double()
                    layer.moe.set_deepspeed_parallelism()
                layer.load_unsharded(full.state_dict())
                first = mesh.rank_in("ep") * E // ep
                out[f"{impl} ep{ep} k{k} cf{cf}"] = _layer_case(layer, full, xs, ws, rank, first, mesh.ranks("ep"))
    return out


def _router_vs_deepspeed():
    from deepspeed.moe.sharded_moe import top1gating, top2gating

    from plscale.strategies.experts.router import route

    gating = {1: lambda logits: top1gating(logits, 1.0, 4, noisy_gate_policy=None, drop_tokens=True, use_rts=False),
              2: lambda logits: top2gating(logits, 1.0, 4, drop_tokens=True, top2_2nd_expert_sampling=False)}
    out = {}
    for name, tokens, experts, skew in (("even", 32, 4, 0.0), ("overflow", 32, 4, 3.0), ("odd", 50, 3, 1.0)):
        logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens))
        logits[:, 0] += skew  # expert 0 popular: its queue overflows
        for k in (1, 2):
            mine = route(logits.clone(), k, 1.0, 4)
            l_aux, comb, disp, counts = gating[k](logits.clone())
            out[f"{name} k{k}"] = {"combine": torch.equal(mine.combine, comb),
                                   "dispatch": torch.equal(mine.dispatch, disp),
                                   "counts": torch.equal(mine.counts, counts), "dropped": mine.dropped,
                                   "l_aux": abs(mine.l_aux.item() - l_aux.item()) / l_aux.item()}
    return out


def _grad_gap(model, want) -> float:
    """Largest gap between two models' gradients, relative to the largest entry of each of `want`'s."""
    wants = dict(want.named_parameters())
    return max(_gap(torch.zeros_like(p) if p.grad is None else p.grad, wants[n])
               / max(wants[n].abs().max().item(), 1e-30) for n, p in model.named_parameters())


def _training(mesh, world, rank, impl):
    """A DeepSpeed engine (ZeRO 0) trains MoELlama for STEPS steps, each rank on its micro-batch:
    the mean loss over the ranks per step, against the unsharded model trained on every rank's
    micro-batch (losses averaged); and the first step's gradients after the engine's reduction
    against the unsharded model's (Adam barely notices a gradient scaled by a constant: the losses
    alone would not catch an expert gradient divided by edp instead of dp)."""
    from plscale.dsconfig.spec import DSSpec, build
    from plscale.strategies.experts.llama import MoELlama, backward, initialize
    from plscale.rank.against_dense import reference_losses

    ds = build(DSSpec(micro_batch=B, world_size=world, grad_clip=0.0, lr=LR))
    torch.manual_seed(0)
    reference = MoELlama(CONFIG, E, 2, 1.0)
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    data = torch.randint(0, CONFIG.vocab, (STEPS, world, B, S + 1), generator=torch.Generator().manual_seed(5))

    def batches(t):
        return [(d[:, :-1], d[:, 1:]) for d in data[t]]

    (sum(reference(x, y) for x, y in batches(0)) / world).backward()
    want_grads = MoELlama(CONFIG, E, 2, 1.0, mesh.group("ep"), impl=impl)  # holds this rank's share of them
    want_grads.load_unsharded({n: torch.zeros_like(p) if p.grad is None else p.grad
                               for n, p in reference.named_parameters()})
    reference.zero_grad(set_to_none=True)
    want = reference_losses(reference, ds, batches, STEPS)

    model = MoELlama(CONFIG, E, 2, 1.0, mesh.group("ep"), impl=impl)
    model.load_unsharded(state)
    engine = initialize(model, ds, mesh)
    losses = []
    for t in range(STEPS):
        x, y = batches(t)[rank]
        loss = engine(x, y)
        backward(engine, loss, mesh)
        if t == 0:
            grad_gap = _grad_gap(model, want_grads)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return {"losses": losses, "want": want, "grad gap": grad_gap, "dropped": sum(s.dropped for s in model.routing)}


def _setup():
    from plscale.rank import distributed

    distributed.init()  # DeepSpeed's communication, as a lab's ranks have it


def _cases(rank, world):
    from plscale.rank.mesh import Mesh

    out = {}
    if world == 2:
        out["router"] = _router_vs_deepspeed()
    for ep in EPS[world]:
        mesh = Mesh.build(ep=ep, dims=("dp", "ep", "edp"))
        impls = ("hand", "deepspeed") if ep == 2 else ("hand",)
        out.update(_layers(mesh, world, rank, ep, impls if world == 2 else ("hand",)))  # DeepSpeed's: ep 2 once
        for impl in impls:
            out[f"engine {impl} ep{ep}"] = _training(mesh, world, rank, impl)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out_dir, got = tmp_path_factory.mktemp("experts"), {}
    for world in (4, 2):  # a fresh spawn each: DeepSpeed keeps its expert groups for the process's life
        got.update(run_ranks(_cases, (world,), out_dir, _setup))
    return got


@pytest.mark.parametrize("case", ["even k1", "even k2", "overflow k1", "overflow k2", "odd k1", "odd k2"])
def test_router_equals_deepspeed_gates(results, case):
    """The same combine weights, dispatch mask and counts, bit for bit, as DeepSpeed's top1gating
    (no noise, no random token selection) and top2gating (no sampled second expert); l_aux to fp32
    rounding (top2gating computes mean * E * E, the router E * sum). In "overflow" expert 0's queue
    overflows: which tokens it keeps is torch.topk's choice (top-1) or the first come (top-2)."""
    got = results[(2, 0)]["router"][case]
    assert got["combine"] and got["dispatch"] and got["counts"], got
    assert got["l_aux"] <= 2e-7
    if case.startswith("overflow"):
        assert got["dropped"] > 0


def _layer_keys(impl, ep):
    return [f"{impl} ep{ep} k{k} cf{cf}" for k in (1, 2) for cf in FACTORS]


LAYERS = [(4, "hand", 2), (4, "hand", 4), (2, "hand", 2), (2, "deepspeed", 2)]


@pytest.mark.parametrize("world, impl, ep", LAYERS)
@pytest.mark.parametrize("what", ["output", "input grad", "gate grad", "expert grads"])
def test_layer_equals_unsharded(results, world, impl, ep, what):
    """Output, input gradient, router gradient (this rank's tokens) and each expert's gradient
    (every rank's tokens, through the all-to-all's backward) equal the unsharded layer's."""
    for key in _layer_keys(impl, ep):
        gaps = [results[(world, r)][key][what] for r in range(world)]
        assert max(gaps) <= TOL, f"{key} {what}: {max(gaps):.3g}"


@pytest.mark.parametrize("world, impl, ep", LAYERS)
def test_capacity_drops(results, world, impl, ep):
    """Each rank drops what the unsharded layer drops on its micro-batch: count - C of every expert
    over capacity, C from plscale.predict.experts.capacity; nothing once C >= tokens."""
    tokens = B * S
    for k in (1, 2):
        for cf in FACTORS:
            for r in range(world):
                got = results[(world, r)][f"{impl} ep{ep} k{k} cf{cf}"]
                c = capacity(tokens, E, k, cf, 4)
                assert got["capacity"] == c
                assert got["dropped"] == got["want dropped"] == sum(max(0, n - c) for n in got["counts"])
                assert sum(got["counts"]) == k * tokens
                if c >= tokens:
                    assert got["dropped"] == 0
            if cf == 0.5:  # the test can fail: something was dropped
                assert any(results[(world, r)][f"{impl} ep{ep} k{k} cf{cf}"]["dropped"] for r in range(world))


@pytest.mark.parametrize("world, ep", [(4, 2), (4, 4), (2, 2)])
def test_all_to_all_tally(results, world, ep):
    """One MoE layer, one micro-batch: two all-to-alls forward (dispatch, combine) and two backward,
    each of the [E, C, h] buffer in float64."""
    for k in (1, 2):
        for cf in FACTORS:
            nbytes = E * capacity(B * S, E, k, cf, 4) * CONFIG.hidden * 8
            for r in range(world):
                tally = results[(world, r)][f"hand ep{ep} k{k} cf{cf}"]["tally"]
                assert tally == {"backward": [2, 2 * nbytes], "forward": [2, 2 * nbytes]}


@pytest.mark.parametrize("world, impl, ep", [(4, "hand", 2), (4, "deepspeed", 2), (4, "hand", 4),
                                             (2, "hand", 2), (2, "deepspeed", 2)])
def test_engine_training_follows_unsharded(results, world, impl, ep):
    """DeepSpeed's engine at ZeRO 0 trains the MoE Llama as the unsharded model trains on every
    rank's micro-batch: the same losses, and the first step's gradients after the reduction (for
    experts: summed over edp, divided by dp; DeepSpeed's rule, kept by hand for MoEMLP)."""
    from plscale.rank.against_dense import largest_gap

    for r in range(world):
        got = results[(world, r)][f"engine {impl} ep{ep}"]
        assert largest_gap(got["losses"], got["want"]) <= 1e-6, got
        assert got["grad gap"] <= 2e-6, got
    assert any(results[(world, r)][f"engine {impl} ep{ep}"]["dropped"] for r in range(world))  # at capacity
