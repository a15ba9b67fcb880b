"""The planner's mixture of experts (Mixtral's shapes, expert parallelism), checked against
transformers' Mixtral (parameters), PyTorch's FLOP counter (a training step's FLOPs), Megatron's
documented optimizer bytes (memory) and published Megatron-Core runs (step time)."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from torch.utils.flop_counter import FlopCounterMode

from plscale.predict import tensors
from plscale.predict.cluster import GPUS
from plscale.predict.memory import MODEL_STATES, Setup, estimate
from plscale.predict.plan import Job, plan
from plscale.predict.presets import ModelConfig, flops_per_token, layer_active_params, param_count
from plscale.predict.published import SHAPES


def hf_mixtral(c: ModelConfig, device: str = "meta"):
    """transformers' model of the shape: Mixtral's, or Qwen3's MoE where the shape has q and k norms."""
    common = dict(vocab_size=c.vocab, hidden_size=c.hidden, num_hidden_layers=c.layers, num_attention_heads=c.heads,
                  num_key_value_heads=c.kv_heads, num_experts_per_tok=c.top_k, max_position_embeddings=c.max_seq,
                  tie_word_embeddings=c.tie_embeddings)
    if c.qk_norm:
        config, model = Qwen3MoeConfig(**common, moe_intermediate_size=c.ffn, num_experts=c.experts,
                                       head_dim=c.head_dim, decoder_sparse_step=1, mlp_only_layers=[]), Qwen3MoeForCausalLM
    else:
        config, model = MixtralConfig(**common, intermediate_size=c.ffn, num_local_experts=c.experts), MixtralForCausalLM
    with torch.device(device):
        return model._from_config(config, attn_implementation="eager", experts_implementation="eager")


def split_counts(model) -> tuple[int, int]:
    """(everything but the experts, the experts) of a transformers Mixtral, by its own parameter names."""
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return sum(p.numel() for p in model.parameters()) - experts, experts


@pytest.mark.parametrize("name, total_b, active_b", [("mixtral-8x7b", 46.7, 12.9), ("mixtral-8x22b", 141, 39),
                                                     ("qwen3-30b-a3b", 30.5, 3.3), ("qwen3-235b-a22b", 235, 22)])
def test_moe_parameters_match_transformers_and_their_publishers(name, total_b, active_b):
    c = SHAPES[name]
    dense, experts = split_counts(hf_mixtral(c))
    assert param_count(c) == dense + experts                              # 46,702,792,704 for 8x7B
    norms = 2 * c.hidden + (2 * c.head_dim if c.qk_norm else 0)
    active = c.layers * (layer_active_params(c) + norms) + 2 * c.vocab * c.hidden + c.hidden
    assert active == dense + experts * c.top_k // c.experts               # the norms are not matmuls
    # Mistral's "46.7B ... 12.9B", "141B ... 39B"; Qwen's "30.5B ... 3.3B" (3.35: Qwen cuts, Mistral rounds)
    last_digit = 0.1 if total_b < 100 else 1
    assert abs(param_count(c) / 1e9 - total_b) < last_digit and abs(active / 1e9 - active_b) < last_digit


TINY = ModelConfig(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, max_seq=128, tie_embeddings=False,
                   experts=4, top_k=2)
TINY_QWEN3 = replace(TINY, head_size=32, qk_norm=True)   # heads of 32, q 128 wide at hidden 64


@pytest.mark.parametrize("c", [TINY, TINY_QWEN3], ids=["mixtral", "qwen3"])
def test_moe_tensors_in_transformers_order(c):
    assert tensors.sizes(c) == [p.numel() for p in hf_mixtral(c).parameters()]


@pytest.mark.parametrize("c", [TINY, TINY_QWEN3], ids=["mixtral", "qwen3"])
def test_moe_training_flops_match_pytorchs_flop_counter(c):
    torch.manual_seed(0)
    model, ids = hf_mixtral(c, "cpu"), torch.randint(0, c.vocab, (2, 32))
    with FlopCounterMode(display=False) as counter:
        model(ids, labels=ids).loss.backward()
    # every token's top-2 experts and the router, forward and backward, attention counted causal-free
    assert counter.get_total_flops() == flops_per_token(c, 32) * ids.numel()


def test_expert_parallel_states_are_megatrons_distributed_optimizer_bytes():
    """Megatron's distributed optimizer (docs/source/api-guide/dist_optimizer.md): 6 + 12/d bytes a parameter
    with bf16 weights and fp32 main gradients, d the ranks sharding it: dp for the dense parameters, dp/ep
    (the expert-data-parallel group) for the experts, of which a rank holds an ep-th."""
    c = SHAPES["mixtral-8x7b"]
    dense, experts = split_counts(hf_mixtral(c))
    dp, ep = 64, 8
    got = estimate(Setup(params=param_count(c), stage=1, dp=dp, model=c, seq=4096, activations="megatron",
                         optimizer="megatron", ep=ep, persistence_threshold=0))
    states = sum(t.device for t in got.terms if t.name in MODEL_STATES)
    assert states == pytest.approx(dense * (6 + 12 / dp) + experts / ep * (6 + 12 / (dp // ep)), rel=1e-9)
    alone = estimate(Setup(params=param_count(c), stage=1, dp=dp, model=c, seq=4096, activations="megatron",
                           optimizer="megatron", persistence_threshold=0))
    assert sum(t.device for t in alone.terms if t.name in MODEL_STATES) == pytest.approx(
        (dense + experts) * (6 + 12 / dp), rel=1e-9)                      # without ep: every expert on every rank


@pytest.mark.parametrize("name, gpus, layout, tflops", [
    # Megatron-LM's MoE README (commit c230e0d7c2): 468 TFLOP/s a GPU, its reference mapping for Mixtral-8x7B
    ("mixtral-8x7b", 64, dict(dp=16, tp=1, pp=4, ep=8, etp=1, virtual=8, micro_batch=1), 468),
    # Liu et al. 2025 (MoE Parallel Folding), tables 2-3, Megatron-Core without folding: 458.3 TFLOP/s
    ("mixtral-8x22b", 128, dict(dp=8, tp=2, pp=8, ep=4, etp=2), 458.3),
])
def test_mixtral_step_time_within_15_percent_of_megatron_core(name, gpus, layout, tflops):
    c = SHAPES[name]
    job = Job(c, gpus, 4096, 256, fixed=tuple(layout.items()), activations="megatron", optimizer="megatron",
              gather_overlap=True)
    best = plan(job, GPUS["H100"]).ranked[0]
    published = flops_per_token(c, 4096) * 256 * 4096 / (gpus * tflops * 1e12)
    assert best.layout == (layout["dp"], layout["tp"], layout["pp"], 1, layout["ep"], layout["etp"])
    assert best.terms["ep"] > 0 and best.step_s == pytest.approx(published, rel=0.15)


def test_all_to_all_over_the_network_costs_more_than_over_nvlink():
    c = SHAPES["mixtral-8x7b"]
    job = Job(c, 64, 4096, 256, fixed=(("dp", 16), ("tp", 1), ("pp", 4), ("ep", 8), ("micro_batch", 1),
                                       ("virtual", 1), ("zero", 1), ("recompute", "none")), activations="megatron")
    inside = plan(job, GPUS["H100"]).ranked[0].terms["ep"]
    h100 = GPUS["H100"]
    across = plan(job, replace(h100, gpus_per_node=4)).ranked[0].terms["ep"]
    # inside a node 7/8 of each message leaves over NVLink; over two 4-GPU nodes 4/8 over the rank's network card
    assert across / inside == pytest.approx((4 / 8 / h100.inter_gbs) / (7 / 8 / h100.intra_gbs), rel=0.05)


def plscale(*args):
    return subprocess.run([sys.executable, "-m", "plscale.cli.main", *args], capture_output=True, text=True)


def test_plan_cli_chooses_expert_parallelism_and_refuses_bad_ep():
    done = plscale("plan", "--model", "mixtral-8x7b", "--gpus", "64", "--optimizer", "megatron", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["job"]["activations"] == "megatron"
    assert all(8 % c["ep"] == 0 and c["dp"] % c["ep"] == 0 for c in out["candidates"])
    assert any(c["ep"] > 1 for c in out["candidates"]) and all(c["tp"] == 1 or c["sp"] for c in out["candidates"])
    for args, says in ((["--model", "mixtral-8x7b", "--ep", "3"], "--ep 3: the 8 experts split over ep 1, 2, 4, 8."),
                       (["--model", "llama3-8b", "--ep", "2"], "--ep 2: llama3-8b's MLPs are dense"),
                       (["--model", "mixtral-8x7b", "--activations", "plscale"], "plscale's Llama has no experts")):
        bad = plscale("plan", *args)
        assert bad.returncode == 2 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_bad_expert_layouts_say_what_is_wrong():
    for args, says in ((["--gpus", "4", "--ep", "8"], "--ep 8 comes out of a pipeline stage's tp x cp x dp ranks"),
                       (["--gpus", "64", "--tp", "2", "--no-sp"], "needs sequence parallelism"),
                       (["--gpus", "64", "--zero", "3", "--ep", "8"], "DeepSpeed's MoE layers refuse ZeRO-3"),
                       (["--gpus", "64", "--tp", "2", "--etp", "4"], "--etp 4: the experts split over --tp 2 or not"),
                       (["--gpus", "64", "--tp", "2", "--ep", "1", "--etp", "1"], "come with expert parallelism")):
        bad = plscale("plan", "--model", "mixtral-8x7b", *args)
        assert bad.returncode == 2 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    for args, says in ((["--tp", "2", "--ep", "4"], "needs sequence parallelism"),
                       (["--ep", "16"], "split the 8 experts, and ep x etp 1 must divide a stage's 64 ranks"),
                       (["--tp", "2", "--sp", "--ep", "4", "--etp", "3"], "use --etp 2 or 1")):
        bad = plscale("estimate", "memory", "--model", "mixtral-8x7b", "--gpus", "64", "--stage", "1", *args)
        assert bad.returncode == 2 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_estimate_memory_with_ep_prices_megatrons_bytes_from_the_cli():
    c = SHAPES["mixtral-8x7b"]
    dense, experts = split_counts(hf_mixtral(c))
    done = plscale("estimate", "memory", "--model", "mixtral-8x7b", "--gpus", "64", "--stage", "1", "--ep", "8",
                   "--optimizer", "megatron", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    states = sum(out["terms"][name]["device"] for name in MODEL_STATES)
    assert states == pytest.approx(dense * (6 + 12 / 64) + experts / 8 * (6 + 12 / 8), rel=1e-9)
    assert out["setup"]["activations"] == "megatron" and out["activations"] is None   # Megatron's count: one term
