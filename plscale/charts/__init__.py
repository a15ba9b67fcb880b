"""Every PNG a lab or a command draws, with matplotlib (imported inside each function, so the
CLI starts without it).

    plots.py       lines over steps, curves and their gaps to a reference, measured against
                   predicted bars and lines, the mesh's grid, the checkpoint interval, the experts' routing
    timeline.py    a pipeline's measured or ideal schedule, stage by stage, and the bubble (lab 05)
    recompute.py   memory over one step and layer by layer, by recomputation strategy (lab 09)
    precision.py   the loss scaler over steps, real tensors against each format's range (lab 09)
    busbw.py       bus bandwidth against message size, nccl-tests style (lab 03, `plscale bench collectives`)

The slides' conceptual diagrams are drawn by plscale/slides/diagrams.
"""
