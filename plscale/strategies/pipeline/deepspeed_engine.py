"""The pipeline lab's schedule run by DeepSpeed: `deepspeed.pipe.PipelineModule`.

DeepSpeed pipelines a model given as a flat list of layer SPECS, not built layers: every
rank reads the whole list, cuts it into P stages (`partition_method`: "uniform" counts
layers, "parameters" balances parameter counts) and builds only its own stage's layers.
The tied embedding and output head are one `TiedLayerSpec` key on the first and the last
stage; DeepSpeed all-reduces their gradients over those two ranks itself (ReduceTiedGrads).
Its schedule (TrainSchedule) is 1F1B; each batch is a list of instructions per stage
(LoadMicroBatch, ForwardPass, SendActivation, RecvGrad, BackwardPass, ... OptimizerStep).

    specs = [TiedLayerSpec("embed", Embedding, c, tied_weight_attr="weight"),
             LayerSpec(Layer, c), ..., LayerSpec(FinalNorm, c),
             TiedLayerSpec("embed", Embedding, c, forward_fn=head_forward, tied_weight_attr="weight")]
    engine = DeepSpeedPipeline(reference, mesh, ds_config, partition="parameters")  # or "uniform"
    loss = engine.step(micro_batches)    # m (tokens, targets) pairs = one train_batch
    engine.set_micro_batches(8)          # another m from the next step on (the bubble sweep)
    engine.parts, engine.stages_here, engine.ops, engine.groups

    plscale lab run pipeline --variant deepspeed --gpus 2      (or deepspeed-uniform; pp-dp: 4 ranks)
    deepspeed --num_gpus 2 labs/05_pipeline/train.py --variant deepspeed   (DS_ACCELERATOR=cpu)
    torchrun --nproc_per_node 4 labs/05_pipeline/train.py --variant pp-dp  (2 stages x 2 replicas)

Ranks: PipeDataParallelTopology(num_pp=P, num_dp=dp) numbers ranks pipe-major, data fastest
(rank = stage * dp + replica), which is Megatron's order with tp = cp = 1: `engine.groups`
holds DeepSpeed's own groups so the lab can show they equal mesh.ranks("pp") / ("dp").

Traps, refused here before train_batch with a one-line UserError (measured without the
check: torch 2.13, deepspeed 0.19.8, 2 CPU ranks over gloo):
- train_batch pulls exactly gradient_accumulation_steps micro-batches from the iterator
  (first and last stage only). One too few: StopIteration on stage 0, the other ranks die on
  "Connection closed by peer" (a middle stage that reads no data would wait for it). One too
  many: silently ignored, the loss and gradients cover the first gas only. DeepSpeed itself
  asserts train_batch_size = micro x accumulation x dp at initialize.
- Shapes are sent once, with the first micro-batch; later ones are received into the cached
  buffer. Shorter sequences (16 after 32): the last stage computes on the old-shaped buffer
  and fails with "Expected input batch_size (64) to match target batch_size (32)". Longer
  (48): gloo aborts the process (SIGABRT, "Received data size doesn't match expected size.
  49152 vs 32768"). DeepSpeed's own ways out: PipelineModule(dynamic_shape=True), or
  engine.reset_activation_shape() before the step of a new shape.
- The UserWarning "c10d::broadcast_: an autograd kernel was not registered" at the first
  backward comes from DeepSpeed broadcasting the tied weight at build time: harmless (the
  losses equal the unpipelined model's), so it is filtered here.

Timing: "wall_clock_breakdown" crashes a non-last stage, so each instruction of
PipelineEngine._INSTRUCTION_MAP is wrapped to record perf_counter before and after; the n-th
instruction of a type in a batch is micro-batch n. ForwardPass -> "F" (the last stage's
includes the loss), BackwardPass -> "B", Send*/Recv* -> "send"/"recv". Loading data, the
gradient all-reduces and the optimizer step are not recorded, as in the other engines: a
timeline spans the schedule's work only.
"""

import time
import warnings
from collections import Counter

import torch

from plscale.errors import UserError
from plscale.predict.pipeline import Op
from plscale.rank.mesh import Mesh
from plscale.rank.models import llama_pieces
from plscale.strategies.pipeline.stages import one_shape

warnings.filterwarnings("ignore", message=r"c10d::broadcast_: an autograd kernel was not registered")

KINDS = {"ForwardPass": "F", "BackwardPass": "B", "SendActivation": "send", "SendGrad": "send",
         "RecvActivation": "recv", "RecvGrad": "recv"}


def layer_specs(c) -> list:
    """The model as DeepSpeed wants it: one spec per llama_pieces piece, same indices."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    classes = llama_pieces.piece_classes(c)
    specs = [TiedLayerSpec("embed", llama_pieces.Embedding, c, tied_weight_attr="weight")]
    specs += [LayerSpec(cls, c) for cls in classes[1:-1]]
    if c.tie_embeddings:
        specs.append(TiedLayerSpec("embed", llama_pieces.Embedding, c, forward_fn=llama_pieces.head_forward,
                                   tied_weight_attr="weight"))
    else:
        specs.append(LayerSpec(llama_pieces.Head, c))
    return specs


class DeepSpeedPipeline:
    def __init__(self, reference, mesh: Mesh, ds_config: dict, partition: str = "parameters"):
        import deepspeed
        from deepspeed.pipe import PipelineModule
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

        if partition not in ("uniform", "parameters"):
            raise UserError(f"unknown partition {partition!r}: use uniform or parameters.")
        c, p, dp = reference.config, mesh.size("pp"), mesh.size("dp")
        module = PipelineModule(layer_specs(c), topology=PipeDataParallelTopology(num_pp=p, num_dp=dp),
                                loss_fn=llama_pieces.loss_fn, partition_method=partition)
        # forward_funcs[i] is piece _local_start + i; a tied head is partial(head_forward, embedding)
        for i, f in enumerate(module.forward_funcs):
            llama_pieces.load_piece(f if isinstance(f, torch.nn.Module) else f.args[0],
                                    module._local_start + i, reference)
        self.engine, *_ = deepspeed.initialize(model=module, config=ds_config,
                                               model_parameters=[q for q in module.parameters() if q.requires_grad])
        grid = self.engine.grid
        self.groups = {"pp": list(grid.pp_group), "dp": list(grid.dp_group)}
        cuts = [int(x) for x in module.parts]                  # P + 1 cut points (numpy ints)
        self.parts = list(zip(cuts[:-1], cuts[1:]))
        self.stages_here = [self.engine.stage_id]
        self.pp_rank, self.dp = mesh.rank_in("pp"), dp
        self.micro, self.m = ds_config["train_micro_batch_size_per_gpu"], ds_config["gradient_accumulation_steps"]
        self.shape, self.ops = None, []
        self._wrap_instructions()

    def _wrap_instructions(self) -> None:
        """An instance copy of _INSTRUCTION_MAP whose entries also record an Op."""
        from deepspeed.runtime.pipe.engine import PipelineEngine

        self._calls = Counter()

        def timed(name, fn):
            def run(engine, **kwargs):
                start = time.perf_counter()
                out = fn(engine, **kwargs)
                micro = self._calls[name]
                self._calls[name] += 1
                self.ops.append(Op(self.pp_rank, KINDS[name], micro, start, time.perf_counter(), engine.stage_id))
                return out
            return run

        self.engine._INSTRUCTION_MAP = {
            cls: timed(cls.__name__, fn) if cls.__name__ in KINDS else fn
            for cls, fn in PipelineEngine._INSTRUCTION_MAP.items()}

    def set_micro_batches(self, m: int) -> None:
        """From the next step on, m micro-batches per step: DeepSpeed's own way of changing the
        accumulation (train_batch_size = micro x m x dp; same micro-batch shape)."""
        self.engine.set_train_batch_size(self.micro * m * self.dp)
        self.m = m

    def _check(self, micro_batches) -> None:
        """The traps of the module docstring, refused in one line each."""
        gas, micro = self.m, self.micro
        if len(micro_batches) != gas:
            raise UserError(f"{len(micro_batches)} micro-batches but gradient_accumulation_steps is {gas}: "
                            f"DeepSpeed's train_batch reads exactly {gas}; pass {gas} or call set_micro_batches first.")
        shape = one_shape(micro_batches, self.shape, "DeepSpeed")
        if shape[0] != micro:
            raise UserError(f"Micro-batches of {shape} but DeepSpeed expects ({micro}, seq) "
                            f"(train_micro_batch_size_per_gpu, --set ds.micro_batch={micro}).")
        self.shape = shape

    def step(self, micro_batches) -> float:
        self._check(micro_batches)
        self.ops, self._calls = [], Counter()
        device = self.engine.device
        batches = iter([(t.to(device), y.to(device)) for t, y in micro_batches])
        loss = self.engine.train_batch(data_iter=batches)   # mean over m and dp, sent up the pipeline
        return float(loss.item())
