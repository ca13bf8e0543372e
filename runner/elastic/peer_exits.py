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
with a message, which aborts the job) and is left alone; one killed by a signal is declared
too, which changes nothing for MPI. Peers on other hosts are the launcher's (their
heartbeats)."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from pathlib import Path

from ..comm.ulfm import declare_failed
from ..runlog.liveness import LOGS, exit_record_written, process_alive

log = logging.getLogger("adpsgd")

WATCH_S = 0.5  # how often the pid files are read: what a survivor may wait at most, beyond
# the time the shrink itself takes
PID_FILE = re.compile(r"rank(\d+)\.pid$")


def ended_without_a_word(run_dir: Path, me: int, declared: set[int]) -> list[int]:
    """The ranks (job-wide numbers, replacements' included) on this host, other than ``me``
    and those in ``declared``, whose process is gone with their exit record still blank."""
    here = socket.gethostname()
    ended = []
    for path in (run_dir / LOGS).glob("rank*.pid"):
        match = PID_FILE.search(path.name)
        if match is None or (rank := int(match.group(1))) == me or rank in declared:
            continue
        try:
            pid, host = path.read_text().split()[:2]
        except (OSError, ValueError):  # being replaced (its heartbeat), or unreadable
            continue
        if host == here and not process_alive(int(pid)) and \
                not exit_record_written(run_dir, rank):
            ended.append(rank)
    return sorted(ended)


def watch_peer_exits(run_dir: Path, me: int) -> None:
    """Start the watch (a daemon thread) for rank ``me`` of an elastic job."""

    def watch() -> None:
        declared: set[int] = set()
        while True:
            time.sleep(WATCH_S)
            try:
                ended = ended_without_a_word(run_dir, me, declared)
            except OSError:  # the run dir is unreadable for now: look again
                continue
            if not ended:
                continue
            declared.update(ended)
            log.warning("rank(s) %s on this host ended without a word (no exit record, no "
                        "kill MPI would have seen): taken for failed, so that the others "
                        "go on without them", ", ".join(map(str, ended)))
            if not declare_failed(ended):
                return  # not Open MPI's ULFM: nothing to tell

    threading.Thread(target=watch, name="peer-exits", daemon=True).start()
