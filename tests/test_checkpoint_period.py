"""trainer.checkpoint_every=auto (runner/checkpoint/period.py): checkpoints spaced by Young's
period sqrt(2 x C x MTBF), C measured from the run's own checkpoints, MTBF from
launcher.mtbf_h or the cluster preset; the same rule in the simulator. The planner and the
milestones it adds, the config's one-line mistakes, and real runs whose logged periods are
recomputed here from the costs they measured."""

from __future__ import annotations

import json
import math
import re

import pytest
from test_cli import assert_one_line_error

from runner.checkpoint.period import FIRST_STEPS, AutoPeriod, young_period_s
from runner.commands.compose import compose_all, validate_job
from runner.errors import UserError
from runner.train.milestones import CHECKPOINT, EVALUATE, Milestones

from conftest import run_cli

TRAIN_SIZE = 1438  # digit_images' training set


def test_the_planner_spaces_checkpoints_by_youngs_period_in_whole_global_batches():
    planner = AutoPeriod(mtbf_s=3600.0, global_batch=64, budget=100_000)
    assert planner.first(0) == FIRST_STEPS * 64
    assert planner.first(99_990) is None  # past the budget: the run's end has one
    point, record = planner.next(5_000, cost_s=2.0, samples_per_s=1_000.0)
    period = math.sqrt(2 * 2.0 * 3600)  # 120 s
    assert record["period_s"] == pytest.approx(period, abs=1e-3) == young_period_s(2.0, 3600)
    stride = math.ceil(period * 1_000 / 64) * 64  # 120,000 samples, a whole global batch
    assert record["period_samples"] == stride and point is None  # 5,000 + stride > budget
    point, record = AutoPeriod(36.0, 64, 100_000).next(5_000, 0.5, 1_000.0)
    assert point == 5_000 + math.ceil(6.0 * 1_000 / 64) * 64 == record["next_at_samples"]


def test_auto_milestones_checkpoint_only_at_the_end_and_where_planned():
    m = Milestones(100, 3, 10, eval_every=None, checkpoint_every=None, stop_check_every=None,
                   epoch_checkpoints=False)
    assert [(p.samples, p.kind) for p in m.points] == [
        (100, EVALUATE), (200, EVALUATE), (300, EVALUATE), (300, CHECKPOINT)]
    m.add_checkpoint(130)
    m.add_checkpoint(130)  # planned twice (a stop right there): listed once
    met = []
    for samples in range(10, 310, 10):
        while (milestone := m.due(samples)) is not None:
            met.append((milestone.samples, milestone.kind))
            if milestone.kind == CHECKPOINT and milestone.samples == 130:
                m.add_checkpoint(250)  # the next one, planned at this one
    assert met == [(100, EVALUATE), (130, CHECKPOINT), (200, EVALUATE), (250, CHECKPOINT),
                   (300, EVALUATE), (300, CHECKPOINT)]
    with pytest.raises(ValueError):
        m.add_checkpoint(120)  # behind the run


def validated(*overrides: str):
    [cfg] = compose_all(["recipe=digit_images", "algo=ssgd", *overrides], False, "config")
    return validate_job(cfg)


@pytest.mark.parametrize("overrides,says", [
    (["trainer.checkpoint_every=atuo", "launcher.mtbf_h=10"], "did you mean auto?"),
    (["trainer.checkpoint_every=auto"], "launcher.mtbf_h=HOURS"),  # no MTBF anywhere
    (["trainer.checkpoint_every=auto", "launcher.mtbf_h=10", "launcher.elastic=true",
      "launcher.nprocs=2"], "launcher.elastic=false"),
    (["trainer.checkpoint_every=0"], "must be a number of steps >= 1, auto or null"),
    (["launcher.mtbf_h=-1"], "must be > 0 hours"),
    (["launcher.mtbfh=10"], "did you mean launcher.mtbf_h"),
    (["launcher.dryrun=true"], "did you mean launcher.dry_run"),
])
def test_mistakes_in_the_new_keys_are_one_line_naming_the_fix(overrides, says):
    with pytest.raises(UserError) as caught:
        validated(*overrides)
    message = str(caught.value)
    assert "\n" not in message and says in message, message


def test_the_cluster_presets_failure_rate_serves_when_launcher_mtbf_h_is_null():
    cfg = validated("trainer.checkpoint_every=auto", "cluster.failures.node_mtbf_hours=50",
                    "launcher.nprocs=8", "launcher.procs_per_node=4")
    planner = AutoPeriod.of(cfg, 8 * 32, 3 * TRAIN_SIZE)
    assert planner.mtbf_s == 50 * 3600 / 2  # 2 nodes
    cfg = validated("trainer.checkpoint_every=auto", "cluster.failures.node_mtbf_hours=50",
                    "launcher.mtbf_h=2", "launcher.nprocs=8", "launcher.procs_per_node=4")
    assert AutoPeriod.of(cfg, 8 * 32, 3 * TRAIN_SIZE).mtbf_s == 2 * 3600 / 2


def check_planned(periods: list[dict], global_batch: int) -> None:
    """Each record's period is Young's for the cost it measured and the job's MTBF, in whole
    global batches at the rate it measured; the next checkpoint came where it was planned
    (the first step at or past it)."""
    assert periods, "no period was planned"
    for record, later in zip(periods, [*periods[1:], None]):
        young = math.sqrt(2 * record["checkpoint_s"] * record["mtbf_s"])
        assert record["period_s"] == pytest.approx(young, rel=1e-9), record
        stride = max(1, math.ceil(record["period_s"] * record["samples_per_s"] / global_batch))
        assert record["period_samples"] == stride * global_batch, record
        planned = record["next_at_samples"]
        if planned is not None and later is not None:
            assert planned <= later["at_samples"] < planned + global_batch, (record, later)


@pytest.mark.mpi
def test_a_real_run_logs_and_records_youngs_period_for_its_measured_cost(tmp_path):
    """2 ranks, 3 epochs, a node MTBF of 2 seconds (so that periods are shorter than an
    epoch): the first checkpoint after 10 steps, then one every Young's period, the epoch ends
    without one, the run's end with one; rank 0's log says each period with its inputs."""
    run_dir = tmp_path / "run"
    run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.epochs=3",
             "trainer.checkpoint_every=auto", "launcher.mtbf_h=0.0006", "trainer.progress=false",
             "trainer.keep_checkpoints=100", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    periods = summary["checkpoint_periods"]
    assert periods[0]["at_samples"] == FIRST_STEPS * 64
    assert all(p["mtbf_s"] == pytest.approx(0.0006 * 3600) for p in periods)
    check_planned(periods, 64)
    written = sorted(int(d.name.split("-")[1]) for d in (run_dir / "checkpoints").iterdir()
                     if d.name.startswith("samples-"))
    assert written == [p["at_samples"] for p in periods], (written, periods)
    assert written[-1] == 3 * TRAIN_SIZE and TRAIN_SIZE not in written  # no epoch-end one
    log = (run_dir / "logs" / "rank0.log").read_text()
    logged = re.findall(r"checkpoint_every=auto: ([\d.]+) s to write, job MTBF ([\d.]+) s: "
                        r"Young's period ([\d.]+) s", log)
    assert len(logged) == len(periods), log
    for (cost, mtbf, period), record in zip(logged, periods):
        assert float(period) == pytest.approx(record["period_s"], abs=0.06)
        assert float(period) == pytest.approx(math.sqrt(2 * float(cost) * float(mtbf)),
                                              abs=0.06)


@pytest.mark.slow
def test_the_simulator_plans_with_the_same_rule_from_the_modelled_write(tmp_path):
    common = ["recipe=digit_images", "algo=dpsgd", "launcher=sim", "launcher.nprocs=4",
              "trainer.epochs=3", "trainer.checkpoint_every=auto", "launcher.mtbf_h=0.00003",
              "trainer.progress=false"]
    refused = run_cli([*common, f"hydra.run.dir={tmp_path / 'no_storage'}"], cwd=tmp_path,
                      check=False)
    assert_one_line_error(refused.returncode, refused.stderr, "cluster.storage_gbps (null "
                          "here)", "cluster.storage_gbps=GBPS")
    assert not (tmp_path / "no_storage").exists()  # refused before anything started
    run_dir = tmp_path / "run"
    # A modelled epoch of 4 learners lasts about 12 virtual ms: a write of about 40 us and a
    # job MTBF of 0.1 s give Young's period near 3 ms, a few checkpoints an epoch.
    run_cli([*common, "cluster.storage_gbps=1000", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    failures = json.loads((run_dir / "summary.json").read_text())["failures"]
    periods = failures["checkpoint_periods"]
    assert all(p["checkpoint_s"] == pytest.approx(failures["checkpoint_s"], abs=1e-4)
               for p in periods), periods
    assert periods[0]["at_samples"] == FIRST_STEPS * 4 * 32
    check_planned(periods, 4 * 32)
    assert len(periods) >= 4, periods  # the first, some planned ones, the end
