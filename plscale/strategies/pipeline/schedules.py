"""Two pipeline schedules written to be read: GPipe and 1F1B, for one stage on each rank.

A pipeline cuts the model into p stages, one per rank, and a batch into m micro-batches.
Stage s runs micro-batch i forward after stage s-1 has, and backward after stage s+1 has.
The schedules differ only in the order each stage takes its work (p = 4, m = 8):

  GPipe ("all forward, all backward"): every stage keeps m micro-batches of activations
    stage 0  F0 F1 F2 F3 F4 F5 F6 F7 .  .  .  .  .  .  B0 B1 ...
    stage 3  .  .  .  F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 ...

  1F1B: warm up with p-s-1 forwards, then alternate one forward, one backward, then cool
  down. Same bubble, but stage s never holds more than p-s micro-batches of activations.
    stage 0  F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 ...
    stage 3  .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 ...

Each micro-batch's loss is divided by m, so the gradients accumulated over the m backwards
are those of the mean loss over the batch. `Schedule.forward` runs the stage on one
micro-batch (on the last stage, the loss too), `Schedule.backward` backpropagates it, and
`links` moves activations and gradients between neighbours (p2p.py); `record` times each
piece of work for the lab's timeline. (In the pictures above a backward is drawn as long as
a forward; `plscale viz pipeline` draws it twice as long, as it usually is.) picotron's
pipeline_parallel.py is the model for the shape of this file.
"""

import time

import torch


class Schedule:
    def __init__(self, stage, links, loss_fn, first: bool, last: bool, record=None):
        self.stage, self.links, self.loss_fn = stage, links, loss_fn
        self.first, self.last = first, last
        self.record = record or (lambda kind, micro, start, end: None)

    def forward(self, x, micro: int, batch):
        """Stage forward of one micro-batch; on the last stage the loss / m. Returns
        (input, output): the input (its .grad is what goes back) and what to backward from."""
        tokens, targets = batch[micro]
        x = tokens if self.first else x.requires_grad_()
        start = time.perf_counter()
        y = self.stage(x)
        if self.last:
            loss = self.loss_fn(y, targets)
            self.losses.append(loss.detach())
            y = loss / len(batch)
        self.record("F", micro, start, time.perf_counter())
        return x, y

    def backward(self, x, y, grad, micro: int):
        """Backward of one micro-batch from its output (and the gradient that came back for
        it); returns the gradient of its input, to send to the previous stage."""
        start = time.perf_counter()
        torch.autograd.backward(y, grad_tensors=None if self.last else grad)
        self.record("B", micro, start, time.perf_counter())
        return None if self.first else x.grad

    def gpipe(self, batch) -> list:
        """All forwards, then all backwards. Returns the micro-batch losses (last stage)."""
        self.losses, m, saved = [], len(batch), []
        for i in range(m):
            x, y = self.forward(self.links.recv_forward(i), i, batch)
            if not self.last:
                self.links.send_forward(y, i)
            saved.append((x, y))
        for i in range(m):
            x, y = saved[i]
            grad = self.links.recv_backward(i)
            self.links.send_backward(self.backward(x, y, grad, i), i)
            saved[i] = None  # the graph goes with it: this micro-batch's activations are freed
        return self.losses

    def one_f_one_b(self, batch, p: int, s: int) -> list:
        """Warm-up, steady state (one forward, one backward), cool-down."""
        self.losses, m, saved = [], len(batch), []
        warmup = min(p - s - 1, m)
        for i in range(warmup):
            x, y = self.forward(self.links.recv_forward(i), i, batch)
            if not self.last:
                self.links.send_forward(y, i)
            saved.append((x, y))
        x_in = self.links.recv_forward(warmup) if warmup < m else None
        for j in range(m - warmup):  # steady: forward micro-batch warmup + j, backward j
            x, y = self.forward(x_in, warmup + j, batch)
            saved.append((x, y))
            grad = None if self.last else self.links.send_forward_recv_backward(y, warmup + j)
            x, y = saved[j]
            saved[j] = None
            grad_in = self.backward(x, y, grad, j)
            if j == m - warmup - 1:
                self.links.send_backward(grad_in, j)
            else:
                x_in = self.links.send_backward_recv_forward(grad_in, j)
        for j in range(m - warmup, m):  # cool-down: the backwards still owed
            x, y = saved[j]
            saved[j] = None
            grad = self.links.recv_backward(j)
            self.links.send_backward(self.backward(x, y, grad, j), j)
        return self.losses
