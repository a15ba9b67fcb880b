"""Collectives written by hand over point-to-point send/recv: the ring all-reduce and the
naive one (everything through rank 0), plus the benchmark loop of the collectives lab."""
