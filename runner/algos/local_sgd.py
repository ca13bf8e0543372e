"""Local SGD and post-local SGD (docs/algorithms.md, Local SGD and post-local SGD).

Each rank takes local SGD steps and every ``period`` (H) steps all ranks average their models
with a blocking allreduce::

    x_i <- x_i - gamma_t * g_i(x_i)
    if (t - t_switch) mod H == 0:  x_i <- (1/n) sum_j x_j        (t > t_switch)

Post-local SGD: before ``switch_epoch`` the ranks run ordinary synchronous SGD (the gradient
allreduce of ssgd.py, so momentum stays consistent and the replicas identical); from then on,
local SGD with period H. ``switch_epoch=0`` (the default) is plain local SGD throughout; the
post-local paper switches at the first learning-rate decay.

Invariants: after each averaging all replicas are identical and the mean model is what it was
before; H = 1 with plain SGD (no momentum) equals SSGD exactly, since models that are equal
before a step differ only by their gradients. Momentum buffers stay local after the switch.

Checkpoints keep whether the switch has happened (and at which step), whether the replicas are
in sync and the averaging count; the averaging schedule itself follows from the step counter.
Resumed with another number of ranks, every rank starts from the mean model and a new period
starts; a switch still to come is moved to the new world's steps (runner/checkpoint/resize.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.section import require
from .base import AlgoConfig, Reduction
from .registry import ALGORITHMS
from .ssgd import SSGD

if TYPE_CHECKING:
    import torch

SYNCHRONOUS, LOCAL, AVERAGE = "synchronous", "local", "average"


def step_kind(step: int, switch_step: int, period: int) -> str:
    """What step ``step`` (counted from 1) does: SYNCHRONOUS (gradient allreduce, up to and
    including ``switch_step``), AVERAGE (a local step, then the model average: every
    ``period``-th step after the switch) or LOCAL."""
    if step <= switch_step:
        return SYNCHRONOUS
    return AVERAGE if (step - switch_step) % period == 0 else LOCAL


def average_models_(buffers: Iterable[torch.Tensor],
                    mean_: Callable[[torch.Tensor], object]) -> None:
    """x_i <- (1/n) sum_j x_j for every flat buffer, in place (both engines): ``mean_`` is an
    allreduce's mean on a rank, a mean over the learners' rows in the simulator."""
    for flat in buffers:
        mean_(flat)


@dataclass
class LocalSGDConfig(AlgoConfig):
    name: str = "local_sgd"
    period: int = 8  # H: local steps between averagings
    # synchronous SGD before this epoch (post-local SGD, e.g. the first lr decay); 0: local
    # SGD from the start
    switch_epoch: float = 0.0

    def check(self, prefix, cfg):
        require(self.period >= 1, f"{prefix}.period", f"must be >= 1, got {self.period}",
                f"{prefix}.period=8")
        require(self.switch_epoch >= 0, f"{prefix}.switch_epoch",
                f"must be >= 0, got {self.switch_epoch}", f"{prefix}.switch_epoch=0")


@ALGORITHMS.register("local_sgd")
class LocalSGD(SSGD):
    Config = LocalSGDConfig
    reduces_to = {"local-sgd-period-1": Reduction(("algo.period=1",)),
                  "post-local-sgd-before-the-switch": Reduction(("algo.switch_epoch=5",))}

    @classmethod
    def averaging_period(cls, cfg):
        # Post-local SGD (switch_epoch > 0) averages gradients at every step before it.
        return None if cfg.switch_epoch > 0 else (cfg.period, "algo.period")

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        # Lockstep: every rank computes the same switch step from the same numbers.
        self.switch_step = round(self.cfg.switch_epoch * self.ctx.steps_per_epoch)
        self.local = self.switch_step == 0
        if self.local:
            self.buckets.remove()
        self._synced = True
        self.averagings = 0

    @property
    def identical_replicas(self) -> bool:  # type: ignore[override]
        return self._synced

    def shared_update_group(self):
        return None if self.local else self.comm

    def state_dict(self):
        return {"local": self.local, "synced": self._synced, "averagings": self.averagings,
                "switch_step": self.switch_step}

    def load_state_dict(self, state):
        if state["local"] and not self.local:
            self.buckets.remove()  # switched before the checkpoint: no gradient allreduce
        self.local, self._synced = state["local"], state["synced"]
        self.averagings = state["averagings"]
        # After a resize the step length changed: the saved switch step is the one in use.
        self.switch_step = state.get("switch_step", self.switch_step)

    def continue_after_loss(self, previous):
        # The same phase and switch step; replicas in sync only if they were.
        self.load_state_dict(previous.state_dict())

    def load_merged_state(self, state, step, epoch):
        # Replicas start identical; a new period starts now. Before the switch, the switch
        # epoch is counted in the new world's steps from here.
        if state["local"]:
            self.load_state_dict({**state, "synced": True, "switch_step": step})
        else:
            self.switch_step = step + max(0, round((self.cfg.switch_epoch - epoch)
                                                   * self.ctx.steps_per_epoch))
        self.averagings = state["averagings"]

    def before_backward(self, step):
        if not self.local:
            super().before_backward(step)

    def after_backward(self, step):
        if not self.local:
            super().after_backward(step)

    def after_step(self, step):
        if not self.local:
            if step >= self.switch_step:  # the last synchronous step is done
                self.buckets.remove()
                self.local = True
            return
        if step_kind(step, self.switch_step, self.cfg.period) != AVERAGE:
            self._synced = False
            return
        with self.timers.time("comm"):
            average_models_(self.ctx.param_buffers,
                            lambda flat: self.comm.allreduce_(flat, op="mean", wire=self.wire))
        self._synced = True
        self.averagings += 1

    def stats(self):
        return {"averagings": self.averagings, "local": float(self.local)}
