"""Spares of an elastic job (``launcher.spares``): processes started with the job that wait
until a learner is lost, then take its place, so that the job grows back to
``launcher.nprocs`` learners.

The ranks from ``launcher.nprocs`` on are spares. Each builds its trainer (recipe, data,
model, optimizer) alone, then waits for word from the first learner. It takes no part in the
learners' steps, so waiting costs them nothing; it polls a receive every
``STANDBY_POLL_S``:

* a loss: the learners revoke ``everyone`` (runner/elastic/membership.py), which fails the
  spare's receive; the spare takes part in the shrink and in the learners' new split, and
  waits again;
* ``join``: after a loss, lockstep learners call the spares in at the next step they agree
  on; asynchronous learners (who agree on no step) at the loss itself, in its recovery
  (:func:`grow`);
* ``spawn``: replacements that waited for a host start now (launcher.respawn;
  runner/elastic/respawn.py): the spare takes part in the spawn, which is collective;
* ``release``: the job has ended; the spare exits as the learners do (status 0, or 75/130
  after a graceful stop).

Growing back, collective over every process alive, after a committed step:

1. the spares that died meanwhile are dropped (a shrink of ``everyone``);
2. the first spares fill the places of the lost learners, ranked after the learners;
3. the first learner sends the job's state to all (counters, milestones, the sample
   ledger's closed epochs and carried counts, membership, learning rate, and the samples of
   the current pass nobody has trained on yet); joining spare k receives the model,
   optimizer and algorithm state of learner k mod the old count, its *donor*;
4. every learner rebuilds for the new size (Trainer.regroup): the rest of the pass is dealt
   to all of them, so every sample of the epoch is still used once. Asynchronous learners
   instead each keep the rest of their own pass, the joiners share what the lost learners
   had still to train of theirs (streams.py), and a joiner's model and momentum are the
   survivors' mean (ADPSGD.start_joiners_at_the_mean).

A learner lost while spares join ends the job (one line; ``resume=auto`` continues it).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..comm import World
from ..comm.buffers import map_tensors
from ..comm.ulfm import revoke_all
from ..comm.world import mpi
from ..errors import UserError
from ..train.faults import FaultInjector
from ..train.rng import rank_seed, seed_everything
from .new_world import learner_comms, unread_pass
from .respawn import respawn, say_ready

if TYPE_CHECKING:
    from .membership import Membership
    from .respawn import Joined

log = logging.getLogger("adpsgd")

# Functions here take the job's elastic.Membership (``m``).
NOTICE_TAG = 7177  # the first learner's word to the spares; a donor's state to its joiner
JOIN, RELEASE = "join", "release"
SPAWN = "spawn"  # replacements that waited for a host start now (respawn.py)
STANDBY_POLL_S = 0.05  # how often a waiting spare looks for word


def split_spares(world_mpi: Any, launcher: Any) -> tuple[Any, World | None, Any]:
    """Collective over MPI_COMM_WORLD: the learners' MPI communicator; on a spare also its
    World (alone, ``spare=True``) and node communicator. A job without spares: the world's
    communicator, None, None."""
    if not (launcher.get("elastic") and launcher.get("spares")):
        return world_mpi, None, None
    MPI = mpi()
    rank = world_mpi.Get_rank()
    hosts = world_mpi.allgather(MPI.Get_processor_name())
    spare = rank >= launcher.nprocs
    learners = world_mpi.Split(MPI.UNDEFINED if spare else 0, rank)
    if not spare:
        return learners, None, None
    same_host = [r for r, host in enumerate(hosts) if host == hosts[rank]]  # its GPU
    world = World(rank=0, size=1, local_rank=0, local_size=1, node=0, num_nodes=1,
                  host_rank=same_host.index(rank), host_size=len(same_host), spare=True)
    return MPI.COMM_SELF.Dup(), world, MPI.COMM_SELF.Dup()


def waiting_alone(joined: Joined) -> tuple[Any, World, Any]:
    """A replacement spawned into the job (respawn.py) waits as a spare does: its own
    communicators, and a World of its own that says where on its host it runs (its GPU)."""
    MPI = mpi()
    host = joined.hosts[joined.me]
    same_host = [n for n in joined.members if joined.hosts[n] == host]
    world = World(rank=0, size=1, local_rank=0, local_size=1, node=0, num_nodes=1,
                  host_rank=same_host.index(joined.me), host_size=len(same_host), spare=True)
    return MPI.COMM_SELF.Dup(), world, MPI.COMM_SELF.Dup()


def notify(m: Membership, notice: Any) -> None:
    """The first learner's ``notice`` to every spare (one that died meanwhile is skipped)."""
    MPI = mpi()
    for spare in m.spares:
        try:
            m.everyone.isend(notice, dest=m.members.index(spare), tag=NOTICE_TAG).wait()
        except MPI.Exception:
            log.info("spare %d did not take word (%s): gone", spare, notice)


def standby(m: Membership) -> None:
    """A spare waits (see the module's docstring) until it has joined the learners or the
    job has ended (its world is still a spare's then)."""
    me = m.me
    log.info("spare %d: waiting to replace a lost learner", me)
    m.trainer.past_start_up = True
    say_ready(m)  # a replacement (respawn.py)
    while m.learners:
        notice = _word(m)
        if isinstance(notice, tuple) and notice[0] == RELEASE:
            # Ends as the learners did (a graceful stop, or completed).
            m.trainer.stop_status = notice[1]
            log.info("spare %d: released at the end of the job", me)
            return
        if notice == JOIN:
            if grow(m):
                return
            continue
        if notice == SPAWN:
            try:
                respawn(m)
                continue
            except mpi().Exception:  # a loss meanwhile: the learners recover from it
                revoke_all()
        # A loss: the learners shrink everyone and split again (elastic.Membership.recover),
        # and start replacements (respawn.py); again at another loss meanwhile.
        while True:
            gone = m.shrink_everyone()
            m.learners = [n for n in m.learners if n not in gone]
            try:
                m.split_learners()
                respawn(m)
                break
            except mpi().Exception:
                revoke_all()
    error = UserError("every learner of the elastic job is gone, and a spare cannot go on "
                      "without one to take the model from", "look for the cause in the "
                      "learners' logs (logs/rank*.log), then continue with resume=auto")
    error.quiet = me != m.members[0]  # the first spare left says it
    raise error


def _word(m: Membership) -> Any:
    """The first learner's next word; None when ``everyone`` was revoked (a loss)."""
    MPI = mpi()
    try:
        request = m.everyone.irecv(source=m.members.index(m.learners[0]), tag=NOTICE_TAG)
        while True:
            done, notice = request.test()
            if done:
                return notice
            time.sleep(STANDBY_POLL_S)
    except MPI.Exception:  # revoked by the learners, or the first learner died
        return None


def grow(m: Membership) -> bool:
    """Collective over every process alive: spares replace the lost learners (see the
    module's docstring). True on every process that is a learner afterwards."""
    t = m.trainer
    started = m.respawned_at or time.perf_counter()  # a replacement's: from its spawn
    m.respawned_at = None
    me = m.me
    joining = me not in m.learners
    if me == m.learners[0]:
        notify(m, JOIN)
    gone = m.shrink_everyone()  # spares that died while they waited
    if lost := [n for n in gone if n in m.learners]:
        raise UserError(f"{m.named(lost)} lost while spares joined the job",
                        "continue with resume=auto")
    before = list(m.learners)
    joiners = m.spares[:m.target - len(before)]
    # Asynchronous learners: at the loss that called the spares (elastic.deal_async), with
    # what the lost learners had still to train to deal, to the joiners if any are left.
    pending, m.pending_deal = m.pending_deal, None
    if not joiners and pending is None:  # every spare died while it waited
        return not joining
    if m.nodes is not None:  # super learners: a joiner takes a lost learner's node
        first = m.members.index(before[0])
        m.nodes = m.everyone.bcast(m.nodes_after_join(before, joiners) if me == before[0]
                                   else None, root=first)
    m.learners = before + joiners
    m.unready -= set(joiners)
    learner_mpi = m.split_learners()
    if me not in m.learners:
        return False
    world, comm, node_comm = learner_comms(
        learner_mpi, t.cfg.comm.timeout_s, t.comm.traffic,
        None if m.nodes is None else [m.nodes[n] for n in m.learners])
    own = None
    if not joining and pending is not None:
        survivors, lost_counts = pending
        m.streams.deal(survivors, lost_counts, joiners)
    job = learner_mpi.bcast(job_state(m) if world.is_main else None, root=0)
    donor = (world.rank - len(before)) % len(before)
    if joining:
        donated = learner_mpi.recv(source=donor, tag=NOTICE_TAG)
        take_job_state(m, job, donated, me)
        algo_state = donated["algo"]
    else:
        algo_state = t.algo.state_dict()  # the reduction in flight completes (dasgd)
        for k in range(world.rank, len(joiners), len(before)):
            learner_mpi.send(on_cpu({"model": t.model.state_dict(), "algo": algo_state,
                                     "optimizer": t.optimizer.state_dict()}),
                             dest=len(before) + k, tag=NOTICE_TAG)
    if job["streams"] is not None:
        # Each learner goes on in its own stream; the algorithm continues from the
        # survivor's own state (a joiner's: its donor's, loaded into its waiting one).
        m.streams.streams = job["streams"]
        mine = m.streams.streams[me]
        own = (mine.epoch, mine.current)
        if joining:
            t.algo.load_state_dict(algo_state)
        if joiners:
            # Each participant that survived counts once (a super learner: its first rank).
            counted = not joining and (m.nodes is None or me == min(
                n for n in before if m.nodes[n] == m.nodes[me]))
            t.algo.start_joiners_at_the_mean(comm, joining, counted)
        algo_state = None
    if pending is None:  # a loss has abandoned it already
        t.stop.close()
    if t.ledger is not None:  # every count so far, carried by all: a learner lost later
        t.ledger.carry(comm, [])  # takes only its part of the rest of the pass with it
    t.regroup(world, comm, node_comm, job["partial"], algo_state, job["lr"], own=own)
    if pending is not None:  # the loss's point, after the first learner's run log is made
        m.chart(len(before))
    if joiners:
        m.announce("joined", joiners, world, time.perf_counter() - started)
    return True


def on_cpu(state: Any) -> Any:
    """``state`` with its tensors copied to host memory: what a joiner receives is loaded
    into its own device's tensors."""
    return map_tensors(state, lambda tensor: tensor.detach().cpu())


def job_state(m: Membership) -> dict[str, Any]:
    """What a joining spare needs of the job, as the first learner has it."""
    t = m.trainer
    epoch, done_steps = t.state.position
    ledger = t.ledger
    partial = None
    if m.streams is None:  # lockstep: the rest of the pass, dealt again to all
        partial = (epoch, m.dealing_order(epoch, unread_pass(t.shards, epoch, done_steps)))
    return {"state": {**t.state.state_dict(),
                      "elapsed_s": time.perf_counter() - t.start_time},
            "milestones": t.milestones, "lr": t.schedule.lr_at(t.state.samples),
            "ledger": None if ledger is None else {"closed": ledger.closed,
                                                   "carried": ledger.carried},
            "events": m.events, "lost_samples": m.lost_samples, "in_flight": m.in_flight,
            "partial": partial, "streams": None if m.streams is None else m.streams.streams}


def take_job_state(m: Membership, job: dict[str, Any], donated: dict[str, Any],
                   me: int) -> None:
    """A joining spare takes the job's counters and its donor's model and optimizer."""
    t = m.trainer
    state = t.state
    state.load_state_dict(job["state"])
    state.local_samples, state.loss_sum, state.loss_steps = 0, 0.0, 0  # its own from here
    t.milestones, t.stop_status = job["milestones"], None  # in the launched job's samples
    if t.ledger is not None and job["ledger"] is not None:
        t.ledger.closed = list(job["ledger"]["closed"])
        t.ledger.carried = job["ledger"]["carried"]
        t.ledger.counts = np.zeros_like(t.ledger.counts)
    m.events, m.lost_samples = list(job["events"]), job["lost_samples"]
    m.in_flight = dict(job["in_flight"])
    t.model.load_state_dict(donated["model"])
    t.optimizer.load_state_dict(donated["optimizer"])
    t.start_time = time.perf_counter() - state.elapsed_before
    t.throughput.restart(time.perf_counter(), state.samples)
    # Its own faults and random streams, by the number it was launched with.
    t.faults = FaultInjector(t.cfg.faults, me, t.cfg.seed)
    seed_everything(rank_seed(t.cfg.seed, me, state.samples))
