"""SSGD: synchronous data-parallel SGD with bucketed, overlapped gradient allreduce.

Update (docs/algorithms.md, SSGD), identical on every rank::

    x_{k+1} = x_k - gamma_k * sum_i c_i g_i(x_k) / sum_i c_i

where ``g_i`` is rank i's mean gradient over its ``c_i`` samples of step k (equal ``c_i`` give
the usual ``(1/n) sum_i g_i``; the weights make a short last batch exact). Gradients live in
contiguous buckets (runner/comm/buffers.py); a bucket's allreduce starts on the communication
thread as soon as backward has filled it, so communication overlaps the rest of backward.

Invariants: replicas stay bit-identical (every rank applies the same averaged gradient); with
n ranks and batch b it equals one process with batch n*b. Warning: any code that sets
``param.grad = None`` (``zero_grad(set_to_none=True)``) breaks the bucket views; the trainer
zeroes in place.

Checkpoints: nothing is in flight between steps (every bucket's allreduce is waited for in
after_backward), so the model and optimizer state are all there is.
"""

from __future__ import annotations

from ..comm.buffers import GradientBuckets
from .base import Algorithm
from .registry import ALGORITHMS


@ALGORITHMS.register("ssgd")
class SSGD(Algorithm):
    identical_replicas = True
    elastic = True

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        bucket_bytes = int(self.ctx.cfg.comm.bucket_mb * 2**20)
        self.buckets = GradientBuckets(list(model.parameters()), bucket_bytes)
        self.buckets.watch(self._launch)
        self._pending = []

    def shared_update_group(self):
        return self.comm  # every rank applies the same averaged gradient

    def close(self):
        self.buckets.remove()

    def _launch(self, index: int) -> None:
        # Called from the autograd thread as soon as a bucket is complete.
        self._pending.append(self.comm.iallreduce_(self.buckets.buckets[index], op="mean",
                                                    wire=self.wire))

    def before_backward(self, step):
        self.buckets.rearm()
        self._pending = []

    def after_backward(self, step):
        self.buckets.flush()  # buckets whose parameters got no gradient this step
        # Waiting for the slowest rank to finish its backward is idle time; what is left of
        # the reductions after everyone has arrived is communication not hidden by backward.
        with self.timers.time("idle"):
            self.comm.barrier()
        with self.timers.time("comm"):
            for handle in self._pending:
                handle.wait()
