"""A typed spec of the DeepSpeed settings the labs use, turned into DeepSpeed JSON.

The batch triple is kept consistent: DeepSpeed requires
    train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size
so the spec stores micro batch and accumulation, and writes train_batch_size only when
the world size is known (DeepSpeed derives it otherwise).

Precision, two ways for bf16 and fp16:
    "bf16" / "fp16" sections   the weights and gradients in 16 bits, an fp32 master copy in the
                               optimizer; fp16 with DeepSpeed's loss scaler (loss_scale 0: dynamic,
                               from 2^initial_scale_power, halved on overflow, doubled after
                               loss_scale_window clean steps; a number: static, 1 = none)
    autocast: "torch_autocast" the weights, gradients and optimizer stay fp32; the ops autocast
                               runs in 16 bits. fp16 at ZeRO 0 gets torch's GradScaler, which the
                               JSON cannot configure (torch's defaults; plscale.strategies.precision.loss_scaling
                               sets it from the spec's loss scaling after deepspeed.initialize)
"""

from dataclasses import asdict, dataclass, fields

from plscale.dsconfig import valid
from plscale.errors import UserError, did_you_mean

# ZeRO-3 keeps tensors of at most this many elements whole on every rank (DeepSpeed's default is 1e5: a small
# model's projections too); plscale's configs keep only the small ones, so a small lab model is still sharded
PERSISTENCE_THRESHOLD = 10_000

OPTIMIZERS = ("AdamW", "Adam")  # others: pass a client optimizer to deepspeed.initialize
SCHEDULERS = (None, "WarmupLR", "WarmupCosineLR")


@dataclass
class DSSpec:
    stage: int = 0                       # ZeRO stage 0-3
    offload_optimizer: bool = False      # optimizer states (and the step) on the CPU
    offload_param: bool = False          # parameters on the CPU (stage 3 only)
    precision: str = "fp32"              # fp32 | bf16 | fp16
    autocast: bool = False               # bf16/fp16 as DeepSpeed's torch_autocast: fp32 weights, 16-bit ops
    loss_scale: float = 0.0              # fp16 only: 0 = dynamic loss scaling; else static (1 = none)
    initial_scale_power: int = 16        # fp16 dynamic scaling starts at 2**this
    loss_scale_window: int = 1000        # fp16: clean steps before the scale doubles
    hysteresis: int = 2                  # fp16 (ZeRO 1-3): overflows before the scale halves
    min_loss_scale: int = 1              # fp16 (DeepSpeed's scaler): the scale never goes below it
    micro_batch: int = 8                 # samples per rank per forward/backward
    grad_accum: int = 1                  # micro-batches per optimizer step
    world_size: int = 0                  # 0 = unknown: train_batch_size left to DeepSpeed
    grad_clip: float = 1.0               # 0 disables clipping
    optimizer: str = "AdamW"
    lr: float = 1e-3
    weight_decay: float = 0.0
    torch_adam: bool = True              # torch's Adam: no JIT build; False = DeepSpeed's fused kernel
    scheduler: str | None = None
    warmup_steps: int = 0
    total_steps: int = 0                 # WarmupCosineLR needs it
    bucket_size: int = 50_000_000        # reduce/all-gather bucket (elements); small on CPU
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    activation_checkpointing: bool = False
    comms_logger: bool = False
    flops_profiler: bool = False
    pipe_activation_interval: int = 0    # pipeline: activation checkpoint every k layers
    steps_per_print: int = 1_000_000     # keep DeepSpeed's own step log quiet; plscale prints
    load_universal: bool = False         # load_checkpoint reads a universal checkpoint (plscale ckpt convert)
    autotp_size: int = 0                 # DeepSpeed AutoTP: tensor-parallel ranks per group; 0 = off

    @classmethod
    def from_dict(cls, values: dict) -> "DSSpec":
        names = {f.name for f in fields(cls)}
        for key in values:
            if key not in names:
                raise UserError(f"Unknown DeepSpeed setting {key!r}.{did_you_mean(key, names)}")
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        valid.require(self.stage, self.precision, self.offload_optimizer, self.offload_param)
        if self.autocast and self.precision == "fp32":
            raise UserError("autocast runs bf16 or fp16 ops on fp32 weights: set precision bf16 or fp16, "
                            "or turn autocast off.")
        if self.precision == "fp16":
            valid.require_loss_scaling(self.loss_scale, self.initial_scale_power, self.loss_scale_window,
                                       self.hysteresis, self.min_loss_scale)
        for name in ("micro_batch", "grad_accum"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be at least 1 (got {getattr(self, name)}).")
        if self.world_size < 0:
            raise UserError(f"world_size must be 0 (unknown) or a rank count (got {self.world_size}).")
        if self.lr <= 0:
            raise UserError(f"lr must be positive (got {self.lr:g}), for example 1e-3.")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise UserError(f"grad_clip ({self.grad_clip:g}) and weight_decay ({self.weight_decay:g}) must be 0 (off) "
                            f"or positive.")
        if self.bucket_size < 1:
            raise UserError(f"bucket_size must be at least 1 element (got {self.bucket_size}); 500000 suits CPUs.")
        if self.warmup_steps < 0 or self.total_steps < 0 or self.pipe_activation_interval < 0 or self.autotp_size < 0:
            raise UserError("warmup_steps, total_steps, pipe_activation_interval and autotp_size must be 0 or more.")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"Optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}.")
        if self.scheduler not in SCHEDULERS:
            raise UserError(f"Scheduler {self.scheduler!r} is not one of WarmupLR, WarmupCosineLR or null.")
        if self.scheduler == "WarmupCosineLR" and self.total_steps < 1:
            raise UserError("WarmupCosineLR needs total_steps >= 1.")


def build(spec: DSSpec) -> dict:
    """The DeepSpeed JSON (as a dict) for a spec."""
    spec.validate()
    config = {
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
    }
    # Under AutoTP, DeepSpeed checks train_batch_size against every rank, tensor-parallel ones
    # included (it reads the config before it makes its groups): left for it to derive.
    if spec.world_size and not spec.autotp_size:
        config["train_batch_size"] = spec.micro_batch * spec.grad_accum * spec.world_size
    # Always explicit: DeepSpeed clips at 1.0 when the key is absent.
    config["gradient_clipping"] = spec.grad_clip
    config["optimizer"] = _optimizer(spec)
    if spec.scheduler:
        config["scheduler"] = _scheduler(spec)
    if spec.autocast:
        config["torch_autocast"] = {"enabled": True, "dtype": valid.AUTOCAST_DTYPES[spec.precision]}
    elif spec.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif spec.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": spec.loss_scale,
                          "initial_scale_power": spec.initial_scale_power,
                          "loss_scale_window": spec.loss_scale_window, "hysteresis": spec.hysteresis,
                          "min_loss_scale": spec.min_loss_scale}
    config["zero_optimization"] = _zero(spec)
    if spec.activation_checkpointing:
        config["activation_checkpointing"] = {"partition_activations": spec.stage == 3,
                                              "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
    if spec.pipe_activation_interval:
        config["pipeline"] = {"activation_checkpoint_interval": spec.pipe_activation_interval}
    if spec.comms_logger:
        config["comms_logger"] = {"enabled": True, "verbose": False, "prof_all": True, "debug": False}
    if spec.flops_profiler:
        config["flops_profiler"] = {"enabled": True, "profile_step": 2, "module_depth": -1,
                                    "top_modules": 1, "detailed": False}
    if spec.autotp_size:  # DeepSpeed shards the model's linears when it builds the engine
        config["tensor_parallel"] = {"autotp_size": spec.autotp_size}
    if spec.load_universal:  # any world size and ZeRO stage 1-3; tag=None reads `latest_universal`
        config["checkpoint"] = {"load_universal": True}
    config["steps_per_print"] = spec.steps_per_print
    config["wall_clock_breakdown"] = False
    return config


def _optimizer(spec: DSSpec) -> dict:
    params = {"lr": spec.lr, "weight_decay": spec.weight_decay, "betas": [0.9, 0.999], "eps": 1e-8}
    # Offloaded optimizers run DeepSpeed's CPU Adam; elsewhere torch's Adam needs no JIT build.
    if spec.torch_adam and not spec.offload_optimizer:
        params["torch_adam"] = True
    return {"type": spec.optimizer, "params": params}


def _scheduler(spec: DSSpec) -> dict:
    if spec.scheduler == "WarmupLR":
        return {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": spec.lr,
                                               "warmup_num_steps": spec.warmup_steps}}
    return {"type": "WarmupCosineLR", "params": {"total_num_steps": spec.total_steps,
                                                 "warmup_num_steps": spec.warmup_steps}}


def _zero(spec: DSSpec) -> dict:
    zero = {"stage": spec.stage}
    if spec.stage >= 1:
        zero.update({"reduce_bucket_size": spec.bucket_size, "allgather_bucket_size": spec.bucket_size,
                     "overlap_comm": spec.overlap_comm, "contiguous_gradients": spec.contiguous_gradients})
    if spec.stage == 3:
        zero.update({"stage3_prefetch_bucket_size": spec.bucket_size,
                     "stage3_param_persistence_threshold": PERSISTENCE_THRESHOLD})
        zero.pop("allgather_bucket_size")
    if spec.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if spec.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return zero
