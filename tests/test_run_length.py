"""An algorithm that averages every N steps, in a run of fewer steps than that, would report an
averaged model that never was (DiLoCo's default period of 50 against a 24-step run trained 4
separate models): such a run is refused with one line, and one that averages only once or
twice is warned. The issue's own command (`recipe=digit_images algo=diloco trainer.epochs=2`,
4 ranks) is a row of docs/errors.md, run by tests/test_errors_doc.py."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from runner.algos import ALGORITHMS
from runner.algos.base import FEW_AVERAGINGS
from runner.errors import ConfigError

from conftest import read_run, run_cli


def algo_config(name: str, **values):
    return OmegaConf.merge(OmegaConf.structured(ALGORITHMS.get(name).Config), values)


@pytest.mark.parametrize("name,values,setting", [
    ("diloco", {}, "algo.period=50"),
    ("local_sgd", {"period": 8}, "algo.period=8"),
    ("dasgd", {"tau": 4}, "algo.tau=4"),
])
def test_a_run_shorter_than_one_period_is_refused_and_a_few_averagings_warned(name, values,
                                                                           setting):
    algorithm = ALGORITHMS.get(name)
    cfg = algo_config(name, **values)
    every = int(setting.split("=")[1])
    with pytest.raises(ConfigError) as refused:
        algorithm.check_run_length(cfg, steps_per_epoch=every - 1, epochs=1)
    assert refused.value.key == setting.split("=")[0]
    assert "they would never average" in str(refused.value), refused.value
    warning = algorithm.check_run_length(cfg, steps_per_epoch=every, epochs=1)
    assert warning.startswith(f"{setting}: {name} averages") and "only 1 averaging(s)" in warning
    assert algorithm.check_run_length(cfg, steps_per_epoch=every, epochs=FEW_AVERAGINGS) \
        is None


def test_dasgd_told_never_to_average_trains_alone_with_a_warning():
    """``algo.tau=0``: the compute-only baseline (benchmarks/bench_dasgd_hiding.py), asked
    for, so not refused; it still says that the run's model is no average."""
    dasgd = ALGORITHMS.get("dasgd")
    cfg = algo_config("dasgd", tau=0, delay=0)
    warning = dasgd.check_run_length(cfg, steps_per_epoch=100, epochs=10)
    assert warning == ("algo.tau=0: dasgd never averages the learners: each trains alone and "
                       "the run's model is no average of theirs")
    from runner.algos.dasgd import launch_due

    assert not any(launch_due(t, 0) for t in range(100))
    assert [t for t in range(8) if launch_due(t, 4)] == [3, 7]


def test_algorithms_that_communicate_every_step_have_no_period():
    assert ALGORITHMS.get("ssgd").check_run_length(algo_config("ssgd"), 1, 1) is None
    assert ALGORITHMS.get("dpsgd").check_run_length(algo_config("dpsgd"), 1, 1) is None
    # Post-local SGD averages gradients at every step before its switch.
    post_local = algo_config("local_sgd", period=50, switch_epoch=1.0)
    assert ALGORITHMS.get("local_sgd").check_run_length(post_local, 10, 10) is None


@pytest.mark.slow
def test_local_sgd_that_averages_twice_is_warned_and_trains(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["recipe=digit_images", "algo=local_sgd", "algo.period=20",
                    "launcher.nprocs=1", "trainer.epochs=1", f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path)
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines()
                if line.startswith("adpsgd-run: warning:")]
    assert len(warnings) == 1 and "only 2 averaging(s) in the whole run" in warnings[0], \
        proc.stderr
    _, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["algo_stats"]["averagings"] == [2]
