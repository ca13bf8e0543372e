"""SGP and overlap SGP under the simulator (runner/algos/sgp.py): the stacked learners step
together, as the real ranks do, with the algorithm's own peer schedule (``push_peers``) and
fold (``fold_``). ``sim.x`` holds the de-biased models z between steps, as the ranks'
parameters do; x = w z while a step is applied and pushed."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...algos.sgp import due_fold, fold_, halve_for_push_, push_peers
from ..lockstep import LockstepDriver
from ..registry import SIM_DRIVERS


@SIM_DRIVERS.register("sgp")
class SGPDriver(LockstepDriver):
    """x <- x - gamma d(z); half of x and w kept, half pushed to (i + 2^m) mod n; z = x / w.
    Overlap SGP folds each push in one step later."""

    def __init__(self, sim):
        super().__init__(sim)
        self.overlap = sim.cfg.algo.overlap
        self.weight = torch.ones(self.n, 1, dtype=torch.float64)
        # A push in flight (overlap): the shares each learner receives, the senders, sent at.
        self.pending: tuple[torch.Tensor, torch.Tensor, list[int], np.ndarray] | None = None
        self.pushes = 0

    def _scale(self, divide: bool = False) -> None:
        """z -> x (x = w z), or back."""
        weight = self.weight.to(self.sim.x.dtype)
        self.sim.x.div_(weight) if divide else self.sim.x.mul_(weight)

    def _fold(self, pending) -> None:
        share, weight_share, senders, sent_at = pending
        fold_(self.sim.x, share)
        fold_(self.weight, weight_share)
        # x's share and w's (one float64) travel to the same peer.
        self.sim.clocks.receive([[j] for j in senders], sent_at, self.sim.nbytes + 8)

    def step(self, step, batches, counts, global_count):
        grads = self.local_gradients(batches, counts, global_count)  # at z
        self.compute_all(step, counts)
        self._scale()
        self.apply(grads)
        if self.n == 1:
            self._scale(divide=True)
            return
        x = self.sim.x
        senders = [push_peers(i, self.n, step)[1] for i in range(self.n)]
        index = torch.tensor(senders)
        sent, weight_sent = torch.empty_like(x), torch.empty_like(self.weight)
        halve_for_push_(x, sent)  # the simulator charges a narrower wire but does not round
        halve_for_push_(self.weight, weight_sent)
        push = (sent[index], weight_sent[index], senders, self.sim.clocks.t.copy())
        self.pushes += 1
        fold_now, self.pending = due_fold(self.overlap, self.pending, push)
        if fold_now is not None:
            self._fold(fold_now)
        self._scale(divide=True)

    def finish(self):
        if self.pending is not None:
            self._scale()
            self._fold(self.pending)
            self.pending = None
            self._scale(divide=True)

    def stats(self):
        return [{"push_sum_weight": float(w), "pushes": self.pushes} for w in self.weight]

    def state_dict(self) -> dict[str, Any]:
        pending = None if self.pending is None else {
            "share": self.pending[0], "weight": self.pending[1], "senders": self.pending[2],
            "sent_at": torch.from_numpy(self.pending[3])}
        return {**super().state_dict(), "weight": self.weight, "pushes": self.pushes,
                "pending": pending}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.weight, self.pushes = state["weight"], state["pushes"]
        pending = state["pending"]
        self.pending = None if pending is None else (
            pending["share"], pending["weight"], list(pending["senders"]),
            pending["sent_at"].numpy().copy())
