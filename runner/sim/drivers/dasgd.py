"""DaSGD under the simulator (runner/algos/dasgd.py): the averaging launched every tau
steps completes in the background of the virtual clocks and merges with the algorithm's own
``merge_`` delay steps later."""

from __future__ import annotations

import numpy as np
import torch

from ...algos.dasgd import launch_due, merge_, merge_due
from ..lockstep import LockstepDriver, rows_to_their_mean_
from ..registry import SIM_DRIVERS


@SIM_DRIVERS.register("dasgd")
class DaSGDDriver(LockstepDriver):
    """Local steps; every tau steps a snapshot is averaged in the background and merged delay
    steps later: x <- abar + (x - s)."""

    def __init__(self, sim):
        super().__init__(sim)
        self.tau, self.delay = sim.cfg.algo.tau, sim.cfg.algo.delay
        self.snapshot: torch.Tensor | None = None
        self.average: torch.Tensor | None = None
        self.launched_at = -1
        self.reduced_at = 0.0  # virtual time the pending reduction completes
        self.reduce_started = 0.0
        self.synced = True
        self.launches = self.merges = 0

    @property
    def identical_replicas(self):  # type: ignore[override]
        return self.synced

    def _merge(self) -> None:
        clocks = self.sim.clocks
        clocks.wait_until(np.full(self.n, self.reduce_started), "idle")
        clocks.wait_until(np.full(self.n, self.reduced_at), "comm")
        merge_(self.sim.x, self.snapshot, self.average)
        self.snapshot = self.average = None
        self.merges += 1

    def step(self, step, batches, counts, global_count):
        t = step - 1  # the rule counts steps from 0
        self.apply(self.local_gradients(batches, counts, global_count))
        self.compute_all(step, counts)
        self.synced = False
        if self.snapshot is not None and merge_due(t, self.launched_at, self.delay):
            self._merge()
        if launch_due(t, self.tau):
            x = self.sim.x
            self.snapshot = x.clone()
            self.average = rows_to_their_mean_(x.clone())
            self.launched_at = t
            self.launches += 1
            self.reduce_started = float(self.sim.clocks.t.max())  # the last learner launches
            self.reduced_at = self.reduce_started + self.sim.cluster.allreduce_s(
                list(range(self.n)), self.sim.nbytes)
            self.count_allreduce(overlapped=self.delay > 0)
            if self.delay == 0:
                self._merge()
                self.synced = True

    def finish(self):
        if self.snapshot is not None:
            self._merge()

    def stats(self):
        return [{"launches": self.launches, "merges": self.merges} for _ in range(self.n)]

    def state_dict(self):
        return {**super().state_dict(), "launched_at": self.launched_at, "synced": self.synced,
                "launches": self.launches, "merges": self.merges,
                "snapshot": self.snapshot, "average": self.average,
                "reduced_at": self.reduced_at, "reduce_started": self.reduce_started}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for key in ("launched_at", "synced", "launches", "merges", "snapshot", "average",
                    "reduced_at", "reduce_started"):
            setattr(self, key, state[key])
