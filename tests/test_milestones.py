"""The order in which every rank meets a run's milestones (runner/train/milestones.py):
evaluations and checkpoints listed, preemption checks computed as they come (one per step's
worth of samples, so a long run on one rank does not list hundreds of thousands of them)."""

from __future__ import annotations

from runner.train.milestones import CHECKPOINT, EVALUATE, STOP_CHECK, Milestones


def walk(m: Milestones, samples_per_step: int, until: int) -> list[tuple[int, str]]:
    """Every milestone met, stepping ``samples_per_step`` at a time up to ``until``."""
    met, samples = [], 0
    while samples < until:
        samples += samples_per_step
        while (milestone := m.due(samples)) is not None:
            met.append((milestone.samples, milestone.kind))
    return met


def test_checks_every_step_below_the_budget_after_the_collective_ones_at_equal_counts():
    # 100 samples an epoch, 2 epochs, global batch 25, a checkpoint every 2 steps.
    m = Milestones(100, 2, 25, eval_every=None, checkpoint_every=2, stop_check_every=1)
    met = walk(m, 25, 200)
    assert met[:5] == [(25, STOP_CHECK), (50, CHECKPOINT), (50, STOP_CHECK),
                       (75, STOP_CHECK), (100, EVALUATE)]
    assert met[5:7] == [(100, CHECKPOINT), (100, STOP_CHECK)]
    assert met[-2:] == [(200, EVALUATE), (200, CHECKPOINT)]  # no check at the budget
    assert [s for s, k in met if k == STOP_CHECK] == list(range(25, 200, 25))
    assert m.done and m.due(10**9) is None


def test_an_asynchronous_count_that_jumps_passes_every_point_in_order():
    m = Milestones(100, 1, 10, eval_every=None, checkpoint_every=None, stop_check_every=1)
    assert [x.samples for x in iter(lambda: m.due(35), None)] == [10, 20, 30]
    m.due(100)
    m.rearm()  # the exact count had not reached the check at 40
    assert m.due(39) is None and m.due(40).samples == 40


def test_the_checkpoint_listed_with_an_evaluation_follows_it_whatever_the_count():
    """An asynchronous count agreed at an epoch end's evaluation may lie short of it: the
    checkpoint listed at the same point is then taken in that meeting (runner/trainer/
    meetings.py), which the list answers alike on every rank; not one listed elsewhere."""
    m = Milestones(100, 2, 10, eval_every=None, checkpoint_every=None, stop_check_every=None)
    assert m.due(104).kind == EVALUATE  # the estimate crossed the epoch end at 100
    assert m.checkpoint_next_at(100) and not m.checkpoint_next_at(104)
    assert m.due(97) is None  # the exact count agreed there: 97
    assert m.due(100) == m.points[1] and m.points[1].kind == CHECKPOINT
    assert not m.checkpoint_next_at(100)  # passed: the next is the final evaluation
    checks = Milestones(100, 2, 10, eval_every=None, checkpoint_every=None, stop_check_every=3)
    while checks.due(100).kind != EVALUATE:  # the checks at 30, 60 and 90 come first
        assert not checks.checkpoint_next_at(100)
    assert checks.checkpoint_next_at(100)
    lone = Milestones(100, 2, 10, eval_every=3, checkpoint_every=None, stop_check_every=None)
    assert lone.due(30).samples == 30 and not lone.checkpoint_next_at(30)


def test_resume_after_the_last_milestone_passed_goes_on_at_the_next_one():
    for last in [(50, CHECKPOINT), (50, STOP_CHECK), (75, STOP_CHECK), (100, EVALUATE)]:
        first = Milestones(100, 2, 25, None, 2, 1)
        met = walk(first, 25, 200)
        later = met[met.index(last) + 1:]
        resumed = Milestones(100, 2, 25, None, 2, 1)
        resumed.resume_after(last)
        position = resumed.position
        assert walk(resumed, 25, 200) == later, last
        shared = Milestones(100, 2, 25, None, 2, 1)
        shared.position = position  # what an elastic job's ranks share
        assert walk(shared, 25, 200) == later, last

def test_without_checks_a_simulation_meets_only_the_collective_ones():
    m = Milestones(100, 2, 25, eval_every=2, checkpoint_every=None, stop_check_every=None)
    assert {k for _, k in walk(m, 25, 200)} == {EVALUATE, CHECKPOINT}
    assert m.last_passed() == (200, CHECKPOINT)
