"""Pipeline parallelism (lab 05): the model cut into stages, a batch into micro-batches.

    schedules.py        GPipe and 1F1B written by hand, for one stage on each rank
    p2p.py              activations forward, gradients back, between neighbouring stages
    stages.py           what the engines share: cutting the Llama into stages, the batches
    plscale_engine.py   the schedules above behind the engines' interface
    deepspeed_engine.py DeepSpeed's PipelineModule and its schedule
    torch_engine.py     torch.distributed.pipelining's PipelineStage and schedules

Prediction: plscale/predict/pipeline.py (the bubble (p-1)/(m+p-1), activations in flight per
stage, the ideal timeline). The measured timeline is drawn by plscale/charts/timeline.py.
Exercise: `plscale exercise pipeline-schedule`.
"""
