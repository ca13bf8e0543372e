"""The asynchronous learners' estimate of the global count (runner/comm/global_clock.py)."""

import numpy as np
import pytest

from runner.comm.global_clock import (
    HISTORY_STEPS,
    HORIZON_S,
    STALL_FACTOR,
    ProgressTable,
    TrainingClock,
)

STEP_S, BATCH, LEARNERS, AGE_S = 0.03, 32, 4, 0.3


def train_together(table: ProgressTable, steps: int, now: float, start_step: int = 0) -> float:
    """``steps`` steps of every learner at the same pace; the others' rows reach ``table``
    AGE_S old (as they ride on the gossip). Returns the wall time after the last step."""
    rate = BATCH / STEP_S
    for step in range(start_step + 1, start_step + steps + 1):
        now += STEP_S
        table.tick(step * BATCH, now)
        their_count = step * BATCH - AGE_S * rate
        table.merge(np.concatenate([[their_count] * LEARNERS, [now - AGE_S] * LEARNERS,
                                    [rate] * LEARNERS]))
    return now


def test_the_estimate_extrapolates_rows_over_steady_training():
    table = ProgressTable(LEARNERS, 0)
    now = train_together(table, 40, 1000.0)
    assert table.rates[0] == pytest.approx(BATCH / STEP_S)
    # Counts alone lag by the others' age; the extrapolation closes it.
    assert table.counts.sum() < LEARNERS * 40 * BATCH - 300
    assert table.estimate(now) == pytest.approx(LEARNERS * 40 * BATCH, abs=2)


def test_a_wait_outside_training_does_not_run_the_estimate_ahead():
    """Every learner waits 4 s between two steps (a checkpoint's capture waiting for the
    previous background write), then takes its next step: the estimate after it is what the
    steps made, within the gap's allowance; over wall time it would be 4 s of the job's
    progress ahead (about 13,000 samples here). The others' rows are still those of before
    the wait (theirs come with the next exchange)."""
    table = ProgressTable(LEARNERS, 0)
    now = train_together(table, 40, 1000.0)
    before = table.estimate(now)
    now += 4.0 + STEP_S
    table.tick(41 * BATCH, now)
    allowance = LEARNERS * BATCH * STALL_FACTOR  # the gap counts as STALL_FACTOR steps
    assert table.estimate(now) <= LEARNERS * 41 * BATCH + allowance
    assert table.estimate(now) > before
    # As it was: every row extrapolated over the wall time since its stamp (ours is new).
    wall_clock = table.counts.sum() + (np.clip(now - table.stamps, 0, HORIZON_S)
                                       * table.rates).sum()
    assert wall_clock > LEARNERS * 41 * BATCH + 3.9 * (LEARNERS - 1) * BATCH / STEP_S


def test_a_row_stamped_before_the_wait_counts_only_its_training_after():
    """A row last heard just before everyone waited: extrapolated over what we trained since
    (the row's training before the wait, then one step), not over the wait."""
    table = ProgressTable(2, 0)
    now = 0.0
    for step in range(1, 21):
        now += STEP_S
        table.tick(step * BATCH, now)
    table.merge(np.array([100.0, 100.0, 0.0, now - 0.01, 0.0, 1000.0]))
    now += 5.0  # the wait
    now += STEP_S
    table.tick(21 * BATCH, now)
    trained_since = 0.01 + STEP_S * STALL_FACTOR  # the gap counts as at most 3 steps
    assert table.estimate(now) == pytest.approx(21 * BATCH + 100 + 1000 * trained_since, abs=1)


def test_the_training_clock_counts_long_gaps_as_a_few_usual_steps():
    clock = TrainingClock()
    for i in range(10):
        clock.step(i * 0.1)
    assert clock.last == pytest.approx(0.9)
    clock.step(0.9 + 60.0)
    assert clock.last == pytest.approx(0.9 + STALL_FACTOR * 0.1)
    # Inside that gap the clock ran with the wall, then stopped.
    assert clock.at(0.9 + 0.05) == pytest.approx(0.95)
    assert clock.at(0.9 + 30.0) == pytest.approx(0.9 + STALL_FACTOR * 0.1)
    # The first gaps count in full: no usual step yet.
    fresh = TrainingClock()
    fresh.step(0.0)
    fresh.step(5.0)
    assert fresh.last == 5.0


def test_the_training_clock_forgets_old_steps_but_still_places_old_stamps():
    clock = TrainingClock()
    for i in range(10_000):
        clock.step(i * 0.001)
    assert len(clock._walls) <= 2 * HISTORY_STEPS
    assert clock.at(0.0) == pytest.approx(0.0, abs=1e-6)  # as if training all along
    assert clock.at(9.9995) == pytest.approx(9.9995)
