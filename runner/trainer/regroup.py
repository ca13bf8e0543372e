"""How a Trainer goes on with another set of learners (launcher.elastic: a loss, a spare
that joins): communicators, data, evaluation, checkpoints, stop agreement, a new algorithm
object and the learning-rate schedule, all pointed at the new world
(:meth:`runner.trainer.Trainer.regroup`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..algos import ALGORITHMS
from ..checkpoint.preemption import StopAgreement
from ..comm import Communicator, World
from ..comm.ulfm import free_quietly
from ..elastic.new_world import dealt_again
from ..errors import ConfigError, UserError
from ..runlog.console import ProgressBar
from ..runlog.records import read_metrics
from ..runlog.writer import RunLog
from ..train.lr_schedule import LRSchedule

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
    for closing in (t.comm, t.ctx.node_comm):  # revoked after a loss, idle after a join
        closing.close()
        free_quietly(closing.mpi_comm)
    t.world, t.comm = world, comm
    t.shards = dealt_again(t.shards, world, partial)
    t.shards.own = own
    t.ctx.world, t.ctx.comm, t.ctx.node_comm = world, comm, node_comm
    t.ctx.steps_per_epoch = t.shards.steps_per_epoch
    t.checkpointer.world, t.checkpointer.comm = world, comm
    t.evaluator.comm = comm
    t.evaluator.shards = dealt_again(t.evaluator.shards, world)
    t.stop = StopAgreement(comm.mpi_comm, world.rank, comm.timeout_s)
    previous = t.algo
    previous.close()
    algorithm = ALGORITHMS.get(t.cfg.algo.name)
    try:
        algorithm.check_survivors(t.cfg, world)
    except ConfigError as ex:  # the topology has no graph for the learners left
        raise UserError(f"the {world.size} learners left cannot go on: {ex.cause}",
                        "for elastic runs choose a topology for any number of learners "
                        "(topology=ring, random_ring, exponential_undirected or complete)"
                        ) from None
    t.algo = algorithm.build(t.cfg.algo, t.ctx)
    t.algo.setup(t.model, t.optimizer)
    if algo_state is None:
        t.algo.continue_after_loss(previous)
    else:
        t.algo.load_state_dict(algo_state)
    t.paused = t.algo_finished = False  # a new object: not paused, its finish() still to come
    rate = t.schedule.lr_at(t.state.samples) if rate is None else rate
    t.schedule = LRSchedule(t.cfg.optim, world.size * t.cfg.trainer.batch_size,
                            len(t.train_set), t.cfg.trainer.epochs)
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
