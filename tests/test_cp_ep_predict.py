"""Context and expert parallelism on paper: ring and Ulysses bytes, MoE all-to-alls and parameters,
activations at s/cp, `plscale estimate cp` and `plscale estimate moe`."""

import doctest
import json
from dataclasses import replace

import pytest

from plscale.errors import UserError
from plscale.predict import context_parallel as cpm
from plscale.predict import experts as moe
from plscale.predict.memory import Setup, activation_bytes, estimate
from plscale.predict.presets import PRESETS, param_count

SMALL, ONE_B = PRESETS["small"], PRESETS["1b"]   # small: h 256, 4 heads of 64, 4 kv heads, L 4; 1b: 32 / 8 heads


@pytest.mark.parametrize("module", [cpm, moe])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


# ---- ring attention ------------------------------------------------------------------------------

def test_ring_bytes_by_hand():
    r = cpm.ring_bytes(micro_batch=2, seq=64, cp=4, kv_heads=2, head_dim=8, element_bytes=2)
    assert r.block == 2 * 16 * 2 * 8 * 2 == 1024                    # b * s/cp * a_kv * d * e
    assert r.forward == 2 * 3 * 1024                                # (k, v) x (cp - 1) hops
    assert r.backward == (4 * 3 + 2) * 1024                         # (k, v, dk, dv) x 3 hops, (dk, dv) home
    assert r.total == 20 * 1024
    assert cpm.ring_bytes(2, 64, 1, 2, 8, 2).total == 0             # one rank sends nothing
    two = cpm.ring_bytes(1, 8, 2, 1, 1, 4)
    assert (two.forward, two.backward) == (2 * 16, 6 * 16)          # block 4 tokens x 4 bytes


def test_ring_forward_is_2_cp_minus_1_over_cp_of_the_whole_k_and_v():
    whole = 1 * 4096 * 8 * 64 * 2                                   # one sequence's k (or v), all tokens
    for cp in (2, 4, 8, 16):
        r = cpm.ring_bytes(1, 4096, cp, 8, 64, 2)
        assert r.forward == 2 * (cp - 1) / cp * whole
    with pytest.raises(UserError, match="does not split over cp 3"):
        cpm.ring_bytes(1, 64, 3, 2, 8, 2)
    with pytest.raises(UserError, match="at least 1 rank"):
        cpm.ring_bytes(1, 64, 0, 2, 8, 2)


def test_ring_and_ulysses_bytes_are_what_a_real_run_sent():
    """labs/08_context_expert/reference.json (run of the ring-attention variant, preset small: 4 heads
    of 64, 4 kv heads; one sequence of 2,048 tokens, fp32, cp 2): the ring's tally of point-to-point
    sends, 8.0 MiB per rank per layer forward and backward, and DeepSpeed's comms logger's all-to-all
    messages for Ulysses, 8.0 MiB."""
    ring = cpm.ring_bytes(1, 2048, 2, SMALL.kv_heads, SMALL.head_dim, 4)
    assert ring.total / 2**20 == pytest.approx(8.0, abs=0.0005)
    uly = cpm.ulysses_bytes(1, 2048, 2, SMALL.heads, SMALL.kv_heads, SMALL.head_dim, 4)
    assert (uly.forward_message + uly.backward_message) / 2**20 == pytest.approx(8.0, abs=0.0005)
    row, = cpm.comm_table(SMALL, 1, [2048], [2], 4)
    assert row.ring / 2**20 == pytest.approx(8.0, abs=0.0005)


# ---- Ulysses ---------------------------------------------------------------------------------------

def test_ulysses_bytes_by_hand():
    u = cpm.ulysses_bytes(1, 32, 4, heads=8, kv_heads=4, head_dim=4, element_bytes=4)
    assert (u.message_q, u.message_kv) == (1 * 8 * 8 * 4 * 4, 1 * 8 * 4 * 4 * 4) == (1024, 512)
    assert u.calls == 4
    assert u.forward_message == u.backward_message == 2 * 1024 + 2 * 512    # q, out; k, v
    assert u.forward_sent == u.backward_sent == 3072 * 3 // 4
    assert u.total_sent == 4608
    one = cpm.ulysses_bytes(1, 32, 1, 8, 2, 4, 4)
    assert (one.calls, one.forward_message, one.total_sent) == (0, 0, 0)


def test_check_ulysses_names_the_degrees_that_work():
    with pytest.raises(UserError, match=r"^4 heads and 4 key/value heads do not split over Ulysses degree 8: "
                                        r"use degree 1, 2 or 4 "):
        cpm.check_ulysses(4, 4, 8)
    with pytest.raises(UserError, match=r"degree 1, 2, 4 or 8 \(they divide both\), or ring attention\.$"):
        cpm.check_ulysses(ONE_B.heads, ONE_B.kv_heads, 16)
    with pytest.raises(UserError, match="degree 1, 2 or 4"):
        cpm.ulysses_bytes(1, 64, 8, 4, 4, 64, 2)
    with pytest.raises(UserError, match="degree 0"):
        cpm.check_ulysses(4, 4, 0)
    cpm.check_ulysses(32, 8, 8)
    assert cpm.ulysses_degrees(32, 8) == [1, 2, 4, 8]


def test_comm_table_ring_stays_flat_ulysses_falls():
    rows = cpm.comm_table(SMALL, 1, [1024, 2048], [2, 3, 4, 8], 2)
    assert [(r.seq, r.cp) for r in rows] == [(1024, 2), (1024, 4), (1024, 8), (2048, 2), (2048, 4), (2048, 8)]
    k = 1024 * SMALL.kv_heads * SMALL.head_dim * 2                  # the whole sequence's k
    first = [r for r in rows if r.seq == 1024]
    # 4k, 5k and 5.5k (k = 524,288 bytes): the sends counted by hand in test_ring_bytes_by_hand, and
    # cp 2 at seq 2048, fp32 is what lab 08's ranks sent (test_ring_and_ulysses_bytes_are_what_a_real_run_sent)
    assert [r.ring for r in first] == [2_097_152, 2_621_440, 2_883_584]
    assert all(r.ring < 6 * k for r in first)                       # bounded: flat as cp grows
    assert first[0].ulysses > first[1].ulysses and first[2].ulysses is None   # 4 heads: no degree 8
    assert [r.ring for r in rows if r.seq == 2048] == [2 * r.ring for r in first]   # doubles with seq


# ---- experts -----------------------------------------------------------------------------------------

def test_alltoall_bytes_by_hand():
    a = moe.alltoall_bytes(tokens=64, experts=4, top_k=2, capacity_factor=1.5, hidden=8, ep=4, element_bytes=2)
    assert a.capacity == 48                                         # ceil(64 / 4 * 2 * 1.5)
    assert a.message == 4 * 48 * 8 * 2 and a.sent == a.message * 3 // 4
    assert (a.calls, a.total_message, a.total_sent) == (4, 4 * a.message, 4 * a.sent)
    local = moe.alltoall_bytes(64, 4, 2, 1.5, 8, 1, 2)
    assert (local.calls, local.sent, local.total_sent) == (0, 0, 0)
    assert moe.alltoall_bytes(4, 4, 1, 1.0, 8, 2, 2, min_capacity=4).capacity == 4


@pytest.mark.parametrize("kw, message", [
    (dict(experts=6, ep=4), r"^6 experts do not split over ep 4 ranks: use ep 1, 2, 3, 6"),
    (dict(ep=0), r"^ep 0: expert parallelism needs at least 1 rank; use ep 1, 2, 4, 8\.$"),
    (dict(capacity_factor=0), r"^capacity_factor 0: use a number above 0"),
    (dict(top_k=3), r"^top_k 3: use 1 or 2"),
])
def test_alltoall_bad_input(kw, message):
    args = dict(tokens=64, experts=8, top_k=2, capacity_factor=1.25, hidden=8, ep=2, element_bytes=2) | kw
    with pytest.raises(UserError, match=message):
        moe.alltoall_bytes(**args)


def test_expert_params_split_the_experts_replicate_the_rest():
    mlp = 3 * SMALL.hidden * SMALL.ffn
    p = moe.expert_params(SMALL, 8)
    assert (p.moe_layers, p.experts, p.gates) == (4, 4 * 8 * mlp, 4 * SMALL.hidden * 8)
    assert p.dense == param_count(SMALL) - 4 * mlp
    assert p.per_rank(1) == p.total and p.per_rank(4) == p.total - 3 * p.experts // 4
    half = moe.expert_params(SMALL, 8, every=2)
    assert half.moe_layers == 2 and half.dense == param_count(SMALL) - 2 * mlp
    assert moe.expert_params(SMALL, 1).total == param_count(SMALL) + 4 * SMALL.hidden   # one expert + a gate


# ---- memory: activations at s/cp -------------------------------------------------------------------

@pytest.mark.parametrize("extra", [dict(), dict(tp=2, sp=True), dict(recompute="full"), dict(recompute="selective"),
                                   dict(recompute="deepspeed", precision="fp32"), dict(precision="fp32")])
def test_cp_activations_are_the_dense_estimate_at_s_over_cp(extra):
    base = Setup(params=param_count(SMALL), model=SMALL, seq=128, micro_batch=2, **extra)
    for cp in (2, 4):
        assert activation_bytes(replace(base, cp=cp)) == activation_bytes(replace(base, seq=128 // cp))
        assert activation_bytes(replace(base, cp=cp)) < activation_bytes(base)


def test_cp_leaves_model_states_and_shows_s_over_cp():
    base = Setup(params=param_count(SMALL), stage=2, dp=8, model=SMALL, seq=128)
    dense, split = estimate(base), estimate(replace(base, cp=4))
    assert split.model_states == dense.model_states
    assert "(s/cp)b" in split.term("activations").formula and "s/cp" not in dense.term("activations").formula
    assert split.to_dict()["setup"]["cp"] == 4
    with pytest.raises(UserError, match="does not split over cp 3"):
        estimate(replace(base, cp=3))
    with pytest.raises(UserError, match="cp must be at least 1"):
        estimate(replace(base, cp=0))
    with pytest.raises(UserError, match="use a multiple of 8 with sp"):
        estimate(replace(base, cp=4, tp=2, sp=True, seq=36))


# ---- the CLI ---------------------------------------------------------------------------------------

def test_estimate_cp_prints_split_work_bytes_and_activations(cli):
    out = cli("estimate", "cp", "--model", "small", "--seq", "128", "--cp", "4")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "small: seq 128 over cp 4, zigzag, 8 chunks of 16 tokens" in text
    assert "0-15, 112-127" in text and "6.82" in text and "1.00" in text       # plain max/min, zig-zag
    assert "ring attention" in text and "Ulysses messages" in text
    assert "every term for 32 of 128 tokens" in text
    assert "note:" not in text


def test_estimate_cp_json_round_trips(cli):
    out = cli("estimate", "cp", "-m", "1b", "--seq", "4096", "--cp", "8", "--split", "plain", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    ring = cpm.ring_bytes(1, 4096, 8, 8, 64, 2)
    uly = cpm.ulysses_bytes(1, 4096, 8, 32, 8, 64, 2)
    assert got["ranks"][7]["chunks"] == [7] and got["chunk_tokens"] == 512
    assert got["work"]["plain"] == cpm.attention_work(4096, 8, "plain")
    assert got["work"]["imbalance"]["zigzag"] == 1.0
    assert got["ring"]["total"] == ring.total and got["ring"]["per_step"] == 16 * ring.total
    assert got["ulysses"]["total_sent"] == uly.total_sent and got["ulysses_note"] is None
    assert [(r["seq"], r["cp"]) for r in got["growth"]][:3] == [(4096, 2), (4096, 4), (4096, 8)]
    setup = Setup(params=1, model=ONE_B, seq=4096)
    assert got["activations"] == {"without_cp": activation_bytes(setup),
                                  "with_cp": activation_bytes(replace(setup, cp=8))}


def test_estimate_cp_notes_ulysses_when_the_heads_do_not_split(cli):
    out = cli("estimate", "cp", "-m", "small", "--seq", "128", "--cp", "8")
    assert out.returncode == 0, out.stderr
    assert "note: Ulysses does not apply: 4 heads and 4 key/value heads do not split over Ulysses degree 8" \
        in " ".join(out.stdout.split())


@pytest.mark.parametrize("args, message", [
    (["--seq", "36", "--cp", "4"], "--seq 36 does not cut into 2 x cp = 8 chunks (zig-zag): use 32 or 40."),
    (["--seq", "36", "--cp", "8", "--split", "plain"], "--seq 36 does not cut into cp = 8 chunks"),
    (["--cp", "0"], "--cp 0: context parallelism needs at least 1 rank"),
    (["--split", "diagonal"], "split 'diagonal': use plain or zigzag."),
    (["--precision", "fp8"], "--precision 'fp8': use bf16, fp16 or fp32."),
])
def test_estimate_cp_bad_input_is_one_line_exit_2(quick_cli, args, message):
    cli = quick_cli
    out = cli("estimate", "cp", *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr


def test_estimate_moe_prints_and_round_trips(cli):
    args = ("estimate", "moe", "-m", "small", "--experts", "8", "--top-k", "2", "--capacity-factor", "1.25",
            "--ep", "4", "--seq", "128", "--micro-batch", "4")
    text = cli(*args).stdout
    assert "capacity per expert C" in text and "160" in text and "20.0 %" in text
    assert "dispatch + combine, fwd + bwd" in text and "7,481,600" in text
    got = json.loads(cli(*args, "--json").stdout)
    a2a = moe.alltoall_bytes(512, 8, 2, 1.25, 256, 4, 2)
    params = moe.expert_params(SMALL, 8)
    assert (got["tokens"], got["capacity"], got["slots"]) == (512, 160, 1280)
    assert got["alltoall"]["per_layer_sent"] == a2a.total_sent
    assert got["alltoall"]["per_step_sent"] == 4 * a2a.total_sent
    assert got["params"]["per_rank"] == params.per_rank(4) == 7_481_600
    assert got["even_routing"] == {"padding": 0.2, "dropped": 0.0}
    assert [r["capacity_factor"] for r in got["capacity_factors"]] == [0.5, 1.0, 1.25, 1.5, 2.0]


@pytest.mark.parametrize("args, message", [
    (["--experts", "8", "--ep", "3"], "8 experts do not split over ep 3 ranks: use ep 1, 2, 4, 8"),
    (["--capacity-factor", "0"], "--capacity-factor 0.0: use a number above 0"),
    (["--top-k", "3"], "--top-k 3: use 1 or 2"),
    (["--seq", "0"], "--seq 0: a sequence has at least one token"),
    (["--every", "9"], "--every 9: small has 4 layers"),
])
def test_estimate_moe_bad_input_is_one_line_exit_2(quick_cli, args, message):
    cli = quick_cli
    out = cli("estimate", "moe", *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr


def test_estimate_memory_cp(cli):
    out = cli("estimate", "memory", "-m", "small", "--gpus", "8", "--cp", "4", "--seq", "128", "--json")
    got = json.loads(out.stdout)
    assert got["setup"]["cp"] == 4 and got["setup"]["dp"] == 8      # ZeRO shards over dp x cp
    assert got["terms"]["activations"]["device"] == activation_bytes(Setup(params=1, model=SMALL, seq=32))
    bad = cli("estimate", "memory", "-m", "small", "--gpus", "8", "--cp", "3")
    assert bad.returncode == 2 and "not a multiple of tp 1 x pp 1 x cp 3" in bad.stderr
