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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..comm import ulfm
from ..comm.ulfm import retire_comm, track
from ..comm.world import mpi
from ..runlog.failure_events import record_event
from ..runlog.liveness import hosts_answering

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
    lost_hosts: list[str]  # of lost learners no replacement has taken yet
    launches: list[list[int]]  # the numbers started together: at launch, then each spawn


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
    retire_comm(parent)
    sketch = everyone.bcast(None, root=0)
    me = sketch["numbers"][everyone.Get_rank() - len(sketch["members"])]
    hosts, names = _exchange_names(everyone, new=True)
    _JOINED = Joined(track(everyone), me, sketch["members"] + sketch["numbers"],
                     list(sketch["learners"]), sketch["hosts"] + hosts, sketch["unready"],
                     list(sketch["lost_hosts"]), sketch["launches"])
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


def placement(m: Membership, count: int) -> list[str | None]:
    """Where up to ``count`` replacements can start now (the first learner decides): without
    a hostfile, anywhere ([None] * count: Open MPI's runtime places them on this machine);
    with one, on hosts that answer (where learners live, or that the launcher found
    answering: runner/runlog/liveness.py's hosts_answering) and can take one (not spawn-unsafe)
    with a slot free (``launcher.procs_per_node``, else the host's slots, less the job's
    processes alive there), the lost learners' hosts first. Fewer than ``count`` when no
    such host is left: the others wait (:func:`spawn_due`)."""
    capacity = m.host_capacity()
    if capacity is None:
        return [None] * count
    used, answering, unsafe = hosts_now(m, capacity)
    open_hosts = answering - unsafe
    preferred = [h for h in m.lost_hosts if short_name(h) in capacity] + list(capacity)
    chosen: list[str | None] = []
    for _ in range(count):
        host = next((short_name(h) for h in preferred if short_name(h) in open_hosts
                     and used[short_name(h)] < capacity[short_name(h)]), None)
        if host is None:
            break
        chosen.append(host)
        used[host] += 1
    return chosen


def hosts_now(m: Membership, capacity: dict[str, int]
              ) -> tuple[Counter[str], set[str], set[str]]:
    """By short name: the job's processes alive on each host; the hosts that answer (where
    learners are heard, or that the launcher found answering; every host of ``capacity``
    without a launcher link); the hosts Open MPI cannot start a process of the job on
    (:func:`spawn_unsafe_hosts`). What :func:`placement` and :func:`why_no_host` both read."""
    used = Counter(short_name(m.hosts[n]) for n in m.members)
    answering = hosts_answering()
    heard = ({short_name(h) for h in answering} | set(used) if answering is not None
             else set(capacity))
    return used, heard, spawn_unsafe_hosts(m)


def spawn_unsafe_hosts(m: Membership) -> set[str]:
    """Hosts where a process of one of the job's live launches (the first, or a spawn, with
    a process alive somewhere) has ended. Open MPI 5's runtime cannot be trusted to start a
    process of the job there: once every process of a launch on a host has ended, a process
    spawned there fails in MPI_Init (PMIx_Connect: "Not supported") and the spawning
    learners wait forever; after one of several ended, the spawn usually works, but failed
    once under load with MPI_ERR_INTERN ("Unreachable"), and the runtime then lost a daemon
    and ended the whole job. A host the live launches never used, or used without a loss,
    takes one; so does a host whose launches have all ended (in no spawn's connect)."""
    alive = set(m.members)
    unsafe = set()
    for launch in m.launches:
        if alive & set(launch):
            unsafe |= {short_name(m.hosts[n]) for n in launch if n not in alive}
    return unsafe


def short_name(host: str) -> str:
    """A host's name without its domain: MPI's processor name may carry one that the
    hostfile does not."""
    return host.split(".", 1)[0]


def spawn_due(m: Membership) -> bool:
    """On the first learner of lockstep learners: whether replacements that had to wait
    (their hosts away or full) can start now; the learners then spawn them after the step
    they agree on (membership.py)."""
    return bool(m.waiting_replacements and not m.respawn_failed
                and placement(m, m.waiting_replacements))


def respawn(m: Membership) -> None:
    """Collective over ``everyone`` at a loss, or when replacements that waited can start
    (see the module's docstring): start a replacement for each lost learner no spare
    replaces, where :func:`placement` finds room; they join ``everyone`` as spares."""
    t = m.trainer
    if not t.cfg.launcher.get("respawn") or m.respawn_failed:
        return
    first = m.members.index(m.learners[0])
    plan = None
    if m.me == m.learners[0]:
        over = t.milestones.done or t.stop_status or t.algo_finished
        count = 0 if over else max(0, m.target - len(m.learners) - len(m.spares))
        plan = (count, placement(m, count))
    count, hosts = m.everyone.bcast(plan, root=first)
    say_waiting(m, count - len(hosts))
    if not hosts:
        return
    MPI = mpi()
    started = time.perf_counter()
    numbers = list(range(len(m.hosts), len(m.hosts) + len(hosts)))
    command, args = sys.executable, ["-m", "runner.worker", str(Path(t.run_dir).resolve()),
                                     RESPAWNED]
    if t.cfg.faults.get("respawn_fails"):  # a fault injected on purpose
        command = str(Path(t.run_dir) / "no-such-program")
    try:
        if hosts[0] is None:
            spawned = m.everyone.Spawn(command, args=args, maxprocs=len(hosts), root=first)
        else:  # one process per host named, in the order of ``numbers``
            infos = [MPI.Info.Create() for _ in hosts]
            for info, host in zip(infos, hosts):
                info.Set("host", host)
            spawned = m.everyone.Spawn_multiple([command] * len(hosts), [args] * len(hosts),
                                                [1] * len(hosts), infos, root=first)
            for info in infos:
                info.Free()
        everyone = spawned.Merge(high=False)
    except MPI.Exception as ex:
        m.respawn_failed = True
        say_respawn_failed(m, len(hosts), f"MPI_Comm_spawn failed: {ex.Get_error_string()}")
        return
    retire_comm(spawned)
    for host in hosts:  # the lost learners' hosts taken again (or as many, taken elsewhere)
        same = [h for h in m.lost_hosts if host is not None and short_name(h) == host]
        if same or m.lost_hosts:
            m.lost_hosts.remove(same[0] if same else m.lost_hosts[0])
    m.unready |= set(numbers)  # with any spawned earlier that is still starting
    m.launches.append(numbers)
    everyone.bcast({"numbers": numbers, "members": m.members, "learners": m.learners,
                    "hosts": m.hosts, "unready": sorted(m.unready),
                    "lost_hosts": m.lost_hosts, "launches": m.launches}, root=0)
    hosts_now, names = _exchange_names(everyone, new=False)
    retire_comm(m.everyone)
    m.everyone = track(everyone)
    m.members = m.members + numbers
    m.hosts = m.hosts + hosts_now
    m.respawned_at = started
    ulfm.learn_process_names(dict(zip(m.members, names)))
    log.info("respawned learner(s) %s on %s in %.2f s", numbers, hosts_now,
             time.perf_counter() - started)


def say_waiting(m: Membership, waiting: int) -> None:
    """Replacements that no host can take now: one line when their number changes.
    Lockstep learners start them once a host answers again or has a free slot
    (:func:`spawn_due`); asynchronous learners meet only at a loss, so theirs are not
    started (a later loss tries again)."""
    if waiting == m.waiting_replacements:
        return
    m.waiting_replacements = waiting
    t = m.trainer
    if not waiting:
        return
    where = why_no_host(m)
    if t.algo.asynchronous:  # tried again at the next loss only
        say_respawn_failed(m, waiting, f"{where}; asynchronous learners meet only at a loss")
        return
    line = (f"adpsgd-run: {waiting} replacement learner(s) wait for a host: {where}; "
            f"{len(m.learners)} learner(s) go on meanwhile")
    m.say(line, t.world.is_main)
    if t.world.is_main:
        record_event(t.run_dir, {"time": round(time.time(), 3), "event": "respawn waits",
                                 "at_samples": t.state.samples, "learners": len(m.learners),
                                 "cause": where})


def why_no_host(m: Membership) -> str:
    """Why :func:`placement` finds no host: the hosts that cannot take one though they have
    room, and why each (see spawn_unsafe_hosts), then that the others are full."""
    capacity = m.host_capacity() or {}
    used, answering, unsafe_now = hosts_now(m, capacity)
    roomy = [h for h in capacity if used[h] < capacity[h]]
    unsafe = [h for h in roomy if h in unsafe_now]
    silent = [h for h in roomy if h not in answering and h not in unsafe]
    reasons = [f"{', '.join(hosts)} {verbs[len(hosts) > 1]} {what}" for hosts, verbs, what in (
        (unsafe, ("has", "have"), "lost a process of the job, and Open MPI's runtime cannot "
                                  "reliably start one there again"),
        (silent, ("does", "do"), "not answer")) if hosts]
    return "; ".join([*reasons, f"no {'other ' if reasons else ''}host of launcher.hostfile "
                                "has a free slot"])


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
