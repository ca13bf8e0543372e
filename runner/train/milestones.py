"""The points of a run, in global samples, at which every rank acts together.

Evaluations, checkpoints and preemption checks are collective, so every rank must meet them in
the same order. The trainer drives them by global samples consumed: exact for lockstep
algorithms (every rank crosses a point at the same step) and a never-decreasing estimate for
asynchronous ones (ranks cross at their own steps, but in the same order). One sorted list of
milestones gives that order; at equal sample counts an evaluation comes before the checkpoint
(a resumed run does not repeat it) and the checkpoint before the preemption check (a stop
right there reuses it).

* evaluations: every epoch end and every ``trainer.eval_every`` steps' worth of samples; the
  last one, at the sample budget ``epochs * train_size``, is final.
* checkpoints: every epoch end (the budget included) and every ``trainer.checkpoint_every``
  steps' worth of samples; with ``checkpoint_every=auto``, the budget and the points the run
  plans as it goes (:meth:`Milestones.add_checkpoint`, runner/checkpoint/period.py).
* preemption checks: every ``stop_check_every`` steps' worth of samples below the budget.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

EVALUATE, CHECKPOINT, STOP_CHECK = "evaluate", "checkpoint", "stop_check"
_ORDER = {EVALUATE: 0, CHECKPOINT: 1, STOP_CHECK: 2}


@dataclass(frozen=True)
class Milestone:
    samples: int
    kind: str
    final: bool = False  # the last evaluation


def _key(milestone: Milestone) -> tuple[int, int]:
    return milestone.samples, _ORDER[milestone.kind]


def _every(stride_steps: int | None, global_batch: int, budget: int) -> set[int]:
    if not stride_steps:
        return set()
    stride = stride_steps * global_batch
    return set(range(stride, budget, stride))


class Milestones:
    """The run's milestones in order. Evaluations and checkpoints are listed; preemption
    checks, one every ``stop_check_every`` steps' worth of samples (possibly every step: a
    long run on one rank has hundreds of thousands), are computed as they come. ``passed``
    counts the listed ones acted on, ``stops_passed`` the checks; ``position`` is both (what
    an elastic job's ranks keep and share)."""

    def __init__(self, train_size: int, epochs: int, global_batch: int,
                 eval_every: int | None, checkpoint_every: int | None,
                 stop_check_every: int | None, epoch_checkpoints: bool = True):
        self.budget = epochs * train_size
        epoch_ends = {e * train_size for e in range(1, epochs + 1)}
        points = [Milestone(s, EVALUATE, s == self.budget)
                  for s in epoch_ends | _every(eval_every, global_batch, self.budget)]
        # epoch_checkpoints=False (checkpoint_every=auto): only the run's end, and the points
        # added as it goes (add_checkpoint)
        checkpoint_ends = epoch_ends if epoch_checkpoints else {self.budget}
        points += [Milestone(s, CHECKPOINT) for s in
                   checkpoint_ends | _every(checkpoint_every, global_batch, self.budget)]
        self.points = sorted(points, key=_key)  # the collective ones
        self.stop_stride = stop_check_every * global_batch if stop_check_every else 0
        # Checks lie strictly below the budget, at stop_stride, 2 * stop_stride, ...
        self.stop_count = (self.budget - 1) // self.stop_stride if self.stop_stride else 0
        self.passed = 0  # listed milestones acted on
        self.stops_passed = 0  # preemption checks acted on
        self._last_was_stop = False

    @property
    def position(self) -> tuple[int, int]:
        return self.passed, self.stops_passed

    @position.setter
    def position(self, value: tuple[int, int]) -> None:
        self.passed, self.stops_passed = value

    def _next_stop(self) -> Milestone | None:
        if self.stops_passed >= self.stop_count:
            return None
        return Milestone((self.stops_passed + 1) * self.stop_stride, STOP_CHECK)

    def add_checkpoint(self, samples: int) -> None:
        """List one more checkpoint at ``samples``, beyond every milestone passed
        (trainer.checkpoint_every=auto plans them as the run goes: runner/checkpoint/period.py).
        Every rank adds the same ones at the same moment, so their lists stay equal."""
        added = Milestone(samples, CHECKPOINT)
        if added in self.points:
            return
        at = bisect.bisect_right([_key(m) for m in self.points], _key(added))
        if at < self.passed:
            raise ValueError(f"a checkpoint at {samples} samples lies behind the run")
        self.points.insert(at, added)

    def _listed(self, ahead: int = 0) -> Milestone | None:
        """The listed milestone ``ahead`` places after the next (None past the end)."""
        index = self.passed + ahead
        return self.points[index] if index < len(self.points) else None

    def _next(self) -> Milestone | None:
        listed = self._listed()
        stop = self._next_stop()
        if listed is None or (stop is not None and _key(stop) < _key(listed)):
            return stop
        return listed

    def due(self, samples: int) -> Milestone | None:
        """The next milestone if ``samples`` has reached it (it then counts as passed)."""
        milestone = self._next()
        if milestone is None or milestone.samples > samples:
            return None
        self._last_was_stop = milestone.kind == STOP_CHECK
        if self._last_was_stop:
            self.stops_passed += 1
        else:
            self.passed += 1
        return milestone

    def rearm(self) -> None:
        """Count the last milestone acted on as not reached yet (the exact count, agreed
        there, had not reached it)."""
        if self._last_was_stop:
            self.stops_passed -= 1
        else:
            self.passed -= 1

    def another_due(self, kind: str, samples: int) -> bool:
        """Whether a later listed milestone of ``kind`` (an evaluation, a checkpoint) is also
        reached at ``samples`` (an asynchronous count that became exact can pass several at
        once: evaluating the same model twice would only repeat a row)."""
        return any(m.kind == kind and m.samples <= samples for m in self.points[self.passed:])

    def collective_due(self, samples: int) -> bool:
        """Whether the next milestone is an evaluation or a checkpoint already reached at
        ``samples`` (every rank meets it at once: the ranks can stay met)."""
        milestone = self._next()
        return (milestone is not None and milestone.kind != STOP_CHECK
                and milestone.samples <= samples)

    def checkpoint_next_at(self, samples: int, ahead: int = 0) -> bool:
        """Whether the next listed milestone (``ahead``: the one that many places after it)
        is a checkpoint at exactly ``samples`` (the same answer on every rank: it reads the
        list, not a count)."""
        listed = self._listed(ahead)
        return listed is not None and listed.kind == CHECKPOINT and listed.samples == samples

    @property
    def done(self) -> bool:
        return self.passed == len(self.points)  # the final evaluation comes after every check

    def last_passed(self) -> tuple[int, str] | None:
        """(samples, kind) of the last milestone acted on: what a checkpoint records, since
        a resumed run may have other milestones (eval_every, checkpoint_every changed)."""
        candidates = []
        if self.passed:
            candidates.append(self.points[self.passed - 1])
        if self.stops_passed:
            candidates.append(Milestone(self.stops_passed * self.stop_stride, STOP_CHECK))
        if not candidates:
            return None
        last = max(candidates, key=_key)
        return last.samples, last.kind

    def resume_after(self, last: tuple[int, str] | None) -> None:
        """Count every milestone up to ``last`` (from :meth:`last_passed`) as passed."""
        if last is None:
            self.position = 0, 0
            return
        key = (last[0], _ORDER[last[1]])
        self.passed = sum(1 for m in self.points if _key(m) <= key)
        self.stops_passed = 0
        if self.stop_stride:
            # The checks at or before ``key``: the j-th is at j * stride, ordered last.
            reached = last[0] // self.stop_stride
            if reached * self.stop_stride == last[0] and key[1] < _ORDER[STOP_CHECK]:
                reached -= 1
            self.stops_passed = max(0, min(self.stop_count, reached))
