"""Tensor and sequence parallelism on paper: parameters per rank, collectives, `plscale estimate tp`."""

import json

import pytest

from plscale.errors import UserError
from plscale.predict.memory import Setup, estimate
from plscale.predict.presets import PRESETS, param_count
from plscale.predict.tensor_parallel import (
    check_divisible,
    collectives,
    megatron_paper_count,
    params_per_rank,
    totals,
)

SMALL = PRESETS["small"]   # V 8192, h 256, L 4, 4 heads, 4 kv heads, f 704, tied


# ---- parameters per rank -------------------------------------------------------------------

def test_small_at_tp2_by_hand():
    embedding = 8192 * 256                                 # tied: the head shares it
    layer_matmuls = 4 * 256 * 256 + 3 * 256 * 704          # q k v o, gate up down
    got = params_per_rank(SMALL, 2)
    assert got.sharded == (embedding + 4 * layer_matmuls) // 2 == 2_654_208
    assert got.replicated == (2 * 4 + 1) * 256 == 2304
    assert got.total == 2_656_512 > param_count(SMALL) / 2


def test_untied_7b_and_grouped_query_1b_by_hand():
    h, f, v = 4096, 11008, 32000                           # Llama-2-7B: head untied, also vocab-sharded
    seven = params_per_rank(PRESETS["7b"], 8)
    assert seven.sharded == (2 * v * h + 32 * (4 * h * h + 3 * h * f)) // 8 == 842_268_672
    assert seven.replicated == 65 * h
    h, kv, f, v = 2048, 512, 8192, 128256                  # Llama-3.2-1B: k, v are h x 512
    one = params_per_rank(PRESETS["1b"], 2)
    assert one.sharded == (v * h + 16 * (2 * h * h + 2 * h * kv + 3 * h * f)) // 2
    assert one.replicated == 33 * h


@pytest.mark.parametrize("name", PRESETS)
def test_tp1_is_the_whole_model(name):
    assert params_per_rank(PRESETS[name], 1).total == param_count(PRESETS[name])


def test_check_divisible_names_the_shape_and_the_fix():
    with pytest.raises(UserError, match=r"^heads 4 of preset 'small' is not divisible by tp 8: use tp 1, 2 or 4 "):
        check_divisible(SMALL, 8, "preset 'small'")
    with pytest.raises(UserError, match=r"^kv_heads 8 of the model is not divisible by tp 16: use tp 1, 2, 4 or 8 "):
        check_divisible(PRESETS["1b"], 16)
    with pytest.raises(UserError, match=r"^hidden 4096 of the model is not divisible by tp 3"):
        params_per_rank(PRESETS["7b"], 3)
    with pytest.raises(UserError, match="at least 1"):
        check_divisible(SMALL, 0)
    check_divisible(PRESETS["7b"], 32)


# ---- collectives ------------------------------------------------------------------------------

def count(rows, op, phase):
    return sum(r.calls for r in rows if r.op == op and r.phase == phase)


def test_without_sp_two_all_reduces_per_layer_each_way_plus_embedding_head_and_loss():
    L, m = SMALL.layers, 3
    rows = collectives(SMALL, 2, seq=128, micro_batch=4, precision="bf16", micro_batches=m)
    a = 4 * 128 * 256 * 2
    assert {r.op for r in rows} == {"all_reduce"}
    layers = [r for r in rows if r.where.startswith("layers")]
    assert [(r.phase, r.calls, r.bytes) for r in layers] == [("forward", 2 * L * m, a), ("backward", 2 * L * m, a)]
    assert megatron_paper_count(L) == {"forward": 2 * L, "backward": 2 * L}
    assert count(rows, "all_reduce", "forward") == (2 * L + 1 + 3) * m       # layers, embedding, loss
    assert count(rows, "all_reduce", "backward") == (2 * L + 1) * m          # layers, head input
    assert totals(rows) == {"all_reduce": ((4 * L + 5) * m, (4 * L + 2) * m * a + 3 * m * 4 * 128 * 4)}
    assert collectives(SMALL, 1, seq=128, micro_batch=4, precision="bf16") == []


def test_sp_replaces_each_all_reduce_by_reduce_scatter_and_all_gather():
    L, m = SMALL.layers, 2
    kw = dict(seq=128, micro_batch=4, precision="fp32", micro_batches=m)
    plain, sp = collectives(SMALL, 2, **kw), collectives(SMALL, 2, sp=True, **kw)
    for phase in ("forward", "backward"):
        assert count(sp, "all_gather", phase) == count(sp, "reduce_scatter", phase) == (2 * L + 1) * m
    # per layer forward: 2 AG + 2 RS move what 2 all-reduces do (all-reduce = RS + AG)
    ag, rs, ar = ([r for r in rows if r.where.startswith("layers") and r.phase == "forward" and r.op == op][0]
                  for rows, op in ((sp, "all_gather"), (sp, "reduce_scatter"), (plain, "all_reduce")))
    assert ag.calls == rs.calls == ar.calls == 2 * L * m
    assert ag.bytes + rs.bytes == 2 * ar.bytes
    # the activations' bytes are the same; SP adds an all-reduce of each norm's gradient per micro-batch
    sums, plain_sums = totals(sp), totals(plain)
    loss = 3 * m * 4 * 128 * 4
    assert sums["all_gather"][1] + sums["reduce_scatter"][1] == 2 * (plain_sums["all_reduce"][1] - loss)
    norms = [r for r in sp if r.where.startswith("replicated norm")]
    assert [(r.op, r.calls, r.bytes) for r in norms] == [("all_reduce", (2 * L + 1) * m, 256 * 4)]
    assert sums["all_reduce"] == ((3 + 2 * L + 1) * m, loss + (2 * L + 1) * m * 256 * 4)
    with pytest.raises(UserError, match="needs tp >= 2"):
        collectives(SMALL, 1, sp=True, **kw)


# ---- the memory model under TP ----------------------------------------------------------------

def test_memory_counts_the_replicated_norms_and_checks_sp():
    s = Setup(params=param_count(SMALL), stage=0, precision="bf16", tp=2, model=SMALL, seq=128)
    assert estimate(s).term("parameters").device == 2 * 2_656_512
    assert estimate(Setup(params=1000, tp=2)).term("parameters").device == 2 * 500   # no shape: Ψ/t
    with pytest.raises(UserError, match="sequence parallelism needs tp >= 2"):
        estimate(Setup(params=1000, sp=True))
    with pytest.raises(UserError, match="does not split into 2 sequence shards"):
        estimate(Setup(params=1000, tp=2, sp=True, seq=127))


def test_activations_under_tp_and_sp_by_hand():
    """small (h 256, h_kv 256, f 704, a 4, V 8192), fp32, 4 x 128 tokens per micro-batch, t = 2:
    tensor parallelism splits everything but the norms; sequence parallelism the norms' own
    2h + 1 too (the column layers keep their gathered input, h, whole)."""
    h, kv, f, a, V, t, e, sb = 256, 256, 704, 4, 8192, 2, 4, 4 * 128
    blocks = sb * (3 * h + 2 * kv + 4 * f) * e / t + 4 * a * sb / t
    tp_layer = sb * (6 * h + 2) * e + blocks
    sp_layer = sb * (4 * h + 2) * e / t + sb * 2 * h * e + blocks
    tp_head = sb * (3 * h + 1) * e + 4 * sb * V / t
    sp_head = sb * (2 * h + 1) * e / t + sb * h * e + 4 * sb * V / t
    base = dict(params=param_count(SMALL), precision="fp32", tp=2, model=SMALL, seq=128, micro_batch=4)
    assert estimate(Setup(**base)).term("activations").device == 4 * tp_layer + tp_head
    assert estimate(Setup(**base, sp=True)).term("activations").device == 4 * sp_layer + sp_head
    # recomputation keeps each layer's input: a t-th of it under sequence parallelism; the rerun
    # holds one layer less its input (fp32: the first norm saves the kept input itself)
    recompute = estimate(Setup(**base, sp=True, recompute="full")).term("activations").device
    assert recompute == 4 * sb * h * e / t + sp_layer - sb * h * e / t + sp_head
    # DeepSpeed's rerun runs on to the layer's output (h/t under sp): the whole layer
    deepspeed = estimate(Setup(**base, sp=True, recompute="deepspeed")).term("activations").device
    assert deepspeed == 4 * sb * h * e / t + sp_layer + sp_head


# ---- `plscale estimate tp` --------------------------------------------------------------------

def test_cli_tp_table_and_json(cli):
    out = cli("estimate", "tp", "--preset", "small", "--tp", "2", "--seq", "128", "--micro-batch", "4")
    assert out.returncode == 0, out.stderr
    assert "2,656,512" in out.stdout and "2,655,360" in out.stdout   # total, dense / tp
    assert "8 all-reduces forward and 8 backward" in out.stdout
    out = cli("estimate", "tp", "--preset", "small", "--tp", "2", "--seq", "128", "--micro-batch", "4",
              "--micro-batches", "2", "--sp", "--precision", "fp32", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["params"]["total"] == 2_656_512 and got["megatron_paper"] == {"forward": 8, "backward": 8}
    a = 4 * 128 * 256 * 4
    assert got["totals"]["all_gather"] == {"calls": 2 * 9 * 2, "bytes": 2 * 9 * 2 * a}
    assert len(got["collectives"]) == len(collectives(SMALL, 2, 128, 4, "fp32", sp=True, micro_batches=2))


@pytest.mark.parametrize("args, message", [
    (["estimate", "tp", "--preset", "small", "--tp", "8"], "heads 4 of preset 'small' is not divisible by tp 8"),
    (["estimate", "tp", "--preset", "smal"], "No model preset 'smal'"),
    (["estimate", "tp", "--tp", "0"], "tp 0"),
    (["estimate", "tp", "--tp", "1", "--sp"], "sequence parallelism needs tp >= 2"),
    (["estimate", "memory", "--model", "small", "--sp"], "sequence parallelism needs tp >= 2"),
])
def test_cli_bad_input_is_one_line_exit_2(quick_cli, args, message):
    cli = quick_cli
    out = cli(*args)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
