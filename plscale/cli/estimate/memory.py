"""`plscale estimate memory`: memory per rank for a model, a ZeRO stage, a parallel layout and a
recomputation strategy, and what recomputation costs in FLOPs. Registered on `plscale estimate`
(plscale/cli/estimate/__init__.py)."""

import json
from dataclasses import asdict, replace

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli import hf_model
from plscale.cli.flags import speaks_flags
from plscale.cli.hf_model import is_hf
from plscale.cli.output import console
from plscale.dsconfig.spec import PERSISTENCE_THRESHOLD
from plscale.errors import UserError
from plscale.predict import recompute as rc
from plscale.predict.activations import activation_bytes, rebuilt_bytes
from plscale.predict.memory import LABELS, estimate
from plscale.predict.presets import (
    PRESETS,
    largest_layer_params,
    param_count,
    parse_count,
)
from plscale.predict.published import SHAPES, model_shape
from plscale.predict.setup import Setup, check_core, check_recompute
from plscale.predict.units import GiB, MiB, gib


@speaks_flags()
def memory(
    model: str = typer.Option("7b", "--model", "-m",
                              help=f"A preset ({', '.join(PRESETS)}), a published shape ({', '.join(SHAPES)}), "
                                   f"a parameter count (1.3e9, 350M, 7b), or a "
                                   f"Hugging Face model's config: hf:FOLDER, hf:config.json, hf:org/name."),
    vocab: int = typer.Option(None, help="Vocabulary size in place of the preset's (a lab trains its own tokenizer)."),
    stage: int = typer.Option(2, help="ZeRO stage 0-3."),
    gpus: int = typer.Option(8, help="Ranks in all: data parallel x tensor parallel x pipeline parallel."),
    precision: str = typer.Option("bf16", help="bf16, fp16 or fp32."),
    offload_optimizer: bool = typer.Option(False, help="Optimizer states and gradients in host memory (stage 1-3)."),
    offload_param: bool = typer.Option(False, help="Parameters in host memory (stage 3)."),
    tp: int = typer.Option(1, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, help="Pipeline-parallel degree."),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism over the TP group (needs --tp >= 2)."),
    cp: int = typer.Option(1, help="Context-parallel degree: ranks sharing each sequence (seq/cp tokens each)."),
    ep: int = typer.Option(1, help="Expert-parallel degree (a mixture of experts: mixtral-8x7b, mixtral-8x22b): "
                                   "ep of a stage's tp x cp x dp ranks split the experts."),
    etp: int = typer.Option(0, help="The experts' tensor-parallel split: the --tp (0, the default: Megatron-Core's) "
                                    "or 1 (whole experts: its parallel folding)."),
    seq: int = typer.Option(None, help="Sequence length (default: the preset's, capped at 2048)."),
    micro_batch: int = typer.Option(1, help="Sequences per rank per forward/backward."),
    grad_accum: int = typer.Option(1, help="Micro-batches per optimizer step (ZeRO-1 and offload hold "
                                           "more gradients while they accumulate)."),
    global_batch: int = typer.Option(None, help="Sequences per step; must equal micro x accum x data parallel."),
    recompute: str = typer.Option("none", help="Activation recomputation: none, selective (the attention core), "
                                               "full (each layer keeps only its input, torch's checkpoint) or "
                                               "deepspeed (full through DeepSpeed's checkpointing)."),
    recompute_layers: int = typer.Option(0, help="Recompute only the first N layers of the model (0: every layer)."),
    attention: str = typer.Option("fused", help="The attention core: fused (flash: keeps q, k, v, output, "
                                               "log-sum-exp) or math (keeps the a x s x s probabilities)."),
    budget: float = typer.Option(None, help="GiB per device; exit 2 when the estimate does not fit."),
    accounting: str = typer.Option("paper", help="paper: the ZeRO paper's model states; deepspeed: "
                                                 "DeepSpeed's estimate_zero2/3_model_states_mem_needs."),
    activations: str = typer.Option(None, help="Whose activation count: plscale (its Llama's, measured by the "
                                    "labs; the default) or megatron (Megatron-LM's, Korthikanti et al. 2022; a "
                                    "mixture of experts' default)."),
    optimizer: str = typer.Option("deepspeed", help="Whose gradients: deepspeed (16-bit, ZeRO's rules), megatron "
                                  "(fp32 main gradients; --stage 1 is its distributed optimizer) or bf16-optimizer "
                                  "(DeepSpeed's BF16_Optimizer: 16-bit and fp32); the last two at --stage 0 or 1."),
    persistence_threshold: int = typer.Option(PERSISTENCE_THRESHOLD, help="ZeRO-3 keeps tensors of at most this "
                                              "many elements whole on every rank (stage3_param_persistence_threshold: "
                                              "plscale's configs 10000, DeepSpeed's default 100000)."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimate as JSON: setup, bytes per term "
                                                       "(device, host), totals."),
) -> None:
    """Memory per rank: parameters, gradients, optimizer states, activations.

    Model states (ZeRO paper): Ψ = parameters / (tp * pp) (a preset under tp:
    the rank's matmul shards plus the replicated norms, / pp), N = gpus / (tp * pp),
    p = 2 bytes (bf16, fp16) or 4 (fp32), K = 12 (fp32 master + Adam m + v).
    stage 0: pΨ + pΨ + KΨ     stage 1: pΨ + pΨ + KΨ/N
    stage 2: pΨ + (p+K)Ψ/N    stage 3: (2p+K)Ψ/N
    fp32 at stage 0 steps the weights themselves (K = 8).
    As DeepSpeed runs it: ZeRO-1 with --grad-accum 1 reduces gradients in
    backward (pΨ/N); offloaded gradients are an fp32 partition (4Ψ/N) on the
    host, plus pΨ/N where micro-batches accumulate (stage 2 with
    --grad-accum > 1, stage 3 always). See plscale/predict/memory.py.
    --optimizer megatron: fp32 gradients, 4Ψ (Megatron's docs: 18 bytes
    a parameter, 6 + 12/N at stage 1); bf16-optimizer: pΨ + 4Ψ (DeepSpeed's
    BF16_Optimizer) + KΨ/N at stage 1. Both bf16, stage 0 or 1.
    --ep (a mixture of experts): ep ranks of a stage hold an ep-th of the
    experts each, split over --etp (tp, or 1: whole); every term is the
    dense parameters' Ψd over N plus the rank's experts' Ψe over the
    tp N / (etp ep) ranks holding the same experts.

    Activations of plscale's Llama (b micro batch, s sequence, h hidden,
    h_kv key/value width, f SwiGLU width, a heads, V vocabulary, t = tp),
    bytes per layer: sb(4h+2)·4 + 2sbhp (norms, fp32 inside) +
    sb(2h+2h_kv+4f)p/t + core/t, the core sb(hp + 4a) (fused) or
    sb(as + 2(h-h_kv))p (math); head sb(2h+1)·4 + sbhp + 4sbV/t. With --sp
    the norms' sb(4h+2)·4 is /t too.  --recompute selective drops the core,
    full and deepspeed keep only each layer's input sbhp (/t with --sp), of
    the first --recompute-layers layers (0: all). The term is what the
    forward keeps plus what one rerun holds in the backward, a core or a
    layer (deepspeed's holds the layer's output too; the math core's
    holds the causal mask too, [s, s] once a rank: the s²p); a note under
    the table gives the two parts. The step's peak holds more: the head's
    backward, the gradients.
    Recomputation's cost: (3F + R) / 3F by FLOPs, R the forward of the
    recomputed layers (full, deepspeed) or their cores' 4sh (selective).
    Pipeline (1F1B): the first stage holds all L layers' worth.
    Context parallel (--cp): every activation term for s/cp tokens; model
    states as without (ZeRO shards over N = dp x cp = gpus / (tp * pp)).
    """
    read = None
    if is_hf(model):
        if vocab is not None:
            raise UserError("--vocab changes a preset's shape; a Hugging Face config names its own: drop --vocab.")
        config, read = hf_model.read(model)
        params, largest = param_count(config), largest_layer_params(config)
    elif model.lower() in PRESETS or model.lower() in SHAPES:  # a preset, or a published run's shape
        if vocab is not None and vocab < 1:
            raise UserError(f"--vocab {vocab}: a vocabulary has at least one token.")
        config = model_shape(model) if vocab is None else model_shape(model).with_vocab(vocab)
        params, largest = param_count(config), largest_layer_params(config)
    elif vocab is not None:
        raise UserError(f"--vocab changes a preset's shape, and {model!r} is not a preset: give one of "
                        f"{', '.join(PRESETS)} to --model, or drop --vocab.")
    else:
        config, params, largest = None, parse_count(model), 0
    check_core(attention)
    check_recompute(recompute, recompute_layers, config.layers if config else None)
    config = config and replace(config, attention=attention)
    if gpus < 1 or tp < 1 or pp < 1 or cp < 1:
        raise UserError(f"--gpus, --tp, --pp and --cp must be at least 1 (got {gpus}, {tp}, {pp}, {cp}).")
    model_parallel, mp_text = tp * pp * cp, f"tp {tp} x pp {pp}" + (f" x cp {cp}" if cp > 1 else "")
    if gpus % model_parallel:
        raise UserError(f"--gpus {gpus} is not a multiple of {mp_text}: data parallel needs "
                        f"a whole number of ranks; try --gpus {model_parallel * max(1, gpus // model_parallel)}.")
    dp = gpus // model_parallel
    if micro_batch < 1 or grad_accum < 1:
        raise UserError(f"--micro-batch and --grad-accum must be at least 1 (got {micro_batch}, {grad_accum}).")
    if global_batch is not None and global_batch != micro_batch * grad_accum * dp:
        raise UserError(f"--global-batch {global_batch} != micro batch {micro_batch} x accumulation {grad_accum} "
                        f"x data parallel {dp} = {micro_batch * grad_accum * dp}: fix one of the three.")
    if stage == 3 and accounting == "deepspeed" and config is None:
        raise UserError("DeepSpeed's ZeRO-3 estimate needs the largest layer: give a preset with --model.")
    if seq is not None and seq < 1:
        raise UserError(f"--seq {seq}: a sequence has at least one token; try --seq 2048.")
    if budget is not None and budget <= 0:
        raise UserError(f"--budget {budget:g}: give the GiB one device has, for example --budget 80.")
    seq = seq or (min(config.max_seq, 2048) if config else 1024)
    activations = ("megatron" if config and config.moe else "plscale") if activations is None else activations
    setup = Setup(params=params, stage=stage, dp=dp * cp, precision=precision, offload_optimizer=offload_optimizer,
                  offload_param=offload_param, tp=tp, pp=pp, sp=sp, model=config, seq=seq, micro_batch=micro_batch,
                  grad_accum=grad_accum, recompute=recompute, recompute_layers=recompute_layers,
                  largest_layer=largest, accounting=accounting, cp=cp, persistence_threshold=persistence_threshold,
                  activations=activations, optimizer=optimizer, ep=ep, etp=etp)
    result = estimate(setup)
    need = gib(result.total("device"))
    flops = rc.step_flops(config, seq, recompute, recompute_layers) if config else None
    if as_json:
        parts = {"kept_at_forward_end": activation_bytes(setup), "one_rerun": rebuilt_bytes(setup)} \
            if config and setup.activations == "plscale" else None   # plscale's count's two parts; Megatron's: one
        typer.echo(json.dumps({**result.to_dict(), "activations": parts, "flops_per_token": flops and {
            **asdict(flops), "time_ratio": flops.time_ratio}}, indent=2, ensure_ascii=False))
        _check_budget(budget, need, model, stage, gpus)
        return

    table = Table(title=f"memory per rank: {model} ({params / 1e9:.3g}B parameters), ZeRO-{stage}, {precision}, "
                        f"{gpus} ranks = dp {dp} x tp {tp}{' (SP)' if sp else ''} x pp {pp}"
                        f"{f' x cp {cp}' if cp > 1 else ''}{f', ep {ep}, etp {etp or tp}' if ep > 1 or etp else ''}",
                  title_justify="left")
    unit, scale = ("GiB", GiB) if result.total("device") + result.total("host") >= GiB else ("MiB", MiB)
    for column in ("", f"device {unit}", f"host {unit}", "formula"):
        table.add_column(column, justify="right" if unit in column else "left")
    for term in result.terms:
        table.add_row(term.label, f"{term.device / scale:.2f}", f"{term.host / scale:.2f}", escape(term.formula))
    if config is None:
        table.add_row(LABELS["activations"], "n/a", "", "needs a model shape: pass a preset to --model")
    table.add_row("[bold]total[/]", f"[bold]{result.total('device') / scale:.2f}[/]",
                  f"[bold]{result.total('host') / scale:.2f}[/]",
                  f"micro batch {micro_batch} x seq {seq}{f' ({seq // cp} a rank)' if cp > 1 else ''}, "
                  f"accumulation {grad_accum}, "
                  f"recompute {recompute}{f' (first {recompute_layers} layers)' if recompute_layers else ''}"
                  f"{f', {attention} attention' if config else ''}")
    console.print(table)
    for line in filter(None, (read, config and hf_model.caveat(config))):
        console.print(escape(line), highlight=False, soft_wrap=True)
    if config and rebuilt_bytes(setup):
        console.print(_activations_note(setup, unit, scale), highlight=False)
    if flops and recompute != "none":
        console.print(f"recompute {recompute}: {_flops(flops.recompute)} again per token, on a step's "
                      f"{_flops(flops.step)} per token (forward {_flops(flops.forward)} + backward "
                      f"{_flops(flops.backward)}): step time x{flops.time_ratio:.3f} by FLOPs", highlight=False)
    _check_budget(budget, need, model, stage, gpus)
    if budget is not None:
        console.print(f"fits: {need:.2f} GiB of {budget:g} GiB per device")


def _activations_note(s: Setup, unit: str, scale: float) -> str:
    """The activations row in its two parts: what the forward keeps (what lab 09 measures at its
    end) and what one rerun adds in the backward; the math core's s²p named."""
    if s.activations == "megatron":
        return (f"activations: Megatron-LM's count (plscale/predict/megatron.py), the first pipeline stage's at its "
                f"peak, {'sequence parallel, ' if s.sp else ''}recomputation {s.recompute}; no rerun counted")
    kept, rerun = activation_bytes(s), rebuilt_bytes(s)
    region = "core's" if s.recompute == "selective" else "layer's"
    term, shape = ("(s/cp)·s·p", "[s/cp, s]") if s.cp > 1 else ("s²p", "[s, s]")
    mask = (f"; {term}: the causal mask, {shape}, which the core's rerun holds (once a rank, not per sequence)"
            if s.recompute == "selective" and s.model.attention == "math" else "")
    return escape(f"activations: {kept / scale:.2f} {unit} kept at the end of the forward + {rerun / scale:.2f} {unit} "
                  f"while one {region} rerun runs in the backward{mask}")


def _check_budget(budget: float | None, need: float, model: str, stage: int, gpus: int) -> None:
    if budget is not None and need > budget:
        raise UserError(f"{model} at ZeRO-{stage} on {gpus} ranks needs {need:.2f} GiB per device, over the "
                        f"budget of {budget:g} GiB: raise --stage, add --offload-optimizer/--offload-param, "
                        f"more --gpus, --recompute full or a smaller --micro-batch.")


def _flops(n: float) -> str:
    unit, scale = next(((u, x) for u, x in (("TFLOPs", 1e12), ("GFLOPs", 1e9), ("MFLOPs", 1e6)) if n >= x),
                       ("kFLOPs", 1e3))
    return f"{n / scale:.3g} {unit}"
