"""Replacements spawned into the running job (``launcher.respawn``): after a loss, the
learners start new processes that stand by as spares and join, so that a long run is back
to ``launcher.nprocs`` learners instead of shrinking for good with every failure.

At a loss, once the survivors have shrunk ``everyone`` and split the learners again
(membership.py's ``recover``; a waiting spare in spares.py's ``standby``), every process
alive calls :func:`respawn`, collectively over ``everyone``:

1. the first learner says how many to start: the learners lost that no waiting spare
   replaces, none once training is over;
2. ``MPI_Comm_spawn`` starts them (``python -m runner.worker RUN_DIR --respawned``), under
   Open MPI's runtime on the hosts of the job; they merge with ``everyone``
   (``MPI_Intercomm_merge``, ranked after it) and are told the job's membership and the
   numbers they take, the next after every process the job has had, so that their logs,
   heartbeats and exit records never mix with a lost learner's;
3. each builds its trainer as a spare does, and waits (spares.py); the learners call it in
   as any spare: lockstep learners at their next committed step, asynchronous ones in this
   recovery. Its ``joined`` event counts from the spawn.

A spawn that fails (no runtime to start it, a host refusing it) is one line, and the job
goes on with the learners it has; it is not tried again. A replacement that dies while it
starts is a spare lost while waiting (spares.py).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..comm import ulfm
from ..comm.ulfm import free_quietly, track
from ..comm.world import mpi
from ..runlog.failure_events import record_event

if TYPE_CHECKING:
    from .membership import Membership

log = logging.getLogger("adpsgd")

RESPAWNED = "--respawned"  # runner.worker's flag for a process started here
READY_TAG = 7178  # a replacement's word to the first learner: its trainer is built


@dataclass
class Joined:
    """What a respawned process learns as it merges with the job."""

    everyone: Any  # the merged communicator of every process alive
    me: int  # the number it takes in the job
    members: list[int]  # the number of each rank of ``everyone``
    learners: list[int]
    hosts: list[str]  # of every number the job has had
    unready: list[int]  # the replacements still starting, this one among them


_JOINED: Joined | None = None  # this process's, when it was respawned (a process has one)


def joined() -> Joined | None:
    """How this process joined the job, if it was respawned (None for a launched one)."""
    return _JOINED


def join_the_job() -> Joined:
    """In a respawned process, right after MPI starts: merge with the job that spawned it
    (collective with :func:`respawn`), learn its number and the membership."""
    global _JOINED
    MPI = mpi()
    parent = MPI.Comm.Get_parent()
    everyone = parent.Merge(high=True)
    free_quietly(parent)
    sketch = everyone.bcast(None, root=0)
    me = sketch["numbers"][everyone.Get_rank() - len(sketch["members"])]
    hosts, names = _exchange_names(everyone, new=True)
    _JOINED = Joined(track(everyone), me, sketch["members"] + sketch["numbers"],
                     list(sketch["learners"]), sketch["hosts"] + hosts, sketch["unready"])
    ulfm.learn_process_names(dict(zip(_JOINED.members, names)))
    # MPI_Finalize waits for every process connected to this one: the job it joined has
    # lost one (which is why it was started), and would wait forever.
    ulfm.PROCESS.lost_peers = True
    return _JOINED


def _exchange_names(everyone: Any, new: bool) -> tuple[list[str], list[int | None]]:
    """Collective over the merged ``everyone`` (``new``: on a process just spawned): the
    hosts of the new processes, and every process's MPI name (to declare it failed)."""
    gathered = everyone.allgather((mpi().Get_processor_name(), ulfm.process_name(), new))
    return ([host for host, _, spawned in gathered if spawned],
            [name for _, name, _ in gathered])


def respawn(m: Membership) -> None:
    """Collective over ``everyone`` at a loss (see the module's docstring): start a
    replacement for each lost learner no spare replaces; they join ``everyone`` as spares."""
    t = m.trainer
    if not t.cfg.launcher.get("respawn") or m.respawn_failed:
        return
    first = m.members.index(m.learners[0])
    count = 0
    if m.me == m.learners[0] and not (t.milestones.done or t.stop_status or t.algo_finished):
        count = max(0, m.target - len(m.learners) - len(m.spares))
    count = m.everyone.bcast(count, root=first)
    if not count:
        return
    MPI = mpi()
    started = time.perf_counter()
    numbers = list(range(len(m.hosts), len(m.hosts) + count))
    try:
        spawned = m.everyone.Spawn(sys.executable, args=[
            "-m", "runner.worker", str(Path(t.run_dir).resolve()), RESPAWNED],
            maxprocs=count, root=first)
        everyone = spawned.Merge(high=False)
    except MPI.Exception as ex:
        m.respawn_failed = True
        say_respawn_failed(m, count, f"MPI_Comm_spawn failed: {ex.Get_error_string()}")
        return
    free_quietly(spawned)
    m.unready |= set(numbers)  # with any spawned earlier that is still starting
    everyone.bcast({"numbers": numbers, "members": m.members, "learners": m.learners,
                    "hosts": m.hosts, "unready": sorted(m.unready)}, root=0)
    hosts, names = _exchange_names(everyone, new=False)
    free_quietly(m.everyone)
    m.everyone = track(everyone)
    m.members = m.members + numbers
    m.hosts = m.hosts + hosts
    m.respawned_at = started
    ulfm.learn_process_names(dict(zip(m.members, names)))
    log.info("respawned learner(s) %s on %s in %.2f s", numbers, hosts,
             time.perf_counter() - started)


def say_respawn_failed(m: Membership, count: int, why: str) -> None:
    """One line (the first learner's) for replacements that could not be started."""
    t = m.trainer
    line = (f"adpsgd-run: {count} replacement learner(s) could not be started ({why}): "
            f"{len(m.learners)} learner(s) go on")
    m.say(line, t.world.is_main)
    if t.world.is_main:
        record_event(t.run_dir, {"time": round(time.time(), 3), "event": "respawn failed",
                                 "at_samples": t.state.samples,
                                 "learners": len(m.learners), "cause": why})


def say_ready(m: Membership) -> None:
    """A replacement, its trainer built, tells the first learner (the learners call it in at
    their next step, not before: they train on while it starts)."""
    if m.me in m.unready:
        try:
            m.everyone.isend(m.me, dest=m.members.index(m.learners[0]), tag=READY_TAG).wait()
        except mpi().Exception:  # the job ended (or lost its first learner) meanwhile: the
            pass                 # word waiting for it says which


def replacements_ready(m: Membership) -> bool:
    """On the first learner: whether every replacement spawned last that is still alive has
    said it is ready (one that died while it started is found gone at the join)."""
    MPI = mpi()
    for number in sorted(m.unready - m.ready_heard):
        if number not in m.members:
            continue
        source = m.members.index(number)
        try:
            if not m.everyone.iprobe(source=source, tag=READY_TAG):
                return False
            m.everyone.recv(source=source, tag=READY_TAG)
        except MPI.Exception:  # it died: the join finds it gone (spares.grow)
            pass
        m.ready_heard.add(number)
    return True
