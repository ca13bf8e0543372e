"""Node failures over a run's failure-free schedule: goodput when the job restarts from its
last checkpoint, against elastic continuation (runner/elastic/membership.py).

Inputs: the failure-free training seconds of the run (``work_s``, what the simulator's timing
gives for its sample budget), and a :class:`FailureModel`. Nodes fail independently, each as
a Poisson process of rate 1/``node_mtbf_s``; a failure takes the node's learners with it.

* **Restart from checkpoint.** Training runs in intervals of ``interval_s``, each followed by
  a checkpoint write of ``checkpoint_s``. A failure (any of the ``nodes``) loses the work
  since the last complete checkpoint and costs ``restart_s`` (detection, requeue, start,
  reading the checkpoint) before training resumes on a full set of nodes (a spare replaces
  the failed one). Young's interval ``sqrt(2 checkpoint_s M)`` with M the job's MTBF
  (``node_mtbf_s / nodes``), and Daly's first-order correction of it (minus
  ``checkpoint_s``), minimise the expected loss.
* **Elastic continuation.** A failure costs ``recovery_s`` (agreement, shrink, the epoch's
  rest dealt again) and the step in flight; training goes on with the learners left, whose
  throughput is taken to scale with their number (data parallel, a fixed batch per learner:
  an assumption; the simulator's own numbers at fewer learners would refine it). No failure
  needs a checkpoint. Without spares nothing replaces the lost nodes, so late in a long run
  on unreliable nodes the job slows down; with ``spare_nodes`` (launcher.spares), a spare
  takes a failed node's place after ``join_s`` while any is left. Waiting spares fail at the
  same rate as the others (a dead spare is simply one fewer).

Goodput: useful samples per second of wall time, as a fraction of the failure-free rate
(``work_s / wall_s``); :func:`mean_goodput` averages Monte Carlo draws (a seeded generator).

:class:`NodeFailures` draws the same failures inside a simulation's event loop
(``cluster.failures``, runner/sim/engine.py), where the run itself goes back to its newest
checkpoint: there the lost work, the checkpoints' cost and the restarts are the run's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checkpoint.period import young_period_s


@dataclass(frozen=True)
class FailureModel:
    node_mtbf_s: float  # mean seconds between failures of one node
    nodes: int
    checkpoint_s: float  # writing one checkpoint (every rank's state)
    restart_s: float  # from a failure to training again from the last checkpoint
    recovery_s: float  # elastic: from a failure to training again without the node
    spare_nodes: int = 0  # elastic: nodes of spares waiting to replace failed ones
    join_s: float = 0.0  # elastic: a spare node's join, training paused

    @property
    def job_mtbf_s(self) -> float:
        return self.node_mtbf_s / self.nodes


def young_interval(checkpoint_s: float, job_mtbf_s: float) -> float:
    """Young's optimum seconds of training between checkpoints: sqrt(2 delta M), the rule of
    trainer.checkpoint_every=auto (runner/checkpoint/period.py)."""
    return young_period_s(checkpoint_s, job_mtbf_s)


def daly_interval(checkpoint_s: float, job_mtbf_s: float) -> float:
    """Daly's first-order optimum: sqrt(2 delta M) - delta (delta < 2M), else M."""
    if checkpoint_s >= 2 * job_mtbf_s:
        return job_mtbf_s
    return young_interval(checkpoint_s, job_mtbf_s) - checkpoint_s


def restart_wall_s(work_s: float, interval_s: float, model: FailureModel,
                   rng: np.random.Generator) -> float:
    """Wall seconds to finish ``work_s`` of training when every failure restarts the job from
    its last checkpoint (one draw)."""
    wall, done = 0.0, 0.0
    next_failure = rng.exponential(model.job_mtbf_s)
    while done < work_s:
        segment = min(interval_s, work_s - done)
        need = segment + (model.checkpoint_s if done + segment < work_s else 0.0)
        if wall + need <= next_failure:
            wall += need
            done += segment
            continue
        # Lost: what this interval had trained and its checkpoint in progress.
        wall = next_failure + model.restart_s
        next_failure = wall + rng.exponential(model.job_mtbf_s)
    return wall


def elastic_wall_s(work_s: float, model: FailureModel, rng: np.random.Generator) -> float:
    """Wall seconds to finish ``work_s`` of full-size training when failed nodes leave, the
    rest go on and spare nodes, while any is left, take their places (one draw); infinite if
    every node fails first."""
    wall, left, alive, spares = 0.0, work_s, model.nodes, model.spare_nodes
    while alive > 0:
        rate = alive / model.nodes  # the fraction of the full job's throughput
        until_failure = rng.exponential(model.node_mtbf_s / (alive + spares))
        if until_failure * rate >= left:
            return wall + left / rate
        wall += until_failure
        left -= until_failure * rate
        if rng.random() < spares / (alive + spares):  # a waiting spare failed
            spares -= 1
            continue
        wall += model.recovery_s
        alive -= 1
        if spares:
            spares, alive = spares - 1, alive + 1
            wall += model.join_s
    return math.inf


def mean_goodput(work_s: float, model: FailureModel, interval_s: float | None, draws: int,
                 seed: int = 0) -> tuple[float, float]:
    """(mean, standard deviation) over ``draws`` of the goodput fraction work_s / wall_s:
    restart from checkpoints every ``interval_s`` seconds of training, or elastic (None)."""
    rng = np.random.default_rng(seed)
    fractions = [work_s / (elastic_wall_s(work_s, model, rng) if interval_s is None else
                           restart_wall_s(work_s, interval_s, model, rng))
                 for _ in range(draws)]
    return float(np.mean(fractions)), float(np.std(fractions))


class NodeFailures:
    """When a simulated job's nodes fail, in virtual seconds: at ``at_s`` (explicit kills) and
    at random, each of ``nodes`` failing as a Poisson process of mean ``node_mtbf_s`` (None:
    never). The job's next random failure is drawn afresh whenever the job starts training
    again (memoryless, so nothing is lost by redrawing); explicit moments that fall while the
    job is down are dropped (the node died while nothing ran on it)."""

    def __init__(self, node_mtbf_s: float | None, nodes: int, at_s: list[float], seed: int):
        self.rng = np.random.default_rng([seed, 0xFA11])  # its own stream: timing unchanged
        self.nodes, self.node_mtbf_s = nodes, node_mtbf_s
        self.planned = sorted(float(t) for t in at_s)
        self.random_at = self._draw_after(0.0)

    def _draw_after(self, t: float) -> float:
        if not self.node_mtbf_s or not self.nodes:
            return math.inf
        return t + float(self.rng.exponential(self.node_mtbf_s / self.nodes))  # the job's MTBF

    def next_at(self) -> float:
        return min(self.planned[0] if self.planned else math.inf, self.random_at)

    def take(self, resumes_at: float, node_leaves: bool = False) -> tuple[float, int | None]:
        """The next failure (its time, and its node when drawn at random; None for an
        explicit one); the job trains again at ``resumes_at``, without that node if
        ``node_leaves`` (an elastic job: the others then fail less often together)."""
        at = self.next_at()
        node = None
        if self.planned and self.planned[0] == at:
            self.planned.pop(0)
        else:
            node = int(self.rng.integers(self.nodes))
        if node_leaves:
            self.nodes -= 1
        self.planned = [t for t in self.planned if t >= resumes_at]
        self.random_at = self._draw_after(resumes_at)
        return at, node
