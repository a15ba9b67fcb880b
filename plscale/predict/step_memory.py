"""The most memory a training step holds on a rank at once, and what the usual fixes make of it.

Host-side and pure. plscale.predict.memory counts what a rank keeps: the model states and the
activations the forward leaves for the backward. For a moment the step holds more, and that
moment is where a run runs out of memory. For plscale's Llama in fp32, trained with torch's AdamW
(foreach=False) and data parallelism, the whole model on each rank or its states sharded by FSDP2:

    peak = states + max(kept + max(head, rerun), embedding) + gathered      (on the device)

    states    parameters, gradients and Adam's two moments, 16 bytes a parameter: the whole model
              on a replica, a shard of each tensor under FSDP2 (plscale.predict.fsdp.states). The
              moments appear at the first optimizer step, so a step that fits once can fail the next.
    kept      what the forward leaves for the backward (plscale.predict.activations)
    head      the head's backward, while all is kept: the gradients of the log-softmax and of the
              logits, fp32 [tokens, V] each (2L); or, when the head's weight is the larger, its
              new gradient, V x h (W), computed once the log-softmax's output and gradient are
              freed (the logits' gradient takes the place of the output)
    rerun     under recomputation, what one rerun holds when it ends (rebuilt_bytes)
    embedding the backward's last op, when little else is kept: a tied embedding's weight gets two
              gradients, the head's (held since the head's backward) and its own, and autograd sums
              them into a third, 3W (an untied one: its own, W)
    gathered  FSDP2: the root's parameters (embedding, final norm), gathered through the step, and
              one layer's, gathered for its backward: both whole, fp32

Measured with the allocator's history (plscale.rank.allocations), fp32 on CPU: equal to the
history's peak within 1% on presets tiny and deep (lab 12's shape) for each branch of the max, and
for no, full and selective recomputation (tests/test_step_memory.py); in lab 12's oom runs on
2 ranks, replicas and FSDP2, checked within 2% (0.3% measured; tests/test_debug_lab.py). The moments in between
(autograd frees what each op saved as it goes) are below these. The head and rerun are not known
to be exact for mixed precision or GPU kernels: bf16 and fused kernels keep other things.

Left out: the optimizer step's temporaries (two of the largest tensor: below the backward's
peak), and what is not a tensor: the process's own memory (Python's objects, the allocator's
rounding, gloo's buffers: a few MiB on lab 12's CPU ranks, measured in its README), and on GPUs the CUDA context and the caching allocator's
fragmentation. Keep room for them: a step predicted within a few percent of a limit may still fail.

Offload (ZeRO-Offload's idea, as lab 12's oom-offload does it by hand): the optimizer lives in
host memory, its fp32 copy of the weights and the moments, 12 bytes a parameter; the device keeps
the weights and the gradients, 8, and sends the gradients to the host after the backward.

`fixes` asks the same of the four fixes of lab 12 and docs/troubleshooting.md: a smaller micro-batch
(the same global batch, accumulated), full recomputation, sharded states (FSDP2; ZeRO-3 holds
20 bytes a parameter instead, plscale.predict.memory), and the optimizer offloaded to the host.
"""

from dataclasses import dataclass, replace

from plscale.predict import fsdp
from plscale.predict.activations import activation_bytes, rebuilt_bytes
from plscale.predict.presets import ModelConfig, param_count
from plscale.predict.setup import Setup
from plscale.predict.units import MiB

FP32 = 4


@dataclass(frozen=True)
class Step:
    """One rank's step: the model, tokens, batch and the memory-saving choices."""
    config: ModelConfig
    seq: int
    micro_batch: int
    ranks: int = 1
    grad_accum: int = 1
    recompute: str = "none"   # none, selective, full (plscale.strategies.recompute)
    sharded: bool = False     # FSDP2 over the ranks, else a whole replica on each
    offload: bool = False     # the optimizer (fp32 copy, moments) in host memory, the gradients sent there

    def setup(self) -> Setup:
        return Setup(params=param_count(self.config), model=self.config, seq=self.seq, precision="fp32",
                     micro_batch=self.micro_batch, grad_accum=self.grad_accum, recompute=self.recompute)


@dataclass
class Peak:
    terms: dict   # name -> bytes on the device at the peak: states, kept, backward (the rest at that moment), gathered
    host: float   # bytes in host memory (offload), apart from the device's

    @property
    def device(self) -> float:
        return sum(self.terms.values())

    def fits(self, limit_mib: float) -> bool:
        return self.device <= limit_mib * MiB


def states(step: Step) -> float:
    """Parameters, gradients and moments per rank, fp32: 16 bytes a parameter of the rank's share."""
    return sum(fsdp.states(step.config, step.ranks, 1 if step.sharded else step.ranks).values())


def peak(step: Step) -> Peak:
    c, s = step.config, step.setup()
    logits = FP32 * step.micro_batch * s.tokens * c.vocab
    head = max(2 * logits, FP32 * c.vocab * c.hidden)
    kept, weight = activation_bytes(s), FP32 * c.vocab * c.hidden
    rerun = rebuilt_bytes(s) if step.recompute != "none" else 0.0
    embedding = (3 if c.tie_embeddings else 1) * weight
    terms = {"states": states(step), "kept": kept, "backward": max(kept + max(head, rerun), embedding) - kept}
    if step.sharded:
        groups = fsdp.shapes(c)
        terms["gathered"] = FP32 * sum(r * k for r, k in groups[-1] + groups[0])   # the root and one layer, whole
    host = 0.0
    if step.offload:   # of 16 bytes a parameter: weights and gradients stay (8), a copy and moments go (12)
        host = terms["states"] * 12 / 16
        terms["states"] *= 8 / 16
    return Peak(terms, host)


def fixes(step: Step) -> dict[str, Step]:
    """The step as each of the usual fixes changes it (one change each, the rest as it is)."""
    return {"micro-batch 1, accumulated": replace(step, micro_batch=1, grad_accum=step.grad_accum * step.micro_batch),
            "full recomputation": replace(step, recompute="full"),
            "states sharded (FSDP2)": replace(step, sharded=True, offload=False),   # one or the other (lab 12)
            "optimizer offloaded to host": replace(step, offload=True, sharded=False)}
