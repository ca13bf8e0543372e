"""``trainer.checkpoint_every=auto``: checkpoints spaced by Young's rule, from the run's own
checkpoint cost and the machine's failure rate.

    T = sqrt(2 C M)

* ``C``: the seconds the run's last scheduled checkpoint took to write (every rank's state,
  until rank 0 had every checksum), measured as it goes; the slowest rank's, so that every
  rank computes the same ``T``;
* ``M``: the job's mean time between failures, ``launcher.mtbf_h`` (hours between failures
  of one node) over the job's nodes (``launcher.nprocs / launcher.procs_per_node``, one node
  when that is not set); with ``launcher.mtbf_h`` null, the cluster preset's
  ``cluster.failures.node_mtbf_hours``;
* ``T`` is seconds of training. The next checkpoint comes ``T`` times the run's measured rate
  (global samples per second of training so far, evaluations and checkpoints left out)
  after this one, rounded up to a whole global batch: a point in samples, which every rank
  meets in the same order as the other milestones (runner/train/milestones.py).

The first one comes after :data:`FIRST_STEPS` steps (also after a resume), to measure ``C``.
Epoch ends get no checkpoint of their own (the run's end does): at scale one per epoch can
cost more than the failures it guards against (docs/scale_studies.md). Young's ``T``
minimises the expected time lost to failures and checkpoints when ``C`` is small against
``M``; runner/sim/failures.py uses the same function for the simulator and the failures
study.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..config.run_schema import node_mtbf_h

FIRST_STEPS = 10  # steps before the first checkpoint of an auto run: it measures C


def young_period_s(checkpoint_s: float, job_mtbf_s: float) -> float:
    """Young's optimum seconds of training between checkpoints: sqrt(2 C M)."""
    return math.sqrt(2 * checkpoint_s * job_mtbf_s)


def job_mtbf_s(node_mtbf_h: float, nodes: int) -> float:
    """The job's mean seconds between failures: any of its ``nodes`` failing ends it."""
    return node_mtbf_h * 3600 / max(1, nodes)


def job_nodes(nprocs: int, procs_per_node: int | None) -> int:
    return 1 if not procs_per_node else math.ceil(nprocs / procs_per_node)


@dataclass
class AutoPeriod:
    """The planner of an auto run's checkpoints (the same on every rank)."""

    mtbf_s: float  # the job's
    global_batch: int
    budget: int  # the run's sample budget: no checkpoint at or past it (its end has one)

    @classmethod
    def of(cls, cfg: Any, global_batch: int, budget: int) -> AutoPeriod:
        """The planner of the run configured by ``cfg`` (checked: an MTBF is given)."""
        launcher = cfg.launcher
        nodes = job_nodes(launcher.nprocs, launcher.get("procs_per_node"))
        return cls(job_mtbf_s(node_mtbf_h(cfg), nodes), global_batch, budget)

    def first(self, samples: int) -> int | None:
        """The first checkpoint of a session that starts at ``samples``."""
        return self._within(samples + FIRST_STEPS * self.global_batch)

    def next(self, samples: int, cost_s: float, samples_per_s: float
             ) -> tuple[int | None, dict[str, Any]]:
        """(the next checkpoint's sample count, or None past the budget; the record of how
        it was chosen) after a checkpoint at ``samples`` that cost ``cost_s``."""
        period_s = young_period_s(cost_s, self.mtbf_s)
        stride = max(1, math.ceil(period_s * samples_per_s / self.global_batch))
        point = self._within(samples + stride * self.global_batch)
        record = {"at_samples": samples, "checkpoint_s": cost_s, "mtbf_s": self.mtbf_s,
                  "period_s": period_s, "samples_per_s": samples_per_s,
                  "period_samples": stride * self.global_batch, "next_at_samples": point}
        return point, record

    def _within(self, point: int) -> int | None:
        return point if point < self.budget else None
