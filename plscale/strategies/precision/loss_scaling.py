"""fp16's loss scaling inside a DeepSpeed engine: which path runs it, the scaler's log, underflow
and overflow of real gradients.

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
after window + 1 clean steps, the GradScaler after window; hysteresis and min_loss_scale are
DeepSpeed's fp16 section's only; "no scaling" (loss_scale 1) in DeepSpeed still skips a step
that overflows, with no GradScaler nothing is checked. (torch_autocast at ZeRO 1-3 is no third
path: DeepSpeed 0.19's ZeRO optimizer finds the overflow itself and returns before it calls its
GradScaler's step and update, so that scale never halves; measured, and refused by lab 09.)

Where fp16 puts a batch's gradients (`predicted_underflow`: fp32 x S counted against the bands of
plscale.predict.loss_scaling, the prediction; `measured_underflow`: an fp16 backward): the gradient at each linear's output, dL/dy, per entry. Once one entry
overflows to inf, the backward carries it on: each later dL/dx = dL/dy W sums it with other
entries (inf - inf = NaN), so every layer the backward reaches after it is inf and NaN, and
says nothing more about fp16's range (`split_at_overflow`). The scaler looks at the weights'
gradients instead, dW = the sum over the batch's tokens of dL/dy x input, computed in fp16 and
larger than any one dL/dy: they overflow first (`weight_overflow`).

DeepSpeed keeps torch_autocast's state in module globals that it never resets: call
`forget_autocast(config)` before each deepspeed.initialize of a process that builds several engines.
"""

import contextlib
import math
from dataclasses import asdict, dataclass

import torch

from plscale.predict.formats import FORMATS
from plscale.predict.loss_scaling import Landing, Underflow, fractions

FP16 = FORMATS["fp16"]


def forget_autocast(config: dict) -> None:
    """Before deepspeed.initialize(config=config): for a config without torch_autocast, clear what
    an earlier torch_autocast engine of this process left in DeepSpeed. DeepSpeed 0.19 keeps it in
    module globals (deepspeed.runtime.torch_autocast.TORCH_AUTOCAST_INITIALIZED and _DTYPE) and
    never resets them; its ZeRO 1-3 optimizers read them when built, so a later engine would get an
    fp16 GradScaler it did not ask for (`configure` refuses such an engine)."""
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
    1-3 DeepSpeed 0.19 keeps a GradScaler in its ZeRO optimizer and calls its step and update
    after clean steps only: an overflowing step returns before them, so the scale never halves and
    a scale too large skips every step; measured on gloo ranks, and the lab refuses that path.)
    An engine without torch_autocast that still got a ZeRO GradScaler is refused: see `forget_autocast`."""
    if getattr(engine.optimizer, "torch_autocast_gradscaler", None) is not None and not engine.torch_autocast_enabled():
        raise RuntimeError("This engine has no torch_autocast section, yet its ZeRO optimizer made torch_autocast's "
                           "GradScaler: an earlier torch_autocast engine in this process left DeepSpeed's "
                           "TORCH_AUTOCAST_INITIALIZED set. Call plscale.strategies.precision.loss_scaling.forget_autocast(config) "
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


def predicted_underflow(grads32: dict, scale: float) -> Underflow:
    """fp32 gradients counted against what plscale.predict.loss_scaling says fp16 does to each
    magnitude times the loss scale."""
    lands = Landing(scale, FP16)

    def count(g):
        x = g[g != 0].double().abs() * scale
        return (x.numel(), lands.flushed(x).sum().item(), lands.subnormal(x).sum().item(),
                lands.overflowed(x).sum().item())
    return fractions([count(g.float()) for g in grads32.values()])


def measured_underflow(grads32: dict, grads16: dict) -> Underflow:
    """Where the gradients of an fp16 run (the same weights and batch, still scaled) fell, at the
    entries that are non-zero in fp32."""
    def count(g32, g16):
        x = g16[g32 != 0].float().abs()
        return (x.numel(), (x == 0).sum().item(), ((x > 0) & (x < FP16.min_normal)).sum().item(),
                (~x.isfinite()).sum().item())
    return fractions([count(grads32[name].float(), grads16[name]) for name in grads32])


def split_at_overflow(grads16: dict) -> tuple[list[str], list[str]]:
    """The layers (in the order the backward reached them) up to and including the first whose
    fp16 gradient has an inf or NaN, and those after it: there the backward carried the inf on."""
    names = list(grads16)
    first = next((i for i, name in enumerate(names) if not grads16[name].isfinite().all()), len(names))
    return names[:first + 1], names[first + 1:]


def nonfinite(tensors) -> float:
    """The fraction of the entries of `tensors` that are inf or NaN."""
    tensors = list(tensors)
    return sum((~t.isfinite()).sum().item() for t in tensors) / max(sum(t.numel() for t in tensors), 1)


@contextlib.contextmanager
def linear_weight_gradients(model: torch.nn.Module):
    """Within: each nn.Linear's weight gradient of a backward, as it reaches the weight (still
    scaled; a weight shared with the embedding gets both gradients, summed):
        with linear_weight_gradients(model) as wgrads: ...backward...     wgrads: name -> tensor"""
    grads, handles = {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            handles.append(module.weight.register_hook(lambda g, name=name: grads.__setitem__(name, g.detach())))
    try:
        yield grads
    finally:
        for handle in handles:
            handle.remove()


def weight_gradients(acts: dict, grads: dict) -> dict:
    """Each linear's own weight gradient from its input and output gradient (plscale.rank.taps):
    dW = the sum over tokens of dL/dy x input, what the backward's dW matmul computes (in fp16
    under autocast, so it is what can overflow there)."""
    return {name: grads[name].flatten(0, -2).float().T @ acts[name].flatten(0, -2).float() for name in grads}


@dataclass
class WeightOverflow:
    """The linears' weight gradients times the loss scale against fp16's largest, 65504."""
    scale: float
    largest: float        # the largest |dW| x S, from fp32
    largest_in: str       # its layer
    entries: int          # weight-gradient entries
    predicted: int        # |dW| x S > 65504, from fp32
    measured: int         # inf or NaN in the fp16 backward's weight gradients


def weight_overflow(dw32: dict, wgrads16: dict, scale: float) -> WeightOverflow:
    """From fp32 weight gradients (`weight_gradients`) and those of an fp16 backward with the loss
    times `scale` (`linear_weight_gradients`), the same layers."""
    peaks = {name: g.abs().max().item() * scale for name, g in dw32.items()}
    top = max(peaks, key=peaks.get)
    return WeightOverflow(scale, peaks[top], top, sum(g.numel() for g in dw32.values()),
                          sum((g.abs() * scale > FP16.max).sum().item() for g in dw32.values()),
                          sum((~wgrads16[name].isfinite()).sum().item() for name in dw32))


@dataclass
class Probe:
    """One batch's fp16 backward with the loss x `scale`, against the fp32 one (`probe`)."""
    scale: float
    measured: Underflow     # over `layers`
    predicted: Underflow
    layers: list            # the linears the backward reached, up to and including the first inf
    carried: list           # the linears after it: the backward carried the inf on
    carried_entries: int
    carried_nonfinite: float  # the fraction of those entries inf or NaN
    weights: WeightOverflow


def probe(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor, scales) -> tuple[dict, list[Probe]]:
    """The gradients at the linears' outputs in fp32 (plscale.rank.taps), then for each scale an fp16
    autocast backward with the loss x scale: where its gradients fell against where fp32 x S
    predicts, over the layers before the first inf, and its weight gradients against 65504."""
    from plscale.rank import taps

    acts32, grads32 = taps.capture(model, tokens, targets)
    dw32, out = weight_gradients(acts32, grads32), []
    for scale in scales:
        with linear_weight_gradients(model) as wgrads16:
            _, grads16 = taps.capture(model, tokens, targets, torch.float16, scale)
        layers, carried = split_at_overflow(grads16)
        sub32 = {name: grads32[name] for name in layers}
        out.append(Probe(scale, measured_underflow(sub32, grads16), predicted_underflow(sub32, scale), layers, carried,
                         sum(grads16[name].numel() for name in carried),
                         nonfinite(grads16[name] for name in carried), weight_overflow(dw32, wgrads16, scale)))
    return grads32, out
