"""Peers on this host that ended without being killed are taken for failed.

ULFM hears of a death from Open MPI's runtime, which reports a process killed by a signal as
failed but not one that exited, whatever its status: a process that Open MPI itself ended
("MPI_ERRORS_ARE_FATAL ... on a NULL communicator" ends that one process, not the job), or
any other exit that skipped the rank's own end. Its peers then wait for it in the next agree
or shrink forever: nothing fails, so nothing else notices, and their heartbeats go on, so
the launcher sees no stall either.

So every rank of an elastic job watches the peers whose pid files (runner/runlog/liveness.py)
say they run on its host: one that is gone while its exit record is still blank is declared
failed to MPI (runner/comm/ulfm.py declare_failed), as the launcher has learners behind a
cut link declared. The survivors' agree and shrink then go on without it, as after a kill.
A peer that wrote its exit record ended on its own terms (it finished, stopped, or failed
with a message, which aborts the job) and is left alone. So is one that MPI already knows
failed (a kill): declared again, even after the survivors had recovered from it, it made
their next agreement fail with every learner alive, and the job end (seen once in about 100
elastic kill tests). A peer is declared only when it is still unknown to MPI on two looks
WATCH_S apart, since MPI hears of a kill a moment after its pid is gone. Peers on other
hosts are the launcher's (their heartbeats), and so are replacements spawned into the job,
which this process's MPI_COMM_WORLD does not hold: their unseen exits end the job at
comm.timeout_s (the bounded shrink)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from ..comm.ulfm import declare_failed, known_failed
from ..comm.world import mpi
from ..runlog.liveness import exit_record_written, process_alive, rank_pid

log = logging.getLogger("adpsgd")

WATCH_S = 0.5  # how often the pid files are read: what a survivor may wait at most, beyond
# the time the shrink itself takes


def ended_without_a_word(run_dir: Path, world_size: int, me: int,
                         declared: set[int]) -> list[int]:
    """The ranks of MPI_COMM_WORLD on this host, other than ``me`` and those in ``declared``,
    whose process is gone with their exit record still blank."""
    return [rank for rank in range(world_size) if rank != me and rank not in declared
            and (pid := rank_pid(run_dir, rank)) is not None and not process_alive(pid)
            and not exit_record_written(run_dir, rank)]


def watch_peer_exits(run_dir: Path, me: int) -> None:
    """Start the watch (a daemon thread) for rank ``me`` of an elastic job."""
    world_size = mpi().COMM_WORLD.Get_size()
    if me >= world_size:  # a replacement: its MPI_COMM_WORLD holds itself alone
        return

    def watch() -> None:
        declared: set[int] = set()
        suspects: set[int] = set()  # gone, unknown to MPI at the last look
        while True:
            time.sleep(WATCH_S)
            ended = ended_without_a_word(run_dir, world_size, me, declared)
            if ended:
                known = known_failed()
                ended = [] if known is None else [rank for rank in ended if rank not in known]
            ended, suspects = [rank for rank in ended if rank in suspects], set(ended)
            if not ended:
                continue
            declared.update(ended)
            log.warning("rank(s) %s on this host ended without a word (no exit record, no "
                        "kill MPI would have seen): taken for failed, so that the others "
                        "go on without them", ", ".join(map(str, ended)))
            if not declare_failed(ended):
                return  # not Open MPI's ULFM: nothing to tell

    threading.Thread(target=watch, name="peer-exits", daemon=True).start()
