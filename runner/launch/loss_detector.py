"""When a silent learner is taken for lost: a detector that learns each learner's heartbeat.

In an elastic job across hosts every learner sends the launcher a datagram every
``launcher.heartbeat_s`` (runner/runlog/liveness.py). A fixed time-out has to be set for the
worst moment of the slowest host, so it waits seconds on a quiet network. This one learns
what each learner's gaps between heartbeats look like once it trains, and takes it for lost
once its silence is longer than

    max(loss_after_s, median(gaps) + loss_spread * MAD(gaps)),   capped at link_timeout_s,

where MAD is the median absolute deviation of the last WINDOW gaps. The median and the MAD
are robust: one gap that a busy core stretched does not move them much, and the floor
``loss_after_s`` covers such a gap. A learner whose heartbeats keep arriving irregularly (a
loaded host, a link that queues them behind the model's bytes) has a wide MAD, and is waited
for longer. A loss is the launcher's decision alone: the learner behind a cut link stops on
its side only after ``link_timeout_s`` without an answer, so the two sides never both go on.

After a loss the survivors shrink, deal the rest of the epoch again and take spares in: work
that can hold a learner's heartbeats up for more than a second on a loaded host, and in which
a further loss is not survived anyway (spares joining end the job). For ``link_timeout_s``
after a loss (:meth:`recovering`), every learner is therefore waited for the ceiling, except
those already silent for half their threshold when the loss was decided: the other learners
behind the same cut link or on the same hung host, whose last heartbeats went a beat or two
apart from the lost one's, are decided as promptly. A change the learners record (a loss, spares
that joined) waits everyone for the ceiling for ``link_timeout_s`` again from the moment it
was recorded (:meth:`calm_after`): a join ends seconds after the loss, and the first steps
after it, with new peers, hold heartbeats up as the recovery did (a CI run at a load of 2 per
core took a learner for lost a second after spares joined, 5.4 s after the loss it followed).
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from dataclasses import dataclass

from ..config.section import require
from ..runlog.liveness import HEARTBEAT_S

WINDOW = 100  # gaps remembered per learner: 20 s of heartbeats at the default 0.2 s


@dataclass
class LossDetectionKeys:
    """The launcher keys of this detector, shared by the launchers whose elastic jobs span
    hosts (launcher=local with a hostfile, launcher=slurm).

    An elastic job across hosts takes a learner that falls silent for lost (a cut link, a
    host gone down or hung) and tells the others, which MPI would not (runner/comm/ulfm.py:
    declare_failed). Each learner sends a heartbeat every heartbeat_s; it is lost once silent
    for loss_after_s, or for loss_spread median absolute deviations above its usual gap
    between heartbeats when that is longer, and at the latest for link_timeout_s, after which
    a learner that hears no answer stops."""

    heartbeat_s: float = 0.2
    loss_after_s: float = 1.0
    loss_spread: float = 8.0
    link_timeout_s: float = 10.0

    def check_loss_detection(self, prefix: str, across_hosts: bool) -> None:
        """Each key in its range; ``across_hosts``: the detector decides losses in this job,
        before the launcher's stall time-out (launcher.stall_timeout_s) ends it."""
        require(self.link_timeout_s >= 2.5 * HEARTBEAT_S, f"{prefix}.link_timeout_s",
                f"must be at least {2.5 * HEARTBEAT_S:g} s (a learner's heartbeat goes every "
                f"{HEARTBEAT_S:g} s), got {self.link_timeout_s:g}",
                f"{prefix}.link_timeout_s=10")
        require(0 < self.loss_after_s <= self.link_timeout_s / 2, f"{prefix}.loss_after_s",
                f"must be above 0 and at most {prefix}.link_timeout_s / 2 = "
                f"{self.link_timeout_s / 2:g} s (a learner behind a cut link waits "
                f"link_timeout_s before it stops on its side), got {self.loss_after_s:g}",
                f"{prefix}.loss_after_s=1")
        require(0 < self.heartbeat_s <= self.loss_after_s / 2.5, f"{prefix}.heartbeat_s",
                f"must be above 0 and at most {prefix}.loss_after_s / 2.5 = "
                f"{self.loss_after_s / 2.5:g} s (a learner is waited for at least 2.5 "
                f"heartbeats), got {self.heartbeat_s:g}",
                f"{prefix}.heartbeat_s={min(0.2, self.loss_after_s / 2.5):g}")
        require(self.loss_spread >= 0, f"{prefix}.loss_spread", f"must be >= 0 (0: "
                f"loss_after_s alone decides), got {self.loss_spread:g}",
                f"{prefix}.loss_spread=8")
        stall_s = getattr(self, "stall_timeout_s", 0)
        require(not (across_hosts and stall_s) or self.link_timeout_s < stall_s,
                f"{prefix}.link_timeout_s", f"must be below {prefix}.stall_timeout_s="
                f"{stall_s:g} (an elastic job takes a silent learner for lost "
                f"before the launcher ends the job for it), got {self.link_timeout_s:g}",
                f"{prefix}.link_timeout_s={max(2.5 * HEARTBEAT_S, stall_s / 2):g}")


@dataclass(frozen=True)
class Sensitivity:
    """The detector's settings (launcher.loss_after_s, loss_spread, link_timeout_s)."""

    loss_after_s: float = 1.0
    loss_spread: float = 8.0
    link_timeout_s: float = 10.0


class LossDetector:
    """Each learner's last heartbeat and its recent gaps; thread-safe (the launcher's
    heartbeat thread feeds it, its supervision loop asks it)."""

    def __init__(self, sensitivity: Sensitivity | None = None) -> None:
        self.sensitivity = sensitivity or Sensitivity()
        self._last: dict[int, float] = {}
        self._gaps: dict[int, deque[float]] = {}
        self._calm_until = float("-inf")  # see recovering()
        self._sharing_the_fault: set[int] = set()  # waited as usual while the others recover
        # rank -> (gap, the threshold then) of its gap nearest to being taken for a loss
        self._closest: dict[int, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def heard(self, rank: int, now: float) -> None:
        """A heartbeat of ``rank`` arrived at ``now`` (time.monotonic())."""
        with self._lock:
            last = self._last.get(rank)
            if last is not None and now > last:
                gaps, gap = self._gaps.setdefault(rank, deque(maxlen=WINDOW)), now - last
                closest = self._closest.get(rank)
                nearest = closest[0] / closest[1] if closest else -1.0
                # No threshold is below the floor: most gaps need no median to be passed over.
                if gap / self.sensitivity.loss_after_s > nearest:
                    threshold = self._threshold(rank, list(gaps), now)
                    if gap / threshold > nearest:
                        self._closest[rank] = (gap, threshold)
                gaps.append(gap)
            self._last[rank] = now

    def forget(self, rank: int) -> None:
        """Start ``rank``'s history again (it ended its start-up: the gaps it had there, when
        a loaded host may hold its heartbeats up for seconds, say nothing of it training)."""
        with self._lock:
            self._gaps.pop(rank, None)
            self._closest.pop(rank, None)

    def closest_calls(self) -> dict[int, dict[str, float]]:
        """For each learner heard again after a silence, its silence nearest to a loss: the
        gap, the threshold in force when it ended and their ratio (1 or more: taken for
        lost). How much room the settings left on this job's hosts and network."""
        with self._lock:
            return {rank: {"gap_s": round(gap, 3), "threshold_s": round(threshold, 3),
                           "share": round(gap / threshold, 3)}
                    for rank, (gap, threshold) in sorted(self._closest.items())}

    def recovering(self, now: float) -> None:
        """A learner was lost at ``now``: wait for the ceiling while the survivors recover
        everyone not yet silent for half their threshold (see the module's docstring)."""
        with self._lock:
            self._sharing_the_fault = {
                rank for rank, last in self._last.items()
                if now - last > self._usual_threshold(list(self._gaps.get(rank, ()))) / 2}
            self._calm_until = max(self._calm_until, now + self.sensitivity.link_timeout_s)

    def calm_after(self, at: float) -> None:
        """The learners recorded a change of membership at ``at`` (a loss, or spares that
        joined): everyone is waited for the ceiling until ``link_timeout_s`` after it, except
        those found sharing the fault of the loss that began the recovery."""
        with self._lock:
            self._calm_until = max(self._calm_until, at + self.sensitivity.link_timeout_s)

    def threshold(self, rank: int, now: float) -> float:
        """The silence after which ``rank`` is taken for lost at ``now``."""
        with self._lock:
            gaps = list(self._gaps.get(rank, ()))
        return self._threshold(rank, gaps, now)

    def _threshold(self, rank: int, gaps: list[float], now: float) -> float:
        if now < self._calm_until and rank not in self._sharing_the_fault:
            return self.sensitivity.link_timeout_s
        return self._usual_threshold(gaps)

    def _usual_threshold(self, gaps: list[float]) -> float:
        s = self.sensitivity
        if len(gaps) < 2:
            return s.loss_after_s
        median = statistics.median(gaps)
        spread = statistics.median(abs(gap - median) for gap in gaps)
        return min(max(s.loss_after_s, median + s.loss_spread * spread), s.link_timeout_s)

    def suspected(self, now: float) -> dict[int, float]:
        """The learners silent past their threshold at ``now``: rank -> seconds silent."""
        with self._lock:
            history = {rank: (last, list(self._gaps.get(rank, ())))
                       for rank, last in self._last.items()}
        return {rank: now - last for rank, (last, gaps) in history.items()
                if now - last > self._threshold(rank, gaps, now)}
