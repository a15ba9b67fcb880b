"""Collectives written by hand over point-to-point send/recv (lab 03, `plscale lab run ring-allreduce`).

    ring.py    the ring all-reduce: reduce-scatter then all-gather, 2(N-1)/N x S bytes per rank
    naive.py   everyone to rank 0 and back: the same sum, (N-1) x S bytes through rank 0

Prediction: plscale/predict/busbw.py (bytes each collective sends, bus bandwidth as nccl-tests
reports it). Exercise: `plscale exercise ring-allreduce`.
"""
