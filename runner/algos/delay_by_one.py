"""Delay-by-one AD-PSGD (docs/algorithms.md, Delay-by-one: the runner's reconstruction;
``algo=adpsgd algo.delay_by_one=true``).

Every step k each learner i exchanges its model with one scheduled peer p(k) (a perfect
matching known to both ends: alternating ring matchings for ``pattern=fixed``, a random
matching drawn from (seed, k) for ``pattern=random``), but consumes the message one step later::

    post send(x_i^k -> p(k)), recv(buf <- p(k))            # overlaps the gradient of step k
    y = the model received during step k-1 (x_i^0 at the first step)
    x_i^{k+1} = (1 - w) x_i^k + w y - gamma * g_i(x_i^k),  w = 1/2

A learner waits only for a message sent one full step earlier, so communication is hidden
when learners run at the same speed. With gamma = 0 the quantity sum_i x^k + w sum_i x^{k-1}
is conserved and all models converge to its mean. Warning: the tempting variant
``x^{k+1} = x^k - gamma g + (X^{k-1}(W - I))_i`` diverges (eigenvalue -1/3 grows by sqrt(4/3)
per step on the ring) and is deliberately not implemented.

Checkpoints fall between steps, while the exchange posted at the last step is still to be
consumed: it is completed (both ends posted it at the same step) and the received model is
stored, so the resumed run mixes it in at the next step as the uninterrupted run would.

Elastic (launcher.elastic): a loss undoes the step in flight on every survivor, and the
survivors take it again in the matchings of their own number. An odd number of learners
leaves one out of each step's matching; it mixes in its own model of the step before, so p
stays a permutation and the invariant above holds over the learners there are. The message
posted in the step before the loss is dropped (the step taken again mixes nothing in): the
conserved quantity starts again from sum_i x_i over the survivors. Spares that join drop it
the same way.
"""

from __future__ import annotations

import numpy as np

from ..comm.communicator import Handle
from ..lazy import torch
from .base import Algorithm

MIX = 0.5  # w


def matching_partner(pattern: str, rank: int, size: int, step: int, seed: int) -> int:
    """The peer of ``rank`` at ``step`` in a matching of ``size`` learners: perfect when
    ``size`` is even; of an odd number (an elastic job after a loss) one learner sits the
    step out, its own partner (it mixes in its own model of the step before)."""
    if pattern == "fixed":  # pairs (2m, 2m+1) on even steps, (2m+1, 2m+2) on odd steps
        shift = step % 2
        position = (rank - shift) % size
        if size % 2 and position == size - 1:  # odd: the last of this step's pairing
            return rank
        return ((position ^ 1) + shift) % size
    order = np.random.default_rng([seed, step]).permutation(size)
    position = int(np.flatnonzero(order == rank)[0])
    if size % 2 and position == size - 1:
        return rank
    return int(order[position ^ 1])


def mix_(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x <- (1 - w) x + w y`` with the model ``y`` received one step earlier."""
    return x.mul_(1 - MIX).add_(y, alpha=MIX)


class DelayByOne(Algorithm):
    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        self.params = self.ctx.param_buffers
        self.sent = [[torch.empty_like(x) for x in self.params] for _ in range(2)]
        self.received = [[torch.empty_like(x) for x in self.params] for _ in range(2)]
        self._in_flight = None  # (handles, peer) posted at this step
        self._slot = 0  # ... in these buffers
        self._previous = None  # ... and at the step before, consumed now

    def _partner(self, step: int) -> int:
        return matching_partner(self.cfg.pattern, self.world.rank, self.world.size, step,
                                self.ctx.cfg.seed)

    def before_forward(self, step):
        if self.world.size == 1:
            return
        slot, peer = step % 2, self._partner(step)
        handles = []
        for x, sent, received in zip(self.params, self.sent[slot], self.received[slot]):
            sent.copy_(x)  # x changes before this message is consumed
            # Sitting the step out (an odd number of learners): its own model is the message.
            handles.append(Handle.completed({peer: sent}) if peer == self.world.rank else
                           self.comm.exchange_(sent, [peer], {peer: received},
                                               wire=self.wire))
        self._previous, self._in_flight = self._in_flight, (handles, peer)
        self._slot = slot

    def after_backward(self, step):
        if self.world.size == 1 or self._previous is None:
            return  # first step: y = x, nothing to mix
        handles, peer = self._previous
        with self.timers.time("comm"), torch.no_grad():
            for x, handle in zip(self.params, handles):
                mix_(x, handle.wait()[peer])
        self._previous = None

    def finish(self):
        if self._in_flight is not None:  # the last exchange: no peer may be left waiting
            for handle in self._in_flight[0]:
                handle.wait()
            self._in_flight = None

    def state_dict(self):
        if self._in_flight is None:
            return {"in_flight": False}
        handles, peer = self._in_flight
        with self.timers.time("comm"):
            received = [handle.wait()[peer].clone() for handle in handles]
        return {"in_flight": True, "peer": peer, "slot": self._slot, "received": received}

    def continue_after_join(self, state):
        """Spares joined: the message in flight was its old partner's (a joiner's: its donor's
        partner's), in a matching of the old world; it is dropped, as after a loss (the
        next step mixes nothing in), rather than mixed into a world it was not sent in."""

    def load_state_dict(self, state):
        self._in_flight = self._previous = None
        if state["in_flight"]:
            # Back in its own slot: the next step's exchange fills the other one.
            slot, peer = state["slot"], state["peer"]
            handles = []
            for buffer, saved in zip(self.received[slot], state["received"]):
                buffer.copy_(saved)
                handles.append(Handle.completed({peer: buffer}))
            self._in_flight, self._slot = (handles, peer), slot
