"""Elastic training (``launcher.elastic=true``): a learner dies and the others go on.

Each step is a small transaction. Before it, a rank copies what the step changes (model,
optimizer state, counters: :class:`StepSnapshot`); after it, every rank *agrees*
(runner/comm/ulfm.py) on whether the step succeeded everywhere. A rank whose step raised an
MPI error first revokes every communicator, so that no survivor stays blocked on a live peer
that has stopped answering. When the agreement fails, every survivor:

1. undoes the step (the snapshot): synchronous algorithms drop only the step in flight;
2. shrinks the world communicator to the survivors and names the learners that are gone;
3. deals what no rank had trained on yet in the current epoch (the survivors' unread shards
   and the lost learners' alike) to the survivors as a partial pass (runner/train/data.py),
   so that every training sample of the epoch is used exactly once;
4. rebuilds its communicators and the algorithm (peers, topology, mixing) for the new size
   and keeps training from its current model: no checkpoint is read, no job restarted.

The sample budget, the milestones and the learning-rate schedule are functions of global
samples, which do not change when a learner leaves. The schedule's linear scaling follows
the global batch of the learners alive: a smaller batch takes the lower rate at once (as a
resized resume does, runner/train/lr_schedule.py).

Learners keep the number they were launched with (their logs, heartbeats and injected faults
go by it); their rank in the communicator is renumbered among the survivors.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from ..comm import Communicator, World
from ..comm.ulfm import agree, free_quietly, is_mpi_error, revoke_all, shrink
from ..comm.world import detect_world, mpi
from ..errors import ConfigError, UserError
from ..runlog.events import record_event
from .data import ShardedBatches

log = logging.getLogger("adpsgd")


class StepSnapshot:
    """A rank's model (parameters and buffers), optimizer state, counters and milestone
    position before a step, kept in tensors reused from step to step."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.tensors = [t for t in (*model.parameters(), *model.buffers())]
        self.optimizer = optimizer
        self.copies: list[torch.Tensor] = []
        self.optimizer_copies: dict[torch.Tensor, dict[str, Any]] = {}

    def take(self, extra: dict[str, Any]) -> None:
        """Copy the step's inputs; ``extra``: plain values restored as they are."""
        if not self.copies:
            self.copies = [t.detach().clone() for t in self.tensors]
        else:
            for copy, t in zip(self.copies, self.tensors):
                copy.copy_(t.detach())
        kept = {}
        for param, state in self.optimizer.state.items():
            before = self.optimizer_copies.get(param, {})
            kept[param] = {key: (before[key].copy_(value) if key in before else value.clone())
                           if torch.is_tensor(value) else value for key, value in state.items()}
        self.optimizer_copies = kept
        self.extra = extra

    def restore(self) -> dict[str, Any]:
        """Put the copies back; returns the ``extra`` given to :meth:`take`."""
        with torch.no_grad():
            for copy, t in zip(self.copies, self.tensors):
                t.copy_(copy)
        for param in list(self.optimizer.state):
            if param not in self.optimizer_copies:  # the step created it (the first step)
                del self.optimizer.state[param]
        for param, saved in self.optimizer_copies.items():
            state = self.optimizer.state[param]
            for key, value in saved.items():
                if torch.is_tensor(value):
                    state[key].copy_(value)
                else:
                    state[key] = value
        return self.extra


class EpochLedger:
    """How many times each training sample was used in the current epoch, over every rank;
    at each epoch's end the ranks add theirs up: summary.json's ``epoch_samples``, one
    ``{"epoch", "distinct", "used"}`` per epoch (every sample once: both equal the training
    set). Lockstep algorithms only: asynchronous ranks each cycle through their own shard.

    A rank counts what it trains on (``counts``). When learners are lost, their counts go
    with them, so the survivors add up theirs at once, with what the lost ones had used of
    the current pass (known from the dealing), into ``carried``: the same on every survivor,
    so that it outlives any of them."""

    def __init__(self, train_size: int):
        self.counts = np.zeros(train_size, dtype=np.int64)
        self.carried: np.ndarray | None = None  # the epoch's counts before the last loss
        self.closed: list[dict[str, int]] = []
        self._mark: tuple | None = None

    def mark(self) -> None:
        """Remember the ledger as it is: :meth:`rollback` returns here."""
        self._mark = (self.counts, self.carried, len(self.closed), [])

    def add(self, indices: np.ndarray) -> None:
        np.add.at(self.counts, indices, 1)
        if self._mark is not None:
            self._mark[3].append(indices)

    def record(self, indices: np.ndarray, epoch: int, last: bool, comm: Communicator) -> None:
        """The samples of a step of ``epoch``; ``last``: the epoch's last step, where the
        ranks add their counts up (collective)."""
        self.add(indices)
        if last:
            total = self._total(comm)
            self.closed.append({"epoch": epoch + 1, "distinct": int(np.count_nonzero(total)),
                                "used": int(total.sum())})
            self.counts, self.carried = np.zeros_like(self.counts), None  # new arrays: mark()

    def carry(self, comm: Communicator, lost_parts: list[np.ndarray]) -> None:
        """Collective over the survivors of a loss: carry every count of the epoch so far,
        the lost learners' ``lost_parts`` of the current pass included."""
        total = self._total(comm)
        for part in lost_parts:
            np.add.at(total, part, 1)
        self.counts, self.carried = np.zeros_like(self.counts), total

    def state_dict(self, comm: Communicator) -> dict[str, Any]:
        """Collective, at a checkpoint: the closed epochs and the current one's counts over
        every rank, which every rank carries from here on (a resumed job, of any size,
        continues the count)."""
        self.counts, self.carried = np.zeros_like(self.counts), self._total(comm)
        return {"closed": list(self.closed), "carried": torch.from_numpy(self.carried.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.closed = list(state["closed"])
        self.carried = state["carried"].numpy().astype(np.int64)
        self.counts = np.zeros_like(self.carried)

    def _total(self, comm: Communicator) -> np.ndarray:
        total = comm.allreduce_numbers(self.counts).astype(np.int64)
        return total + self.carried if self.carried is not None else total

    def rollback(self) -> None:
        counts, carried, closed, added = self._mark
        for indices in added:
            np.subtract.at(counts, indices, 1)
        self.counts, self.carried = counts, carried
        del self.closed[closed:]
        self._mark = None


class Membership:
    """The learners alive, and the step transaction that survives losing some of them."""

    def __init__(self, trainer: Any, min_learners: int):
        self.trainer = trainer
        self.min_learners = min_learners
        world = trainer.world
        self.learners = list(range(world.size))  # learner number of each rank, in rank order
        self.hosts = trainer.comm.allgather_objects(mpi().Get_processor_name())
        self.events: list[dict[str, Any]] = []
        self.lost_samples = 0  # what the lost learners had trained on (summary's samples)
        self.snapshot = StepSnapshot(trainer.model, trainer.optimizer)
        self.chart(world.size)

    def chart(self, learners: int) -> None:
        """TensorBoard's ``membership/learners``: the learners alive against global samples."""
        t = self.trainer
        if t.runlog is not None:
            t.runlog.scalars({"membership/learners": learners}, t.state.samples)

    @classmethod
    def of(cls, trainer: Any) -> Membership | None:
        """The membership of an elastic run (collective), None for the others."""
        launcher = trainer.cfg.launcher
        return cls(trainer, launcher.min_learners) if launcher.get("elastic") else None

    def attempt(self, step: Callable[[], None]) -> bool:
        """Run one step (and the milestones it reaches) as a transaction: True when it
        succeeded on every rank; False when a learner was lost, after undoing the step and
        rebuilding the job for the survivors."""
        t = self.trainer
        state = t.state
        self.step_started = time.perf_counter()
        self.snapshot.take({"state": dataclasses.replace(state), "passed": t.milestones.passed,
                            "stop_status": t.stop_status})
        if t.ledger is not None:
            t.ledger.mark()
        error = None
        try:
            step()
        except Exception as ex:  # noqa: BLE001 - an MPI error is a lost peer until shown otherwise
            if not is_mpi_error(ex):
                raise
            error = ex
            revoke_all()
        if agree(t.comm.mpi_comm, error is None):
            return True
        extra = self.snapshot.restore()
        for field in dataclasses.fields(state):  # in place: others hold the state object
            setattr(state, field.name, getattr(extra["state"], field.name))
        t.milestones.passed, t.stop_status = extra["passed"], extra["stop_status"]
        if t.ledger is not None:
            t.ledger.rollback()
        if error is None:  # another rank failed: ours completed, on communicators now revoked
            revoke_all()
        self.recover(error)
        return False

    def recover(self, error: BaseException | None) -> None:
        t = self.trainer
        old_world, old_comm, old_shards = t.world, t.comm, t.shards
        shrunk = shrink(old_comm.mpi_comm)
        if not shrunk.lost:  # every rank is alive: the error was not a lost peer
            raise error if error is not None else RuntimeError("a step failed on another "
                                                               "rank with every rank alive")
        lost = [self.learners[r] for r in shrunk.lost]
        self.learners = [self.learners[r] for r in shrunk.survivors]
        comm = Communicator(shrunk.comm, "mpi", name="world", timeout_s=old_comm.timeout_s)
        world, node_mpi = detect_world(shrunk.comm, None)
        node_comm = Communicator(node_mpi, "mpi", name="node", timeout_s=old_comm.timeout_s)
        state = t.state
        epoch, done_steps = state.position
        if t.ledger is not None:  # with what the lost learners had used of this pass
            t.ledger.carry(comm, [old_shards.pass_order(epoch)[r::old_world.size]
                                  [:done_steps * old_shards.batch_size] for r in shrunk.lost])
        unread = np.concatenate([old_shards.unread(epoch, done_steps, r)
                                 for r in range(old_world.size)])
        survivors_samples = comm.allreduce_numbers([state.local_samples])[0]
        self.lost_samples = int(state.lockstep_samples - survivors_samples)
        for closing in (old_comm, t.ctx.node_comm):
            closing.close()
            free_quietly(closing.mpi_comm)
        t.stop.abandon()
        rebuild(t, world, comm, node_comm, (epoch, unread))
        state.position = (epoch, 0)  # the start of the partial pass
        self.log_loss(lost, state.samples, world)
        self.chart(world.size)
        if len(self.learners) < self.min_learners:
            raise UserError(f"only {len(self.learners)} learner(s) remain after losing "
                            f"{self.named(lost)} (launcher.min_learners={self.min_learners})",
                            "look for the cause in the lost learners' logs; lower "
                            "launcher.min_learners to go on with fewer, or continue with "
                            "resume=auto")

    def named(self, learners: list[int]) -> str:
        return ", ".join(f"learner {n} ({self.hosts[n]})" for n in learners)

    def log_loss(self, lost: list[int], samples: int, world: World) -> None:
        """One event per lost learner; one line on the console (the new rank 0's)."""
        # From the start of the step that failed (the kill came during it) to training again.
        recovered_s = round(time.perf_counter() - self.step_started, 3)
        for learner in lost:
            self.events.append({"event": "lost", "learner": learner,
                                "host": self.hosts[learner], "at_samples": samples,
                                "learners": world.size, "recovered_s": recovered_s})
        line = (f"adpsgd-run: {self.named(lost)} lost at {samples:,} samples: "
                f"{world.size} learner(s) go on ({recovered_s:.1f} s to recover)")
        log.warning("%s", line)
        if world.is_main:
            print(line, file=self.trainer.progress_stream or sys.stderr, flush=True)
            for event in self.events[-len(lost):]:
                record_event(self.trainer.run_dir, {
                    **event, "time": round(time.time(), 3),
                    "cause": f"lost; {world.size} learner(s) go on"})


def lost_samples(membership: Membership | None) -> int:
    """Samples the learners lost so far had trained on (0 when not elastic)."""
    return membership.lost_samples if membership is not None else 0


def elastic_step(membership: Membership | None, step: Callable[..., None], *args: Any) -> bool:
    """``step(*args)``: as a transaction in an elastic run, else as it is (always True)."""
    if membership is None:
        step(*args)
        return True
    return membership.attempt(functools.partial(step, *args))


def dealt_again(old: ShardedBatches, world: World,
                partial: tuple[int, np.ndarray] | None = None) -> ShardedBatches:
    """``old``'s data dealt to the ranks of ``world``; ``partial``: the current epoch and
    the samples nobody has trained on in it."""
    shards = ShardedBatches(old.n_items, world.rank, world.size, old.batch_size, old.seed,
                            old.shuffle)
    shards.partial = partial
    return shards


def rebuild(t: Any, world: World, comm: Communicator, node_comm: Communicator,
            partial: tuple[int, np.ndarray]) -> None:
    """Point trainer ``t`` at the survivors: communicators, data, evaluation, checkpoints,
    stop agreement, a new algorithm object (which takes over from the old one) and the
    learning-rate schedule for the new global batch."""
    from ..algos import ALGORITHMS
    from ..checkpoint.preemption import StopAgreement
    from ..runlog.progress import ProgressBar
    from ..runlog.records import read_metrics
    from ..runlog.writer import RunLog
    from .lr_schedule import LRSchedule

    became_main = world.is_main and not t.world.is_main
    t.world, t.comm = world, comm
    t.shards = dealt_again(t.shards, world, partial)
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
        algorithm.check_world(OmegaConf.merge(t.cfg, {"launcher": {"nprocs": world.size}}))
    except ConfigError as ex:  # the topology has no graph for the learners left
        raise UserError(f"the {world.size} learners left cannot go on: {ex.cause}",
                        "for elastic runs choose a topology for any number of learners "
                        "(topology=ring, random_ring, exponential_undirected or complete)"
                        ) from None
    t.algo = algorithm.build(t.cfg.algo, t.ctx)
    t.algo.setup(t.model, t.optimizer)
    t.algo.continue_after_loss(previous)
    t.paused = t.algo_finished = False  # a new object: not paused, its finish() still to come
    rate = t.schedule.lr_at(t.state.samples)
    t.schedule = LRSchedule(t.cfg.optim, world.size * t.cfg.trainer.batch_size,
                            len(t.train_set), t.cfg.trainer.epochs)
    t.schedule.start_ramp(t.state.samples, rate)
    t.progress.relabel(f"{t.cfg.algo.name} x{world.size}")
    if became_main:  # the first rank was lost: this one writes the run's records now
        t.state.history = read_metrics(t.run_dir)
        t.runlog = RunLog(t.run_dir, t.cfg, t.recipe.primary_metric,
                          purge_step=t.state.step + 1)
        if t.cfg.trainer.progress:
            t.progress = ProgressBar(t.progress_stream, t.milestones.budget, t.state.samples,
                                     f"{t.cfg.algo.name} x{world.size}",
                                     t.cfg.trainer.progress_every_s)
