"""Activation recomputation (lab 09, `plscale lab run recompute`): keep less of the forward,
rebuild it inside the backward.

    llama.py   none, selective (the attention core), full (every layer) and DeepSpeed's
               checkpointing, applied to plscale's Llama in place

Prediction: plscale/predict/activations.py (what each strategy keeps per layer) and
plscale/predict/recompute.py (the FLOPs a rerun costs). Charts: plscale/charts/recompute.py.
"""
