"""DiLoCo under the simulator (runner/algos/diloco.py): local steps on every stacked learner,
and at each round's end the outer step on the mean pseudo-gradient, with the algorithm's own
outer optimizer over theta (one copy: every learner holds the same)."""

from __future__ import annotations

from typing import Any

import torch

from ...algos.diloco import outer_optimizer, outer_step_
from ..lockstep import LockstepDriver
from ..registry import SIM_DRIVERS


def mean_over_rows(theta: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
    """Every learner's allreduce of theta - x_i, at once."""
    torch.mean(theta.unsqueeze(0) - x, dim=0, out=out)


@SIM_DRIVERS.register("diloco")
class DiLoCoDriver(LockstepDriver):
    """x_i <- x_i - gamma d_i; every period: theta <- OuterSGD(theta, mean_i(theta - x_i)),
    x_i <- theta."""

    def __init__(self, sim):
        super().__init__(sim)
        self.cfg = sim.cfg.algo
        self.synced = True
        self.rounds = 0

    def setup(self):
        self.theta = self.sim.x[0].clone()
        self.theta.grad = torch.zeros_like(self.theta)
        self.outer = outer_optimizer([self.theta], self.cfg)

    @property
    def identical_replicas(self):  # type: ignore[override]
        return self.synced

    def step(self, step, batches, counts, global_count):
        self.apply(self.local_gradients(batches, counts, global_count))
        self.compute_all(step, counts)
        if step % self.cfg.period:
            self.synced = False
            return
        with torch.no_grad():
            outer_step_(self.outer, [self.theta], [self.sim.x], mean_over_rows)
        self.allreduce_together()
        self.synced = True
        self.rounds += 1

    def stats(self):
        return [{"rounds": self.rounds} for _ in range(self.n)]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "theta": self.theta.detach().clone(),
                "outer": self.outer.state_dict(), "synced": self.synced, "rounds": self.rounds}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        with torch.no_grad():
            self.theta.copy_(state["theta"])
        self.outer.load_state_dict(state["outer"])
        self.synced, self.rounds = state["synced"], state["rounds"]
