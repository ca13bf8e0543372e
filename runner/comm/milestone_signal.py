"""Telling every asynchronous participant at once that a milestone was reached.

Asynchronous learners estimate global progress from the counters that ride on their exchanges
(runner/comm/pairwise.py). When the estimate of one of them crosses a milestone (an evaluation,
a checkpoint), it stops exchanging and waits there for the others; a passive whose actives all
wait then hears of nobody's progress and closes the gap on its own samples alone, n times
slower than the job did. So whoever reaches a milestone first announces it to every other
participant (one small non-blocking message each), and each participant takes the largest
announced milestone as a floor for its estimate: a count someone else's estimate reached is a
count the job really reached.

An estimate can run ahead of the job, though, and so can what it announces. Where the
participants meet (an evaluation, a checkpoint, the end) they agree on the exact count, and
each makes it its floor (:meth:`MilestoneSignal.met`): announcements made before that meeting,
still on their way, are then dropped (each carries the number of meetings its sender had
passed). Without that, an estimate that had run past the run's budget kept the floor there, and
after a meeting that found the exact count short of it every learner met again at its next
step, and the next, until the count got there.

Every participant passes the same milestones, so each one ends up receiving exactly
``(n - 1) * announced`` messages; :meth:`MilestoneSignal.close` waits for those (bounded by a
timeout) so that no message is left in flight when the communicator is freed.
"""

from __future__ import annotations

import time

import numpy as np

from .pairwise import ExchangeTimeout
from .ulfm import free_completed, keep_abandoned, retire_comm, start_send, track
from .world import mpi

TAG = 31


class MilestoneSignal:
    def __init__(self, mpi_comm, timeout_s: float = 300.0):
        """``mpi_comm``: the participants (a duplicate is used; only the calling thread)."""
        self.MPI = mpi()
        self.comm = track(mpi_comm.Dup())  # revoked with the others when a peer is lost
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout_s = timeout_s
        self.floor = 0  # the largest milestone anyone announced since the last meeting
        self.meetings = 0  # passed (the same on every participant)
        self.announced = 0
        self.received = 0
        self._sends: list = []  # (request, payload): the payload must outlive the send
        self._inbox = np.zeros(2, dtype=np.int64)  # (samples, meetings of the sender)
        self._status = self.MPI.Status()
        self.closed = False

    def announce(self, samples: int) -> None:
        """This participant reached the milestone at ``samples`` global samples."""
        if self.closed:
            return
        payload = np.array([samples, self.meetings], dtype=np.int64)
        for peer in range(self.size):
            if peer != self.rank:
                self._sends.append((start_send(self.comm, payload, dest=peer, tag=TAG),
                                    payload))
        self.announced += 1
        self.floor = max(self.floor, samples)
        done = [r.Test() for r, _ in self._sends]
        free_completed([r for (r, _), d in zip(self._sends, done) if d])
        self._sends = [send for send, d in zip(self._sends, done) if not d]

    def latest(self) -> int:
        """The largest milestone announced so far (reads what has arrived; never waits)."""
        while not self.closed and self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=TAG,
                                                   status=self._status):
            self.comm.Recv(self._inbox, source=self._status.Get_source(), tag=TAG)
            self.received += 1
            if int(self._inbox[1]) == self.meetings:  # not from before the last meeting
                self.floor = max(self.floor, int(self._inbox[0]))
        return self.floor

    def met(self, exact: int) -> None:
        """At a meeting, where everyone learned the exact count (every participant calls
        it): that is the floor from now on."""
        self.latest()
        self.meetings += 1
        self.floor = min(self.floor, exact)

    def abandon(self) -> None:
        """After a peer was lost (elastic jobs): free without waiting for anyone."""
        if not self.closed:
            self.closed = True
            keep_abandoned(self._sends)  # in flight to the lost peer: never freed in flight
            self._sends = []
            retire_comm(self.comm)

    def close(self) -> None:
        """Receive every announcement still on its way, complete the sends, free."""
        if self.closed:
            return
        deadline = time.monotonic() + self.timeout_s
        expected = self.announced * (self.size - 1)
        while self.received < expected or not all(r.Test() for r, _ in self._sends):
            if time.monotonic() > deadline:
                raise ExchangeTimeout(
                    f"participant {self.rank}: {expected - self.received} milestone "
                    f"announcement(s) of other participants never arrived in "
                    f"{self.timeout_s:.0f} s (is every rank alive?)")
            self.latest()
            time.sleep(1e-3)
        free_completed([r for r, _ in self._sends])
        self._sends = []
        self.closed = True
        self.comm.Free()
