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

Asynchronous learners (AD-PSGD) never agree per step, which would make them wait for each
other: a lost peer shows up as an MPI error in the gossip (or a milestone's collective), the
learner that sees it revokes its communicators so that every other one sees an error within a
step, and the survivors go on without undoing anything but the averaging in flight
(:meth:`Membership.attempt_async`); what the lost learner had still to train of its pass is
dealt to them (runner/elastic/streams.py).

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

from ..comm import Communicator, World
from ..comm.hostfile import read_hostfile
from ..comm.ulfm import agree, is_mpi_error, retire_comm, revoke_all, shrink, track
from ..comm.world import mpi
from ..errors import TooFewLearners, UserError
from ..runlog.failure_events import record_event
from ..runlog.liveness import the_launcher_hears_us
from ..train.data import ShardedBatches
from .launcher_link import cut_off
from .new_world import learner_comms, unread_pass
from .respawn import joined, replacements_ready, respawn, short_name, spawn_due
from .streams import Streams, stream_of
from .trainer_view import ElasticTrainer

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
    so that it outlives any of them. Counts are also added up at checkpoints; the first
    ``summed_steps`` steps of the current pass are in ``carried`` then, and only the lost
    learners' later steps are added at a loss."""

    def __init__(self, train_size: int):
        self.counts = np.zeros(train_size, dtype=np.int64)
        self.carried: np.ndarray | None = None  # the epoch's counts added up so far
        self.summed_steps = 0  # steps of the current pass in ``carried``
        self.closed: list[dict[str, int]] = []
        self._mark: tuple | None = None

    def mark(self) -> None:
        """Remember the ledger as it is: :meth:`rollback` returns here."""
        self._mark = (self.counts, self.carried, self.summed_steps, len(self.closed), [])

    def add(self, indices: np.ndarray) -> None:
        np.add.at(self.counts, indices, 1)
        if self._mark is not None:
            self._mark[-1].append(indices)

    def record(self, indices: np.ndarray, epoch: int, last: bool, comm: Communicator) -> None:
        """The samples of a step of ``epoch``; ``last``: the epoch's last step, where the
        ranks add their counts up (collective)."""
        self.add(indices)
        if last:
            total = self._total(comm)
            self.closed.append({"epoch": epoch + 1, "distinct": int(np.count_nonzero(total)),
                                "used": int(total.sum())})
            self.counts, self.carried = np.zeros_like(self.counts), None  # new arrays: mark()
            self.summed_steps = 0

    def lost_part(self, shards: ShardedBatches, epoch: int, done_steps: int, rank: int
                  ) -> np.ndarray:
        """What the learner of ``rank`` in ``shards`` used of ``epoch``'s pass in its first
        ``done_steps`` steps and the ledger has not added up yet."""
        mine = shards.pass_order(epoch)[rank::shards.size]
        return mine[self.summed_steps * shards.batch_size:done_steps * shards.batch_size]

    def carry(self, comm: Communicator, lost_parts: list[np.ndarray]) -> None:
        """Collective over the learners after a change of membership: carry every count of
        the epoch so far, the lost learners' ``lost_parts`` included; the rest of the pass
        is dealt again, from its step 0."""
        total = self._total(comm)
        for part in lost_parts:
            np.add.at(total, part, 1)
        self.counts, self.carried, self.summed_steps = np.zeros_like(self.counts), total, 0

    def state_dict(self, comm: Communicator, done_steps: int) -> dict[str, Any]:
        """Collective, at a checkpoint after ``done_steps`` steps of the current pass: the
        closed epochs and the current one's counts over every rank, which every rank
        carries from here on (a resumed job, of any size, continues the count)."""
        self.counts, self.carried = np.zeros_like(self.counts), self._total(comm)
        self.summed_steps = done_steps
        return {"closed": list(self.closed), "carried": torch.from_numpy(self.carried.copy()),
                "summed_steps": done_steps}

    def load_state_dict(self, state: dict[str, Any], resized: bool = False) -> None:
        """``resized``: the job resumed with another number of ranks, which deals the rest
        of the pass again."""
        self.closed = list(state["closed"])
        self.carried = state["carried"].numpy().astype(np.int64)
        self.counts = np.zeros_like(self.carried)
        self.summed_steps = 0 if resized else state.get("summed_steps", 0)

    def _total(self, comm: Communicator) -> np.ndarray:
        total = comm.allreduce_numbers(self.counts).astype(np.int64)
        return total + self.carried if self.carried is not None else total

    def rollback(self) -> None:
        counts, carried, self.summed_steps, closed, added = self._mark
        for indices in added:
            np.subtract.at(counts, indices, 1)
        self.counts, self.carried = counts, carried
        del self.closed[closed:]
        self._mark = None


class Membership:
    """The learners alive, the spares waiting (launcher.spares; runner/elastic/spares.py), and
    the step transaction that survives losing learners.

    ``everyone`` is a communicator of every process of the job still alive, learners and
    spares: a loss shrinks it, and the learners' communicator is split from it. Processes
    keep the number they were launched with (``members``: of each rank of ``everyone``;
    ``learners``: of each rank of the learners' communicator, in rank order)."""

    def __init__(self, trainer: ElasticTrainer, min_learners: int):
        self.trainer = trainer
        self.min_learners = min_learners
        self.target = trainer.cfg.launcher.nprocs  # learners the job was launched with
        MPI = mpi()
        if (respawned := joined()) is not None:  # a replacement spawned into the job
            self.everyone, self.me = respawned.everyone, respawned.me
            self.members, self.learners = respawned.members, respawned.learners
            self.hosts = respawned.hosts
        else:
            self.everyone = track(MPI.COMM_WORLD.Dup())
            self.me = MPI.COMM_WORLD.Get_rank()
            self.members = list(range(self.everyone.Get_size()))
            self.learners = list(range(self.target))
            self.hosts = self.everyone.allgather(MPI.Get_processor_name())
        # launcher.respawn (respawn.py): when the replacements joining were spawned; whether
        # a spawn failed (it is not tried again).
        self.respawned_at: float | None = None
        self.respawn_failed = False
        # Replacements spawned that are still starting (respawn.py), and those the first
        # learner has heard are ready (the others learn it at the next step's agreement).
        self.unready: set[int] = set(respawned.unready) if respawned is not None else set()
        self.ready_heard: set[int] = set()
        # The hosts of lost learners no replacement has taken yet (a replacement goes back
        # there first, where it can: respawn.spawn_unsafe_hosts reads the launches);
        # replacements that no host could take yet (respawn.placement), and whether the
        # learners agreed to start them before their next step.
        self.lost_hosts: list[str] = list(respawned.lost_hosts) if respawned is not None else []
        self.launches = respawned.launches if respawned is not None else [list(self.members)]
        self.waiting_replacements = 0
        self.spawn_next = False
        self._capacity: dict[str, int] | None | bool = False  # not read yet
        # Learner -> its node as launched, for an algorithm whose nodes survive a loss
        # (hadpsgd's super learners; it takes no spares).
        self.nodes = (dict(zip(self.learners, trainer.comm.allgather_objects(trainer.world.node)))
                      if trainer.algo.keeps_nodes else None)
        self.events: list[dict[str, Any]] = []
        self.lost_samples = 0  # what the lost learners had trained on (summary's samples)
        # Asynchronous learners: where each is in its stream of samples (streams.py), told
        # by each (a resumed run's passes are whatever its checkpoint dealt).
        self.streams = None
        if trainer.algo.asynchronous:
            state = trainer.state
            mine = stream_of(trainer.shards, state.position, state.local_samples)
            self.streams = Streams(trainer.shards, dict(zip(
                self.learners, trainer.comm.allgather_objects(mine))))
        # Lost learner -> (its pass, the samples it was about to train) when it was lost
        # (the same on every learner; a joining spare receives them): see same_failure().
        self.in_flight: dict[int, tuple[int, list[int]]] = {}
        # Asynchronous learners that spares join at a loss: (survivors -> samples trained,
        # lost learners -> samples as last heard), for grow() to deal.
        self.pending_deal: tuple[dict[int, int], dict[int, int]] | None = None
        self.snapshot = StepSnapshot(trainer.model, trainer.optimizer)
        if not trainer.world.spare:
            self.chart(self.target)

    def chart(self, learners: int) -> None:
        """TensorBoard's ``membership/learners``: the learners alive against global samples."""
        t = self.trainer
        if t.runlog is not None:
            t.runlog.scalars({"membership/learners": learners}, t.state.samples)

    @classmethod
    def of(cls, trainer: ElasticTrainer) -> Membership | None:
        """The membership of an elastic run (collective over every process), None for the
        others. A spare waits in here until it replaces a lost learner or the job ends
        (:attr:`waiting` stays True then)."""
        launcher = trainer.cfg.launcher
        if not launcher.get("elastic"):
            return None
        membership = cls(trainer, launcher.min_learners)
        if trainer.world.spare:
            from .spares import standby

            standby(membership)
        return membership

    @property
    def waiting(self) -> bool:
        """Whether this process is a spare that was never needed (the job has ended)."""
        return self.trainer.world.spare

    @property
    def spares(self) -> list[int]:
        return [n for n in self.members if n not in self.learners]

    def attempt(self, step: Callable[[], None]) -> bool:
        """Run one step (and the milestones it reaches) as a transaction: True when it
        succeeded on every rank; False when a learner was lost, after undoing the step and
        rebuilding the job for the survivors."""
        t = self.trainer
        if t.algo.asynchronous:
            return self.attempt_async(step)
        state = t.state
        self.step_started = time.perf_counter()
        self.snapshot.take({"state": dataclasses.replace(state), "passed": t.milestones.position,
                            "stop_status": t.stop_status,
                            "algo": t.algo.before_undoable_step(state.step + 1)})
        if t.ledger is not None:
            t.ledger.mark()
        error = None
        try:
            if self.spawn_next:  # replacements that waited for a host (respawn.py)
                self.spawn_next = False
                self.spawn_waiting()
            step()
        except Exception as ex:  # noqa: BLE001 - an MPI error is a lost peer until shown otherwise
            if not is_mpi_error(ex):
                raise
            error = ex
            revoke_all()
        # The first learner says whether the replacements spawned last (respawn.py) are
        # ready (until they are, the learners train on without them), and whether those
        # that waited for a host can start (they do before the next step).
        first = self.me == self.learners[0]
        ready = not self.unready or not first or replacements_ready(self)
        agreed = agree(t.comm.mpi_comm, error is None,
                       flags=int(ready) | int(not first or spawn_due(self)) << 1,
                       timeout_s=t.comm.timeout_s, who=f"learner {self.me}")
        if agreed:
            self.spawn_next = bool(agreed & 4)
            if agreed & 2:
                self.unready.clear()
                self.ready_heard.clear()
            if not self.spares_wanted():
                return True
            from .spares import grow  # after a committed step: the job grows back

            grow(self)
            return False
        extra = self.snapshot.restore()
        t.algo.undo_step(extra["algo"])  # before the survivors' object takes over from it
        for field in dataclasses.fields(state):  # in place: others hold the state object
            setattr(state, field.name, getattr(extra["state"], field.name))
        t.milestones.position, t.stop_status = extra["passed"], extra["stop_status"]
        if t.ledger is not None:
            t.ledger.rollback()
        if error is None:  # another rank failed: ours completed, on communicators now revoked
            revoke_all()
        self.recover(error)
        self.drop_undone_evaluations()
        return False

    def drop_undone_evaluations(self, rows_kept: int | None = None) -> None:
        """The records of an evaluation that ran in the step just undone (metrics.jsonl rows,
        TensorBoard events past the step gone back to): the survivors evaluate at that step
        again, and a run has one row per evaluation. An asynchronous learner keeps its step
        but meets the milestones of the failed attempt again: the rows after its first
        ``rows_kept`` go (its TensorBoard events stay: the step is not gone back to)."""
        t = self.trainer
        if t.runlog is None:  # only the first learner writes them
            return
        history = t.state.history
        kept = (history[:rows_kept] if rows_kept is not None else
                [row for row in history if row["step"] <= t.state.step])
        if len(kept) < len(history):
            t.state.history = kept
            t.runlog.rewrite_metrics(kept)
            if rows_kept is None:
                t.runlog.restart_at(t.state.step, t.state.samples)

    def attempt_async(self, step: Callable[[], None]) -> bool:
        """One step of an asynchronous learner: nobody agrees per step (the learners never
        wait for each other). A lost peer shows up as an MPI error: in the gossip running
        beside training, raised before the step starts (check_peers), or in the collective
        of a milestone; the rank revokes its communicators, so every other learner sees one
        too within a step. The step's own update is local and stays; only the exchange in
        flight and a milestone under way are dropped (the milestone is met again after)."""
        t = self.trainer
        self.step_started = time.perf_counter()
        passed, stop_status = t.milestones.position, t.stop_status
        rows = len(t.state.history)
        try:
            t.algo.check_peers()
            step()
            return True
        except Exception as ex:  # noqa: BLE001 - an MPI error is a lost peer until shown otherwise
            if not is_mpi_error(ex):
                raise
            error = ex
            revoke_all()
        t.milestones.position, t.stop_status = passed, stop_status
        self.recover(error)
        self.drop_undone_evaluations(rows_kept=rows)
        return False

    def spawn_waiting(self) -> None:
        """Collective over every process alive, the spares called from their standby: start
        the replacements that waited for a host (respawn.py)."""
        if self.me == self.learners[0]:
            from .spares import SPAWN, notify

            notify(self, SPAWN)
        respawn(self)

    def host_capacity(self) -> dict[str, int] | None:
        """Processes each host of launcher.hostfile takes (launcher.procs_per_node, else its
        slots), by short name; None without a hostfile; empty when it cannot be read now."""
        if self._capacity is False:
            launcher = self.trainer.cfg.launcher
            self._capacity = None
            if launcher.get("hostfile"):
                try:
                    self._capacity = {short_name(h.name): launcher.procs_per_node or h.slots
                                      for h in read_hostfile(launcher.hostfile)}
                except UserError as ex:  # changed since the start: no host is known to work
                    self._capacity = {}
                    log.warning("no replacement can be placed: %s", ex)
        return self._capacity

    def spares_wanted(self, unready_too: bool = False) -> bool:
        """Whether spares join now (the same answer on every learner): fewer learners than
        launched, a spare left as far as known (``unready_too``: or a replacement spawned
        that is still starting), and training going on."""
        t = self.trainer
        spares = [n for n in self.spares if unready_too or n not in self.unready]
        return (len(self.learners) < self.target and bool(spares)
                and not (t.milestones.done or t.stop_status or t.algo_finished))

    def too_few_learners(self) -> bool:
        """Whether fewer learners than launcher.min_learners are left, counting the spares
        that would take lost learners' places (none once training is over)."""
        joining = (min(len(self.spares), self.target - len(self.learners))
                   if self.spares_wanted(unready_too=True) else 0)
        return len(self.learners) + joining < self.min_learners

    def shrink_everyone(self) -> list[int]:
        """Collective over every process alive: drop the dead ones from ``everyone`` (and
        from ``learners``); returns their numbers."""
        shrunk = shrink(self.everyone, self.trainer.comm.timeout_s, f"process {self.me}")
        gone = [self.members[r] for r in shrunk.lost]
        self.lost_hosts += [self.hosts[n] for n in gone if n in self.learners]
        retire_comm(self.everyone)
        self.everyone = shrunk.comm
        self.members = [self.members[r] for r in shrunk.survivors]
        if spares := [n for n in gone if n not in self.learners]:
            line = (f"adpsgd-run: spare(s) {', '.join(f'{n} ({self.hosts[n]})' for n in spares)}"
                    f" lost while waiting: {len(self.spares)} spare(s) left")
            samples = self.trainer.state.samples
            for spare in spares:  # the membership history holds every process the job lost
                self.events.append({"event": "spare lost", "learner": spare,
                                    "host": self.hosts[spare], "at_samples": samples,
                                    "learners": len(self.learners)})
            self.say(line, self.trainer.world.is_main)
            if self.trainer.world.is_main:
                self.record_latest(len(spares),
                                   f"lost while waiting; {len(self.spares)} spare(s) left")
        return gone

    def split_learners(self) -> Any:
        """Collective over ``everyone``: the learners' MPI communicator, ranked in the order
        of ``learners`` (COMM_NULL on a spare)."""
        MPI = mpi()
        if self.me not in self.learners:
            return self.everyone.Split(MPI.UNDEFINED, 0)
        return self.everyone.Split(0, self.learners.index(self.me))

    def recover(self, error: BaseException | None) -> None:
        t = self.trainer
        log.info("recovering from %s", f"{type(error).__name__}: {error}" if error is not None
                 else "a step that failed on another rank")
        old_comm, old_shards, before = t.comm, t.shards, list(self.learners)
        if not the_launcher_hears_us():  # this side of a cut link: the others go on
            cut_off(t.run_dir, self.me, "MPI reported peers lost, and the launcher did not "
                    "answer: this learner is behind a cut link")
        gone = self.shrink_everyone()
        if not any(n in gone for n in before):  # every learner is alive: not a lost learner
            raise error if error is not None else RuntimeError("a step failed on another "
                                                               "rank with every rank alive")
        # What the survivors last heard each lost asynchronous learner had trained (asked of
        # the old algorithm object, before it goes).
        heard = t.algo.heard_samples() if self.streams is not None else None
        t.faults.crash_in_recovery()
        while True:
            self.learners = [n for n in before if n not in gone]
            try:
                world, comm, node_comm = learner_comms(
                    self.split_learners(), old_comm.timeout_s, old_comm.traffic,
                    None if self.nodes is None else [self.nodes[n] for n in self.learners])
                respawn(self)  # with the spares, which wait in spares.standby
                break
            except Exception as ex:  # noqa: BLE001 - another loss during the recovery
                if not is_mpi_error(ex):
                    raise
                log.warning("another process was lost during the recovery: shrinking again")
                revoke_all()
                gone += self.shrink_everyone()
        lost_ranks = [r for r, n in enumerate(before) if n in gone]
        lost = [before[r] for r in lost_ranks]
        t.stop.abandon()
        if self.streams is None:
            repeated = self.deal_lockstep(old_shards, lost_ranks, lost, world, comm, node_comm)
        else:
            # The survivors know what a lost learner had trained when they last heard from
            # it, not what it was training when it died: no repeated-failure rule here.
            repeated = None
            self.deal_async(heard, lost_ranks, lost, world, comm, node_comm)
        # (With spares joining, the chart's point comes after grow()'s rebuild: the first
        # learner's run log may be the new one made there.)
        self.announce("lost", lost, world, time.perf_counter() - self.step_started,
                      chart=self.pending_deal is None)
        if repeated is not None:
            earlier, learner, samples = repeated
            log.error("training samples both were about to train: %s", samples)
            shown = ", ".join(map(str, samples[:5])) + (", ..." if len(samples) > 5 else "")
            raise self.agreed(UserError(
                f"the same failure repeated: {self.named([learner])} was lost about to train "
                f"{len(samples)} training sample(s) that {self.named([earlier])} was also "
                f"about to train when it was lost (indices {shown}); the job ends rather than "
                "lose every learner to them",
                f"look at those samples (all of them in logs/rank*.log) and in "
                f"logs/rank{earlier}.log and logs/rank{learner}.log (memory, a corrupt file, a "
                "crash in native code); fix or leave them out, then continue with resume=auto"))
        if self.too_few_learners():
            # The survivors hold the whole run (the lost learners' part dealt to them): their
            # checkpoint is where a restart (launcher.max_restarts, or resume=auto) goes on
            # with every learner, nothing trained lost.
            t.save_checkpoint("too few learners")
            raise self.agreed(TooFewLearners(
                f"only {len(self.learners)} learner(s) remain after losing {self.named(lost)} "
                f"(launcher.min_learners={self.min_learners}); they checkpointed at step "
                f"{t.state.step}", "look for the cause in the lost learners' logs; continue "
                "with resume=auto (launcher.max_restarts does it), or lower "
                "launcher.min_learners to go on with fewer"))
        if self.pending_deal is not None:
            from .spares import grow

            grow(self)

    def agreed(self, error: UserError) -> UserError:
        """An error every survivor raises alike: the first learner says it and ends the job
        (the others wait quietly), after it has recorded the loss (announce)."""
        error.quiet = not self.trainer.world.is_main
        return error

    def deal_lockstep(self, old_shards: ShardedBatches, lost_ranks: list[int], lost: list[int],
                      world: World, comm: Communicator, node_comm: Communicator
                      ) -> tuple[int, int, list[int]] | None:
        """Lockstep learners, all at the same step of the pass (the step in flight undone):
        the rest of the pass, the lost learners' part too, dealt again to the survivors.
        Returns a repeated failure (same_failure), if this loss is one."""
        t = self.trainer
        epoch, done_steps = t.state.position
        repeated = self.same_failure({n: (epoch, old_shards.epoch_batches(epoch, r)[done_steps])
                                      for r, n in zip(lost_ranks, lost)})
        if t.ledger is not None:  # with what the lost learners had used of this pass
            t.ledger.carry(comm, [t.ledger.lost_part(old_shards, epoch, done_steps, r)
                                  for r in lost_ranks])
        survivors_samples = comm.allreduce_numbers([t.state.local_samples])[0]
        self.lost_samples = int(t.state.lockstep_samples - survivors_samples)
        unread = unread_pass(old_shards, epoch, done_steps)
        t.regroup(world, comm, node_comm, (epoch, self.dealing_order(epoch, unread)))
        return repeated

    def deal_async(self, heard: list[float], lost_ranks: list[int], lost: list[int],
                   world: World, comm: Communicator, node_comm: Communicator) -> None:
        """Asynchronous learners, each at its own place of its own pass: what the lost ones
        had still to train of theirs (from the largest count any survivor had heard) is
        shared among the survivors after the rest of their own passes (streams.py)."""
        t, state = self.trainer, self.trainer.state
        known = comm.allreduce_numbers(heard, op="max").astype(np.int64)
        lost_counts = {n: int(known[r]) for r, n in zip(lost_ranks, lost)}
        trained = comm.allgather_objects(state.local_samples)
        self.lost_samples += sum(lost_counts.values())
        # The exact global count, the same on every survivor (each had its estimate).
        state.samples = sum(trained) + self.lost_samples
        # Where in the milestones the survivors go on: the first learner's (which writes the
        # records). Each met them at its own time, and a revoke can fail a collective on one
        # rank that completed on another, so they may disagree by one.
        t.milestones.position, t.stop_status, joining = comm.bcast_object(
            (t.milestones.position, t.stop_status, self.spares_wanted(unready_too=True)),
            root=0)
        survivors = dict(zip(self.learners, trained))
        if joining:
            # Spares take the lost learners' places here, where every learner has stopped
            # (asynchronous learners meet nowhere else): grow() deals and rebuilds for all.
            self.pending_deal = (survivors, lost_counts)
            for unused in (comm, node_comm):
                unused.close()
                retire_comm(unused.mpi_comm)
            return
        mine = self.streams.deal(survivors, lost_counts)[self.learners[world.rank]]
        t.regroup(world, comm, node_comm, None, own=(mine.epoch, mine.current))

    def same_failure(self, in_flight: dict[int, tuple[int, np.ndarray]]
                     ) -> tuple[int, int, list[int]] | None:
        """Record what each learner just lost was about to train (``in_flight``: learner ->
        (its pass, its next batch)); returns (an earlier lost learner, a learner lost now,
        the samples both were about to train) when a loss repeats an earlier one of the same
        pass: a sample that kills whichever learner it is dealt to (a crash in native code,
        an out-of-memory kill), which would otherwise take every learner one by one. The
        rest of a pass is dealt again after a loss with those samples last
        (:meth:`dealing_order`), and each sample of it is trained once, so a loss unrelated
        to them is taken for a repeat only if it comes in the very step, near the pass's
        end, that trains one of them again."""
        found = None
        for learner, (epoch, samples) in in_flight.items():
            for earlier, (pass_, before) in self.in_flight.items():
                shared = np.intersect1d(samples, before) if pass_ == epoch else []
                if len(shared) and found is None:
                    found = (earlier, learner, shared.tolist())
        self.in_flight.update({n: (epoch, samples.tolist())
                               for n, (epoch, samples) in in_flight.items()})
        return found

    def dealing_order(self, epoch: int, unread: np.ndarray) -> np.ndarray:
        """The rest of pass ``epoch`` in the order it is dealt again: the samples that lost
        learners were about to train go last, so that a sample that kills whoever trains it
        does so at the end of the pass, and a learner lost soon after a loss or a join (for
        another reason) is not taken for a repeat (same_failure)."""
        flagged = [samples for pass_, samples in self.in_flight.values() if pass_ == epoch]
        if not flagged:
            return unread
        last = np.isin(unread, np.concatenate(flagged))
        return np.concatenate([unread[~last], unread[last]])

    def nodes_after_join(self, learners: list[int], joiners: list[int]) -> dict[int, int]:
        """Each learner's node once ``joiners`` join ``learners``: the k-th joiner takes the
        node of the k-th lost learner not yet replaced (by launch number); the nodes of lost
        learners that nobody replaces stay known, for later joiners."""
        lost = sorted(n for n in self.nodes if n not in learners)
        nodes = {n: node for n, node in self.nodes.items() if n not in lost[:len(joiners)]}
        nodes.update({joiner: self.nodes[n] for joiner, n in zip(joiners, lost)})
        return nodes

    def named(self, learners: list[int]) -> str:
        return ", ".join(f"learner {n} ({self.hosts[n]})" for n in learners)

    def announce(self, event: str, learners: list[int], world: World, seconds: float,
                 chart: bool = True) -> None:
        """One ``event`` (lost or joined) per learner in summary.json's membership and
        logs/events.jsonl; one line on the console (rank 0's): a loss from the start of the
        step that failed (the kill came during it) to training again, a join from the
        spares' call to training again."""
        if not learners:
            return
        samples = self.trainer.state.samples
        timing = "recovered_s" if event == "lost" else "joined_s"
        for learner in learners:
            self.events.append({"event": event, "learner": learner,
                                "host": self.hosts[learner], "at_samples": samples,
                                "learners": world.size, timing: round(seconds, 3)})
        going = "go on" if event == "lost" else "train"
        if event == "lost" and self.too_few_learners():  # recover() ends the job right after
            going = f"remain, fewer than launcher.min_learners={self.min_learners}"
        line = (f"adpsgd-run: {self.named(learners)} {event} at {samples:,} samples: "
                f"{world.size} learner(s) {going} ({seconds:.1f} s to "
                f"{'recover' if event == 'lost' else 'join'})")
        self.say(line, world.is_main)
        if world.is_main:
            self.record_latest(len(learners), f"{event}; {world.size} learner(s) {going}")
        if chart:
            self.chart(world.size)

    def say(self, line: str, main: bool) -> None:
        """A membership change's line: in every process's log, and on the console once
        (``main``: on the first learner)."""
        log.warning("%s", line)
        if main:
            print(line, file=self.trainer.progress_stream or sys.stderr, flush=True)

    def record_latest(self, count: int, cause: str) -> None:
        """The last ``count`` membership events in logs/events.jsonl, with ``cause`` (the
        first learner writes them)."""
        for record in self.events[-count:]:
            record_event(self.trainer.run_dir,
                         {**record, "time": round(time.time(), 3), "cause": cause})

    def close(self) -> None:
        """At the end of a learner's run: the first learner releases the spares still
        waiting (runner/elastic/spares.py)."""
        if self.trainer.world.is_main and self.spares:
            from .spares import RELEASE, notify

            notify(self, (RELEASE, self.trainer.stop_status))


def lost_samples(membership: Membership | None) -> int:
    """Samples the learners lost so far had trained on (0 when not elastic)."""
    return membership.lost_samples if membership is not None else 0


def elastic_step(membership: Membership | None, step: Callable[..., None], *args: Any) -> bool:
    """``step(*args)``: as a transaction in an elastic run, else as it is (always True)."""
    if membership is None:
        step(*args)
        return True
    return membership.attempt(functools.partial(step, *args))
