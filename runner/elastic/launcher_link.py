"""A rank's side of an elastic job across hosts (launcher.elastic with launcher.hostfile): the
launcher hears every learner's heartbeats and answers them with the learners it takes for
lost (runner/runlog/liveness.py's LauncherLink). The survivors declare those to MPI, which
cannot see a peer behind a cut link fail; a learner that hears itself named, or no answer at
all, leaves at once: the job goes on across the cut without it."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import NoReturn

from ..comm.ulfm import declare_failed, known_failed
from ..errors import EXIT_PEER_LOST
from ..runlog.liveness import write_exit_record

log = logging.getLogger("adpsgd")


def learners_lost_elsewhere(run_dir: Path, rank: int, ranks: list[int]) -> None:
    """The launcher of an elastic job across hosts takes learners ``ranks`` for lost (it
    stopped hearing them: a cut link, a host gone down or hung): MPI is told so, and this
    rank's operations with them fail as with dead peers; a rank named itself stops."""
    if rank in ranks:
        cut_off(run_dir, rank, "the launcher took this learner for lost (its heartbeats "
                "stopped reaching it)")
    log.warning("the launcher took learner(s) %s for lost: no heartbeat from them",
                ", ".join(map(str, ranks)))
    # One MPI saw fail already (a kill) is not declared again: after the survivors'
    # recovery from it, that failed their next agreement with every learner alive.
    known = known_failed() or set()
    if not declare_failed([rank for rank in ranks if rank not in known]):
        log.error("this MPI cannot be told that peers are lost: the job ends at "
                  "launcher.stall_timeout_s")


def cut_off(run_dir: Path, rank: int, why: str) -> NoReturn:
    """Leave at once, aborting nothing: the job goes on across the cut without this side.
    What is said goes to the rank's log and exit record (EXIT_PEER_LOST), by a thread given
    2 s, since the run dir's file system may be behind the same cut. The process itself exits
    0: Open MPI's mpiexec ends the job with a non-zero status (or waits on it) when a rank
    that it still hears, the cut healed or the host resumed, leaves with one, which reported
    the job the others finished as failed."""

    def say() -> None:
        log.error("rank %d: %s: this side of a cut link stops; the job goes on without it",
                  rank, why)
        write_exit_record(run_dir, rank, EXIT_PEER_LOST)

    writer = threading.Thread(target=say, daemon=True)
    writer.start()
    writer.join(2.0)
    os._exit(0)
