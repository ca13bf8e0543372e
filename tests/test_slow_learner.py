"""Which learner is slow: per-learner step times in summary.json, TensorBoard and the report,
and one line at the end of a run naming the slowest learner and its host."""

from __future__ import annotations

import json
import subprocess

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from runner.runlog.learner_times import learners_of, slowest_learner_line

from conftest import BIN, run_cli


def report(compute: float, steps: int = 10, comm: float = 0.0, idle: float = 0.0,
           host: str = "node1") -> dict:
    return {"time": {"compute": compute, "data": 0.0, "comm": comm, "idle": idle},
            "steps": steps, "host": {"name": host}, "node": int(host.removeprefix("node"))}


def test_the_slowest_learner_is_named_with_its_host():
    learners = learners_of([report(1.0, idle=2.0), report(1.1, idle=1.9),
                            report(3.0, host="node7"), report(0.9, idle=2.1)])
    assert learners[2] == {"rank": 2, "learner": 2, "node": 7, "host": "node7", "steps": 10,
                           "step_s": 0.3, "compute_s": 0.3, "wait_s": 0.0}
    assert slowest_learner_line(learners) == (
        "slowest learner: rank 2 on host node7, 300.0 ms of its own work per step, 3.0x the "
        "other learners' median 100.0 ms (10 steps against their median 10; they waited "
        "200.0 ms per step)")


def test_after_an_elastic_loss_the_slowest_is_also_named_by_its_launch_number():
    """Learner 0 was lost: rank 0 is learner 1 now, which the line says (rank 0 alone would
    name the learner that died)."""
    reports = [{**report(c), "learner": n} for c, n in ((3.0, 1), (1.0, 2), (1.1, 3))]
    line = slowest_learner_line(learners_of(reports))
    assert line.startswith("slowest learner: rank 0 (learner 1 as launched) on host node1, "), line


def test_learners_within_1_5x_are_not_named():
    assert slowest_learner_line(learners_of([report(1.0), report(1.45), report(1.2)])) is None
    assert slowest_learner_line(learners_of([report(1.0)])) is None  # one learner: no peers
    # Two learners: the slow one against the other, not against a median that holds itself.
    assert "rank 1 " in slowest_learner_line(learners_of([report(1.0), report(1.6)]))


@pytest.mark.mpi
@pytest.mark.slow
def test_a_straggler_is_named_in_the_summary_tensorboard_and_report(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.epochs=1",
                    "faults.straggler.ranks=[1]", "faults.straggler.factor=4",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    learners = summary["learners"]
    assert [learner["rank"] for learner in learners] == [0, 1]
    # Lockstep: the straggler's own work is the others' waiting (4x, on any machine: the
    # fault sleeps three times what the straggler's own compute measured).
    assert learners[1]["compute_s"] > 1.5 * learners[0]["compute_s"]
    assert learners[0]["wait_s"] > learners[1]["wait_s"]
    line = [text for text in proc.stdout.splitlines() if text.startswith("slowest learner:")]
    assert line and line[0].startswith(
        f"slowest learner: rank 1 on host {learners[1]['host']}, "), proc.stdout
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    for rank in (0, 1):
        assert {f"learners/compute_s/rank{rank}", f"learners/wait_s/rank{rank}"} <= set(
            events.Tags()["scalars"])
    out = tmp_path / "report"
    subprocess.run([str(BIN / "adpsgd-report"), str(run_dir), "--out", str(out)], check=True,
                   capture_output=True, timeout=120)
    assert (out / "learners.png").stat().st_size > 5_000
