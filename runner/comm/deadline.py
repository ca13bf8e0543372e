"""Bounded waits for blocking MPI calls.

A blocking collective (barrier, allreduce of a few numbers, gathering objects) cannot be
interrupted from Python while it waits inside MPI, and a peer that died or hangs would keep it
waiting forever. Rather than turning every such call into a polling loop (latency on every
step), each one runs inside ``DEADLINES.watch(what, timeout_s)``: a daemon thread notices a
call that outlived its deadline, reports one line naming this rank and the operation, and ends
the job (by default through ``MPI_Abort``, which takes every rank down). The watch itself costs
two dictionary writes.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("adpsgd")
POLL_S = 0.5


class CommTimeout(RuntimeError):
    """A communication that got no answer within its timeout."""


def abort_job(message: str) -> None:
    """Default action on an expired deadline: log, print one line, take every rank down."""
    from .world import mpi

    log.error("%s", message)
    print(f"adpsgd-run: {message}", file=sys.stderr, flush=True)
    mpi().COMM_WORLD.Abort(1)


class Deadlines:
    def __init__(self) -> None:
        # thread id -> (operation, deadline, timeout)
        self._watched: dict[int, tuple[str, float, float]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.on_expired: Callable[[str], None] = abort_job

    @contextmanager
    def watch(self, what: str, timeout_s: float) -> Iterator[None]:
        """Run the body (one blocking call) under a deadline of ``timeout_s`` seconds;
        ``what`` names the rank, the peers and the operation for the message."""
        me = threading.get_ident()
        previous = self._watched.get(me)
        self._watched[me] = (what, time.monotonic() + timeout_s, timeout_s)
        self._start()
        try:
            yield
        finally:
            if previous is None:
                self._watched.pop(me, None)
            else:
                self._watched[me] = previous

    def waiting(self, thread: int) -> str | None:
        """The watched call thread ``thread`` is waiting in now, as ``watch`` named it."""
        watched = self._watched.get(thread)
        return watched[0] if watched else None

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._monitor, name="deadlines",
                                                    daemon=True)
                    self._thread.start()

    def _monitor(self) -> None:
        while True:
            time.sleep(POLL_S)
            now = time.monotonic()
            for what, deadline, timeout_s in list(self._watched.values()):
                if now > deadline:
                    self.on_expired(f"{what} got no answer in {timeout_s:.0f} s (is every "
                                    "rank alive? see the other ranks' logs)")
                    return


DEADLINES = Deadlines()
