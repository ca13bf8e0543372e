"""What an asynchronous participant knows of everyone's progress (AD-PSGD's global clock).

Each participant keeps, for every participant j, the samples j had seen (``counts``), the wall
time at which j had seen them (``stamps``) and j's recent speed in samples/s of training
(``rates``). Its own row it updates at every step; the others' rows travel with every exchange
and are merged by keeping the newer row. The estimate extrapolates each row from its stamp to
now at its rate (at most ``HORIZON_S``): counts alone lag behind by whatever the others did
since the last exchange that reported it, which made AD-PSGD cross evaluation points and its
budget late. An extrapolation may also run ahead; the trainer acts on a milestone only once the
exact count (agreed at the milestone) has reached it.

The extrapolation runs on this participant's *training clock*, not on the wall clock: the time
between two of its steps counts only up to ``STALL_FACTOR`` times its usual step, so a wait
outside training (a checkpoint's capture waiting for the previous background write, a slow
collective) does not count. The learners wait together there, and extrapolating every row over
the wait made the estimate run seconds of the job's progress ahead: in the lab at 100 Mbit/s
with evaluations and checkpoints beside training, all seven epoch-end milestones of an 8-epoch
run came within its first 4.6 epochs (an estimate of 17,847 samples where the job had trained
about 5,200), and the milestone signal spread each overshoot to every learner. A learner that
waits alone under-estimates the others meanwhile, by at most what they did since their last
row reached it; the gossip thread keeps merging their rows during the wait.

Stamps are ``time.time()``: on one machine exact, on a cluster as good as its clock sync (an
offset of a few milliseconds moves an estimate by a few milliseconds of progress).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque

import numpy as np

HORIZON_S = 10.0  # extrapolate a row at most this far past its stamp
RATE_WINDOW_STEPS = 4  # a participant measures its rate over this many of its steps
SMOOTHING = 0.5  # weight of the newest window in a participant's running rate
STALL_FACTOR = 3.0  # a gap between steps counts as training up to this many usual steps
USUAL_STEP_OF = 16  # the usual step: the median of this many last gaps between steps
HISTORY_STEPS = 2048  # steps remembered at least: a stamp older counts as training all along


class TrainingClock:
    """Seconds spent training: wall time, except that a gap between two steps longer than
    ``STALL_FACTOR`` usual steps counts as that much (see the module docstring). The first
    ``RATE_WINDOW_STEPS`` gaps count in full (no usual step yet)."""

    def __init__(self):
        self.last_wall: float | None = None
        self.last: float = 0.0  # the clock at the last step
        self._gaps: deque[float] = deque(maxlen=USUAL_STEP_OF)
        # (wall, clock) at the last HISTORY_STEPS steps or more, where stamps fall (lists for
        # bisect, trimmed in chunks)
        self._walls: list[float] = []
        self._clocks: list[float] = []

    def allowance(self) -> float:
        """The most a gap between two steps counts as."""
        if len(self._gaps) < RATE_WINDOW_STEPS:
            return float("inf")
        return STALL_FACTOR * statistics.median(self._gaps)

    def step(self, now: float) -> None:
        if self.last_wall is not None:
            gap = max(now - self.last_wall, 0.0)
            self.last += min(gap, self.allowance())
            self._gaps.append(gap)
        self.last_wall = now
        self._walls.append(now)
        self._clocks.append(self.last)
        if len(self._walls) > 2 * HISTORY_STEPS:
            del self._walls[:-HISTORY_STEPS], self._clocks[:-HISTORY_STEPS]

    def at(self, wall: float) -> float:
        """The clock at wall time ``wall`` (before our first step the wall time itself: rows
        extrapolate over wall time until we have a step to measure from)."""
        if self.last_wall is None:
            return wall
        if wall >= self.last_wall:
            return self.last + min(wall - self.last_wall, self.allowance())
        i = bisect.bisect_right(self._walls, wall) - 1
        if i < 0:  # older than we remember: as if training all along
            return self._clocks[0] - (self._walls[0] - wall)
        # Within a gap the clock runs with the wall until it has counted what that gap counts.
        return min(self._clocks[i] + (wall - self._walls[i]), self._clocks[i + 1])


class ProgressTable:
    def __init__(self, size: int, rank: int):
        self.size, self.rank = size, rank
        self.counts = np.zeros(size, dtype=np.int64)
        self.stamps = np.zeros(size)  # 0: nothing heard of that participant yet
        self.rates = np.zeros(size)  # samples per second of training
        self.clock = TrainingClock()
        # (our count, training clock, steps since) the rate is measured from
        self._window: tuple[int, float, int] | None = None

    def tick(self, samples: int, now: float | None = None) -> None:
        """Our own progress after a step; our rate over windows of RATE_WINDOW_STEPS steps
        (single steps time too noisily), per second of our training clock."""
        now = time.time() if now is None else now
        self.clock.step(now)
        me, trained = self.rank, self.clock.last
        self.counts[me] = max(self.counts[me], samples)
        self.stamps[me] = now
        if self._window is None:
            self._window = (int(self.counts[me]), trained, 0)
            return
        start, then, steps = self._window
        steps += 1
        if steps >= RATE_WINDOW_STEPS and trained > then:
            rate = (self.counts[me] - start) / (trained - then)
            self.rates[me] = rate if self.rates[me] == 0 else (
                (1 - SMOOTHING) * self.rates[me] + SMOOTHING * rate)
            self._window = (int(self.counts[me]), trained, 0)
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
        trained = self.clock.at(now)
        since = np.array([trained - self.clock.at(stamp) if stamp > 0 else 0.0
                          for stamp in self.stamps])
        ahead = np.clip(since, 0.0, HORIZON_S) * self.rates
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
