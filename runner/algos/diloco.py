"""DiLoCo: local steps, then an outer step on the averaged pseudo-gradient (docs/algorithms.md,
DiLoCo).

Every learner starts each round of H = ``period`` steps from the shared outer model theta::

    H steps:  x_i <- x_i - gamma_t * d_i(x_i)      the trainer's optimizer (the inner one)
    Delta = (1/n) sum_i (theta - x_i)               one allreduce: the outer pseudo-gradient
    theta <- theta - outer_lr * (Delta + mu * v),   v <- mu * v + Delta    (SGD, Nesterov)
    x_i <- theta

with mu = ``outer_momentum`` (plain momentum-free SGD when 0). Rounds end at steps that are
multiples of H, as local SGD's averagings do.

Invariants: after each round the replicas are identical (x_i = theta); with outer_lr = 1 and
outer_momentum = 0 the outer step is theta - mean_i(theta - x_i) = mean_i x_i, so the run is
local SGD with the same period (tests/test_equivalence_mpi.py, to 1e-10). The inner
optimizer's state (momentum) stays local and carries over rounds.

Checkpoints hold theta and the outer optimizer's state (its momentum).

Elastic (launcher.elastic): a step that ends a round also keeps theta and the outer momentum
before it (:meth:`DiLoCo.before_undoable_step`), so that a learner lost during the round's
allreduce leaves theta as it was on every survivor; the survivors then go on with the same
theta, momentum and round, and the round's outer step averages the pseudo-gradients of the
learners left: Delta = (1/n') sum over the n' survivors of (theta - x_i).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.section import require
from ..lazy import torch
from .base import AlgoConfig, Algorithm, Reduction
from .registry import ALGORITHMS

if TYPE_CHECKING:
    from .optim import SGD


@dataclass
class DiLoCoConfig(AlgoConfig):
    name: str = "diloco"
    period: int = 50  # H: inner steps per round
    outer_lr: float = 0.7  # the outer SGD's learning rate
    # The outer SGD's Nesterov momentum (0: none). The paper's 0.9 (with AdamW inside) made
    # SGD-momentum inner steps diverge at period 10 (digits, 4 learners: docs/RESULTS.md).
    outer_momentum: float = 0.5

    def check(self, prefix, cfg):
        require(self.period >= 1, f"{prefix}.period", f"must be >= 1, got {self.period}",
                f"{prefix}.period=50")
        require(self.outer_lr > 0, f"{prefix}.outer_lr", f"must be > 0, got {self.outer_lr}",
                f"{prefix}.outer_lr=0.7")
        require(0 <= self.outer_momentum < 1, f"{prefix}.outer_momentum",
                f"must be in [0, 1), got {self.outer_momentum}", f"{prefix}.outer_momentum=0.5")


def outer_optimizer(theta: list[torch.Tensor], cfg: DiLoCoConfig) -> SGD:
    """The outer SGD over theta (both engines use it)."""
    from .optim import SGD  # a subclass of torch's: imports it

    return SGD(theta, lr=cfg.outer_lr, momentum=cfg.outer_momentum,
               nesterov=cfg.outer_momentum > 0)


def outer_step_(outer: SGD, thetas: list[torch.Tensor], xs: list[torch.Tensor],
                mean_pseudo_gradient_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                                                None]) -> None:
    """The end of a round, in place (both engines)::

        theta.grad <- mean_i (theta - x_i);  theta <- OuterSGD(theta);  x_i <- theta

    ``mean_pseudo_gradient_(theta, x, out)`` writes the learners' mean of theta - x_i to
    ``out``: an allreduce on a rank, a mean over the rows in the simulator (whose ``x`` is
    every learner's, one row each; theta is one copy, which the reset broadcasts)."""
    for theta, x in zip(thetas, xs):
        mean_pseudo_gradient_(theta, x, theta.grad)
    outer.step()
    for theta, x in zip(thetas, xs):
        x.copy_(theta)


@ALGORITHMS.register("diloco")
class DiLoCo(Algorithm):
    Config = DiLoCoConfig
    elastic = True
    reduces_to = {"diloco-outer-sgd-1-is-local-sgd": Reduction(
        ("algo.period=3", "algo.outer_lr=1", "algo.outer_momentum=0", "optim.momentum=0.9"),
        ("algo=local_sgd", "algo.period=3", "optim.momentum=0.9"))}

    @classmethod
    def averaging_period(cls, cfg):
        return cfg.period, "algo.period"

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        self.x = self.ctx.param_buffers
        self.theta = [flat.detach().clone() for flat in self.x]
        for theta in self.theta:
            theta.grad = torch.zeros_like(theta)
        self.outer = outer_optimizer(self.theta, self.cfg)
        self._synced = True
        self.rounds = 0

    @property
    def identical_replicas(self) -> bool:  # type: ignore[override]
        return self._synced

    def after_step(self, step):
        if step % self.cfg.period:
            self._synced = False
            return
        with self.timers.time("comm"), torch.no_grad():
            outer_step_(self.outer, self.theta, self.x, self._allreduce_pseudo_gradient)
        self._synced = True
        self.rounds += 1

    def _allreduce_pseudo_gradient(self, theta: torch.Tensor, x: torch.Tensor,
                                   out: torch.Tensor) -> None:
        self.comm.allreduce_(torch.sub(theta, x, out=out), op="mean", wire=self.wire)

    def state_dict(self):
        return {"theta": [t.detach().clone() for t in self.theta],
                "outer": self.outer.state_dict(), "synced": self._synced,
                "rounds": self.rounds}

    def load_state_dict(self, state):
        with torch.no_grad():
            for mine, saved in zip(self.theta, state["theta"]):
                mine.copy_(saved)
        self.outer.load_state_dict(state["outer"])
        self._synced, self.rounds = state["synced"], state["rounds"]

    def before_undoable_step(self, step):
        if step % self.cfg.period:  # a local step: only the phase changes
            return {"synced": self._synced}
        state = self.state_dict()  # theta cloned already; the outer momentum is not
        state["outer"] = copy.deepcopy(state["outer"])
        return state

    def undo_step(self, saved):
        if "theta" in saved:
            self.load_state_dict(saved)
        self._synced = saved["synced"]

    def continue_after_loss(self, previous):
        # Theta, the outer momentum and the round go on (the same on every survivor).
        self.load_state_dict(previous.state_dict())

    def load_merged_state(self, state, step, epoch):
        # The replicas start from their mean, where a round starts; the outer momentum (the
        # same on every old learner) goes on.
        with torch.no_grad():
            for theta, x in zip(self.theta, self.x):
                theta.copy_(x)
        self.outer.load_state_dict(state["outer"])
        self.rounds = state["rounds"]

    def stats(self):
        return {"rounds": self.rounds}
