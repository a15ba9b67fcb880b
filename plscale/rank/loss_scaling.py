"""fp16's loss scaling inside a DeepSpeed engine: which path runs it, the scaler's log, underflow.

fp16 keeps 5 exponent bits: nothing below 2^-24 (its smallest subnormal), nothing above 65504.
Gradients of a mean loss are small, and many fall below fp16's smallest normal (2^-14), where
bits are lost, or below 2^-25, where they round to 0. Loss scaling multiplies the loss by S
before backward, so every gradient is S times larger in fp16, and divides the weights'
gradients by S (in fp32) before the step. Dynamic scaling looks for S:

    an inf or NaN in the gradients (overflow)   skip the step, S = S / 2
    loss_scale_window clean steps in a row       S = 2 S

Two paths run it, picked by the device and the ZeRO stage (plscale.dsconfig.valid.fp16_path):
    DeepSpeed's "fp16" section   fp16 weights, fp32 master copy, DeepSpeed's DynamicLossScaler:
                                 on GPUs at ZeRO 1-3. (At ZeRO 0, DeepSpeed 0.19's engine.backward
                                 does not scale the loss that its fp16 optimizer's step unscales,
                                 deepspeedai/DeepSpeed#8393.)
    DeepSpeed's "torch_autocast" fp32 weights, ops in fp16, torch.amp.GradScaler: at ZeRO 0, and on
                                 CPUs, where DeepSpeed refuses its fp16 section. DeepSpeed makes the
                                 GradScaler with torch's defaults; `configure` replaces it with one
                                 that follows the spec, `grad_scaler_settings` says what ran.
`ScalerLog` reads both the same way. The two differ in small ways: DeepSpeed grows the scale
after window + 1 clean steps, the GradScaler after window; hysteresis (ZeRO 1-3) and
min_loss_scale are DeepSpeed's only; "no scaling" (loss_scale 1) in DeepSpeed still skips a
step that overflows, with no GradScaler nothing is checked.

DeepSpeed keeps torch_autocast's state in module globals that it never resets: call
`forget_autocast(config)` before each deepspeed.initialize of a process that builds several engines.
"""

import contextlib
import math
from dataclasses import asdict, dataclass

import torch

from plscale.predict.formats import FORMATS

FP16 = FORMATS["fp16"]


def forget_autocast(config: dict) -> None:
    """Before deepspeed.initialize(config=config): for a config without torch_autocast, clear what
    an earlier torch_autocast engine of this process left in DeepSpeed. DeepSpeed 0.19 keeps it in
    module globals (deepspeed.runtime.torch_autocast.TORCH_AUTOCAST_INITIALIZED and _DTYPE) and
    never resets them; its ZeRO 1-3 optimizers read them when built, so a later engine would get an
    fp16 GradScaler that is never updated (`configure` refuses such an engine)."""
    from deepspeed.runtime import torch_autocast

    if not (config.get("torch_autocast") or {}).get("enabled"):
        torch_autocast.TORCH_AUTOCAST_INITIALIZED, torch_autocast.TORCH_AUTOCAST_DTYPE = False, None


def grad_scaler(spec, device: str = "cpu"):
    """A torch GradScaler that follows the spec's fp16 loss scaling; None for no scaling
    (loss_scale 1). A static scale above 1 has no GradScaler form (check.py refuses it)."""
    if spec.loss_scale == 1:
        return None
    if spec.loss_scale:
        raise ValueError(f"torch's GradScaler has no static scale (loss_scale {spec.loss_scale:g})")
    return torch.amp.GradScaler(device, init_scale=2.0 ** spec.initial_scale_power, growth_factor=2.0,
                                backoff_factor=0.5, growth_interval=spec.loss_scale_window)


def configure(engine, spec) -> None:
    """On the torch_autocast path at ZeRO 0, give the engine the GradScaler the spec asks for
    (DeepSpeed made one with torch's defaults); on the others there is nothing to do. (At ZeRO
    1-2 DeepSpeed 0.19 keeps a GradScaler in its ZeRO optimizer and never updates it: the scale
    stays where it starts, every step after an overflow is skipped; the lab refuses that path.)
    An engine without torch_autocast that still got a ZeRO GradScaler is refused: see `forget_autocast`."""
    if getattr(engine.optimizer, "torch_autocast_gradscaler", None) is not None and not engine.torch_autocast_enabled():
        raise RuntimeError("This engine has no torch_autocast section, yet its ZeRO optimizer made torch_autocast's "
                           "GradScaler: an earlier torch_autocast engine in this process left DeepSpeed's "
                           "TORCH_AUTOCAST_INITIALIZED set. Call plscale.rank.loss_scaling.forget_autocast(config) "
                           "before deepspeed.initialize.")
    if engine.torch_autocast_z0_gradscaler is not None:
        engine.torch_autocast_z0_gradscaler = grad_scaler(spec, engine.device.type)


def grad_scaler_settings(engine) -> dict | None:
    """The settings of the GradScaler the engine runs (the torch_autocast path at ZeRO 0), as
    torch reports them before the first step; None where none runs."""
    scaler = engine.torch_autocast_z0_gradscaler
    if scaler is None:
        return None
    return {"init_scale": scaler.get_scale(), "growth_factor": scaler.get_growth_factor(),
            "backoff_factor": scaler.get_backoff_factor(), "growth_interval": scaler.get_growth_interval()}


@dataclass
class ScalerStep:
    step: int
    scale_before: float
    scale_after: float
    overflow: bool      # an inf or NaN in the gradients
    skipped: bool       # the optimizer did not step (measured: its step hook did not run)


class ScalerLog:
    """The loss scale around each optimizer step, from DeepSpeed's fp16 optimizer or the
    GradScaler:   with log.step(i): engine.step()      then log.rows, log.summary()."""

    def __init__(self, engine):
        self.engine, self.rows, self.updates = engine, [], 0
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)  # the torch optimizer that steps
        inner.register_step_post_hook(lambda *_: setattr(self, "updates", self.updates + 1))

    def scale(self) -> float:
        scaler = self.engine.torch_autocast_z0_gradscaler
        if scaler is not None:
            return float(scaler.get_scale())
        if self.engine.fp16_enabled():
            return float(self.engine.optimizer.loss_scale or 1.0)
        return 1.0

    @contextlib.contextmanager
    def step(self, step: int):
        boundary = self.engine.is_gradient_accumulation_boundary()
        before, updates = self.scale(), self.updates
        yield
        if boundary:
            skipped = self.updates == updates
            overflow = bool(getattr(self.engine.optimizer, "overflow", skipped)) if self.engine.fp16_enabled() \
                else skipped and self.engine.torch_autocast_z0_gradscaler is not None  # GradScaler: skip = inf
            self.rows.append(ScalerStep(step, before, self.scale(), overflow, skipped))

    def summary(self) -> dict:
        scales = [r.scale_before for r in self.rows] + [r.scale_after for r in self.rows[-1:]]
        return {"steps": len(self.rows), "overflows": sum(r.overflow for r in self.rows),
                "skipped": sum(r.skipped for r in self.rows),
                "backoffs": sum(r.scale_after < r.scale_before for r in self.rows),
                "growths": sum(r.scale_after > r.scale_before for r in self.rows),
                "largest_scale": max(scales, default=1.0), "smallest_scale": min(scales, default=1.0),
                "final_scale": scales[-1] if scales else 1.0}

    def broken_rule(self, window: int, hysteresis: int = 1) -> list[str]:
        """Rows that break dynamic scaling: an overflow must skip its step and halve the scale
        (DeepSpeed's hysteresis h lets h - 1 overflows keep it, until it next grows); a clean
        step keeps it, or doubles it after at least `window` clean steps in a row. Empty when
        the log follows the rule."""
        out, clean, kept = [], 0, 0
        for r in self.rows:
            ratio = r.scale_after / r.scale_before
            if r.overflow:
                clean, kept = 0, kept + (ratio == 1.0)
                if not r.skipped or ratio not in (0.5, 1.0) or kept > hysteresis - 1:
                    out.append(f"step {r.step}: overflow, skipped {r.skipped}, scale x{ratio:g}")
            else:
                clean += 1
                if r.skipped or ratio not in (1.0, 2.0) or (ratio == 2.0 and clean < window):
                    out.append(f"step {r.step}: clean ({clean} in a row), skipped {r.skipped}, scale x{ratio:g}")
                if ratio == 2.0:
                    clean, kept = 0, 0
        return out

    def to_list(self) -> list[dict]:
        return [asdict(r) for r in self.rows]


def describe(rows: list[ScalerStep]) -> list[str]:
    """The log as lines a person reads: an overflow per line, clean steps at one scale together."""
    power = lambda s: f"2^{math.log2(s):g}" if s > 0 else "0"
    out, start = [], None
    for i, r in enumerate(rows):
        if r.overflow or r.skipped:
            out.append(f"step {r.step:3}: scale {power(r.scale_before):>6}  "
                       f"{'overflow' if r.overflow else 'no update'}, step skipped -> {power(r.scale_after)}")
            continue
        start = r.step if start is None else start
        last = i + 1 == len(rows) or rows[i + 1].overflow or rows[i + 1].skipped or r.scale_after != r.scale_before
        if last:
            steps = f"step {r.step:3}" if start == r.step else f"steps {start}-{r.step}"
            grew = f" -> doubled to {power(r.scale_after)}" if r.scale_after > r.scale_before else ""
            out.append(f"{steps}: scale {power(r.scale_before):>6}  clean ({r.step - start + 1}){grew}")
            start = None
    return out


@dataclass
class Underflow:
    """Gradient entries (non-zero in fp32) against fp16's range, as fractions of them."""
    entries: int
    flushed: float      # rounded to 0: below half the smallest subnormal
    subnormal: float    # kept with fewer bits: below the smallest normal (flushed ones apart)
    overflowed: float   # beyond the largest: inf


def predicted_underflow(grads32: dict, scale: float) -> Underflow:
    """From fp32 gradients and fp16's range (plscale.predict.formats): where each gradient,
    times the loss scale, would fall in fp16."""
    def count(g):
        x = g[g != 0].double().abs() * scale
        return (x.numel(), (x <= FP16.flush_limit).sum().item(),
                ((x > FP16.flush_limit) & (x < FP16.min_normal)).sum().item(), (x > FP16.max).sum().item())
    return _fractions([count(g.float()) for g in grads32.values()])


def measured_underflow(grads32: dict, grads16: dict) -> Underflow:
    """Where the gradients of an fp16 run (the same weights and batch, still scaled) fell, at the
    entries that are non-zero in fp32."""
    def count(g32, g16):
        x = g16[g32 != 0].float().abs()
        return (x.numel(), (x == 0).sum().item(), ((x > 0) & (x < FP16.min_normal)).sum().item(),
                (~x.isfinite()).sum().item())
    return _fractions([count(grads32[name].float(), grads16[name]) for name in grads32])


def _fractions(counts: list[tuple]) -> Underflow:
    entries = sum(c[0] for c in counts)
    return Underflow(entries, *(sum(c[i] for c in counts) / max(entries, 1) for i in (1, 2, 3)))
