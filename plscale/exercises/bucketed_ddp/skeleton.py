"""Exercise bucketed-ddp: data parallelism as torch's DDP does it, gradients all-reduced in buckets during backward.

Lab 02 (labs/02_imdb_ddp) runs torch's DistributedDataParallel. Check with

    plscale exercise check bucketed-ddp

N ranks hold the same model and read different batches; after backward every rank must hold
the gradient of the mean loss over all of them: each gradient all-reduced (summed) and divided
by N. One all-reduce per parameter would pay a collective's fixed cost many times; one at the
end would wait for the whole backward before sending a byte. DDP (Li et al., PyTorch
Distributed, VLDB 2020) cuts the difference: parameters go into buckets, and a bucket's
all-reduce starts, asynchronously, as soon as the backward has produced all of its gradients,
while the backward goes on with the layers below.

1. Buckets, in `__init__`: take the module's parameters that require a gradient (a frozen one
   has none to reduce) in REVERSE order (the backward makes the last layer's gradients first)
   and fill buckets of at most `bucket_bytes` bytes of fp32
   gradient each: a parameter that would overflow the current bucket starts the next one (a
   parameter larger than the cap sits alone in its own). `self.buckets`: a list of lists of
   parameters, in the order they are reduced.
2. A hook on every parameter (`p.register_post_accumulate_grad_hook`) marks its gradient
   ready; when a bucket's last gradient is ready, flatten the bucket's gradients into one
   tensor and start `dist.all_reduce(flat, async_op=True)`: keep the flat tensor and the
   handle it returns.
3. `finish()`, called after `loss.backward()`: wait for every handle, divide by N, copy each
   slice of the flat tensors back into its parameter's `.grad`, and get ready for the next
   backward.

What the checks test, on 2 and 4 ranks, with a small MLP and each rank its own batch: the
buckets for two caps; the gradients after `finish()` equal torch's DistributedDataParallel's;
every all-reduce started during the backward (one per bucket, async_op=True), none in
`finish()`; three SGD steps equal DDP's and every rank's parameters the same; a frozen
parameter in no bucket, its gradient left None. Use torch.distributed's default group.
"""

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)
from torch import nn


class BucketedDDP:
    def __init__(self, module: nn.Module, bucket_bytes: int = 25 * 2**20):
        self.module, self.bucket_bytes = module, bucket_bytes
        # TODO: self.buckets (step 1); a hook on every parameter (step 2); whatever bookkeeping you need
        raise NotImplementedError("BucketedDDP.__init__")

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        # TODO: step 3
        raise NotImplementedError("BucketedDDP.finish")
