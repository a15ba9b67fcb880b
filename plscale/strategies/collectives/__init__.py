"""Collectives written by hand over point-to-point send/recv, and measured (lab 03,
`plscale lab run ring-allreduce`, `plscale bench collectives`).

    ring.py             the ring all-reduce: reduce-scatter then all-gather, 2(N-1)/N x S bytes per rank
    naive.py            everyone to rank 0 and back: the same sum, (N-1) x S bytes through rank 0
    timing.py           one point of a benchmark, the nccl-tests way: warm up, time, check the answer
    against_library.py  the hand-written all-reduces beside dist.all_reduce: same bits, time ratio

Prediction: plscale/predict/busbw.py (bytes each collective sends, bus bandwidth as nccl-tests
reports it). Exercise: `plscale exercise ring-allreduce`.
"""
