"""The question every memory prediction answers: a `Setup` (model, ZeRO stage, precision, parallel
degrees, sequence, batch, recomputation), and the rules on its settings.

Host-side and pure. plscale.predict.memory turns a Setup into bytes per rank, with the activation
model of plscale.predict.activations; `plscale estimate memory`, the planner and the labs build one
(`memory.setup_from_ds_config` from a run's DeepSpeed config). `Setup.validate` refuses what cannot
run with a PredictionError naming the field ("seq", "tp", ...), which its caller words as a flag or
a setting.

Recomputation (Korthikanti et al., 2022), of the first k layers of the whole model (k = 0: all);
what each strategy keeps and rebuilds is in plscale.predict.activations:

    none       each layer keeps everything it saves for backward
    selective  a recomputed layer drops its attention core's tensors
    full       a recomputed layer keeps only its input (torch.utils.checkpoint)
    deepspeed  full recomputation through DeepSpeed's CheckpointFunction

The attention core (CORES): fused (PyTorch's flash kernel, scaled_dot_product_attention) or math
(the probabilities kept).
"""

from dataclasses import dataclass

from plscale.dsconfig.spec import PERSISTENCE_THRESHOLD
from plscale.dsconfig.valid import require as require_valid_zero
from plscale.errors import did_you_mean
from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig, check_moe_shape
from plscale.predict.tensor_parallel import check_divisible

STRATEGIES = ("none", "selective", "full", "deepspeed")  # the one list: Setup, the CLI, the ranks, the lab
WHOLE_LAYER = ("full", "deepspeed")  # a recomputed layer keeps only its input
CORES = ("fused", "math")
OPTIMIZERS = ("deepspeed", "megatron", "bf16-optimizer")   # memory.py's gradients by framework


def check_optimizer(optimizer, precision: str, stage: int | None = None) -> None:
    """One line unless the optimizer is one of OPTIMIZERS and, other than DeepSpeed's ZeRO, in bf16 at
    ZeRO stage 0 or 1 (None: any of those) as memory.py counts it."""
    if optimizer not in OPTIMIZERS:
        raise PredictionError("optimizer", optimizer, f": use {', '.join(OPTIMIZERS)}.", show=repr(optimizer))
    if optimizer != "deepspeed" and ((stage or 0) > 1 or precision != "bf16"):
        raise PredictionError("optimizer", optimizer, ": Megatron's optimizer (fp32 gradients with bf16) and "
                              "DeepSpeed's BF16_Optimizer are counted for bf16 weights at ZeRO stage 0 or 1 (a "
                              "distributed optimizer): use {optimizer} deepspeed for stages 2-3, fp16 or fp32.")


def check_strategy(strategy, name: str = "recompute") -> None:
    """One line unless the strategy is one of STRATEGIES; `name` is the quantity's name."""
    if strategy not in STRATEGIES:
        raise PredictionError(name, strategy, f": use {', '.join(STRATEGIES)}."
                                              f"{did_you_mean(str(strategy), STRATEGIES)}", show=repr(strategy))


def check_layers(recompute_layers, layers: int | None, name: str = "recompute_layers",
                 model: str = "the model") -> None:
    """One line unless recompute_layers is 0 (every layer) to `layers` (None: any count)."""
    if isinstance(recompute_layers, int) and not isinstance(recompute_layers, bool) and recompute_layers >= 0 \
            and (layers is None or recompute_layers <= layers):
        return
    if layers is None:
        raise PredictionError(name, recompute_layers, ": give 0 (every layer) or the number of layers to recompute.",
                              show=repr(recompute_layers))
    raise PredictionError(name, recompute_layers, f": {model} has {layers} layers; use 0 (every layer) to {layers}.",
                          show=repr(recompute_layers))


def check_recompute(strategy, recompute_layers: int, layers: int | None,
                    names: tuple[str, str] = ("recompute", "recompute_layers")) -> None:
    """One line on a strategy that does not exist or a layer count the model lacks. `names` are
    the two quantities' names (a Setup's fields by default)."""
    what, count = names
    check_strategy(strategy, what)
    check_layers(recompute_layers, layers, count)
    if recompute_layers and strategy == "none":
        raise PredictionError(count, recompute_layers, f" with {{{what}}} none: pick one of "
                                                       f"{', '.join(STRATEGIES[1:])}, or drop {{{count}}}.")


def recomputed_count(strategy: str, recompute_layers: int, layers: int) -> int:
    """How many of `layers` the strategy recomputes: the first recompute_layers (0: all), none for none."""
    if strategy == "none":
        return 0
    return min(recompute_layers, layers) if recompute_layers else layers


def check_core(core, name: str = "attention") -> None:
    """One line unless the core is one of CORES; `name` is the quantity's name. The fused core is
    PyTorch's flash kernel (scaled_dot_product_attention): "flash" is answered with fused."""
    if core in CORES:
        return
    if str(core).lower().replace("-", "_") in ("flash", "flash_attention", "flash_attn", "sdpa"):
        raise PredictionError(name, core, ": use fused (PyTorch's flash kernel, scaled_dot_product_attention).",
                              show=repr(core))
    raise PredictionError(name, core, f": use fused (PyTorch's flash kernel) or math (the probabilities "
                                      f"kept).{did_you_mean(str(core), CORES)}", show=repr(core))


def check_ep(ep: int, etp: int, tp: int, ranks: int, model: ModelConfig | None) -> None:
    """One line unless ep x etp ranks can split the model's experts out of the `ranks` (tp x cp x dp) of a
    pipeline stage: Megatron-Core's expert grid, etp x ep x edp over the same ranks, etp 1 or tp."""
    if model is None or not model.moe:
        if ep == 1:
            raise PredictionError("etp", etp, ": the experts' tensor-parallel split, and this model's MLPs are "
                                              "dense: drop {etp}.")
        raise PredictionError("ep", ep, ": expert parallelism splits a mixture of experts; this model's MLPs are "
                                        "dense: use {ep} 1.")
    if etp not in (1, tp):
        raise PredictionError("etp", etp, f": the experts split over tp {tp} (Megatron-Core's default) or not at all: "
                                          f"use {{etp}} {tp} or 1.")
    if model.experts % ep or ranks % (ep * etp):
        ok = [str(e) for e in range(1, model.experts + 1) if model.experts % e == 0 and ranks % (e * etp) == 0]
        raise PredictionError("ep", ep, f": expert-parallel ranks split the {model.experts} experts, and ep x etp "
                                        f"{etp} must divide a stage's {ranks} ranks (tp x cp x dp): use {{ep}} "
                                        f"{', '.join(ok)}.")


@dataclass
class Setup:
    params: int                       # Ψ_total, the whole model
    stage: int = 0
    dp: int = 1                       # data-parallel ranks N: what ZeRO shards over
    precision: str = "bf16"
    offload_optimizer: bool = False
    offload_param: bool = False
    tp: int = 1
    pp: int = 1
    sp: bool = False                  # sequence parallel (Megatron, over the TP group; tp >= 2)
    model: ModelConfig | None = None  # the shape, for activations (None: activations not estimated)
    seq: int = 1024
    micro_batch: int = 1
    grad_accum: int = 1               # micro-batches per optimizer step (memory.py's rules 2 and 3)
    recompute: str = "none"           # activation recomputation: none, selective, full or deepspeed
    recompute_layers: int = 0         # of the first k layers of the model (0: every layer)
    largest_layer: int = 0            # parameters of the largest module (deepspeed accounting, stage 3)
    accounting: str = "paper"         # "paper" or "deepspeed"
    cp: int = 1                       # context-parallel ranks per sequence: activations of seq / cp tokens
    persistence_threshold: int = PERSISTENCE_THRESHOLD   # ZeRO-3 keeps tensors of at most this many elements
                                      # whole (stage3_param_persistence_threshold: plscale's configs 1e4, DeepSpeed's
                                      # default 1e5; memory.py's rule 6)
    activations: str = "plscale"      # whose activation count: plscale's Llama's (activations.py, measured by
                                      # the labs) or Megatron-LM's (megatron.py, Korthikanti et al. 2022)
    virtual: int = 1                  # model chunks per pipeline rank (interleaved 1F1B; megatron.py's count)
    optimizer: str = "deepspeed"      # whose gradients (memory.py, OPTIMIZERS): DeepSpeed's ZeRO optimizer,
                                      # Megatron-LM's (fp32 main grads) or DeepSpeed's BF16_Optimizer
    ep: int = 1                       # expert-parallel ranks (model.experts > 1): each holds experts / ep of them,
                                      # their states sharded over the stage's tp x dp / (etp x ep) ranks holding the
                                      # same experts (memory.py; dp here is dp x cp)
    etp: int = 0                      # the experts' tensor-parallel split: 0 as tp (Megatron-Core's default), or 1
                                      # (whole experts on every rank: Megatron-Core's parallel folding)
    reduce_in_backward: bool = True   # ZeRO-1 reduces bucket by bucket inside a lone backward (DeepSpeed:
                                      # memory.py's rule 2); False: after it, from whole gradients (plscale's
                                      # hand-written ZeRO-1, strategies/hybrid/zero1.py)

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def tokens(self) -> int:
        """Tokens of each sequence one rank holds: seq / cp."""
        return self.seq // self.cp

    def validate(self) -> None:
        require_valid_zero(self.stage, self.precision, self.offload_optimizer, self.offload_param)
        for name in ("dp", "tp", "pp", "cp", "ep", "seq", "micro_batch", "grad_accum"):
            if getattr(self, name) < 1:
                raise PredictionError(name, getattr(self, name), f" must be at least 1 (got {getattr(self, name)}).",
                                      show="")
        if self.persistence_threshold < 0:
            raise PredictionError("persistence_threshold", self.persistence_threshold, ": use 0 (every tensor "
                                  "partitioned) or more elements, e.g. 10000 (plscale's) or 100000 (DeepSpeed's).")
        if self.activations not in ("plscale", "megatron"):
            raise PredictionError("activations", self.activations, ": use plscale (its Llama's, measured) or megatron "
                                  "(Korthikanti et al. 2022).")
        if self.activations == "megatron" and self.recompute not in ("none", "selective", "full"):
            raise PredictionError("recompute", self.recompute, ": Megatron's activation model knows none, selective "
                                  "and full.")
        check_optimizer(self.optimizer, self.precision, self.stage)
        if self.accounting not in ("paper", "deepspeed"):
            raise PredictionError("accounting", self.accounting, ": use paper or deepspeed.")
        if self.accounting == "deepspeed" and (self.stage < 2 or self.precision == "fp32"):
            raise PredictionError("accounting", self.accounting, ": DeepSpeed's estimators cover ZeRO stages 2 and 3 "
                                  "in bf16/fp16: use {accounting} paper for stages 0-1 or fp32.", show="deepspeed")
        if self.sp and self.tp == 1:
            raise PredictionError("sp", self.sp, ": sequence parallelism needs tp >= 2: raise {tp} or drop {sp}.",
                                  show="")
        if self.seq % self.cp:
            raise PredictionError("seq", self.seq, f" does not split over {{cp}} {self.cp} ranks: use a multiple "
                                                   f"of {self.cp}.")
        if self.sp and self.tokens % self.tp:
            if self.cp > 1:
                raise PredictionError("seq", self.seq, f" / {{cp}} {self.cp} = {self.tokens} tokens do not split into "
                                                       f"{self.tp} sequence shards: use a multiple of "
                                                       f"{self.cp * self.tp} with {{sp}}.")
            raise PredictionError("seq", self.seq, f" does not split into {self.tp} sequence shards: use a multiple "
                                                   f"of {self.tp} with {{sp}}.")
        check_recompute(self.recompute, self.recompute_layers, self.model.layers if self.model else None)
        if self.model:
            check_moe_shape(self.model)
        if self.model and self.model.moe and self.activations == "plscale":
            raise PredictionError("activations", self.activations, ": plscale's Llama has no experts: count a "
                                  "mixture of experts' activations as Megatron-LM keeps them ({activations} megatron).")
        if self.ep > 1 or self.etp:
            check_ep(self.ep, self.expert_tp, self.tp, self.tp * self.dp, self.model)
        if self.model and self.model.moe and self.tp > 1 and not self.sp:
            raise PredictionError("sp", self.sp, ": a mixture of experts with tp > 1 needs sequence parallelism "
                                  "(Megatron-Core refuses it without): add {sp}.", show="")
        if self.model:
            check_core(self.model.attention)
        if self.model and self.tp > 1:
            check_divisible(self.model, self.tp)
        if self.model and self.model.layers % self.pp:
            raise PredictionError("pp", self.pp, f": {self.model.layers} layers do not split into {self.pp} pipeline "
                                                 f"stages: pick a pipeline degree that divides {self.model.layers}.")
