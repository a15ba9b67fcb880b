"""Every hand-written tensor-parallel layer against its dense counterpart, on real processes over
gloo at tp 2 and tp 4: forward output and every gradient, in float64 so that only summation
order can differ (tolerance 1e-10). Also the tally of collectives against the Megatron count."""

import pytest
import torch
import torch.distributed as dist

from helpers.ranks import run_ranks
from plscale.predict import tensor_parallel as predict_tp
from plscale.predict.presets import ModelConfig

WORLDS = (2, 4)
# heads 8, key/value heads 4 (grouped-query), everything divisible by 4
CONFIG = ModelConfig(vocab=96, hidden=32, layers=2, heads=8, kv_heads=4, ffn=48, max_seq=16)
B, S = 2, 8
TOL = 1e-10


def _gap(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def _sharded_like(tp_model, dense_values):
    """What each parameter of tp_model holds when loaded from a dense model whose weights are
    `dense_values` (the dense gradients): the expected shard of every gradient."""
    from plscale.rank.models.llama import Llama
    holder = Llama(CONFIG).double()
    with torch.no_grad():
        for p, v in zip(holder.parameters(), dense_values):
            p.copy_(v)
    twin = type(tp_model)(CONFIG, tp_model.group, tp_model.sequence_parallel).double()
    twin.load_dense(holder)
    return dict(twin.named_parameters())


def _cases(rank, world):
    from plscale.rank.mesh import Mesh
    from plscale.rank.models.llama import Llama
    from plscale.strategies.tensor_parallel import layers, operators as ops
    from plscale.strategies.tensor_parallel.llama import TensorParallelLlama

    mesh = Mesh.build(tp=world, dims=("tp",))
    group, out = mesh.group("tp"), {}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, CONFIG.hidden, generator=g, dtype=torch.float64, requires_grad=True)

    # Column then row: the Megatron MLP, without and with sequence parallelism
    w1 = torch.randn(2 * CONFIG.ffn, CONFIG.hidden, generator=g, dtype=torch.float64)
    w2 = torch.randn(CONFIG.hidden, 2 * CONFIG.ffn, generator=g, dtype=torch.float64)
    dense_x = x.detach().clone().requires_grad_()
    y = torch.nn.functional.linear(torch.nn.functional.linear(dense_x, w1).relu(), w2)
    y.pow(2).sum().backward()
    for sp in (False, True):
        col = layers.ColumnParallelLinear(CONFIG.hidden, 2 * CONFIG.ffn, group, sp).double()
        row = layers.RowParallelLinear(2 * CONFIG.ffn, CONFIG.hidden, group, sp).double()
        col.load_shard(w1)
        row.load_shard(w2)
        xin = (ops.split_sequence(dense_x.detach(), group) if sp else dense_x.detach()).clone().requires_grad_()
        yp = row(col(xin).relu())
        want_y = ops.split_sequence(y.detach(), group) if sp else y.detach()
        yp.pow(2).sum().backward()  # under SP each rank's sum covers its slice of the sequence
        want_gx = ops.split_sequence(dense_x.grad, group) if sp else dense_x.grad
        out[f"mlp sp={sp} output"] = _gap(yp, want_y)
        out[f"mlp sp={sp} input grad"] = _gap(xin.grad, want_gx)

    # Attention alone (grouped-query: 8 query heads, 4 key/value heads, split over the ranks)
    from plscale.rank.models.llama import Attention, rope_tables
    from plscale.strategies.tensor_parallel.llama import ParallelAttention
    torch.manual_seed(2)
    attn = Attention(CONFIG).double()
    cos, sin = rope_tables(CONFIG.head_dim, S, CONFIG.rope_theta)
    xa = x.detach().clone().requires_grad_()
    attn(xa, cos, sin).pow(2).sum().backward()
    par = ParallelAttention(CONFIG, group, False, layers.ColumnParallelLinear, layers.RowParallelLinear).double()
    par.qkv.load_shard(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
    par.o_proj.load_shard(attn.o_proj.weight)
    xp = x.detach().clone().requires_grad_()
    yp = par(xp, cos, sin)
    out["attention output"] = _gap(yp, attn(x.detach(), cos, sin))
    yp.pow(2).sum().backward()
    twin = ParallelAttention(CONFIG, group, False, layers.ColumnParallelLinear, layers.RowParallelLinear).double()
    twin.qkv.load_shard(attn.q_proj.weight.grad, attn.k_proj.weight.grad, attn.v_proj.weight.grad)
    twin.o_proj.load_shard(attn.o_proj.weight.grad)
    out["attention grads"] = max(_gap(xp.grad, xa.grad), _gap(par.qkv.weight.grad, twin.qkv.weight),
                                 _gap(par.o_proj.weight.grad, twin.o_proj.weight))

    # Vocabulary-parallel embedding and cross-entropy alone
    table = torch.randn(CONFIG.vocab, CONFIG.hidden, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, CONFIG.vocab, (B, S), generator=g)
    torch.nn.functional.embedding(ids, table).pow(2).sum().backward()
    emb = layers.VocabParallelEmbedding(CONFIG.vocab, CONFIG.hidden, group).double()
    emb.load_shard(table.detach())
    e = emb(ids)
    out["embedding output"] = _gap(e, torch.nn.functional.embedding(ids, table.detach()))
    e.pow(2).sum().backward()
    out["embedding grads"] = _gap(emb.weight.grad, table.grad[emb.start:emb.end])
    logits = torch.randn(B, S, CONFIG.vocab, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, CONFIG.vocab, (B, S), generator=g)
    targets[0, :3] = -100  # skipped, as F.cross_entropy's ignore_index skips them
    want_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    want_loss.backward()
    mine = logits.detach()[..., emb.start:emb.end].clone().requires_grad_()
    got = layers.vocab_parallel_cross_entropy(mine, targets, emb.start, group)
    got.backward()
    out["cross-entropy loss"] = abs(got.item() - want_loss.item())
    out["cross-entropy grads"] = _gap(mine.grad, logits.grad[..., emb.start:emb.end])

    # The mesh as DeepSpeed asks for it (Megatron's mpu): tp 2 x dp world/2
    from plscale.rank.mesh import MegatronMPU
    mpu = MegatronMPU(Mesh.build(tp=2, dims=("tp", "dp", "pp")))
    out["mpu"] = {"model": [dist.get_process_group_ranks(mpu.get_model_parallel_group()),
                            mpu.get_model_parallel_rank(), mpu.get_model_parallel_world_size()],
                  "data": [mpu.get_data_parallel_group_ranks(), mpu.get_data_parallel_rank(),
                           mpu.get_data_parallel_world_size()],
                  "tensor": [mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_src_rank()],
                  "pipeline": [mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size()]}

    # The whole model: loss and every gradient, without and with sequence parallelism
    torch.manual_seed(1)
    dense = Llama(CONFIG).double()
    tokens = torch.randint(0, CONFIG.vocab, (B, S + 1), generator=g)
    loss = dense(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    dense_grads = [p.grad for p in dense.parameters()]
    for sp in (False, True):
        model = TensorParallelLlama(CONFIG, group, sequence_parallel=sp).double()
        model.load_dense(dense)
        ops.TALLY.reset()
        tp_loss = model(tokens[:, :-1], tokens[:, 1:])
        tp_loss.backward()
        out[f"model sp={sp} loss"] = abs(tp_loss.item() - loss.item())
        want = _sharded_like(model, dense_grads)
        out[f"model sp={sp} grads"] = max(_gap(p.grad, want[n]) for n, p in model.named_parameters())
        out[f"model sp={sp} tally"] = {f"{op} {phase}": list(v) for (op, phase), v in ops.TALLY.rows().items()}
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(_cases, WORLDS, tmp_path_factory.mktemp("tp_layers"))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", ["mlp sp=False output", "mlp sp=False input grad", "mlp sp=True output",
                                  "mlp sp=True input grad", "model sp=False loss", "model sp=False grads",
                                  "model sp=True loss", "model sp=True grads", "attention output",
                                  "attention grads", "embedding output", "embedding grads",
                                  "cross-entropy loss", "cross-entropy grads"])
def test_parallel_equals_dense(results, world, case):
    gaps = [results[(world, r)][case] for r in range(world)]
    assert max(gaps) <= TOL, f"{case} at tp {world}: largest gap {max(gaps):.3g}"


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("sp", [False, True])
def test_tally_matches_prediction(results, world, sp):
    """The collectives one rank issued in one forward and backward are the ones predicted (the
    model ran in float64: every message twice its fp32 size)."""
    rows = predict_tp.collectives(CONFIG, world, seq=S, micro_batch=B, precision="fp32", sp=sp)
    want = {f"{op} {phase}": [calls, 2 * nbytes] for (op, phase), (calls, nbytes) in predict_tp.by_op_phase(rows).items()}
    for r in range(world):
        assert results[(world, r)][f"model sp={sp} tally"] == want


@pytest.mark.parametrize("world", WORLDS)
def test_megatron_mpu_gives_deepspeed_the_mesh_groups(results, world):
    """DeepSpeed reads the groups through Megatron's mpu interface: tp groups of neighbours,
    dp groups across them (plscale.predict.grid's Megatron order), pipeline of one."""
    from plscale.predict.grid import Layout
    layout = Layout(world, tp=2)
    for r in range(world):
        got = results[(world, r)]["mpu"]
        tp_ranks, dp_ranks = layout.group_of("tp", r), layout.group_of("dp", r)
        assert got["model"] == [tp_ranks, tp_ranks.index(r), 2]
        assert got["data"] == [dp_ranks, dp_ranks.index(r), world // 2]
        assert got["tensor"] == [tp_ranks.index(r), tp_ranks[0]]
        assert got["pipeline"] == [0, 1]
