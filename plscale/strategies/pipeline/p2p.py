"""Point-to-point between neighbouring pipeline stages: activations forward, gradients back.

    stage s-1  --activation-->  stage s  --activation-->  stage s+1
               <--gradient----           <--gradient----

Each call posts its sends and receives together with `dist.batch_isend_irecv` and waits for
all of them. Two neighbours that both called a blocking `send` first would wait for each
other forever (on gloo a send returns only once the receive is posted); in one batch the
order does not matter. The first stage has no one to receive from and the last no one to
send to: those calls do nothing and return None.

Every tensor that crosses has the same shape, (micro_batch, seq, hidden): the receiver
allocates it before the data arrives.
"""

import time

import torch
import torch.distributed as dist


class StageLinks:
    def __init__(self, pipeline_ranks: list[int], rank: int, group, shape, dtype, device, record=None):
        i = pipeline_ranks.index(rank)
        self.prev = pipeline_ranks[i - 1] if i > 0 else None
        self.next = pipeline_ranks[i + 1] if i + 1 < len(pipeline_ranks) else None
        self.group, self.shape, self.dtype, self.device = group, shape, dtype, device
        self.record = record or (lambda kind, micro, start, end: None)
        self._sent = {"forward": [0, 0], "backward": [0, 0]}   # activations to next, gradients to prev

    def _empty(self):
        return torch.empty(self.shape, dtype=self.dtype, device=self.device)

    def _exchange(self, micro: int, send=(), recv=()) -> list:
        """Send (tensor, peer) pairs and receive from peers in one batch; the received tensors."""
        ops = [dist.P2POp(dist.isend, t.contiguous(), peer, self.group) for t, peer in send if peer is not None]
        for t, peer in send:
            if peer is not None:
                count = self._sent["forward" if peer == self.next else "backward"]
                count[0], count[1] = count[0] + 1, count[1] + t.numel() * t.element_size()
        got = [(self._empty(), peer) for peer in recv if peer is not None]
        ops += [dist.P2POp(dist.irecv, t, peer, self.group) for t, peer in got]
        if not ops:
            return [None] * len(recv)
        start = time.perf_counter()
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        self.record("recv" if got else "send", micro, start, time.perf_counter())
        return [t for t, _ in got] if got else [None] * len(recv)

    def sent(self) -> list[tuple[str, int, int]]:
        """(direction, sends, bytes) of what this rank sent: activations forward, gradients backward."""
        return [(d, c, b) for d, (c, b) in self._sent.items() if c]

    # forward pass: activations
    def recv_forward(self, micro: int):
        return self._exchange(micro, recv=[self.prev])[0]

    def send_forward(self, y, micro: int) -> None:
        self._exchange(micro, send=[(y.detach(), self.next)])

    # backward pass: gradients of the activations
    def recv_backward(self, micro: int):
        return self._exchange(micro, recv=[self.next])[0]

    def send_backward(self, grad, micro: int) -> None:
        self._exchange(micro, send=[(grad, self.prev)])

    # 1F1B's steady state: a send and a receive with the same neighbour, in one batch
    def send_forward_recv_backward(self, y, micro: int):
        return self._exchange(micro, send=[(y.detach(), self.next)], recv=[self.next])[0]

    def send_backward_recv_forward(self, grad, micro: int):
        return self._exchange(micro, send=[(grad, self.prev)], recv=[self.prev])[0]
