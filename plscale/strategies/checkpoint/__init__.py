"""Checkpoints inside the ranks, and the failures they guard against (lab 06).

    sealed.py        a checkpoint that is complete or absent: checksums, a `latest` that moves last
    rank_state.py    what a rank adds beside DeepSpeed's state (RNG, data position)
    basic.py         save every k steps, training waits
    incremental.py   full saves now and then, XOR deltas between them
    asynchronous.py  copy to memory, write in a background thread
    multilevel.py    node-local memory often, shared storage now and then
    strategies.py    the four by name, from the lab's `ckpt` settings
    fault.py         one rank killed at one step, the way a crashed node dies
    dcp.py           PyTorch's way: an FSDP2 model saved by torch.distributed.checkpoint, loaded at
                     any world size; the engine calls the strategies make, so they run on it too

Prediction: plscale/predict/checkpoint.py (bytes written, Young/Daly's interval, steps lost).
Checkpoints on disk, outside a run: plscale/ckpt (`plscale ckpt`).
"""
