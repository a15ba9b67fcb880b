"""Tensor and sequence parallelism, Megatron-style, written to be read (lab 07).

    operators.py   f and g (and their sequence-parallel forms) as autograd functions; a tally of every call
    layers.py      ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, vocab-parallel cross-entropy
    llama.py       the lab's Llama with every block split across the tensor-parallel group
    dtensor_path.py, autotp_path.py, megatron_path.py   the production paths
    side_by_side.py  each production path trained beside the hand-written one: same weights, same batches

Lab 07 (`plscale lab run tp`). Prediction: plscale/predict/tensor_parallel.py (parameters and
collectives per rank, `plscale estimate tp`) and plscale/predict/activations.py. Exercise:
`plscale exercise tp-column`.
"""
