"""summary.json of a failed job (runner/runlog/summary.py: write_failure_summary)."""

from __future__ import annotations

import json
import os
import time

from runner.config.compose import compose_all, validate
from runner.runlog.summary import write_failure_summary

CFG = validate(compose_all(["recipe=digit_images", "algo=dpsgd", "launcher.nprocs=4"], False,
                           "config")[0])


def session_started(run_dir) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "run.yaml").write_text("{}\n")
    past = time.time() - 60  # the session began a minute ago; what follows is newer
    os.utime(run_dir / ".hydra" / "run.yaml", (past, past))


def test_a_job_that_died_without_a_summary_gets_one_that_says_failed(tmp_path):
    session_started(tmp_path)
    write_failure_summary(tmp_path, CFG, 137)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["exit_status"], summary["nprocs"]) == ("failed", 137, 4)
    assert summary["checkpoint"] is None and summary["last_eval"] is None
    assert (summary["steps"], summary["samples"]) == (0, 0)  # stopped before its first step


def test_a_failed_job_says_how_far_its_run_dir_shows_it_got(tmp_path):
    session_started(tmp_path)
    evals = [{"epoch": e, "step": 20 * e, "samples": 640 * e, "split": "eval", "loss": 1.0}
             for e in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    write_failure_summary(tmp_path, CFG, 137)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["steps"], summary["samples"]) == (40, 1280)
    assert summary["last_eval"]["step"] == 40


def test_ranks_stopped_by_the_runtime_keep_their_summary_but_not_their_status(tmp_path):
    """Open MPI's runtime ends a job that lost a host's daemon with SIGTERM to the ranks left,
    which checkpoint and write status "preempted": the job failed (exit 137), and a script
    reading summary.json must see that, with everything the ranks wrote."""
    session_started(tmp_path)
    written = {"status": "preempted", "algo": "dpsgd", "steps": 12,
               "checkpoint": "checkpoints/samples-0000001438", "learners": [{"rank": 0}]}
    (tmp_path / "summary.json").write_text(json.dumps(written))
    write_failure_summary(tmp_path, CFG, 137)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {**written, "status": "failed", "exit_status": 137}


def test_a_summary_from_an_earlier_session_is_replaced(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "steps": 9}))
    past = time.time() - 120
    os.utime(tmp_path / "summary.json", (past, past))
    session_started(tmp_path)
    write_failure_summary(tmp_path, CFG, 1)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["exit_status"]) == ("failed", 1)
    assert summary["steps"] == 0  # not the 9 of the earlier session
