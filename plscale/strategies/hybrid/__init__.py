"""4D parallelism: one Llama split by data, tensor, pipeline and context parallelism at once,
from the hand-written pieces of the other packages (lab 11).

    layer.py   HybridDecoderLayer: lab 07's tensor-parallel layer whose attention core is ring
               attention (zig-zag) over the cp group, on the rank's own heads (sequence
               parallelism optional)
    stage.py   HybridStage: a pipeline stage of such layers; embedding first, norm, tied head
               and vocab-parallel loss (a share, / cp) last
    step.py    HybridStep: 1F1B over the pp group, the tied gradients summed, one all-reduce
               over dp-cp and AdamW, or ZeRO-1; its collectives counted, its states' census
    zero1.py   Zero1AdamW: ZeRO-1 over dp-cp by hand: reduce-scatter, AdamW on each rank's 1/N
               (fp32 master, moments), all-gather
    deepspeed_pipe.py  DeepSpeedHybrid: the same layers in DeepSpeed's PipelineModule; its
               data axis is the mesh's dp x cp

The mesh is Megatron's, tp-cp-dp-pp (plscale/rank/mesh.py): tp neighbours inside a node, pp
the farthest apart. Lab 11 (`plscale lab run 4d`) trains it against the dense model.
Predictions: plscale/predict/memory.py (states per rank, tensor_parallel.stage_params),
plscale/predict/hybrid.py (pp sends, the tied and dp-cp collectives), plscale/predict/tensor_parallel.py
(tp collectives), plscale/predict/context_parallel.py (ring bytes, zig-zag balance),
plscale/predict/pipeline.py (the bubble).
"""
