"""SSGD under the simulator (runner/algos/ssgd.py): the learners' weighted gradients
averaged, one update applied to every row, an allreduce every learner waits for."""

from __future__ import annotations

import torch

from ..lockstep import LockstepDriver
from ..registry import SIM_DRIVERS


@SIM_DRIVERS.register("ssgd")
class SSGDDriver(LockstepDriver):
    """x <- x - gamma * mean_i(c_i n / C g_i): the averaged gradient applied on every row."""

    identical_replicas = True

    def step(self, step, batches, counts, global_count):
        # The rows are equal, so the learners' weighted gradients are summed in one backward
        # pass at row 0 (the allreduce's mean, by linearity); row 0 alone is stepped and
        # copied to the others (its momentum too).
        sim = self.sim
        weights = self.weights(counts, global_count) / self.n
        mean = sim.weighted_gradient(sim.x[0], batches, counts, weights)
        sim.apply_update(torch.tensor([0]), mean.unsqueeze(0),
                         torch.tensor([sim.lr], dtype=torch.float64))
        sim.replicate_row(0)
        self.compute_all(step, counts)
        self.allreduce_together()
