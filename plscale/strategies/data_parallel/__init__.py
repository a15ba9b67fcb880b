"""The pieces data parallelism adds to a training loop (labs 01 and 02).

    sampler.py   which samples each rank sees: a shard per rank, reshuffled every epoch
    gather.py    evaluation across ranks: predictions gathered by sample index, counted once
    reductions.py  the gradient reductions DDP and DeepSpeed really issue, counted as they run

The gradient all-reduce itself is DDP's or DeepSpeed's; lab 01 shows by hand why averaging the
shards' gradients equals the full batch's. Prediction: what an all-reduce sends,
plscale/predict/busbw.py.
"""
