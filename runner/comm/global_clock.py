"""What an asynchronous participant knows of everyone's progress (AD-PSGD's global clock).

Each participant keeps, for every participant j, the samples j had seen (``counts``), the wall
time at which j had seen them (``stamps``) and j's recent speed in samples/s (``rates``). Its
own row it updates at every step; the others' rows travel with every exchange and are merged
by keeping the newer row. The estimate of the global count extrapolates each row from its
stamp to now at its rate (at most ``HORIZON_S``): counts alone lag behind by whatever the
others did since the last exchange that reported it, which made AD-PSGD cross evaluation
points and its budget late. An extrapolation may also run ahead; the trainer acts on a
milestone only once the exact count (agreed at the milestone) has reached it.

Stamps are ``time.time()``: on one machine exact, on a cluster as good as its clock sync (an
offset of a few milliseconds moves an estimate by a few milliseconds of progress).
"""

from __future__ import annotations

import time

import numpy as np

HORIZON_S = 10.0  # extrapolate a row at most this far past its stamp
RATE_WINDOW_STEPS = 4  # a participant measures its rate over this many of its steps
SMOOTHING = 0.5  # weight of the newest window in a participant's running rate


class ProgressTable:
    def __init__(self, size: int, rank: int):
        self.size, self.rank = size, rank
        self.counts = np.zeros(size, dtype=np.int64)
        self.stamps = np.zeros(size)  # 0: nothing heard of that participant yet
        self.rates = np.zeros(size)
        # (our count, time, steps since) the rate is measured from
        self._window: tuple[int, float, int] | None = None

    def tick(self, samples: int, now: float | None = None) -> None:
        """Our own progress after a step; our rate over windows of RATE_WINDOW_STEPS steps
        (single steps time too noisily)."""
        now = time.time() if now is None else now
        me = self.rank
        self.counts[me] = max(self.counts[me], samples)
        self.stamps[me] = now
        if self._window is None:
            self._window = (int(self.counts[me]), now, 0)
            return
        start, then, steps = self._window
        steps += 1
        if steps >= RATE_WINDOW_STEPS and now > then:
            rate = (self.counts[me] - start) / (now - then)
            self.rates[me] = rate if self.rates[me] == 0 else (
                (1 - SMOOTHING) * self.rates[me] + SMOOTHING * rate)
            self._window = (int(self.counts[me]), now, 0)
        else:
            self._window = (start, then, steps)

    def pause_clock(self) -> None:
        """Nobody trains while the learners are paused (evaluation, checkpoint): restart every
        row's clock when training resumes, and our rate's window with it."""
        self.stamps[self.stamps > 0] = time.time()
        self._window = None

    @staticmethod
    def packed_nbytes(size: int) -> int:
        """Bytes of :meth:`pack`'s message for ``size`` participants."""
        return 3 * size * np.dtype(np.float64).itemsize

    def pack(self) -> np.ndarray:
        """The table as one float64 message of 3 x size values."""
        return np.concatenate([self.counts.astype(np.float64), self.stamps, self.rates])

    def merge(self, packed: np.ndarray) -> None:
        """Take every row the message knows more recently than we do."""
        counts, stamps, rates = packed.reshape(3, self.size)
        newer = stamps > self.stamps
        newer[self.rank] = False
        self.counts[newer] = np.maximum(self.counts[newer], counts[newer].astype(np.int64))
        self.stamps[newer] = stamps[newer]
        self.rates[newer] = rates[newer]

    def estimate(self, now: float | None = None) -> int:
        """Global samples seen by now, extrapolated (see the module docstring)."""
        now = time.time() if now is None else now
        heard = self.stamps > 0
        ahead = np.clip(now - self.stamps, 0.0, HORIZON_S) * self.rates * heard
        return int(self.counts.sum() + ahead.sum())

    def heard(self, counts: list[int], stamps: list[float]) -> None:
        """Everyone's exact count as of their own stamps (told by a collective beside
        training): the rows it knows more recently than we do, as a merge would take them."""
        newer = np.asarray(stamps) > self.stamps
        newer[self.rank] = False
        self.counts[newer] = np.maximum(self.counts[newer], np.asarray(counts)[newer])
        self.stamps[newer] = np.asarray(stamps)[newer]

    def set_exact(self, counts: list[int], now: float | None = None) -> None:
        """Everyone's exact count, agreed at a milestone: true as of now."""
        now = time.time() if now is None else now
        self.counts[:] = counts
        self.stamps[:] = now
        self._window = None
