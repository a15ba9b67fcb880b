"""The pipeline lab's engines, one interface: plscale_engine (the schedules of
plscale/rank/parallel/pipeline.py), deepspeed_engine (PipelineModule), torch_engine
(torch.distributed.pipelining); stages.py holds what they share."""
