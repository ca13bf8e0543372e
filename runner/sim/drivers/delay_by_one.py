"""AD-PSGD's delay-by-one variant (``algo.delay_by_one=true``, runner/algos/delay_by_one.py)
under the simulator: lockstep, each learner mixing in the model its matching partner sent one
step earlier, with the algorithm's own ``matching_partner`` and ``mix_``. The AD-PSGD driver
(drivers/adpsgd.py) builds it for that setting."""

from __future__ import annotations

import numpy as np
import torch

from ...algos.delay_by_one import matching_partner
from ...algos.delay_by_one import mix_ as delay_mix_
from ..lockstep import LockstepDriver


class DelayByOneDriver(LockstepDriver):
    """Each step every learner sends x^k to its matching partner p(k) and mixes in, after its
    next gradient, the model its partner sent one step earlier: x <- (1-w) x + w y."""

    def __init__(self, sim):
        super().__init__(sim)
        self.pattern, self.seed = sim.cfg.algo.pattern, sim.cfg.seed
        self.previous: tuple[torch.Tensor, np.ndarray] | None = None  # (models, sent at)
        self.previous_partner: list[int] = []

    def step(self, step, batches, counts, global_count):
        partners = [matching_partner(self.pattern, i, self.n, step, self.seed)
                    for i in range(self.n)] if self.n > 1 else []
        sent_models = self.sim.x.clone() if self.n > 1 else None
        start = self.sim.clocks.t.copy()
        grads = self.local_gradients(batches, counts, global_count)
        self.compute_all(step, counts)
        if self.previous is not None:
            models, sent_at = self.previous
            delay_mix_(self.sim.x, models[torch.tensor(self.previous_partner)])
            self.sim.clocks.receive([[p] for p in self.previous_partner], sent_at,
                                    self.sim.nbytes)
        self.apply(grads)
        if self.n > 1:
            self.previous, self.previous_partner = (sent_models, start), partners

    def finish(self):
        """The last step's message is never mixed in, but the ranks wait for it to arrive."""
        if self.previous is not None:
            self.sim.clocks.receive([[p] for p in self.previous_partner], self.previous[1],
                                    self.sim.nbytes)
            self.previous = None

    def state_dict(self):
        if self.previous is None:
            return {**super().state_dict(), "previous": None}
        return {**super().state_dict(), "previous": self.previous[0],
                "sent_at": torch.from_numpy(self.previous[1]), "partners": self.previous_partner}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if state["previous"] is None:
            self.previous = None
        else:
            self.previous = (state["previous"], state["sent_at"].numpy().copy())
            self.previous_partner = list(state["partners"])
