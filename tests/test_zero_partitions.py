"""DeepSpeed's ZeRO-1/2 gradient partitions hold whole tensors (plscale.predict.zero_partitions,
memory.py's rule 5): against DeepSpeed's own partitioning code, and against what lab 04's tensor
census measured."""

from dataclasses import replace

import pytest
import torch

from plscale.predict.memory import Setup, estimate, rank_params
from plscale.predict.presets import PRESETS, param_count
from plscale.predict.zero_partitions import held_elements, partition_size, tensor_sizes
from plscale.rank.models.llama import Llama

SHAPES = {"tiny": PRESETS["tiny"], "small": PRESETS["small"], "deep": PRESETS["deep"],
          "tiny-untied": replace(PRESETS["tiny"], tie_embeddings=False),
          "tiny-gqa": replace(PRESETS["tiny"], kv_heads=2), "small-5000": PRESETS["small"].with_vocab(5000)}


@pytest.mark.parametrize("name", SHAPES)
def test_tensor_sizes_are_the_built_models_parameters_in_order(name):
    with torch.device("meta"):
        model = Llama(SHAPES[name])
    assert tensor_sizes(SHAPES[name]) == [p.numel() for p in model.parameters()]


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_held_elements_follow_deepspeeds_get_partition_info(name, n):
    """DeepSpeedZeroOptimizer's own code: the flat buffer padded by align_dense_tensors to
    nccl_start_alignment_factor (2) x N, cut in N (get_data_parallel_partitions), and each rank's
    params_in_partition (get_partition_info, which reads nothing of self), held whole."""
    from deepspeed.runtime.utils import align_dense_tensors
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    sizes = tensor_sizes(SHAPES[name])
    tensors = [torch.empty(s, device="meta") for s in sizes]
    size = sum(t.numel() for t in align_dense_tensors(tensors, 2 * n)) // n
    assert partition_size(sum(sizes), n) == size
    theirs = [sum(t.numel() for t in DeepSpeedZeroOptimizer.get_partition_info(None, tensors, size, r)[0])
              for r in range(n)]
    assert held_elements(sizes, n) == theirs
    assert sum(theirs) >= sum(sizes)  # a tensor across a boundary is held by both sides


# Lab 04's census (plscale lab run ... --cpu, 2026-12-01, runs/20261201-*-zero-*/summary.json,
# memory.gradients.measured_bytes), fp32, after the backward of step 1's first micro-batch. Each rank
# also held 4 bytes more: the optimizer's _global_grad_norm, a 0-d fp32 tensor, not a gradient partition.
MEASURED = [
    # zero2 --gpus 2 (the lab's default: small, vocab 8192 from the local BPE, grad_accum 2)
    (dict(model="small", stage=2, dp=2, grad_accum=2), [10_881_028, 11_082_756]),
    # zero2 --gpus 2 --set model.preset=tiny --set model.seq=64 (vocab 2048)
    (dict(model="tiny", stage=2, dp=2, grad_accum=2), [1_508_356, 1_443_332]),
    # zero1 --gpus 2 --set ds.grad_accum=1 (reduced in the backward, memory.py's rule 2)
    (dict(model="small", stage=1, dp=2, grad_accum=1), [10_881_028, 11_082_756]),
    # zero2-offload --gpus 2 --set model.preset=tiny --set model.seq=64: on the host, the fp32 partition
    # (4Ψ/N exactly) and accumulated_grads_in_cpu, one whole buffer per tensor of the partition
    (dict(model="tiny", stage=2, dp=2, grad_accum=2, offload_optimizer=True), [2_885_892, 2_820_868]),
]


@pytest.mark.parametrize("setup,measured", MEASURED)
def test_gradient_term_is_what_the_census_measured_on_each_rank(setup, measured):
    config = PRESETS[setup.pop("model")]
    term = estimate(Setup(params=param_count(config), model=config, precision="fp32", **setup)).term("gradients")
    assert term.by_rank == tuple(m - 4 for m in measured)
    assert term.total == max(term.by_rank) and (term.host if setup.get("offload_optimizer") else term.device) == term.total


def test_without_a_shape_or_with_model_parallelism_the_partition_is_p_psi_over_n():
    config = PRESETS["small"]
    psi = param_count(config)
    for kw in (dict(), dict(model=config, tp=2), dict(model=config, pp=2)):
        s = Setup(params=psi, stage=2, dp=2, precision="fp32", **kw)
        term = estimate(s).term("gradients")
        assert term.by_rank == () and term.device == 4 * rank_params(s) / 2
    # unpartitioned gradients (stage 0, ZeRO-1 accumulating), offload's lone micro-batch (the exact fp32
    # partition) keep their own rules
    # stage 3 (stage3.py's own exact partitions), likewise
    for kw in (dict(stage=0), dict(stage=1, grad_accum=2), dict(stage=2, offload_optimizer=True), dict(stage=3),
               dict(stage=3, grad_accum=2, offload_optimizer=True)):
        assert estimate(Setup(params=psi, dp=2, precision="fp32", model=config, **kw)).term("gradients").by_rank == ()
