"""Mixed precision (lab 09, `plscale lab run precision`, `fp16`, `fp8`).

    loss_scaling.py   fp16's loss scaling inside a DeepSpeed engine: which path runs it, the
                      scaler's log, underflow and overflow of real gradients
    fp8.py            e4m3 and e5m2 casts of real tensors, with and without a per-tensor scale
    engine.py         a DeepSpeed engine for one precision, fp16's two paths in one place
    explain.py        what a precision run found, in the words the lab prints under its tables

Prediction: plscale/predict/formats.py (each format's range and precision, bytes per parameter)
and plscale/predict/memory.py (what bf16 and fp16 keep per rank). Charts: plscale/charts/precision.py.
"""
