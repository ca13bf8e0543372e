"""SGP: Stochastic Gradient Push (docs/algorithms.md, SGP).

Each learner i keeps a numerator x_i and a push-sum weight w_i (w_i = 1 at the start); the
model it computes gradients on, and the one evaluated, is the de-biased z_i = x_i / w_i. At
step k, with the optimizer's direction d_i (momentum and weight decay included) at z_i::

    x_i <- x_i - gamma * d_i(z_i)
    push (x_i / 2, w_i / 2) to the out-peer (i + 2^m) mod n,  m = k mod M
    x_i <- x_i / 2 + x_in / 2,  w_i <- w_i / 2 + w_in / 2     (from the in-peer (i - 2^m) mod n)
    z_i <- x_i / w_i

with M = ceil(log2 n): one peer per step on the time-varying directed exponential graph,
distances 1, 2, 4, ... < n in turn (:func:`push_peers`). The mixing matrix P_k (half kept,
half pushed) is column stochastic, so sum_i x_i changes only by the optimizer's steps and
sum_i w_i = n at every step; z is unbiased for any column-stochastic schedule. With one
in-peer per step, as here, P_k is also row stochastic and w stays 1 (the code still sends
it: push-sum is what makes the rule hold on other schedules).

``algo.overlap=true`` is overlap SGP (one step of staleness): the push of step k is posted
without waiting and folded in at step k+1, ``x_i <- x_i / 2 + (the share pushed to i at
step k-1)``. One share per learner is then in flight; sum_i x_i plus the shares in flight
moves only by the optimizer's steps. :meth:`finish` folds in the last share before the final
evaluation, and a checkpoint completes the share in flight and stores it.

Elastic (launcher.elastic): the step in flight is undone, so every survivor's parameters hold
its z again; the shares in flight (overlap SGP) are lost with the communicators. Each survivor
starts push-sum again at w = 1 from that z (x = z): the weights sum to the new n, no learner's
model moves, and the peer schedule is the directed exponential graph of the survivors. Spares
that join (each with its donor's z) start the same way.

Warnings: the trainer's optimizer steps x (the model's parameters hold z between steps and x
from :meth:`apply_update` to the end of :meth:`after_step`), so weight decay acts on x, and
momentum is local (as in D-PSGD). Messages are the flat parameter buffers plus one float64 number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

from ..lazy import torch
from .base import AlgoConfig, Algorithm
from .registry import ALGORITHMS

T = TypeVar("T")


@dataclass
class SGPConfig(AlgoConfig):
    name: str = "sgp"
    # Overlap SGP: the push of step k is received at step k+1, without waiting for it.
    overlap: bool = False


def push_peers(rank: int, size: int, step: int) -> tuple[int, int]:
    """(out-peer, in-peer) of ``rank`` at ``step``: distance 2^(step mod M), M = ceil(log2
    size), on the ring of ``size`` learners."""
    distances = max(1, math.ceil(math.log2(size)))
    hop = 2 ** (step % distances)
    return (rank + hop) % size, (rank - hop) % size


def halve_for_push_(x: torch.Tensor, sent: torch.Tensor, wire: torch.dtype | None = None
                    ) -> None:
    """``sent <- x / 2`` (rounded to ``wire`` when set), ``x <- x - sent``: the half kept and
    the half pushed add up to x exactly, so the learners' sum moves only by their steps. For a
    numerator buffer and for the push-sum weight, on a rank and on the simulator's stacked
    rows alike."""
    torch.mul(x, 0.5, out=sent)
    if wire is not None:
        sent.copy_(sent.to(wire))
    x.sub_(sent)  # x - x/2 is x/2 exactly: the same as halving when nothing is rounded


def fold_(x: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
    """``x <- x + received``, where ``x`` already holds the half kept (both engines)."""
    return x.add_(received)


def due_fold(overlap: bool, in_flight: T | None, push: T) -> tuple[T | None, T | None]:
    """(the push to fold in now, the one left in flight) after ``push`` was posted: SGP folds
    a push in at once; overlap SGP folds the previous one and leaves this one in flight."""
    return (in_flight, push) if overlap else (push, None)


@ALGORITHMS.register("sgp")
class SGP(Algorithm):
    Config = SGPConfig
    elastic = True

    @classmethod
    def topology_ignored(cls, run_cfg):
        return ("sgp pushes along its own schedule (one out-peer per step on the directed "
                "exponential graph)")

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        self.z = self.ctx.param_buffers  # what forward, backward and evaluation see
        self.weight = torch.ones(1, dtype=torch.float64)
        # Two sets of buffers: overlap SGP posts a push while the previous one is in flight.
        self._sent = [[torch.empty_like(flat) for flat in self.z] for _ in range(2)]
        self._received = [[torch.empty_like(flat) for flat in self.z] for _ in range(2)]
        self._weight_sent = [torch.empty(1, dtype=torch.float64) for _ in range(2)]
        self._weight_received = [torch.empty(1, dtype=torch.float64) for _ in range(2)]
        self._pending: tuple[int, list] | None = None  # (buffer set, handles) in flight
        self._numerator = False  # whether the parameters hold x (else z)
        self.pushes = 0

    @property
    def identical_replicas(self) -> bool:  # type: ignore[override]
        return self.comm.size == 1

    def _to_numerator(self) -> None:
        """The parameters hold z between steps; x = w z from here to :meth:`after_step`."""
        if not self._numerator:
            with torch.no_grad():
                for flat in self.z:
                    flat.mul_(self.weight.item())
            self._numerator = True

    def apply_update(self, optimizer):
        self._to_numerator()  # the optimizer steps x
        optimizer.step()

    def after_step(self, step):
        if self.comm.size == 1:
            return
        self._to_numerator()  # also after a step whose update was skipped (a NaN loss)
        out_peer, in_peer = push_peers(self.comm.rank, self.comm.size, step)
        slot = self.pushes % 2
        with self.timers.time("comm"), torch.no_grad():
            x = self.z  # holds x until the division below
            handles = []
            for flat, sent, received in zip(x, self._sent[slot], self._received[slot]):
                halve_for_push_(flat, sent, self.wire)
                handles.append(self.comm.exchange_(sent, [out_peer], {in_peer: received},
                                                   wire=self.wire))
            halve_for_push_(self.weight, self._weight_sent[slot])
            handles.append(self.comm.exchange_(self._weight_sent[slot], [out_peer],
                                               {in_peer: self._weight_received[slot]}))
            self.pushes += 1
            fold_now, self._pending = due_fold(self.cfg.overlap, self._pending, (slot, handles))
            if fold_now is not None:
                self._fold(*fold_now)
            self._to_model()

    def _to_model(self) -> None:
        """Back to z = x / w in the parameters, at the end of a step's push."""
        with torch.no_grad():
            for flat in self.z:
                flat.div_(self.weight.item())
        self._numerator = False

    def _fold(self, slot: int, handles: list) -> None:
        """Wait for the push in ``slot`` and add the share received to x and w."""
        for handle in handles:
            handle.wait()
        for flat, received in zip(self.z, self._received[slot]):
            fold_(flat, received)
        fold_(self.weight, self._weight_received[slot])

    def finish(self):
        if self._pending is not None:  # the last push: received before the final evaluation
            self._to_numerator()
            with self.timers.time("comm"), torch.no_grad():
                self._fold(*self._pending)
            self._pending = None
            self._to_model()

    def state_dict(self):
        state = {"weight": float(self.weight), "pushes": self.pushes, "in_flight": None}
        if self._pending is not None:  # completed and stored, folded in at the next step
            slot, handles = self._pending
            with self.timers.time("comm"):
                for handle in handles:
                    handle.wait()
            state["in_flight"] = {"share": [t.clone() for t in self._received[slot]],
                                  "weight": float(self._weight_received[slot])}
        return state

    def load_state_dict(self, state):
        self.weight.fill_(state["weight"])
        self.pushes = state["pushes"]
        self._pending = None
        if state["in_flight"] is not None:
            slot = (self.pushes - 1) % 2
            for mine, saved in zip(self._received[slot], state["in_flight"]["share"]):
                mine.copy_(saved)
            self._weight_received[slot].fill_(state["in_flight"]["weight"])
            self._pending = (slot, [])

    def continue_after_loss(self, previous):
        # Built afresh (w = 1, nothing in flight) on the survivors' z: the push count goes on.
        self.pushes = previous.pushes

    def continue_after_join(self, state):
        # As after a loss: a share in flight was pushed in the old world (a joiner would fold
        # its donor's a second time), so push-sum starts again at w = 1 from each z.
        self.pushes = state["pushes"]

    @property
    def weight_in_flight(self) -> float:
        """The push-sum weight this learner pushed and its peer has not folded in yet
        (overlap SGP): with it, the learners' weights sum to n at every step."""
        return 0.0 if self._pending is None else float(self._weight_sent[self._pending[0]])

    def stats(self):
        return {"push_sum_weight": float(self.weight), "pushes": self.pushes}
