"""Where DeepSpeed's ZeRO-1/2 cuts the flat parameter buffer into N partitions, and so which
gradients each rank keeps: whole tensors, not exactly Ψ/N.

Read in DeepSpeed 0.19, deepspeed/runtime/zero/stage_1_and_2.py (DeepSpeedZeroOptimizer):

  * __init__ flattens each parameter group, its tensors in model.parameters() order, into one
    buffer padded at its end to a multiple of nccl_start_alignment_factor x N = 2N elements
    (flatten_dense_tensors_aligned; with parameter_alignment off, the default, nothing between
    tensors), and cuts it into N partitions of P = len / N elements (get_data_parallel_partitions).
  * get_partition_info: rank r's params_in_partition are the tensors that start inside
    [rP, (r+1)P), plus the one that straddles rP.
  * reduce_ipg_grads, after each bucket's reduction: the gradients of every other tensor are
    freed (clear_grad_attribute); copy_grads_in_partition copies each of rank r's tensors'
    gradients WHOLE into grads_in_partition, a buffer of the sum of their sizes
    (contiguous_gradients, plscale's default; with it off their .grad stay whole instead).
  * independent_gradient_partition_epilogue, after each backward: all_grad_tensors keeps those
    whole gradients (views of grads_in_partition) while micro-batches accumulate, and the reduce
    bucket (ipg_buckets, reduce_bucket_size elements; a tensor above that size is reduced in place,
    extra_large_param_to_reduce) is freed by _release_ipg_buffers. Only step() cuts the exact
    partition of P out of them (get_flat_partition).

So after a backward rank r holds the gradients of its params_in_partition, whole: P, plus the
part before rP of the tensor that straddles its start, plus the part after (r+1)P of the one
that straddles its end, less the last rank's padding. A tensor that crosses a boundary is held
in full by both ranks. Not modelled: round_robin_gradients (reorders the tensors before
flattening; off by default), parameter_alignment, and peaks inside a backward (the bucket; the
next micro-batch's grads_in_partition before it is added to the first).

Pure: the tensor sizes come from the shape, in the order of the model's modules
(plscale.predict.tensors; a test checks them against the built models).
"""

from plscale.predict import tensors
from plscale.predict.presets import ModelConfig

NCCL_START_ALIGNMENT_FACTOR = 2  # DeepSpeedZeroOptimizer.nccl_start_alignment_factor (elements)


def tensor_sizes(c: ModelConfig) -> list[int]:
    """Elements of each parameter in model.parameters() order (plscale.predict.tensors): for
    plscale's Llama the embedding; per layer the input norm, q, k, v, o, the post-attention norm,
    gate, up, down; the final norm; the output head unless it is the embedding's (tied: counted
    once, at the embedding). A Hugging Face model's come in transformers' order."""
    return tensors.sizes(c)


def partition_size(total: int, n: int, alignment_factor: int = NCCL_START_ALIGNMENT_FACTOR) -> int:
    """P: the flat buffer of `total` elements padded to a multiple of alignment_factor x n, over n."""
    step = alignment_factor * n
    return -(-total // step) * step // n


def held_elements(sizes: list[int], n: int) -> list[int]:
    """Gradient elements rank 0 .. n-1 keeps after a backward: the whole size of every tensor in
    its params_in_partition (get_partition_info's rule: it starts in [rP, (r+1)P) or straddles rP)."""
    size = partition_size(sum(sizes), n)
    held = []
    for r in range(n):
        start, end, at, total = r * size, (r + 1) * size, 0, 0
        for numel in sizes:
            if start <= at < end or at < start < at + numel:
                total += numel
            at += numel
        held.append(total)
    return held
