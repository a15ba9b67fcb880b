"""Context parallelism: the sequence split over cp ranks, attention stitched back together.

    ring_attention.py  ring attention, forward and backward by hand: k/v blocks go round the
                       ring, partial softmaxes merge by log-sum-exp; a tally of bytes and work
    ulysses.py         DeepSpeed-Ulysses: all-to-all from a sequence split to a head split and back
    llama.py           the dense Llama with either attention, RoPE at global positions; split_batch

Which tokens a rank holds (plain or zig-zag) is `plscale.predict.context_parallel.positions`,
the same definition the lab's prediction uses.

Lab 08 (`plscale lab run ring-attention`, `ulysses`). Prediction: plscale/predict/context_parallel.py
(`plscale estimate cp`).
"""
