"""How a Trainer goes on with another set of learners (launcher.elastic: a loss, a spare
that joins, :meth:`runner.trainer.Trainer.regroup`): its seat moves to the new world (the
algorithm's context, checkpoints and evaluation read it there), and what is built from the
world (the data dealt, the stop agreement, the algorithm object, the learning-rate schedule)
is built again by the same methods that built it at the start."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..algos import ALGORITHMS
from ..comm import Communicator, World
from ..comm.ulfm import retire_comm
from ..errors import ConfigError, UserError
from ..runlog.console import ProgressBar
from ..runlog.records import read_metrics
from ..runlog.writer import RunLog

if TYPE_CHECKING:
    from .loop import Trainer


def regroup(t: Trainer, world: World, comm: Communicator, node_comm: Communicator,
            partial: tuple[int, np.ndarray] | None, algo_state: dict[str, Any] | None = None,
            rate: float | None = None, own: tuple[int, np.ndarray] | None = None) -> None:
    """Point trainer ``t`` at the learners of ``world``: communicators (the old ones are
    freed), data, evaluation, checkpoints, stop agreement, a new algorithm object and the
    learning-rate schedule for the new global batch; training goes on at the start of the
    ``partial`` pass, or (an asynchronous learner) of its ``own`` pass (epoch, samples).
    The new algorithm takes over from the old one after a loss, or loads
    ``algo_state`` (a joining spare: its donor's; the others: their own); the schedule
    climbs from ``rate`` (default: the old one's rate now)."""
    became_main = world.is_main and not t.world.is_main
    # The communicators left: revoked after a loss, idle after a join.
    for closing in t.seat.move(world, comm, node_comm):
        closing.close()
        retire_comm(closing.mpi_comm)
    # The parts that read the seat (the algorithm's context, checkpoints, evaluation) follow
    # it; what is built from the world is built again by the methods __init__ uses.
    t.deal(t.shards.dealt_to(world.rank, world.size, partial))
    t.shards.own = own
    t.agree_on_stops()
    previous = t.algo
    previous.close()
    try:
        ALGORITHMS.get(t.cfg.algo.name).check_survivors(t.cfg, world)
    except ConfigError as ex:  # the topology has no graph for the learners left
        raise UserError(f"the {world.size} learners left cannot go on: {ex.cause}",
                        "for elastic runs choose a topology for any number of learners "
                        "(topology=ring, random_ring, exponential_undirected or complete)"
                        ) from None
    t.build_algorithm()
    if algo_state is None:
        t.algo.continue_after_loss(previous)
    else:
        t.algo.continue_after_join(algo_state)
    rate = t.schedule.lr_at(t.state.samples) if rate is None else rate
    t.schedule = t.schedule_for_the_world()
    t.schedule.start_ramp(t.state.samples, rate)
    t.progress.relabel(f"{t.cfg.algo.name} x{world.size}")
    t.state.position = ((partial or own)[0], 0)
    if became_main:  # the first rank was lost: this one writes the run's records now
        t.state.history = read_metrics(t.run_dir)
        t.runlog = RunLog(t.run_dir, t.cfg, t.recipe.primary_metric,
                          resume_at=(t.state.step, t.state.samples))
        if t.cfg.trainer.progress:
            t.progress = ProgressBar(t.progress_stream, t.milestones.budget, t.state.samples,
                                     f"{t.cfg.algo.name} x{world.size}",
                                     t.cfg.trainer.progress_every_s)
