"""The failure model behind the goodput study (runner/sim/failures.py): against closed forms."""

from __future__ import annotations

import math

import numpy as np

from runner.sim.failures import (
    FailureModel,
    daly_interval,
    elastic_wall_s,
    mean_goodput,
    restart_wall_s,
    young_interval,
)


def model(node_mtbf_s: float, nodes: int = 1, checkpoint_s: float = 1.0, restart_s: float = 0.0,
          recovery_s: float = 0.0) -> FailureModel:
    return FailureModel(node_mtbf_s, nodes, checkpoint_s, restart_s, recovery_s)


def test_without_failures_only_the_checkpoints_cost():
    rng = np.random.default_rng(0)
    never = model(1e30)
    assert restart_wall_s(100.0, 10.0, never, rng) == 100.0 + 9 * 1.0  # none after the last
    assert elastic_wall_s(100.0, never, rng) == 100.0


def test_restart_matches_the_expected_time_of_an_interval_under_exponential_failures():
    # One interval of T = tau + delta seconds, each failure costing R: E[wall] = (M + R)
    # (e^(T/M) - 1) (the classic result for restarts under Poisson failures).
    m, tau, delta, restart = 50.0, 20.0, 5.0, 3.0
    failures = model(m, checkpoint_s=delta, restart_s=restart)
    expected = (m + restart) * (math.exp((tau + delta) / m) - 1)
    rng = np.random.default_rng(1)
    # work of two intervals: the last one writes no checkpoint
    walls = [restart_wall_s(2 * tau, tau, failures, rng) for _ in range(20000)]
    last = (m + restart) * (math.exp(tau / m) - 1)
    assert abs(np.mean(walls) / (expected + last) - 1) < 0.02


def test_elastic_goes_on_at_the_rate_of_the_nodes_left():
    # Two nodes, recovery free: the first failure after X ~ Exp(M/2); the rest at half speed.
    m, work = 100.0, 30.0
    rng = np.random.default_rng(2)
    walls = np.array([elastic_wall_s(work, model(m, nodes=2), rng) for _ in range(20000)])
    assert walls.min() >= work  # inf: both nodes failed before the end
    # At least the work, at most twice it while one node is left (and it lasts).
    finite = walls[np.isfinite(walls)]
    assert finite.max() <= 2 * work + 1e-9
    # P(no failure during the work) = exp(-2 work / m)
    assert abs((walls == work).mean() - math.exp(-2 * work / m)) < 0.02


def test_a_spare_node_keeps_the_job_at_full_speed_until_both_nodes_failed():
    # One node and one spare, recovery and join free: the job trains at full speed while
    # either node lives (the spare takes over, or fails while it waits), so it ends at
    # exactly the work unless both fail first: P = (1 - e^(-work/M))^2.
    m, work = 100.0, 60.0
    spared = FailureModel(m, 1, 1.0, 0.0, 0.0, spare_nodes=1)
    rng = np.random.default_rng(5)
    walls = np.array([elastic_wall_s(work, spared, rng) for _ in range(20000)])
    finite = walls[np.isfinite(walls)]
    assert np.allclose(finite, work)
    assert abs(np.isinf(walls).mean() - (1 - math.exp(-work / m)) ** 2) < 0.01
    # A join that costs time: each replacement adds it.
    slow_join = FailureModel(m, 1, 1.0, 0.0, 0.0, spare_nodes=1, join_s=5.0)
    walls = np.array([elastic_wall_s(work, slow_join, rng) for _ in range(2000)])
    assert set(np.round(walls[np.isfinite(walls)], 9)) <= {work, work + 5.0}


def test_young_and_daly_intervals():
    assert young_interval(10.0, 2000.0) == 200.0
    assert daly_interval(10.0, 2000.0) == 190.0
    assert daly_interval(50.0, 20.0) == 20.0  # a checkpoint longer than 2 M: M


def test_the_optimum_interval_beats_much_shorter_and_much_longer_ones():
    failures = model(3600.0, nodes=4, checkpoint_s=30.0, restart_s=120.0)
    best = daly_interval(30.0, failures.job_mtbf_s)
    work = 24 * 3600.0
    at = {k: mean_goodput(work, failures, best * k, draws=400, seed=3)[0] for k in (0.1, 1, 10)}
    assert at[1] > at[0.1] + 0.05 and at[1] > at[10] + 0.05, at
    elastic, _ = mean_goodput(work, model(3600.0 * 10000, nodes=4), None, draws=200, seed=4)
    assert elastic > 0.99  # 0.01 failures expected in the day
