"""The restart policy (runner/launch/restart_policy.py) on its own: which failures are retried, the
line each decision prints, the record it keeps (tests/test_restarts.py runs it with real
ranks)."""

import json

from runner.launch.restart_policy import JobFailure, Restarts
from runner.runlog.failure_events import read_events
from runner.runlog.records import read_restarts


def lost_rank(cause: str = "rank 1 died without reporting an error") -> JobFailure:
    return JobFailure(cause, True, 1000.0, lambda: None)


def test_a_lost_rank_restarts_until_none_are_left_and_is_recorded(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("{}\n")  # the failed attempt's, with no checkpoint
    restarts = Restarts(tmp_path, 2)
    assert restarts.decide(lost_rank("rank 1 died"), [120, None])
    assert restarts.decide(lost_rank("rank 0 died"), [None, None])
    assert not restarts.decide(lost_rank("rank 1 died"), [300, 310])
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("adpsgd-run: restart 1 of 2: rank 1 died; starting over: no checkpoint was "
                      "complete, 120 samples lost")
    assert err[1].endswith("samples lost unknown")
    assert err[2] == ("adpsgd-run: not restarting: the run has used all 2 of its restarts "
                      "(launcher.max_restarts=2 counts them across the run's jobs; "
                      "logs/restarts.json lists them)")
    assert not (tmp_path / "metrics.jsonl").exists()  # a start over reads no stale results
    records = read_restarts(tmp_path)
    assert [r["cause"] for r in records] == ["rank 1 died", "rank 0 died"]
    assert records[0]["at_samples"] == 120 and records[0]["resumed_from_samples"] == 0
    assert records[0]["failed_at"] == 1000.0 and records[0]["seconds_down"] is None


def test_the_same_failure_without_a_newer_checkpoint_is_not_retried(tmp_path, capsys):
    restarts = Restarts(tmp_path, 3)
    assert restarts.decide(lost_rank(), [64, 64])
    assert not Restarts(tmp_path, 3).decide(lost_rank(), [64, 64])  # also across launchers
    assert "the failure repeats at the same point" in capsys.readouterr().err
    assert len(read_restarts(tmp_path)) == 1


def test_users_errors_and_no_restarts_are_never_retried(tmp_path, capsys):
    error = JobFailure("error: non-finite training loss", False, 0.0, lambda: None)
    assert not Restarts(tmp_path, 3).decide(error, [10])
    assert not Restarts(tmp_path, 0).decide(lost_rank(), [10])
    assert capsys.readouterr().err == "" and read_restarts(tmp_path) == []


def test_a_damaged_record_is_named_and_the_run_goes_on(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "restarts.json").write_text('{"restarts": [{"cause": "x"')
    assert Restarts(tmp_path, 1).decide(lost_rank(), [5])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"adpsgd-run: warning: {tmp_path}/logs/restarts.json is "
                             "unreadable (") and err[0].endswith("earlier restarts are not kept")
    assert len(json.loads((tmp_path / "logs" / "restarts.json").read_text())["restarts"]) == 1


def test_a_job_that_failed_before_its_first_heartbeat_is_placed_by_its_last_evaluation(
        tmp_path, capsys):
    """No rank had reported its samples (heartbeats come seconds apart): the failure's event
    and the restart's record take how far the job got from its run dir, not null."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"epoch": 1, "step": 5, "samples": 640, "split": "eval"}) + "\n")
    failure = lost_rank()
    failure.record(tmp_path, [None, None])
    assert [e["at_samples"] for e in read_events(tmp_path)] == [640]
    assert Restarts(tmp_path, 1).decide(failure, [None, None])
    assert capsys.readouterr().err.endswith("no checkpoint was complete, 640 samples lost\n")
    assert read_restarts(tmp_path)[0]["at_samples"] == 640


def test_max_restarts_counts_the_restarts_of_the_whole_run(tmp_path, capsys):
    """A later job of the same run (resume=auto, a requeue) starts with the restarts its run
    has had: launcher.max_restarts limits the run, and the line counts on."""
    assert Restarts(tmp_path, 2).decide(lost_rank("rank 1 died"), [64, 64])
    later = Restarts(tmp_path, 2)  # the next job of the run
    assert later.taken == 1
    assert later.decide(lost_rank("rank 0 died"), [128, 128])
    assert not Restarts(tmp_path, 2).decide(lost_rank("rank 1 died"), [192, 192])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("adpsgd-run: restart 1 of 2: rank 1 died")
    assert err[1].startswith("adpsgd-run: restart 2 of 2: rank 0 died")
    assert "has used all 2 of its restarts" in err[2]
    assert len(read_restarts(tmp_path)) == 2
