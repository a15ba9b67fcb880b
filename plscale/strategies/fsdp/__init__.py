"""PyTorch's own sharding: FSDP2 (`fully_shard`) over a DeviceMesh, beside DeepSpeed's ZeRO (lab 04).

    fully_shard.py   each decoder layer one FSDP2 group, the rest (embedding, tied head, norm) the
                     root's; reshard after forward (ZeRO-3's schedule) or not (ZeRO-2's); HSDP on a
                     2D mesh; fp32 or FSDP2's mixed precision; a model built on the meta device and
                     filled from one full state dict
    census.py        what each rank holds: FSDP2's shards and gathered parameters, the sharded
                     gradients, Adam's moments
    composed.py      FSDP2 x DTensor tensor parallel x torch.distributed.pipelining on one
                     DeviceMesh pp x dp x tp, in torchtitan's order (lab 11's fsdp2 variants)

The collectives are FSDP2's (torch.distributed.fsdp); plscale.rank.dispatched counts them as torch
dispatches them. Predictions: plscale/predict/fsdp.py.
"""
