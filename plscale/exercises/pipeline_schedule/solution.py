"""Reference solution of the pipeline-schedule exercise (the task: skeleton.py). Not copied by
`plscale exercise start`; plscale/predict/pipeline.py `order` and plscale/strategies/collectives/
pipeline.py are the lab's versions."""


def gpipe(p: int, s: int, m: int) -> list[tuple[str, int]]:
    """Stage s of p, m micro-batches: all forwards, then all backwards."""
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b(p: int, s: int, m: int) -> list[tuple[str, int]]:
    """Stage s of p, m micro-batches: warm-up forwards, one forward one backward, cool-down backwards."""
    warmup = min(p - s - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]
