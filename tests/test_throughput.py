"""train/samples_per_s between two training logs (runner/runlog/throughput.py)."""

import pytest

from runner.runlog.throughput import Throughput


def test_the_rate_is_samples_over_seconds_since_the_last_reading():
    meter = Throughput(now=10.0, samples=0)
    assert meter.read(12.0, 1000) == pytest.approx(500.0)
    assert meter.read(13.0, 1300) == pytest.approx(300.0)


def test_a_restart_keeps_a_corrected_count_and_a_pause_out_of_the_rate():
    """An asynchronous estimate of 5000 made exact at an evaluation (4200), which took 3 s:
    read across it, the rate would be negative; from the restart it is training's alone."""
    meter = Throughput(now=0.0, samples=0)
    assert meter.read(5.0, 5000) == pytest.approx(1000.0)
    across = Throughput(now=5.0, samples=5000)
    assert across.read(8.5, 4200 + 500) < 0  # what the restart prevents
    meter.restart(8.0, 4200)
    assert meter.read(8.5, 4200 + 500) == pytest.approx(1000.0)
