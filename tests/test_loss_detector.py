"""The launcher's loss detector (runner/launch/loss_detector.py): when a learner that falls
silent is taken for lost, from the gaps between the heartbeats it sent so far."""

import random
import statistics

import pytest

from runner.launch.loss_detector import WINDOW, LossDetector, Sensitivity


def beats(detector: LossDetector, rank: int, gaps: list[float], start: float = 100.0) -> float:
    """Heartbeats of ``rank`` with these gaps; returns the time of the last one."""
    now = start
    detector.heard(rank, now)
    for gap in gaps:
        now += gap
        detector.heard(rank, now)
    return now


def test_regular_heartbeats_are_waited_for_the_floor_and_no_longer():
    detector = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=10))
    rng = random.Random(0)
    last = beats(detector, 0, [0.2 + rng.uniform(-0.01, 0.01) for _ in range(50)])
    assert detector.threshold(0, 0.0) == 1.0
    assert detector.suspected(last + 0.99) == {}
    assert detector.suspected(last + 1.01) == {0: pytest.approx(1.01)}


def test_irregular_heartbeats_are_waited_for_longer_by_their_spread():
    """A learner on a loaded host whose beats come every 0.2 to 0.8 s: its threshold is the
    median gap plus loss_spread of its median absolute deviations, above the floor."""
    detector = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=10))
    rng = random.Random(1)
    gaps = [rng.uniform(0.2, 0.8) for _ in range(60)]
    last = beats(detector, 3, gaps)
    median = statistics.median(gaps)
    mad = statistics.median(abs(g - median) for g in gaps)
    assert abs(detector.threshold(3, 0.0) - (median + 8 * mad)) < 1e-9
    assert detector.threshold(3, 0.0) > 1.5  # about 0.5 + 8 * 0.15
    assert detector.suspected(last + 1.2) == {}  # the floor alone would have lost it here
    assert 3 in detector.suspected(last + detector.threshold(3, 0.0) + 0.01)


def test_one_stretched_gap_does_not_move_the_threshold_much_and_the_ceiling_holds():
    detector = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=10))
    beats(detector, 0, [0.2] * 40 + [3.0] + [0.2] * 40)
    assert detector.threshold(0, 0.0) == 1.0  # robust: the median and MAD ignore one outlier
    wild = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=4))
    beats(wild, 0, [0.1, 5.0] * 30)
    assert wild.threshold(0, 0.0) == 4  # never past link_timeout_s


def test_the_window_forgets_old_gaps_and_a_restart_forgets_all():
    detector = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=10))
    last = beats(detector, 0, [0.2, 1.6] * 50)  # a rough start-up ...
    assert detector.threshold(0, 0.0) > 5
    beats(detector, 0, [0.2] * WINDOW, start=last)  # ... then steady: only these count
    assert detector.threshold(0, 0.0) == 1.0
    beats(detector, 1, [0.2, 1.6] * 50)
    detector.forget(1)  # the learner began training: its start-up's gaps say nothing
    assert detector.threshold(1, 0.0) == 1.0


def test_learners_are_judged_each_by_its_own_heartbeats_and_never_heard_ones_not_at_all():
    detector = LossDetector(Sensitivity(loss_after_s=0.5, loss_spread=8, link_timeout_s=10))
    beats(detector, 0, [0.1] * 30, start=100.0)
    beats(detector, 1, [0.1, 0.6] * 15, start=100.0)
    now = 100.0 + 3.0 + 0.8  # 0 has been silent 0.8 s, 1 has been silent 0.3 s
    assert detector.suspected(now) == {0: pytest.approx(0.8)}
    assert 7 not in detector.suspected(now + 100)  # never heard: nothing to miss


def test_after_a_loss_everyone_is_waited_for_the_ceiling_while_the_survivors_recover():
    """Shrinking, dealing the epoch again and taking spares in can hold a survivor's
    heartbeats up; a loss there is not survived anyway, so for link_timeout_s after a loss
    nobody is taken for lost before the ceiling."""
    detector = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=5))
    last = beats(detector, 0, [0.2] * 30)
    detector.recovering(last)
    assert detector.threshold(0, last + 1) == 5 and detector.suspected(last + 2) == {}
    assert 0 in detector.suspected(last + 5.5)  # still lost at the ceiling
    beats(detector, 1, [0.2] * 30, start=last + 10)  # the window is over
    assert detector.threshold(1, last + 20) == 1.0


def test_a_recorded_join_waits_everyone_for_the_ceiling_again_from_its_time():
    """Spares joined 5.4 s after a loss (1.3 s to recover, 4.1 to join, at a load of 2 per
    core): the calm the loss began is over by then, and the first steps with the new peers
    hold heartbeats up as the recovery did. The join's record begins a calm of its own from
    when it was recorded; one recorded long ago calms nothing."""
    detector = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=5))
    last = beats(detector, 1, [0.2] * 30)
    detector.recovering(last)  # learners behind a cut are lost
    joined = last + 5.4
    beats(detector, 1, [0.2] * 26, start=last + 0.2)  # heard until the join ends
    assert 1 in detector.suspected(joined + 1.2)  # the loss's calm alone is over
    detector.calm_after(joined)
    assert detector.threshold(1, joined + 1.2) == 5 and detector.suspected(joined + 1.2) == {}
    assert detector.threshold(1, joined + 5.1) == 1.0  # over link_timeout_s after the join
    detector.calm_after(joined - 60)  # an old record seen late: shortens nothing, adds nothing
    assert detector.threshold(1, joined + 5.1) == 1.0 and detector.threshold(1, joined + 1) == 5


def test_learners_behind_the_same_cut_are_decided_as_promptly_as_the_first():
    """Two learners behind one cut link sent their last heartbeats 0.15 s apart: when the
    first is decided, the other has been silent for most of its threshold and shares the
    fault, so it is decided at its own threshold, not the ceiling. A survivor heard a moment
    ago is waited for the ceiling while it recovers. (A CI run lost learner 3 of the adpsgd
    cut-link test 4 s after learner 2, at the ceiling.)"""
    detector = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=5))
    last_of_2 = beats(detector, 2, [0.2] * 30, start=100.0)
    last_of_3 = beats(detector, 3, [0.2] * 30, start=100.15)
    beats(detector, 0, [0.2] * 35, start=100.0)  # heard on after the cut, last at 2's + 1 s
    decided = last_of_2 + 1.01
    assert detector.suspected(decided) == {2: pytest.approx(1.01)}
    detector.recovering(decided)
    assert detector.threshold(3, decided) == 1.0 and detector.threshold(0, decided) == 5
    assert detector.suspected(last_of_3 + 1.01) == {2: pytest.approx(1.16),
                                                     3: pytest.approx(1.01)}
    assert 0 not in detector.suspected(last_of_2 + 1.0 + 4.9)  # recovering: the ceiling


def test_each_learner_s_closest_call_is_its_longest_silence_against_the_threshold_then():
    """logs/heartbeats.json's numbers: the gap nearest to a loss is judged against the
    threshold in force when it ended (a 0.9 s gap among 0.2 s beats is nearer than a 1.5 s
    one among 0.1 s beats while the ceiling held everyone), and a restart of the history
    forgets it."""
    detector = LossDetector(Sensitivity(loss_after_s=1.0, loss_spread=8, link_timeout_s=10))
    beats(detector, 0, [0.2] * 20 + [0.9] + [0.2] * 5)
    last = beats(detector, 1, [0.1] * 20, start=200.0)
    detector.calm_after(last)  # a join: everyone waited for the ceiling (10 s) for a while
    beats(detector, 1, [1.5, 0.2], start=last)
    calls = detector.closest_calls()
    assert calls[0] == {"gap_s": 0.9, "threshold_s": 1.0, "share": 0.9}
    assert calls[1] == {"gap_s": 1.5, "threshold_s": 10.0, "share": 0.15}
    detector.forget(0)
    assert 0 not in detector.closest_calls()
