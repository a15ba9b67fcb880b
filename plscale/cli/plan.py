"""`plscale plan`: the best training configuration for a model on a cluster (plscale/predict/plan.py)."""

import json
from dataclasses import replace
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli import hf_model
from plscale.cli.flags import in_flags, speaks_flags
from plscale.cli.hf_model import is_hf
from plscale.cli.output import console, make_console
from plscale.errors import UserError
from plscale.predict import plan as planner
from plscale.predict.cluster import GPUS, find_gpu
from plscale.predict.presets import PRESETS, ModelConfig, param_count
from plscale.predict.published import SHAPES, model_shape
from plscale.predict.setup import check_optimizer
from plscale.predict.units import gib

SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
ASSUMPTIONS = [
    ("compute: training FLOPs (6 a weight a token, attention, recomputation's rerun) at the efficiency the "
     "layout's per-GPU matmul shapes reach (plscale.predict.matmul: the GPU's measured best GEMM, tile and wave "
     "quantization, flash attention's causal half, elementwise work at the memory bandwidth), or --efficiency; "
     "the slowest pipeline stage (first: embedding, last: head and loss) sets the pace"),
    ("memory: plscale.predict.memory (ZeRO model states, activations; 1F1B's first stage holds pp micro-batches, "
     "interleaving more); fits under (1 - headroom) of the GPU; activations as plscale's Llama keeps them, or "
     "with --activations megatron as Megatron-LM does (Korthikanti et al. 2022, plscale.predict.megatron)"),
    ("tp: Megatron's collectives (tensor_parallel.collectives), over NVLink, not overlapped unless --tp-overlap "
     "(then only what the compute cannot cover); sequence parallelism on or off; full recomputation reruns the "
     "forward ones"),
    ("dp: gradient reduce-scatter/all-reduce over dp x cp (the experts' over dp x cp / ep; ZeRO-3 adds parameter "
     "all-gathers) hidden behind the backward of its micro-batch; parameter all-gathers after the step exposed "
     "unless --overlap-param-gather"),
    "pp: 1F1B or interleaved bubble (pipeline.bubble_fraction), p2p activations not overlapped; ZeRO 0-1 with pp",
    ("cp: ring attention's k, v hops of the rank's kv heads (context_parallel.ring_bytes) hidden behind its "
     "causal zig-zag attention core"),
    ("ep (a mixture of experts): ep ranks of a stage's tp x cp x dp hold E/ep experts each, split over etp (tp, or "
     "1: whole), their states sharded over the ranks holding the same experts; the "
     "router's dispatch and combine all-to-alls (4 a MoE layer a micro-batch, k routes a token, dropless and evenly "
     "routed) on the critical path, not overlapped; sequence parallelism always on with tp > 1; the tp group's "
     "gathers of the k routes a token counted as a dense MLP's (1x, not kx); no ZeRO-3 with ep > 1"),
    ("optimizer: AdamW's step over the states a rank keeps (/ dp x cp under ZeRO), 28 bytes a parameter at the "
     "GPU's memory bandwidth; on CPU ranks (--here) measured, with gloo's collectives, a p2p hop and a layer's fixed cost"),
    ("links: Megatron's rank order (tp, cp, dp, pp; the experts' etp, ep, edp over tp x cp x dp); a group spanning nodes with k members a node runs at "
     "min(NVLink, k x network); latency a step 1 us NVLink, 5 us network; an all-reduce min(ring, tree) steps, "
     "an all-gather or reduce-scatter a ring's n - 1"),
    ("ranking: by step time; candidates within 1% of their group's fastest are a tie, ranked by fewer "
     "model-parallel ranks, then less memory"),
    ("not modelled: fused kernels beyond one op, the network's lower efficiency on small messages, launch "
     "latency, uneven expert routing, token dropping, offload, fp8 beyond the matmuls (--fp8), zero-bubble schedules; "
     "checked against 49 published runs, it predicts dense H100 runs 13-30% faster than they ran, and Qwen3's "
     "many small experts 24-33% faster (benchmarks/plan_validation.py)"),
]


def _model(name: str | None, shape: dict, tied: bool | None = None) -> tuple[str, ModelConfig]:
    given = {k: v for k, v in shape.items() if v is not None}
    if is_hf(name):
        flags = [f"--{k.replace('_', '-')}" for k in given] + ([] if tied is None else ["--tied/--untied"])
        if flags:
            raise UserError(f"--model {name} names its own shape: drop {', '.join(flags)}.")
        config, read = hf_model.read(name)
        for line in filter(None, (read, hf_model.caveat(config))):
            make_console(stderr=True).print(escape(line), highlight=False, soft_wrap=True)
        return name, config
    if name is None and not given:
        raise UserError(f"Name a model with --model ({', '.join([*PRESETS, *SHAPES])}) or give its shape with "
                        f"--layers, --hidden, --heads, --kv-heads, --ffn and --vocab.")
    if name is not None and name[:1].isdigit() and name.lower() not in PRESETS:
        raise UserError(f"--model {name}: plan needs a shape, not only a parameter count: give a preset or "
                        f"published shape ({', '.join([*PRESETS, *SHAPES])}), or --layers, --hidden, --heads, "
                        f"--kv-heads, --ffn and --vocab.")
    for key, value in given.items():
        if value < 1:
            raise UserError(f"--{key.replace('_', '-')} {value}: must be at least 1.")
    if name is None:
        missing = [f"--{k.replace('_', '-')}" for k in SHAPE_FLAGS if k not in given]
        if missing:
            raise UserError(f"A model shape needs all of --layers, --hidden, --heads, --kv-heads, --ffn and --vocab "
                            f"(missing {', '.join(missing)}), or --model PRESET.")
        if given["hidden"] % given["heads"] or given["heads"] % given["kv_heads"]:
            raise UserError(f"--hidden {given['hidden']} must split into --heads {given['heads']}, and the heads "
                            f"into --kv-heads {given['kv_heads']} groups.")
        return "custom", ModelConfig(max_seq=131072, tie_embeddings=bool(tied), **given)
    config = model_shape(name)
    if tied is not None:
        given["tie_embeddings"] = tied
    return (name, replace(config, **given)) if given else (name, config)


def _this_machine(saved: Path | None, ranks: int, config: ModelConfig, micro_batch: int, seq: int, notes):
    """This machine's figures: read from an earlier plan's JSON, or measured now with `ranks` CPU ranks."""
    from plscale.run.machine import Machine, measure_showing
    if saved is None:
        return measure_showing(notes, ranks, config, micro_batch, seq)
    try:
        raw = json.loads(saved.read_text())
        found = Machine.from_dict(raw.get("machine", raw))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"--machine {saved}: not a plan's JSON with this machine's figures ({exc}); "
                        f"write one with `plscale plan --here --json > plan.json`.") from None
    if found.ranks != ranks:
        raise UserError(f"--machine {saved} was measured with {found.ranks} ranks; plan with --gpus "
                        f"{found.ranks}, or measure {ranks} by leaving out --machine.")
    return found


@speaks_flags()
def plan(
    model: str = typer.Option(None, "--model", "-m", help=f"A preset or published shape: {', '.join([*PRESETS, *SHAPES])}; "
                              f"or a Hugging Face model's config: hf:FOLDER, hf:config.json, hf:org/name."),
    gpus: int = typer.Option(8, help="GPUs in all."),
    gpu: str = typer.Option(None, help=f"The GPU: {', '.join(GPUS)} (default H100); the options below change its figures."),
    memory: float = typer.Option(None, help="GiB per GPU (replaces the --gpu's)."),
    peak_tflops: float = typer.Option(None, help="Dense peak TFLOP/s per GPU in the training precision (replaces the --gpu's)."),
    intra_gbs: float = typer.Option(None, help="NVLink (inside a node) GB/s per GPU, one direction (replaces the --gpu's)."),
    inter_gbs: float = typer.Option(None, help="Network (across nodes) GB/s per GPU, one direction (replaces the --gpu's)."),
    gpus_per_node: int = typer.Option(None, help="GPUs a node (replaces the --gpu's, 8)."),
    seq: int = typer.Option(None, help="Sequence length (default: the model's longest, at most 4096)."),
    global_batch: int = typer.Option(None, help="Sequences per optimizer step (default: about 4M tokens)."),
    efficiency: float = typer.Option(None, help="Fraction of the peak FLOP/s the compute reaches (default: what each "
                                     "layout's matmul shapes reach on the GPU, plscale/predict/matmul.py; 0.5 for a GPU "
                                     "without matmul figures; --here: 1, the measured FLOP/s are the model's own)."),
    fp8: bool = typer.Option(False, "--fp8", help="The matmuls in fp8 (Transformer Engine, torchao float8) on a GPU "
                             "with fp8 tensor cores (MFU against its fp8 peak); weights and activations stay bf16."),
    tp_overlap: bool = typer.Option(False, "--tp-overlap", help="Tensor-parallel collectives pipelined with the GEMMs "
                                    "(Megatron-Core's --tp-comm-overlap, torchtitan's async TP)."),
    overlap_param_gather: bool = typer.Option(False, "--overlap-param-gather", help="ZeRO-1/2's parameter all-gather "
                                              "hidden behind the next step's forward (Megatron-Core's flag)."),
    sp: bool = typer.Option(None, "--sp/--no-sp", help="Fix sequence parallelism on or off (default: either, "
                            "with tp > 1)."),
    precision: str = typer.Option(None, help="bf16, fp16 or fp32 (default bf16; --here: fp32)."),
    here: bool = typer.Option(False, "--here", help="Plan for this machine's CPU: --gpus ranks over gloo, as the "
                              "labs run without a GPU; measures them first (seconds), replaces --gpu."),
    machine: Path = typer.Option(None, help="With --here: this machine's figures from an earlier plan's --json "
                                 "(its \"machine\"), instead of measuring again."),
    activations: str = typer.Option(None, help="Whose activation count: plscale (its Llama's, measured by the "
                                    "labs; the default) or megatron (Megatron-LM's, Korthikanti et al. 2022: for "
                                    "Megatron layouts, and a mixture of experts' default)."),
    optimizer: str = typer.Option("deepspeed", help="Whose gradients the memory counts: deepspeed (16-bit, ZeRO's "
                                  "rules), megatron (fp32 main gradients, its distributed optimizer as ZeRO-1) or "
                                  "bf16-optimizer (DeepSpeed's BF16_Optimizer: 16-bit and fp32); the last two take "
                                  "ZeRO 0-1."),
    headroom: float = typer.Option(planner.HEADROOM, help="Fraction of GPU memory kept free (fragmentation, buffers)."),
    top: int = typer.Option(5, help="Candidates to print."),
    every: bool = typer.Option(False, "--all", help="Every configuration, not only the best of each dp x tp x pp x cp."),
    tp: int = typer.Option(None, help="Fix the tensor-parallel degree."),
    pp: int = typer.Option(None, help="Fix the pipeline-parallel degree."),
    cp: int = typer.Option(None, help="Fix the context-parallel degree."),
    dp: int = typer.Option(None, help="Fix the data-parallel degree."),
    ep: int = typer.Option(None, help="Fix the expert-parallel degree (a mixture of experts: ep ranks of a stage's "
                           "tp x cp x dp split the experts)."),
    etp: int = typer.Option(None, help="Fix the experts' tensor-parallel split: the --tp (Megatron-Core's default) "
                            "or 1 (whole experts: its parallel folding)."),
    zero: int = typer.Option(None, help="Fix the ZeRO stage (0-3)."),
    recompute: str = typer.Option(None, help="Fix recomputation: none, selective or full."),
    micro_batch: int = typer.Option(None, help="Fix the sequences per micro-batch."),
    virtual: int = typer.Option(None, help="Fix the model chunks per pipeline rank (1: plain 1F1B)."),
    layers: int = typer.Option(None, help="Shape: layers (with the other shape options, or to change a preset)."),
    hidden: int = typer.Option(None, help="Shape: hidden width."),
    heads: int = typer.Option(None, help="Shape: attention heads."),
    kv_heads: int = typer.Option(None, help="Shape: key/value heads."),
    ffn: int = typer.Option(None, help="Shape: SwiGLU inner width."),
    vocab: int = typer.Option(None, help="Shape: vocabulary."),
    tied: bool = typer.Option(None, "--tied/--untied", help="Shape: the output head shares the embedding's weight, or "
                              "has its own (a custom shape's default: untied; a preset's or published shape's: its "
                              "own)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """The best training configuration for a model on a cluster.

    Enumerates dp x tp x pp x cp = gpus, ZeRO 0-3, recomputation and the
    micro-batch; drops what does not fit by the memory model; ranks the rest
    by predicted step time: compute at the efficiency its matmul shapes
    reach, the pipeline bubble and each dimension's communication over the
    link it crosses. Assumptions and
    formulas: plscale/predict/plan.py and step_time.py.
    """
    name, config = _model(model, {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
                                   "ffn": ffn, "vocab": vocab}, tied)
    for flag, value in (("--seq", seq), ("--global-batch", global_batch), ("--gpus", gpus),
                        ("--micro-batch", micro_batch), ("--virtual", virtual)):
        if value is not None and value < 1:
            raise UserError(f"{flag} {value}: must be at least 1.")
    seq = min(config.max_seq, 4096) if seq is None else seq
    check_optimizer(optimizer, "fp32" if here else precision or "bf16", zero)   # before --here measures
    if sp and tp == 1:
        raise UserError("--sp: sequence parallelism splits over the tensor-parallel group: use --tp 2 or more, "
                        "or --no-sp.")
    measured = None
    if here:
        given = [f for f, v in (("--gpu", gpu), ("--memory", memory), ("--peak-tflops", peak_tflops),
                                ("--intra-gbs", intra_gbs), ("--inter-gbs", inter_gbs),
                                ("--gpus-per-node", gpus_per_node)) if v is not None]
        if given:
            raise UserError(f"--here measures this machine; drop {', '.join(given)} (or drop --here to plan for a GPU).")
        notes = make_console(stderr=True) if as_json else console   # stdout is the JSON alone
        measured = _this_machine(machine, gpus, config, micro_batch or 1, seq, notes)
        cluster = measured.cluster()
    elif machine is not None:
        raise UserError("--machine gives this machine's figures: use it with --here.")
    else:
        cluster = find_gpu(gpu, memory, peak_tflops, intra_gbs, inter_gbs, gpus_per_node)
    efficiency = 1.0 if here and efficiency is None else efficiency
    precision = ("fp32" if here else "bf16") if precision is None else precision
    if recompute is not None and recompute not in planner.RECOMPUTE:
        raise UserError(f"--recompute {recompute!r}: use {', '.join(planner.RECOMPUTE)}.")
    if zero is not None and zero not in (0, 1, 2, 3):
        raise UserError(f"--zero {zero}: use a ZeRO stage 0, 1, 2 or 3.")
    if pp is not None and pp > 1 and zero is not None and zero > 1:
        raise UserError(f"--pp {pp} --zero {zero}: ZeRO-2/3 are not combined with pipeline parallelism (DeepSpeed's "
                        f"pipeline engine refuses them; Megatron's distributed optimizer is ZeRO-1): use --zero 0 or 1 "
                        f"with --pp, or drop --pp.")
    if top < 1:
        raise UserError(f"--top {top}: print at least 1.")
    global_batch = max(1, 2**22 // seq) if global_batch is None else global_batch
    if ep not in (None, 1) and not config.moe:
        raise UserError(f"--ep {ep}: {name}'s MLPs are dense; expert parallelism splits a mixture of experts "
                        f"({', '.join(k for k, v in SHAPES.items() if v.moe)}).")
    if ep is not None and (ep < 1 or config.experts % ep):
        ok = ", ".join(str(e) for e in range(1, config.experts + 1) if config.experts % e == 0)
        raise UserError(f"--ep {ep}: the {config.experts} experts split over ep {ok}.")
    if etp is not None and not config.moe:
        raise UserError(f"--etp {etp}: {name}'s MLPs are dense; --etp splits a mixture of experts' experts.")
    if etp is not None and etp < 1:
        raise UserError(f"--etp {etp}: use 1 (whole experts) or the --tp.")
    activations = ("megatron" if config.moe else "plscale") if activations is None else activations
    fixed = tuple((k, v) for k, v in {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep, "etp": etp, "zero": zero,
                                      "recompute": recompute,
                                      "micro_batch": micro_batch, "virtual": virtual, "sp": sp}.items()
                  if v is not None)
    if activations not in ("plscale", "megatron"):
        raise UserError(f"--activations {activations!r}: use plscale or megatron.")
    if activations == "plscale" and config.moe:
        raise UserError("--activations plscale: plscale's Llama has no experts; a mixture of experts' activations are "
                        "counted as Megatron-LM keeps them: drop --activations.")
    if activations == "megatron" and recompute == "deepspeed":
        raise UserError("--activations megatron --recompute deepspeed: Megatron's count knows none, selective, full.")
    job = planner.Job(config, gpus, seq, global_batch, precision, efficiency, headroom, fixed, overlap=not here,
                      activations=activations, tp_overlap=tp_overlap, gather_overlap=overlap_param_gather,
                      optimizer=optimizer, fp8=fp8)
    result = planner.plan(job, cluster)
    usable = result.usable
    if not result.ranked:
        if result.least_memory is None:
            raise UserError(f"No layout of {gpus} GPUs fits this job: {in_flags(planner.no_layout_reason(job, cluster), plan)}.")
        c = result.least_memory
        states = sum(v for k, v in c.parts.items() if k != "activations")
        parts = (f"model states {gib(states):.1f} GiB, activations {gib(c.parts.get('activations', 0)):.1f} GiB"
                 if c.parts else "")
        biggest = ("model states" if states >= c.parts.get("activations", 0) else "activations") if c.parts else ""
        hint = {"model states": "more GPUs (or a higher --zero) to shard the states, a larger GPU or a smaller model",
                "activations": "recomputation, a shorter --seq, more tp or cp, or a smaller --micro-batch"}.get(
                    biggest, "more GPUs, a larger GPU, a shorter --seq or a smaller model")
        raise UserError(f"No configuration fits: the smallest needs at least {gib(c.memory):.1f} GiB per GPU (dp {c.dp} "
                        f"tp {c.tp} pp {c.pp} cp {c.cp}{f' ep {c.ep}' if c.ep > 1 else ''}, ZeRO-{c.zero}, recompute {c.recompute}, micro-batch "
                        f"{c.micro_batch}{': ' + parts if parts else ''}); the GPU has {gib(cluster.memory):.1f} GiB, "
                        f"{gib(usable):.1f} usable with {headroom:.0%} headroom"
                        f"{f'; most of it is {biggest}' if biggest else ''}: {hint}.")
    shown = (result.ranked if every else result.best_per_layout())[:top]
    if as_json:
        typer.echo(json.dumps({
            "model": name, "shape": config.to_dict(), "params": param_count(config), "gpu": cluster.to_dict(),
            "job": {"gpus": gpus, "seq": seq, "global_batch": global_batch, "precision": precision,
                    "activations": activations,
                    "efficiency": efficiency, "fp8": fp8, "optimizer": optimizer, "tp_overlap": tp_overlap,
                    "overlap_param_gather": overlap_param_gather, "headroom": headroom, "fixed": dict(fixed)},
            **({"machine": measured.to_dict()} if measured else {}),
            "considered": result.considered, "fitting": len(result.ranked),
            "candidates": [c.to_dict() for c in shown], "assumptions": ASSUMPTIONS}, indent=2))
        return
    nodes = -(-gpus // cluster.gpus_per_node)
    params, tokens = param_count(config), global_batch * seq
    size = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"
    step_tokens = f"{tokens / 1e6:.2f}M" if tokens >= 1e5 else f"{tokens:,}"
    where = (f"this machine, {escape(cluster.name)}" if cluster.cores else
             f"{gpus} x {escape(cluster.name)} ({nodes} node{'s' if nodes > 1 else ''})")
    table = Table(title=f"plan: {escape(name)} ({size}) on {where}, seq {seq}, global batch {global_batch} "
                        f"({step_tokens} tokens), {precision}, "
                        f"{f'efficiency {efficiency:g}' if efficiency else 'efficiency by matmul shape'}"
                        f"{', fp8 matmuls' if fp8 else ''}"
                        f"{', activations as Megatron-LM keeps them' if activations == 'megatron' else ''}",
                  title_justify="left")
    experts = ("ep",) if config.moe else ()
    for column in ("#", "dp", "tp", "pp", "cp", *experts, "v", "zero", "recompute", "micro x m", "GiB/GPU",
                   "step (s)", "tokens/s", "MFU", "why it beats the next"):
        table.add_column(column, justify="left" if column in ("recompute", "why it beats the next") else "right")
    for i, c in enumerate(shown):
        why = planner.why_faster(c, shown[i + 1]) if i + 1 < len(shown) else ""
        memory = f"{gib(c.memory):.1f}" if gib(c.memory) >= 0.1 else f"{gib(c.memory):.3f}"   # CPU ranks' small models
        table.add_row(str(i + 1), str(c.dp), f"{c.tp}{' sp' if c.sp else ''}", str(c.pp), str(c.cp),
                      *(f"{c.ep}{f' etp{c.expert_tp}' if c.expert_tp != c.tp else ''}" for _ in experts),
                      str(c.virtual), str(c.zero), c.recompute,
                      f"{c.micro_batch} x {c.micro_batches}", memory, f"{c.step_s:.3g}", f"{c.tokens_per_s:,.0f}",
                      f"{c.mfu:.1%}", escape(why))
    console.print(table)
    best = shown[0]
    console.print("step time of #1: " + ", ".join(f"{planner.LABELS[t]} {best.terms[t]:.3g} s"
                                                   for t in planner.TERMS if best.terms[t]), highlight=False)
    console.print(f"{result.considered:,} configurations considered, {len(result.ranked):,} fit in "
                  f"{gib(usable):.1f} GiB ({gib(cluster.memory):.1f} GiB less {headroom:.0%}); "
                  f"{'all' if every else 'the best of each dp x tp x pp x cp' + (' x ep x etp' if config.moe else '')} shown in ranked order (ties within 1%: fewer "
                  f"model-parallel ranks, then less memory first). v: model chunks "
                  f"per pipeline rank (interleaved 1F1B when > 1); sp: sequence parallelism; micro x m: sequences "
                  f"per micro-batch x micro-batches per step.", highlight=False)
    for line in run_it(name, result.ranked, seq, precision, cluster.gpus_per_node, bool(cluster.cores)):
        console.print(line, highlight=False, soft_wrap=True)
    console.print("[dim]Assumptions (plscale/predict/plan.py, step_time.py):\n" + "\n".join(f"  - {escape(a)}" for a in ASSUMPTIONS)
                  + "[/]", highlight=False)


def config_is_moe(name: str) -> bool:
    return name in SHAPES and SHAPES[name].moe


def run_it(name: str, ranked: list, seq: int, precision: str, per_node: int, here: bool) -> list[str]:
    """The lab command that trains the plan's best layout the zero lab can run, with the model: data
    parallelism under ZeRO 0-3, no recomputation (lab 04 trains a preset or a Hugging Face folder;
    tensor, pipeline and context parallelism run on plscale's Llama in lab 11). Lines to print."""
    if is_hf(name):
        target = name[len(hf_model.PREFIX):]
        if Path(target).name == "config.json" and Path(target).expanduser().is_file():
            target = str(Path(target).parent)
        if not Path(target).expanduser().is_dir():
            return [f"run it: the zero lab trains a model from its folder: download {target} "
                    f"(huggingface-cli download {target} --local-dir models/{target.split('/')[-1]}) and plan "
                    f"--model hf:models/{target.split('/')[-1]} for the command."]
        model = [f"model.hf={target}"]
    elif config_is_moe(name):
        return ["run it: no lab trains a Mixtral yet; lab 08 runs expert parallelism on plscale's MoE Llama "
                "(plscale lab run moe-deepspeed)."]
    elif name in PRESETS:
        model = [f"model.preset={name}"]
    else:
        return ["run it: the labs build presets and Hugging Face folders, not this shape (plan --model hf:FOLDER "
                "for the command)."]
    runnable = [c for c in ranked if c.layout[1:] == (1, 1, 1) and c.recompute == "none"]
    if not runnable:
        return ["run it: no layout without tp, pp, cp or recomputation fits, and the zero lab runs data "
                "parallelism only; lab 11 composes the others on plscale's Llama."]
    c = runnable[0]
    sets = [*model, f"model.seq={seq}", f"ds.precision={precision}", f"ds.micro_batch={c.micro_batch}",
            f"ds.grad_accum={c.micro_batches}"]
    flags = " ".join(f"--set {item}" for item in sets)
    nodes = -(-c.dp // per_node) if not here else 1
    aside = "" if c is ranked[0] else f" (#{ranked.index(c) + 1} of all, the best the zero lab runs: #1 needs tp, pp, " \
        "cp or recomputation)"
    lines = [f"run it{aside}:"]
    if nodes == 1:
        lines.append(f"  plscale lab run zero --variant zero{c.zero} --gpus {c.dp}{' --cpu' if here else ''} {flags}")
    if not here:
        gpus = min(c.dp, per_node)
        lines += [f"  on pods:  plscale runpod up --gpus {gpus}{f' --nodes {nodes}' if nodes > 1 else ''} --gpu-type TYPE "
                  f"(plscale runpod gpus lists them), then plscale runpod run zero --variant zero{c.zero} {flags}",
                  f"  on Slurm: plscale slurm submit zero --variant zero{c.zero} --nodes {nodes} --gpus {gpus} {flags}"]
        if is_hf(name):
            lines.append("  (model.hf's folder must be where the ranks run: inside the project, which runpod sync "
                         "copies, or on the cluster's shared filesystem)")
    return lines
