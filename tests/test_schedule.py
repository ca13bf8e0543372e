import math

from runner.config.run_schema import OptimConfig
from runner.train.lr_schedule import LRSchedule


def test_goyal_warmup_from_base_rate_to_scaled_rate():
    optim = OptimConfig(lr=0.1, reference_batch=256, warmup_epochs=5, schedule="step",
                        milestones=[30, 60, 80])
    train_size, global_batch = 10_000, 1024
    schedule = LRSchedule(optim, global_batch, train_size, epochs=90)
    assert schedule.lr_at(0) == 0.1
    assert math.isclose(schedule.lr_at(5 * train_size), 0.1 * global_batch / 256)
    rates = [schedule.lr_at(s) for s in range(0, 5 * train_size + 1, 500)]
    assert all(b >= a for a, b in zip(rates, rates[1:]))
    assert math.isclose(schedule.lr_at(30 * train_size), 0.04)
    assert math.isclose(schedule.lr_at(80.5 * train_size), 0.4 * 1e-3)


def test_no_scaling_and_cosine():
    optim = OptimConfig(lr=0.2, scaling="none", schedule="cosine")
    schedule = LRSchedule(optim, global_batch=4096, train_size=100, epochs=10)
    assert schedule.lr_at(0) == 0.2
    assert math.isclose(schedule.lr_at(500), 0.1)
    assert schedule.lr_at(1000) < 1e-12


def test_warmup_never_starts_above_the_scaled_rate():
    optim = OptimConfig(lr=0.4, reference_batch=256, warmup_epochs=2)
    schedule = LRSchedule(optim, global_batch=64, train_size=1000, epochs=5)
    assert [schedule.lr_at(s) for s in (0, 500, 2000, 4000)] == [0.1] * 4
