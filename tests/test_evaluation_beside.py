"""Evaluations beside training (trainer.eval_in_background, runner/train/evaluation_beside.py)
on real ranks: AD-PSGD scores copies of its models in a thread while it trains, so that only
the checkpoints meet; a copy's numbers equal those of the same models scored by a meeting; a
run resumed from a checkpoint whose evaluation was still being scored scores it first."""

import pytest

from runner.checkpoint.files import complete_checkpoints

from conftest import SMALL_DIGITS_MODEL, read_run, run_cli

pytestmark = pytest.mark.mpi

# 2 epochs of 23 steps at 2 ranks x 32: evaluations every 6 steps' worth of samples and at
# the epoch ends; checkpoints at the epoch ends.
RUN = ["recipe=digit_images", "algo=adpsgd", "launcher.nprocs=2", "trainer.epochs=2",
       "trainer.eval_every=6", *SMALL_DIGITS_MODEL]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("beside")
    runs = {"beside": ["trainer.eval_in_background=true",
                       "trainer.checkpoint_in_background=true"],
            "met": [],
            # Lockstep learners, whose count is exact: the epoch's evaluation and checkpoint
            # always meet at one count.
            "eval_beside": ["algo=ssgd", "trainer.eval_in_background=true"]}
    for name, overrides in runs.items():
        run_cli([*RUN, *overrides, f"hydra.run.dir={root / name}"], cwd=root)
    # The epoch-1 checkpoint: its evaluation was copied at that meeting, and owed by it.
    first = complete_checkpoints(root / "eval_beside")[0]
    run_cli([*RUN, *runs["eval_beside"], f"resume={first.path}",
             f"hydra.run.dir={root / 'resumed'}"], cwd=root)
    return {name: read_run(root / name) for name in [*runs, "resumed"]}, first, root


def rows(metrics, split="eval"):
    return [row for row in metrics if row["split"] == split]


def test_evaluations_and_checkpoints_beside_training_meet_only_at_the_end(runs):
    (beside, beside_summary), (met, met_summary) = runs[0]["beside"], runs[0]["met"]
    # Every evaluation is there, in order: 7 every 6 steps' worth, 2 at the epoch ends (a
    # count that became exact past two of them scores once: the met run may skip one).
    assert len(rows(beside)) >= 5 and len(rows(met)) >= 5, (rows(beside), rows(met))
    for key in ("step", "samples"):
        assert [row[key] for row in rows(beside)] == sorted(row[key] for row in rows(beside))
    # Beside training the learners meet only for the final evaluation and checkpoint (and
    # again where an estimate ran ahead of the exact count); met, at every milestone.
    assert 2 <= beside_summary["milestones"] <= 6, beside_summary["milestones"]
    assert met_summary["milestones"] >= beside_summary["milestones"] + 5, \
        (met_summary["milestones"], beside_summary["milestones"])
    assert beside_summary["eval_beside_s"] > 0 and met_summary["eval_beside_s"] == 0
    assert beside_summary["status"] == "completed" and beside_summary["top1"] > 80
    # Both epoch-end checkpoints were written beside training, complete, each at the exact
    # count of its cut (the learners' own counts at their captures: the estimates that
    # reached the epoch's end may have run ahead); the run's summary names the last.
    checkpoints = complete_checkpoints(runs[2] / "beside")
    assert len(checkpoints) == 2 and checkpoints[0].samples < checkpoints[-1].samples
    assert checkpoints[-1].samples >= 2 * 1438
    assert beside_summary["checkpoint"] == str(checkpoints[-1].path)


def test_a_copy_scored_beside_training_equals_the_same_models_scored_by_a_meeting(runs):
    """The epoch-1 copy was taken at the checkpoint's meeting: the thread's numbers for it
    and those of the run resumed from that checkpoint, which scores the checkpointed model
    itself first (the checkpoint owed it), agree."""
    (beside, _), (resumed, summary) = runs[0]["eval_beside"], runs[0]["resumed"]
    first = runs[1]
    for split in ("eval",):  # SSGD's replicas are one model
        copied = [row for row in rows(beside, split) if row["step"] == first.step]
        rescored = [row for row in rows(resumed, split) if row["step"] == first.step]
        assert len(copied) == len(rescored) == 1, (copied, rescored)
        for key in ("loss", "top1", "top5", "consensus_distance", "step", "epoch"):
            assert rescored[0][key] == pytest.approx(copied[0][key], rel=1e-6), (split, key)
    # The resumed run's history is the first run's up to the checkpoint, then its own.
    assert [r["step"] for r in rows(resumed)][:len(rows(beside)) // 2] == \
        [r["step"] for r in rows(beside)][:len(rows(beside)) // 2]
    assert summary["status"] == "completed"


@pytest.mark.parametrize("overrides,said", [
    (["trainer.eval_in_backgrond=true"], "did you mean trainer.eval_in_background?"),
    (["trainer.checkpoint_in_backgroud=true"], "did you mean trainer.checkpoint_in_background?"),
    (["algo=ssgd", "trainer.checkpoint_in_background=true"], "only adpsgd, hadpsgd take"),
    (["trainer.checkpoint_in_background=true", "launcher.elastic=true"],
     "an elastic job's learners change under the writing thread"),
    (["trainer.eval_in_background=true", "launcher.elastic=true"],
     "an elastic job's learners change under the evaluation thread's communicator"),
], ids=["eval-typo", "checkpoint-typo", "ssgd", "checkpoint-elastic", "eval-elastic"])
def test_settings_that_cannot_work_end_with_one_line_before_ranks_start(tmp_path, overrides,
                                                                        said):
    proc = run_cli(["recipe=digit_images", "algo=adpsgd", *overrides,
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("adpsgd-run:")]
    assert proc.returncode != 0 and len(errors) == 1 and said in errors[0], proc.stderr
    assert not (tmp_path / "run" / "logs").exists() or not list(
        (tmp_path / "run" / "logs").glob("rank*.log"))
