"""Mixture of experts with expert parallelism, written to be read, beside DeepSpeed's MoE (lab 08).

    router.py     top-1/top-2 gating by hand: slots by cumsum, capacity drops, l_aux; bit for bit
                  DeepSpeed's top1gating/top2gating
    dispatch.py   [S, h] -> [E, C, h] -> all-to-all -> each rank's experts -> all-to-all -> [S, h];
                  a tally of every all-to-all
    layer.py      MoEMLP (router + local SwiGLU experts + dispatch) and DeepSpeed's MoE behind the
                  same interface, both loadable from one unsharded set of weights
    llama.py      the Llama with an MoE MLP in every layer; DeepSpeed engine set-up, and the
                  gradient reduction DeepSpeed applies to expert weights, by hand

How many slots an expert has (the capacity) is `plscale.predict.experts.capacity`, the same
definition the lab's prediction uses.

Lab 08 (`plscale lab run moe`, `moe-deepspeed`). Prediction: plscale/predict/experts.py
(`plscale estimate moe`).
"""
