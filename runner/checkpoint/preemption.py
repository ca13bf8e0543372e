"""Graceful stop: a scheduler's warning (SIGUSR1, SIGTERM) or a user's Ctrl-C (SIGINT) makes
the job checkpoint and exit: status ``preempted`` and exit 75 for the first, ``stopped`` and
exit 130 for the second. A second Ctrl-C stops at once (the launcher kills the job; a rank
running inside the launcher's process raises KeyboardInterrupt).

Schedulers warn a job before they stop it (``srun --signal``, ``scancel --signal``, a
preemption's SIGTERM); the local launcher forwards the signals it receives, Ctrl-C included,
to every rank. A signal only sets a flag: the rank finishes its step, and the ranks then have
to agree on *when* to stop, since the checkpoint is collective and ranks (asynchronous ones
especially) are at different steps when the signal lands, and it may reach only some of them.

The agreement rides on preemption-check points (runner/train/milestones.py: one every step's
worth of global samples), which every rank meets in the same order. At a check each rank starts
a non-blocking MAX-allreduce of its flag and of its seconds per step since the previous check,
and reads the result of the check before, which has long completed unless a peer is more than
a check behind (that wait is bounded by ``comm.timeout_s``). A rank that sees a set flag stops
right there, and so does every other rank, at the same check. The checks are spaced in time,
not steps: from the slowest rank's seconds per step (the same number on every rank, so every
rank picks the same points) the next check comes about ``STOP_CHECK_INTERVAL_S`` later, at
least one step and at most ``STOP_CHECK_STEPS`` steps on. A signal is then acted on within two
checks, about a second whether a step takes 10 ms or 2 s. At an evaluation or a checkpoint,
where the ranks meet anyway, they agree at once (a blocking MAX-allreduce), so a signal that
arrived during one is acted on right after it; one that arrived while the ranks were still
starting is acted on before the first step (the launcher also notes it in the run dir,
runner/runlog/liveness.py, for a rank quicker to its first step than the launcher to its pid
file). The flag says why: a user's stop outranks a preemption.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

import numpy as np

log = logging.getLogger("adpsgd")

# SIGUSR2 is a Ctrl-C that came through Open MPI's mpiexec, which forwards SIGUSR1 and SIGUSR2
# to every rank but ends the job on SIGINT and SIGTERM (runner/launch/local.py).
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
PREEMPTED, STOPPED = "preempted", "stopped"
# What each signal asks for, and which reason wins when several arrive.
REASONS = {signal.SIGUSR1: PREEMPTED, signal.SIGTERM: PREEMPTED, signal.SIGINT: STOPPED,
           signal.SIGUSR2: STOPPED}
LEVELS = {PREEMPTED: 1, STOPPED: 2}
# Preemption checks: about this many seconds apart, at most this many steps apart (a check is a
# tiny non-blocking allreduce; async learners can run at most two checks apart).
STOP_CHECK_INTERVAL_S = 0.5
STOP_CHECK_STEPS = 16
_received: list[int] = []  # signals received by this process
# Stops asked for otherwise: the launcher's note of a signal that came before this rank could
# take one, or the rank's own decision. Kept apart, so that the forwarded signal that follows
# the note is not taken for a second Ctrl-C.
_requested: list[int] = []


def _on_signal(signum: int, frame) -> None:
    if signum == signal.SIGINT and signal.SIGINT in _received:
        raise KeyboardInterrupt  # a second Ctrl-C: stop at once
    _received.append(signum)


def install_stop_handlers() -> Callable[[], None]:
    """Make SIGUSR1/SIGTERM/SIGINT request a graceful stop (SIGUSR1 would otherwise kill the
    process, SIGINT raise a KeyboardInterrupt wherever the rank is); return a function that
    restores the previous handlers."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _received.clear()
        _requested.clear()

    return restore


def stop_reason() -> str | None:
    """``stopped`` (Ctrl-C), ``preempted`` (a scheduler's signal) or None."""
    reasons = [REASONS[s] for s in (*_received, *_requested)]
    return max(reasons, key=LEVELS.__getitem__) if reasons else None


def request_stop(signum: int = signal.SIGUSR1) -> None:
    """Stop as ``signum`` asks, without it being a press of its own (for code that decides to
    stop by itself, or learns of a signal the launcher received)."""
    _requested.append(signum)


def _level(reason: str | None) -> float:
    return float(LEVELS.get(reason, 0)) if reason else 0.0


def _reason(level: float) -> str | None:
    return next((r for r, n in LEVELS.items() if n == int(level)), None)


class StopAgreement:
    """The ranks' shared decision to stop, made at preemption-check milestones.

    (This module imports neither torch nor the communication layer at the top: the worker
    installs the handlers before those slow imports.)"""

    def __init__(self, mpi_comm, rank: int, timeout_s: float):
        from ..comm.world import mpi

        self.MPI = mpi()
        from ..comm.ulfm import track

        self.comm = track(mpi_comm.Dup())  # its own: never mixed with other collectives
        self.rank, self.timeout_s = rank, timeout_s
        self._sent = np.zeros(2)  # [stop level, seconds per step since the previous check]
        self._result = np.zeros(2)
        self._pending = None
        self.checks = 0
        self.points = 0  # check points passed (every rank passes the same ones)
        self.stride = 1  # points from one check to the next: agreed, the same on every rank
        self._next_check = 1  # the point of the next check
        self._last: tuple[float, int] | None = None  # (time, step) of this rank's last check
        self.seen_at: int | None = None  # the step at which this rank first saw a stop request

    def _collect(self) -> str | None:
        from ..comm.deadline import DEADLINES

        with DEADLINES.watch(f"rank {self.rank}: agreement on preemption check "
                             f"{self.checks - 1} with every rank", self.timeout_s):
            self._pending.Wait()
        self._pending = None
        slowest_step_s = self._result[1]
        if slowest_step_s > 0:
            self.stride = int(min(STOP_CHECK_STEPS,
                                  max(1, STOP_CHECK_INTERVAL_S // slowest_step_s)))
        return _reason(self._result[0])

    def _agree_at_once(self, where: str) -> str | None:
        """A blocking MAX-allreduce of the stop flags (every rank calls it ``where``)."""
        from ..comm.deadline import DEADLINES

        flag, result = np.array([_level(stop_reason())]), np.zeros(1)
        with DEADLINES.watch(f"rank {self.rank}: {where} with every rank", self.timeout_s):
            self.comm.Allreduce(flag, result, op=self.MPI.MAX)
        return _reason(result[0])

    def at_start(self) -> str | None:
        """Before the first step (blocking; every rank calls it): the stop reason if some
        rank was asked to stop while the ranks were starting."""
        return self._agree_at_once("start of training")

    def now(self) -> str | None:
        """At a milestone every rank meets anyway (an evaluation, a checkpoint; blocking,
        every rank calls it there): the stop reason if any rank has a stop request now. A
        Ctrl-C during an evaluation then stops the run right after it, not two preemption
        checks later."""
        return self._agree_at_once("agreement on a stop at a milestone")

    def check(self, step: int) -> str | None:
        """At a preemption-check point, after this rank's ``step``: at the points chosen for
        a check, the stop reason when some rank had a stop request at the previous check
        (then every rank returns it here), else None."""
        self.points += 1
        if self.seen_at is None and stop_reason():
            self.seen_at = step
            log.info("rank %d: stop request (%s) seen after step %d", self.rank, stop_reason(),
                     step)
        if self.points < self._next_check:
            return None
        if self._pending is not None and (reason := self._collect()):
            return reason
        now = time.perf_counter()
        # This rank's seconds per step since its last check (0: not measured yet).
        last_time, last_step = self._last or (now, step)
        self._sent[:] = (_level(stop_reason()),
                         (now - last_time) / (step - last_step) if step > last_step else 0.0)
        self._last = now, step
        self._pending = self.comm.Iallreduce(self._sent, self._result, op=self.MPI.MAX)
        self.checks += 1
        self._next_check = self.points + self.stride
        return None

    def abandon(self) -> None:
        """Drop the check in flight and the communicator, which hold a lost learner
        (launcher.elastic): the survivors start a new agreement."""
        from ..comm.ulfm import keep_abandoned, retire_comm

        if self._pending is None:
            retire_comm(self.comm)
        else:  # its schedule still runs in MPI's progress, on this communicator: dropping
            # the request frees it in flight (its failed send then aborts the process, "Send
            # error after request freed"), and freeing the communicator under it crashes
            keep_abandoned([self._pending, self.comm])
            self._pending = None

    def close(self) -> None:
        """Complete the last check (every rank started the same ones) and free the
        communicator."""
        if self._pending is not None:
            self._collect()
        self.comm.Free()
