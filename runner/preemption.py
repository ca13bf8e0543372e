"""Graceful stop: SIGUSR1 or SIGTERM make the job checkpoint and exit with status 75.

Schedulers warn a job before they stop it (``srun --signal``, ``scancel --signal``, a
preemption's SIGTERM); the local launcher forwards the signals it receives to every rank. A
signal only sets a flag: the rank finishes its step, and the ranks then have to agree on *when*
to stop, since the checkpoint is collective and ranks (asynchronous ones especially) are at
different steps when the signal lands, and it may reach only some of them.

The agreement rides on preemption-check milestones (runner/milestones.py), which every rank
meets in the same order: at check j each rank starts a non-blocking MAX-allreduce of its flag
and reads the result of check j-1, which has long completed unless a peer is more than a
check behind (that wait is bounded by ``comm.timeout_s``). A rank that sees a set flag stops
right there, and so does every other rank, at the same check. A signal is acted on within two
checks (``STOP_CHECK_STEPS`` steps' worth of samples each), wherever it arrived.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import numpy as np

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
STOP_CHECK_STEPS = 16  # lockstep steps' worth of global samples between preemption checks
_received: list[int] = []  # signals received by this process


def install_stop_handlers() -> Callable[[], None]:
    """Make SIGUSR1/SIGTERM request a graceful stop (SIGUSR1 would otherwise kill the
    process); return a function that restores the previous handlers."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: _received.append(signum))

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _received.clear()

    return restore


def stop_requested() -> bool:
    return bool(_received)


def request_stop(signum: int = signal.SIGUSR1) -> None:
    """What the signal handler does (for code that decides to stop by itself)."""
    _received.append(signum)


class StopAgreement:
    """The ranks' shared decision to stop, made at preemption-check milestones.

    (This module imports neither torch nor the communication layer at the top: the worker
    installs the handlers before those slow imports.)"""

    def __init__(self, mpi_comm, rank: int, timeout_s: float):
        from .comm.world import mpi

        self.MPI = mpi()
        self.comm = mpi_comm.Dup()  # its own communicator: never mixed with other collectives
        self.rank, self.timeout_s = rank, timeout_s
        self._flag = np.zeros(1)
        self._result = np.zeros(1)
        self._pending = None
        self.checks = 0

    def _collect(self) -> bool:
        from .comm.deadline import DEADLINES

        with DEADLINES.watch(f"rank {self.rank}: agreement on preemption check "
                             f"{self.checks - 1} with every rank", self.timeout_s):
            self._pending.Wait()
        self._pending = None
        return bool(self._result[0])

    def check(self) -> bool:
        """At a preemption-check milestone: True when some rank had a stop request at the
        previous check (then every rank returns True here)."""
        if self._pending is not None and self._collect():
            return True
        self._flag[0] = 1.0 if stop_requested() else 0.0
        self._pending = self.comm.Iallreduce(self._flag, self._result, op=self.MPI.MAX)
        self.checks += 1
        return False

    def close(self) -> None:
        """Complete the last check (every rank started the same ones) and free the
        communicator."""
        if self._pending is not None:
            self._collect()
        self.comm.Free()
