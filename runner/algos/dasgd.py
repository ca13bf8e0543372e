"""DaSGD: local SGD with delayed averaging (docs/algorithms.md, DaSGD).

Every rank takes local SGD steps; every ``tau`` steps it snapshots its model and starts a
non-blocking allreduce of the snapshot, keeps training, and ``delay`` steps later merges the
average into the model, keeping the local progress made meanwhile::

    t = 0, 1, 2, ...:   x <- x - gamma_t * g(x, batch_t)                  (never waits)
        if a reduction launched at t0 is pending and t == t0 + delay:
            x <- abar + (x - s)            abar = mean_i s_i, the average of the snapshots
        if (t + 1) mod tau == 0:
            s <- copy(x); start abar <- allreduce_mean(s)
            if delay == 0: x <- abar       (blocking: local SGD with period tau)

The merge keeps the mean model, since mean_i (abar + x_i - s_i) = mean_i x_i. The reduction runs
on the communication thread while the next ``delay`` forward/backward passes proceed; a rank
waits at the merge only when the reduction took longer than that. All ranks launch and merge at
the same step numbers (the trainer's steps are lockstep), so at most one reduction is in flight
when ``delay <= tau``. With ``delay = 0, tau = 1`` and plain SGD this is SSGD exactly. Momentum
buffers stay local (docs/algorithms.md). At the end the reduction in flight is merged before
the rank stops. ``tau = 0`` never averages: each rank trains alone, the compute-only baseline
that measures what averaging costs (benchmarks/bench_dasgd_hiding.py); the run says so in a
warning, and a ``tau`` longer than the whole run is refused (Algorithm.check_run_length).

Checkpoints: a reduction in flight is completed (every rank launched it at the same step) and
stored unmerged, with its snapshot s and launch step; the resumed run merges it at t0 + delay,
exactly as the uninterrupted run does. Resumed with another number of ranks, every rank starts
from the mean of the saved models, with nothing in flight (runner/checkpoint/resize.py).

Warning: the merge rule's match with the paper's equations is a reconstruction (see
docs/algorithms.md, DaSGD); it is the rule this runner implements and tests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..comm.communicator import Handle
from ..config.section import require
from ..lazy import torch
from .base import AlgoConfig, Algorithm, Reduction
from .registry import ALGORITHMS


def launch_due(t: int, tau: int) -> bool:
    """Whether step ``t`` (from 0) launches an averaging: every ``tau`` steps (never for 0)."""
    return tau > 0 and (t + 1) % tau == 0


def merge_due(t: int, launched_at: int, delay: int) -> bool:
    """Whether the reduction launched at step ``launched_at`` merges after step ``t``."""
    return t == launched_at + delay


def merge_(x: torch.Tensor, snapshot: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
    """``x <- abar + (x - s)``: the average of the snapshots plus the local progress since."""
    return x.sub_(snapshot).add_(average)


@dataclass
class DaSGDConfig(AlgoConfig):
    name: str = "dasgd"
    tau: int = 4  # local steps between launches of an averaging; 0: never (ranks train alone)
    delay: int = 1  # local steps between a launch and its merge (<= tau); 0 blocks (local SGD)

    def check(self, prefix, cfg):
        require(self.tau >= 0, f"{prefix}.tau",
                f"must be >= 1 (or 0: never average), got {self.tau}", f"{prefix}.tau=4")
        require(0 <= self.delay <= self.tau, f"{prefix}.delay",
                f"must be between 0 and algo.tau={self.tau}, got {self.delay}",
                f"{prefix}.delay={min(1, self.tau)}")


@ALGORITHMS.register("dasgd")
class DaSGD(Algorithm):
    Config = DaSGDConfig
    elastic = True
    reduces_to = {"dasgd-blocking-every-step": Reduction(("algo.tau=1", "algo.delay=0"))}

    @classmethod
    def averaging_period(cls, cfg):
        return cfg.tau, "algo.tau"

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        self.x = self.ctx.param_buffers
        self.snapshot = [torch.empty_like(flat) for flat in self.x]  # s
        self.average = [torch.empty_like(flat) for flat in self.x]  # becomes abar in place
        self._handles: list | None = None
        self._launched_at = -1  # t0
        self._synced = True  # replicas identical (at start and after a blocking average)
        self.launches = self.merges = 0
        self.merge_wait_s = 0.0

    @property
    def identical_replicas(self) -> bool:  # type: ignore[override]
        return self._synced

    def _launch(self, t: int) -> None:
        self._handles = []
        for flat, snap, avg in zip(self.x, self.snapshot, self.average):
            snap.copy_(flat)
            self._handles.append(self.comm.iallreduce_(avg.copy_(flat), op="mean",
                                                       wire=self.wire))
        self._launched_at = t
        self.launches += 1

    def _merge(self) -> None:
        assert self._handles is not None
        started = time.perf_counter()
        with self.timers.time("comm"):
            for handle in self._handles:
                handle.wait()
        self.merge_wait_s += time.perf_counter() - started
        with torch.no_grad():
            for flat, snap, avg in zip(self.x, self.snapshot, self.average):
                merge_(flat, snap, avg)
        self._handles = None
        self.merges += 1

    def after_step(self, step):
        t = step - 1  # the trainer counts steps from 1, the rule from 0
        self._synced = False
        if self._handles is not None and merge_due(t, self._launched_at, self.cfg.delay):
            self._merge()
        if launch_due(t, self.cfg.tau):
            self._launch(t)
            if self.cfg.delay == 0:
                self._merge()  # x == s here, so the merge is x <- abar
                self._synced = True

    def finish(self):
        if self._handles is not None:  # the last reduction: every rank completes and merges it
            self._merge()

    def state_dict(self):
        state = {"launched_at": self._launched_at, "synced": self._synced,
                 "launches": self.launches, "merges": self.merges,
                 "merge_wait_s": self.merge_wait_s, "pending": self._handles is not None}
        if self._handles is not None:
            with self.timers.time("comm"):
                for handle in self._handles:
                    handle.wait()
            state["snapshot"] = [t.clone() for t in self.snapshot]
            state["average"] = [t.clone() for t in self.average]
        return state

    def load_state_dict(self, state):
        self._launched_at, self._synced = state["launched_at"], state["synced"]
        self.launches, self.merges = state["launches"], state["merges"]
        self.merge_wait_s = state["merge_wait_s"]
        self._handles = None
        if state["pending"]:
            for mine, saved in zip(self.snapshot, state["snapshot"]):
                mine.copy_(saved)
            for mine, saved in zip(self.average, state["average"]):
                mine.copy_(saved)
            self._handles = [Handle.completed(avg) for avg in self.average]

    def continue_after_loss(self, previous):
        # The average in flight is lost with the learner: the next launch starts a new one.
        self.launches, self.merges = previous.launches, previous.merges
        self.merge_wait_s = previous.merge_wait_s
        self._synced = previous._synced and previous._handles is None

    def load_merged_state(self, state, step, epoch):
        # Merging the average in flight first would leave the mean model as it is
        # (mean_i (abar + x_i - s_i) = mean_i x_i): the replicas start identical, none pending.
        self.launches, self.merges = state["launches"], state["merges"]
        self.merge_wait_s = state["merge_wait_s"]

    def stats(self):
        return {"launches": self.launches, "merges": self.merges,
                "merge_wait_s": self.merge_wait_s}
