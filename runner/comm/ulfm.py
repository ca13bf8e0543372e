"""Surviving a dead rank: MPI's User-Level Failure Mitigation (ULFM), as Open MPI 5 runs it
with ``mpiexec --with-ft ulfm``.

Under ULFM an operation that involves a dead process returns an error (``MPI_ERR_PROC_FAILED``)
instead of hanging, and a rank that sees one can *revoke* a communicator: every pending and
future operation on it then fails on every rank (``MPI_ERR_REVOKED``), which is how ranks
that wait on a live peer learn about a death they could not see. Two operations still work on
a revoked communicator: *agree* (a fault-tolerant AND over the survivors, whose outcome is the
same on all of them) and *shrink* (a new communicator of the survivors, ranks renumbered in
their old order).

The protocol built on it (runner/elastic/membership.py): every communicator a rank uses is
:func:`track`-ed; a rank whose step raised an MPI error revokes them all
(:func:`revoke_all`), so that no survivor stays blocked; every survivor then calls
:func:`agree` on the world communicator, and if the step did not succeed everywhere,
:func:`shrink` gives the survivors and the old ranks that are gone.

Warning: only communicators built from MPI communicators can shrink; torch.distributed's
groups (NCCL, gloo) cannot, so elastic runs move tensors over MPI.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .world import mpi

log = logging.getLogger("adpsgd")


class FailureState:
    """What this process knows of failures: the communicators it uses (world, its
    duplicates, node), which a failure revokes, and whether it has lost peers (MPI_Finalize
    can then wait forever for them: seen with Open MPI 5.0.11, survivors of a kill -9 hung in
    it, so the process exits without it). MPI's state is per process, and so is this one:
    :data:`PROCESS`."""

    def __init__(self) -> None:
        # (mpi4py's communicators cannot be hashed; a freed one turns into COMM_NULL.)
        self.tracked: list = []
        self.lost_peers = False
        self.names: dict[int, int] = {}  # learn_process_names()
        self.abandoned: list = []  # keep_abandoned()

    def track(self, mpi_comm):
        """Remember ``mpi_comm`` for :meth:`revoke_all`; returns it."""
        MPI = mpi()
        # A communicator of this process alone never waits on another; revoked, it would
        # stay so.
        if mpi_comm is not None and mpi_comm != MPI.COMM_SELF:
            self.tracked[:] = [c for c in self.tracked if c != MPI.COMM_NULL]
            self.tracked.append(mpi_comm)
        return mpi_comm

    def revoke_all(self) -> None:
        """Revoke every tracked communicator: every survivor blocked on one of them returns."""
        MPI = mpi()
        for comm in list(self.tracked):
            if comm == MPI.COMM_NULL:
                continue
            try:
                comm.Revoke()
            except MPI.Exception:  # revoked already, or freed
                pass

    def shrink(self, mpi_comm, timeout_s: float | None = None, who: str = "a rank") -> Shrunk:
        """The survivors' communicator and who is gone (collective over the survivors).
        ``timeout_s``: the job ends (one line naming ``who``) when the shrink has not returned
        by then: it waits for every process MPI does not know to be dead, and one that ended
        unseen (runner/elastic/peer_exits.py) or hangs would keep it waiting for good."""
        MPI = mpi()
        lost_before, self.lost_peers = self.lost_peers, True  # one may die during the shrink
        with _bounded(f"{who}: shrinking to the survivors of a loss", timeout_s):
            new = mpi_comm.Shrink()
        new.Set_errhandler(MPI.ERRORS_RETURN)
        survivors = MPI.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())),
                                              mpi_comm.Get_group())
        lost = sorted(set(range(mpi_comm.Get_size())) - set(survivors))
        # After a shrink that lost nobody, Finalize is safe.
        self.lost_peers = lost_before or bool(lost)
        self.track(new)
        return Shrunk(new, list(survivors), lost)


@dataclass(frozen=True)
class Shrunk:
    comm: object  # the survivors' communicator
    survivors: list[int]  # their ranks in the old communicator, in new rank order
    lost: list[int]  # the old ranks that are gone


PROCESS = FailureState()
track, revoke_all, shrink = PROCESS.track, PROCESS.revoke_all, PROCESS.shrink


def lost_peers() -> bool:
    """Whether this process has lost peers (it then exits without MPI_Finalize)."""
    return PROCESS.lost_peers


class GarbledMessage(RuntimeError):
    """An object collective returned bytes that do not unpickle. ULFM leaves the buffers of a
    collective undefined when a member dies in it, and it may report the death on some ranks
    only: a survivor can get garbage and no error (seen: an allgather at a checkpoint, just
    after a learner on another host was killed). Elastic training takes it for a lost peer;
    :func:`shrink` then tells whether one is gone, and the error stands if none is."""


def is_mpi_error(ex: BaseException) -> bool:
    """Whether ``ex`` is an error the MPI library returned (a dead or revoking peer, mostly;
    :func:`shrink` tells which when nobody is gone), or a collective's garbled result."""
    return isinstance(ex, (mpi().Exception, GarbledMessage))


# Open MPI 5.0.11's agreement (MPIX_Comm_agree) now and then answers 0, on every survivor
# alike, with no process failed and every one saying 1, when another thread of the process is
# inside MPI meanwhile (a communication thread's collective or exchange, a checkpoint written
# beside training). 4 ranks, each with a thread running allreduces or ring exchanges on
# another communicator (2026-12-05): 1 agreement in 50 to 1 in 400 answered 0; none without
# that thread, none with requests only pending. A step every learner had completed was then
# undone and the job ended "with every rank alive" (DaSGD at its first averaging, SGP with
# overlap). Asked again it answered right: of 343 such 0s in 18,000 agreements, 341 on the
# first asking again, 2 on the second. So a 0 is asked again, by every survivor alike (each
# got the same 0), and a real failure (some survivor said 0) answers 0 every time.
AGREEMENT_ASKED_AGAIN = 4


def agree(mpi_comm, ok: bool, flags: int = 0, timeout_s: float | None = None,
          who: str = "a rank") -> int:
    """Collective over the survivors: 1 only if every survivor says ``ok`` and nobody
    failed since the last agreement (the outcome is the same on every survivor), else 0.
    ``flags`` (bits from 1 on) are ANDed across the survivors into the same answer: a fact
    that one survivor knows goes to all with it (the others set its bit). ``timeout_s``:
    as :meth:`FailureState.shrink`'s. A 0 is asked again, up to
    :data:`AGREEMENT_ASKED_AGAIN` times (every survivor gets the same answer, so every one
    asks): Open MPI's agreement can answer 0 wrongly beside another thread's traffic."""
    MPI = mpi()
    said = int(ok) | flags << 1
    for asked in range(1 + AGREEMENT_ASKED_AGAIN):
        try:
            with _bounded(f"{who}: the survivors' agreement on a step", timeout_s):
                agreed = mpi_comm.Agree(said)
        except MPI.Exception as ex:  # a process failed (MPI says so to every survivor
            # that has not acknowledged it, and these never do)
            log.info("%s: the agreement says a process failed (%s)", who,
                     ex.Get_error_string().strip())
            return 0
        if agreed & 1:
            if asked:
                log.warning("%s: the agreement answered 0, then %d when asked again (%d "
                            "time(s)): Open MPI's agreement beside another thread's traffic",
                            who, agreed, asked)
            return agreed
    log.info("%s: the agreement answered 0 %d times (this rank said %d)", who,
             1 + AGREEMENT_ASKED_AGAIN, said)
    return 0


def _bounded(what: str, timeout_s: float | None):
    """A deadline for one blocking call (runner/comm/deadline.py), or none."""
    from .deadline import DEADLINES

    return contextlib.nullcontext() if timeout_s is None else DEADLINES.watch(what, timeout_s)


# PMIx's status for a process that ended without finalizing (PMIX_ERR_PROC_TERM_WO_SYNC):
# what Open MPI's own failure detector reports a silent peer with.
PROC_TERMINATED = -200


def _open_mpi() -> tuple | None:
    """Open MPI 5's libraries (libmpi, libopen-pal), or None with another MPI."""
    import ctypes

    library = os.environ.get("MPI4PY_LIBMPI")
    try:
        mpi_lib = ctypes.CDLL(library or "libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
        pal = ctypes.CDLL(str(Path(library).parent / "libopen-pal.so.80") if library
                          else "libopen-pal.so.80", mode=ctypes.RTLD_GLOBAL)
        mpi_lib.ompi_proc_for_name, mpi_lib.ompi_errhandler_proc_failed_internal  # noqa: B018
    except (OSError, AttributeError, ValueError):
        return None
    return mpi_lib, pal


def process_name(libraries: tuple | None = None) -> int | None:
    """This process's name in Open MPI 5's runtime (its job in the low 32 bits, its rank
    in it, the vpid, in the high ones), None with another MPI. ``libraries``: _open_mpi()'s,
    when the caller has them."""
    import ctypes

    libraries = libraries or _open_mpi()
    if libraries is None:
        return None
    # opal_process_info starts with this process's name.
    return ctypes.c_uint64.in_dll(libraries[1], "opal_process_info").value


def learn_process_names(names: dict[int, int | None]) -> None:
    """Job-wide number -> process name, for processes that are not rank N of this
    process's MPI_COMM_WORLD (replacements spawned into the job: runner/elastic/respawn.py)."""
    PROCESS.names.update({n: name for n, name in names.items() if name is not None})


PROGRESS_TAG = 32766  # a tag no message carries: probing it only drives MPI's progress


def declare_failed(ranks: list[int]) -> bool:
    """Take the processes ``ranks`` (their numbers in the job: the rank in MPI_COMM_WORLD of
    a process launched with it) for failed on this rank, as if MPI had
    seen them die: every pending and later operation with them fails, and agree and shrink
    go on without them. For peers that MPI cannot see fail: behind a cut link they are
    silent, not gone, and Open MPI 5's own heartbeat detector crashes ranks as they start
    (docs/failures.md). The launcher, which hears every learner's heartbeats, names them;
    every survivor declares them, so that all agree.

    Warning: this calls Open MPI 5's ``ompi_errhandler_proc_failed_internal``, the exported
    function its detector reports a failure through (not part of the MPI standard); False,
    with nothing done, where the library lacks it (another MPI)."""
    import ctypes

    libraries = _open_mpi()
    if libraries is None:
        return False
    me = process_name(libraries)
    mpi_lib = libraries[0]
    job, vpid = me & 0xFFFFFFFF, me >> 32
    if not PROCESS.names and vpid != mpi().COMM_WORLD.Get_rank():  # not the layout this
        return False                                                # was written for
    proc_for_name, failed = (mpi_lib.ompi_proc_for_name,
                             mpi_lib.ompi_errhandler_proc_failed_internal)
    proc_for_name.restype, proc_for_name.argtypes = ctypes.c_void_p, [ctypes.c_uint64]
    failed.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_bool]
    PROCESS.lost_peers = True
    for rank in ranks:
        name = PROCESS.names.get(rank, job | (rank << 32))
        if (proc := proc_for_name(name)) is not None:
            # not forwarded: every survivor hears it from the launcher
            failed(proc, PROC_TERMINATED, False)
    return True


def known_failed() -> set[int] | None:
    """The ranks of MPI_COMM_WORLD that MPI knows failed (it is driven first: it hears of
    a failure in its progress); None when MPI cannot say now."""
    MPI = mpi()
    world = MPI.COMM_WORLD
    try:  # on MPI_COMM_WORLD revoked by a recovery (the learners' own) the probe fails,
        world.Iprobe(source=world.Get_rank(), tag=PROGRESS_TAG)  # and the reading must not
    except MPI.Exception:
        pass
    try:
        failed = world.Get_failed()
        size = failed.Get_size()
        known = MPI.Group.Translate_ranks(failed, list(range(size)), world.Get_group())
        failed.Free()
    except (MPI.Exception, NotImplementedError):  # no ULFM in this MPI
        return None
    return set(known)


def keep_abandoned(requests: list) -> None:
    """Keep the requests of an exchange a failure interrupted for the rest of the process.
    Dropped, mpi4py frees them while still in flight, and a send to a lost peer that then
    fails has no request to report to: Open MPI aborts the process ("Send error after request
    freed ... on a NULL communicator"), whatever the error handlers say (seen on SGP's
    survivors, whose overlapped exchange was in flight at the loss)."""
    PROCESS.abandoned.extend(requests)


def start_send(mpi_comm, buf, dest: int, tag: int):
    """Post a message to ``dest`` as a started persistent request (the same calls work on
    every MPI). Why not ``Isend``: under Open MPI 5's ULFM, a wait that fails because a peer
    died completes the requests at the MPI level while the transport still holds them, and
    an ordinary request is then freed by that wait; when the transport reports its own error
    on it later (at the revoke, or on finding the peer gone), Open MPI aborts the process:
    "Send error after request freed ... on a NULL communicator". Seen on the survivors of a
    SIGKILL in a 4-rank ring exchange of 40 KB messages: 4 runs in 9 aborted with Isend, none
    in 16 with persistent requests, which a wait only makes inactive. Free them with
    :func:`free_completed` once they all completed, or keep them (:func:`keep_abandoned`)."""
    request = mpi_comm.Send_init(buf, dest=dest, tag=tag)
    request.Start()
    return request


def start_recv(mpi_comm, buf, source: int, tag: int):
    """Post a receive from ``source`` as a started persistent request (see
    :func:`start_send`)."""
    request = mpi_comm.Recv_init(buf, source=source, tag=tag)
    request.Start()
    return request


def free_completed(requests: list) -> None:
    """Free persistent requests that completed without an error."""
    for request in requests:
        request.Free()


def post_each(posts: list) -> list:
    """The requests of ``posts`` (callables that each post one), posted in order. A post that
    fails (a revoked communicator, a peer found dead) keeps the ones already posted
    (:func:`keep_abandoned`) before the error goes on: dropped, they would be freed in
    flight."""
    requests: list = []
    try:
        for post in posts:
            requests.append(post())
    except BaseException:
        keep_abandoned(requests)
        raise
    return requests


# The communicators this process is done with, kept until it ends (retire_comm).
_RETIRED: list = []


def retire_comm(mpi_comm) -> None:
    """Put away a communicator this process is done with (it may be revoked and hold dead
    ranks) without freeing it: it stays allocated, unused, until the process ends.

    Freeing it lets a later communicator take its context id, and Open MPI 5's agreement
    (MPIX_Comm_agree, :func:`agree`) was seen to answer the later one with an outcome of the
    freed one's: after a killed learner's loss and a spare's join, a step every learner had
    completed was agreed failed, "with every rank alive", and the job ended (2 of 12 runs on
    a loaded machine; 0 of 24 with communicators kept). A rank retires a handful per loss
    or join, and one or two as it ends. (The same symptom comes from Open MPI's agreement
    beside another thread's traffic, found later (:data:`AGREEMENT_ASKED_AGAIN`), which may
    have been part of those runs too; kept communicators cost little and stay.)"""
    MPI = mpi()
    if mpi_comm is None or mpi_comm == MPI.COMM_NULL or mpi_comm == MPI.COMM_WORLD:
        return
    _RETIRED.append(mpi_comm)
