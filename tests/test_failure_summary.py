"""summary.json of a failed job (runner/runlog/summary.py: write_failure_summary)."""

from __future__ import annotations

import json
import os
import time

import pytest

from runner.commands.compose import compose_all, validate
from runner.errors import UserError
from runner.launch.failure_summary import write_failure_summary
from runner.runlog.records import drop_torn_tail, read_metrics

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


def test_a_job_stopped_at_once_says_what_its_ranks_had_trained_beyond_its_run_dir(tmp_path):
    """A second Ctrl-C before the first evaluation or checkpoint: the run dir shows 0 steps,
    but the ranks' heartbeats (logs/rank<N>.pid: pid, host, global samples, operation) show
    what they had trained, which the summary reports as samples_reached."""
    from runner.commands.run import samples_the_ranks_reached

    session_started(tmp_path)
    (tmp_path / "logs").mkdir()
    for rank, samples in ((0, 5120), (1, 5248), (2, None)):  # rank 2 had not trained yet
        beat = f"{1000 + rank} host" + (f" {samples} step" if samples is not None else "")
        (tmp_path / "logs" / f"rank{rank}.pid").write_text(beat + "\n")
    reached = samples_the_ranks_reached(tmp_path, CFG)
    write_failure_summary(tmp_path, CFG, 130, status="stopped", samples_reached=reached)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["steps"], summary["samples"], summary["samples_reached"]) == (0, 0, 5248)
    assert samples_the_ranks_reached(tmp_path / "nothing", CFG) is None


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


def test_an_append_cut_short_is_left_out_and_the_next_one_starts_its_own_line(tmp_path):
    """A rank killed (or a disk filled) while it appended an evaluation leaves a last line
    without its newline: the failed job's summary still comes out, and the next session's
    writer cuts that line off before it appends."""
    session_started(tmp_path)
    whole = json.dumps({"epoch": 1, "step": 20, "samples": 640, "split": "eval"}) + "\n"
    (tmp_path / "metrics.jsonl").write_text(whole + '{"epoch": 2, "step": 4')
    write_failure_summary(tmp_path, CFG, 137)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["steps"], summary["samples"]) == ("failed", 20, 640)
    assert [r["step"] for r in read_metrics(tmp_path)] == [20]
    drop_torn_tail(tmp_path / "metrics.jsonl")
    assert (tmp_path / "metrics.jsonl").read_text() == whole
    drop_torn_tail(tmp_path / "nothing.jsonl")  # no file: nothing to do


def test_a_damaged_line_inside_metrics_is_named(tmp_path):
    """Not an append cut short (more lines follow it): damage, named with its line, for the
    commands that read the file; the failed job's summary leaves the evaluations out."""
    session_started(tmp_path)
    good = json.dumps({"epoch": 1, "step": 20, "samples": 640, "split": "eval"})
    (tmp_path / "metrics.jsonl").write_text(f"{good}\n{good[:-9]}\x00\n{good}\n")
    with pytest.raises(UserError, match=r"metrics.jsonl line 2 is not a JSON record"):
        read_metrics(tmp_path)
    write_failure_summary(tmp_path, CFG, 1)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["steps"], summary["last_eval"]) == ("failed", 0, None)
