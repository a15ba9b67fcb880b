"""What runs inside each rank, and nothing lab-specific. The strategies a lab teaches are
plscale/strategies, which build on this; nothing here imports them (tests/test_imports.py).

    runtime.py             start and finish a lab: arguments, settings, distributed init, the run directory
    distributed.py         the process group over gloo or NCCL, restarts, seeds, gathering from every rank
    mesh.py                the process groups of a layout (dp, tp, pp, cp, ep), Megatron's order
    logs.py, metrics.py    per-rank logs; metrics.jsonl and summary.json, each figure with its unit
    system.py              versions and hardware, recorded with every run
    census.py              live tensors by role (parameters, gradients, optimizer states, activations)
    allocations.py         the allocator's history over one step
    memory.py              resident or allocated memory per rank
    comms.py               one reader of DeepSpeed's comms logger
    tally.py               collectives counted where a hand-written mechanism issues them
    taps.py                real tensors at a model's linear layers, for one forward and backward
    optim.py               the optimizer a run's DeepSpeed config describes, built by torch
    against_prediction.py  measured beside predicted: memory per rank, collectives per step
    against_dense.py       a split model's losses against the dense model's
    rank_tables.py         every rank's values side by side, printed by rank 0
    sanity.py              the first test of a cluster (`plscale doctor --distributed`)
    data/, models/         the datasets and the models the labs train
"""
