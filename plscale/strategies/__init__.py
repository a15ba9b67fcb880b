"""The strategies, written to be read: one package per way of splitting a training run.

    collectives/       the ring all-reduce and the naive one, over send/recv        lab 03
    data_parallel/     the sharded sampler and the de-duplicating evaluation gather  labs 01, 02
    fsdp/              PyTorch's FSDP2 per layer, HSDP, meta-device init, a census    lab 04
                       FSDP2 x DTensor tp x torch's pipeline (torchtitan's order)     lab 11
    pipeline/          GPipe and 1F1B, the p2p links, three engines behind one face  lab 05
    tensor_parallel/   Megatron's f and g, parallel layers, the TP Llama, production  lab 07
    context_parallel/  ring attention (plain and zig-zag), Ulysses, the CP Llama      lab 08
    experts/           the router, the all-to-all dispatch, the MoE Llama             lab 08
    recompute/         activation recomputation on the Llama: selective, full         lab 09
    precision/         fp16's loss scaling, fp8's casts                               lab 09
    checkpoint/        basic, incremental, async and multi-level checkpoints; faults  lab 06
    hybrid/            tp x cp layers in pipeline stages, 1F1B, one dp-cp reduce    lab 11

ZeRO (lab 04) is DeepSpeed's own: the lab configures it (plscale/dsconfig) and measures it, and
sets PyTorch's FSDP2 (fsdp/) beside it; the graded exercise plscale/exercises/zero1 has a student
write ZeRO-1 by hand.

What each strategy costs is predicted, without torch, in plscale/predict (each package's
docstring names its module); what runs a rank (distributed init, the mesh's groups, logs,
metrics, the memory census) is plscale/rank. Nothing here imports plscale.run.
"""
