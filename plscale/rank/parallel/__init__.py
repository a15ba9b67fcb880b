"""The building blocks of parallel training written to be read: collectives by hand over
point-to-point send/recv (the ring all-reduce, the naive one), and more to come."""
