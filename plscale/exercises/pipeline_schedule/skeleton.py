"""Exercise pipeline-schedule: the order of work of one pipeline stage, GPipe and 1F1B.

Lab 05 (labs/05_pipeline) measures both schedules' bubble and memory. Check with

    plscale exercise check pipeline-schedule

A pipeline cuts the model into p stages, stage s on rank s, and the batch into m
micro-batches. Stage s can run micro-batch i forward, ("F", i), once stage s - 1 has run it
forward (it receives the activations), and backward, ("B", i), once stage s + 1 has run it
backward (it receives the gradient); the last stage's backward needs only its own forward.
A schedule is the order in which one stage takes its 2m pieces of work: a list of
("F", i) and ("B", i), every micro-batch i = 0 .. m-1 once forward and once backward.

gpipe(p, s, m)        GPipe (Huang et al., 2019): all m forwards, then all m backwards,
                      micro-batches in order within each. Stage s holds the activations
                      of all m micro-batches at once.
one_f_one_b(p, s, m)  1F1B, PipeDream-Flush (Narayanan et al., 2021; Megatron-LM): warm up
                      with min(p - s - 1, m) forwards; then, while forwards remain, one
                      forward followed by one backward; then the backwards still owed.
                      Micro-batches in order within each kind. The same bubble as GPipe,
                      (p - 1) / (m + p - 1) of the step idle, but stage s never holds more
                      than p - s micro-batches (forwarded, not yet backwarded) at once.

What the checks test, for p = 2 and 4 stages and several m: each micro-batch once forward
and once backward, forward first; GPipe's all-forwards-first order; 1F1B's activations in
flight, order and bubble; and both schedules run for real: a small model cut into p stages
on p gloo ranks, activations and gradients sent point to point in your order, its gradients
compared with the whole model's.
"""


def gpipe(p: int, s: int, m: int) -> list[tuple[str, int]]:
    """Stage s of p, m micro-batches: all forwards, then all backwards."""
    # TODO: your code here
    raise NotImplementedError("gpipe")


def one_f_one_b(p: int, s: int, m: int) -> list[tuple[str, int]]:
    """Stage s of p, m micro-batches: warm-up forwards, one forward one backward, cool-down backwards."""
    # TODO: your code here
    raise NotImplementedError("one_f_one_b")
