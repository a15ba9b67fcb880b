"""What each DeepSpeed setting does to memory, communication and speed, for `config diff`."""

from plscale.dotted import flatten

# Longest matching dotted prefix wins.
MEANING = {
    "zero_optimization.stage": "ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters "
                               "across data-parallel ranks. Higher stage: less memory per rank; stage 3 adds "
                               "an all-gather of parameters in forward and backward (about 1.5x the traffic).",
    "zero_optimization.offload_optimizer": "Optimizer states and the Adam step move to CPU memory: frees "
                                           "12 bytes/param of GPU memory, costs PCIe traffic and CPU time per step.",
    "zero_optimization.offload_param": "Parameters live in CPU memory and are fetched per layer: frees the "
                                       "remaining GPU parameter memory, slows every forward and backward.",
    "zero_optimization.reduce_bucket_size": "Elements reduced per collective: larger buckets mean fewer, more "
                                            "efficient calls but a larger temporary buffer.",
    "zero_optimization.allgather_bucket_size": "Elements all-gathered per collective: same trade-off as the "
                                               "reduce bucket.",
    "zero_optimization.overlap_comm": "Overlap gradient reduction with backward compute: faster steps, "
                                      "more buffer memory.",
    "zero_optimization.contiguous_gradients": "Copy gradients into one contiguous buffer: less fragmentation, "
                                              "one extra copy.",
    "zero_optimization.stage3": "ZeRO-3 prefetch/persistence tuning: trades memory for fewer, earlier all-gathers.",
    "train_batch_size": "Global batch (micro x accumulation x ranks): changes the optimization itself.",
    "train_micro_batch_size_per_gpu": "Samples per rank per forward: activation memory grows with it; "
                                      "larger micro batches use the hardware better.",
    "gradient_accumulation_steps": "Micro-batches per optimizer step: a larger global batch at the same "
                                   "activation memory; gradient all-reduce happens once per step.",
    "gradient_clipping": "Clip the global gradient norm: stability; needs one extra norm reduction.",
    "optimizer": "Optimizer and its hyperparameters: Adam keeps two fp32 moments (8 bytes/param).",
    "optimizer.params.torch_adam": "Use torch's Adam instead of DeepSpeed's fused kernel: no JIT build, "
                                   "slower on GPUs.",
    "scheduler": "Learning-rate schedule: changes the optimization, not memory or communication.",
    "fp16": "fp16 mixed precision: halves parameter/activation bytes and uses tensor cores; needs loss scaling.",
    "fp16.loss_scale": "fp16 loss scaling: 0 = dynamic (halve on overflow, grow after a clean window), a "
                       "number = a static scale (1 = none). Too low: small gradients underflow to 0.",
    "fp16.initial_scale_power": "Dynamic loss scaling starts at 2^this: too high costs a skipped step per "
                                "halving at the start.",
    "fp16.loss_scale_window": "Clean steps before the loss scale doubles: shorter finds headroom sooner, "
                              "overflows (skipped steps) more often.",
    "fp16.hysteresis": "Overflows tolerated before the loss scale halves (DeepSpeed's scaler only).",
    "fp16.min_loss_scale": "The floor of the dynamic loss scale (DeepSpeed's scaler only).",
    "torch_autocast": "torch.autocast inside DeepSpeed: weights, gradients and optimizer stay fp32, the ops "
                      "(linears) run in bf16 or fp16; no memory saved on model states, 16-bit speed for the "
                      "matmuls; fp16 gets torch's GradScaler at ZeRO 0. Not together with an fp16 or bf16 section.",
    "bf16": "bf16 mixed precision: halves parameter/activation bytes, fp32's range so no loss scaling.",
    "activation_checkpointing": "Recompute activations in backward: activation memory drops to one per layer "
                                "boundary, compute rises by about a third.",
    "checkpoint.load_universal": "Load a universal checkpoint (every parameter whole, from "
                                 "`plscale ckpt convert --to universal`): resume at another world size or layout.",
    "tensor_parallel.autotp_size": "DeepSpeed AutoTP: each decoder layer's linear weights split over this many "
                                   "ranks (Megatron's column/row layers), shrinking their weights, gradients and "
                                   "optimizer states per rank by it; embedding, norms and head stay whole. Costs "
                                   "activation all-reduces: 2 per layer forward, 5 backward (q, k, v, gate, up).",
    "pipeline": "Pipeline-parallel settings: activation checkpoint interval between stages.",
    "comms_logger": "Log every collective's size and time: a little overhead, a table of communication.",
    "flops_profiler": "Profile FLOPs and latency of one step: overhead on the profiled step only.",
    "steps_per_print": "How often DeepSpeed prints its own step line: no effect on training.",
    "wall_clock_breakdown": "Time forward, backward and step separately: adds synchronisation, slows steps.",
}


def meaning(key: str) -> str:
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in MEANING:
            return MEANING[prefix]
        for known, text in MEANING.items():  # stage3_* keys share one explanation
            if prefix.startswith(known) and known.endswith("stage3"):
                return text
    return "Not explained by plscale; see the DeepSpeed config documentation."


def diff(a: dict, b: dict) -> list[tuple[str, object, object, str]]:
    """(key, value in a, value in b, what it means) for every key that differs."""
    flat_a, flat_b = flatten(a), flatten(b)
    missing = object()
    rows = []
    for key in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(key, missing), flat_b.get(key, missing)
        if va != vb:
            rows.append((key, "(unset)" if va is missing else va, "(unset)" if vb is missing else vb,
                         meaning(key)))
    return rows
