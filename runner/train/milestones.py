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
  steps' worth of samples.
* preemption checks: every ``stop_check_every`` steps' worth of samples below the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

EVALUATE, CHECKPOINT, STOP_CHECK = "evaluate", "checkpoint", "stop_check"
_ORDER = {EVALUATE: 0, CHECKPOINT: 1, STOP_CHECK: 2}


@dataclass(frozen=True)
class Milestone:
    samples: int
    kind: str
    final: bool = False  # the last evaluation


def _every(stride_steps: int | None, global_batch: int, budget: int) -> set[int]:
    if not stride_steps:
        return set()
    stride = stride_steps * global_batch
    return set(range(stride, budget, stride))


class Milestones:
    def __init__(self, train_size: int, epochs: int, global_batch: int,
                 eval_every: int | None, checkpoint_every: int | None, stop_check_every: int):
        self.budget = epochs * train_size
        epoch_ends = {e * train_size for e in range(1, epochs + 1)}
        points = [Milestone(s, EVALUATE, s == self.budget)
                  for s in epoch_ends | _every(eval_every, global_batch, self.budget)]
        points += [Milestone(s, CHECKPOINT)
                   for s in epoch_ends | _every(checkpoint_every, global_batch, self.budget)]
        points += [Milestone(s, STOP_CHECK)
                   for s in _every(stop_check_every, global_batch, self.budget)]
        self.points = sorted(points, key=lambda m: (m.samples, _ORDER[m.kind]))
        self.passed = 0  # milestones already acted on

    def due(self, samples: int) -> Milestone | None:
        """The next milestone if ``samples`` has reached it (it then counts as passed)."""
        if self.passed < len(self.points) and self.points[self.passed].samples <= samples:
            self.passed += 1
            return self.points[self.passed - 1]
        return None

    def rearm(self) -> None:
        """Count the last milestone acted on as not reached yet (the exact count, agreed
        there, had not reached it)."""
        self.passed -= 1

    def another_due(self, kind: str, samples: int) -> bool:
        """Whether a later milestone of ``kind`` is also reached at ``samples`` (an
        asynchronous count that became exact can pass several at once: evaluating the same
        model twice would only repeat a row)."""
        return any(m.kind == kind and m.samples <= samples for m in self.points[self.passed:])

    def collective_due(self, samples: int) -> bool:
        """Whether the next milestone is an evaluation or a checkpoint already reached at
        ``samples`` (every rank meets it at once: the ranks can stay met)."""
        return (self.passed < len(self.points) and self.points[self.passed].kind != STOP_CHECK
                and self.points[self.passed].samples <= samples)

    @property
    def done(self) -> bool:
        return self.passed == len(self.points)

    def count(self, kind: str, upto: int | None = None) -> int:
        """Milestones of ``kind`` among the first ``upto`` (default: all)."""
        return sum(1 for m in self.points[:upto] if m.kind == kind)

    def last_passed(self) -> tuple[int, str] | None:
        """(samples, kind) of the last milestone acted on: what a checkpoint records, since
        a resumed run may have other milestones (eval_every, checkpoint_every changed)."""
        if not self.passed:
            return None
        last = self.points[self.passed - 1]
        return last.samples, last.kind

    def resume_after(self, last: tuple[int, str] | None) -> None:
        """Count every milestone up to ``last`` (from :meth:`last_passed`) as passed."""
        if last is None:
            self.passed = 0
            return
        key = (last[0], _ORDER[last[1]])
        self.passed = sum(1 for m in self.points if (m.samples, _ORDER[m.kind]) <= key)
