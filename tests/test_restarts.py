"""launcher.max_restarts through the real adpsgd-run and mpiexec: a job that loses a rank is
started again from its newest complete checkpoint and the run completes as one; a crash that
comes back at the same step, and a user's error, are not retried."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_dead_rank import EXACT, assert_like_uninterrupted, bench

from runner.checkpoint.files import complete_checkpoints
from runner.runlog.summary import results_table

from conftest import BIN, read_run, run_cli

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def test_a_rank_killed_mid_epoch_is_restarted_and_the_run_completes(tmp_path):
    """kill -9 of rank 0 of an AD-PSGD job after its first checkpoint, max_restarts=2: one
    restart, the run completes at its epochs with the uninterrupted runs' accuracy, and
    metrics.jsonl holds each evaluation once."""
    job = ["trainer.progress=false", "trainer.eval_every=20", "launcher.max_restarts=2"]
    result = bench.kill_one_rank(tmp_path, "adpsgd", 2, 0, job, name="restarted", epochs=4)
    stderr = result["stderr"]
    assert result["status"] == 0, stderr
    lines = [line for line in stderr.splitlines() if "restart" in line]
    assert len(lines) == 1, stderr
    assert re.fullmatch(r"adpsgd-run: restart 1 of 2: rank 0 (was killed by signal 9 \(SIGKILL\)"
                        r"|died without reporting an error); continuing from \S+ \(\d+ samples\), "
                        r"(\d+ samples lost|samples lost unknown)", lines[0]), lines[0]
    metrics, summary = read_run(Path(result["run_dir"]))
    assert summary["status"] == "completed", summary
    [restart] = summary["restarts"]
    assert restart["cause"].startswith("rank 0 ") and restart["seconds_down"] > 0, restart
    assert restart["resumed_from_samples"] > 0
    assert restart["at_samples"] is None or restart["at_samples"] >= \
        restart["resumed_from_samples"]
    evals = [m for m in metrics if m["split"] == "eval"]
    assert len({m["step"] for m in evals}) == len(evals), "an evaluation was written twice"
    last = evals[-1]
    assert 4 <= last["epoch"] < 4.5, last
    print(f"restart: {restart}")
    assert_like_uninterrupted("adpsgd", last["top1"], "restarted")
    assert result["leftover_pids"] == []
    # What the console's last lines say of it (adpsgd-run prints this table at the end).
    assert re.search(r"samples/s, status completed \(1 restart\), run dir ",
                     results_table(result["run_dir"])), results_table(result["run_dir"])


def test_the_same_crash_at_the_same_step_stops_after_the_second_with_its_cause(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli([*EXACT, "trainer.epochs=2", "trainer.checkpoint_every=4",
                    "launcher.max_restarts=2", "faults.sigkill.ranks=[1]",
                    "faults.sigkill.step=30", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                   check=False, timeout=300)
    assert proc.returncode == 137, proc.stderr
    stderr = proc.stderr
    assert stderr.count("restart 1 of 2: rank 1 ") == 1 and "restart 2 of 2" not in stderr
    assert "the failure repeats at the same point" in stderr, stderr
    cause = [line for line in stderr.splitlines() if "died without reporting" in line
             and "Fix:" in line]
    assert len(cause) == 1 and cause[0].startswith("adpsgd-run: rank 1 (pid "), stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and len(summary["restarts"]) == 1, summary


def test_a_restart_past_a_damaged_checkpoint_records_the_one_it_continued_from(tmp_path):
    """The newest checkpoint changed after it was complete (a flipped byte), then a rank is
    killed: the restart continues from the intact one before it, as resume=auto loads, and
    its line and summary.restarts say so (they once named the damaged one, "0 samples
    lost"); metrics.jsonl still holds each evaluation once."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(BIN / "adpsgd-run"), *EXACT, "trainer.epochs=4",
                             "launcher.max_restarts=1", "faults.delay_s=0.1",
                             f"hydra.run.dir={run_dir}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 240
    while len(checkpoints := complete_checkpoints(run_dir)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    older, newest = checkpoints[-2:]
    damaged = newest.rank_file(0)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    os.kill(int((run_dir / "logs" / "rank1.pid").read_text().split()[0]), signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    [line] = [line for line in stderr.splitlines() if "restart 1 of 1" in line]
    assert (f"continuing from {older.path} ({older.samples} samples) ({newest.path.name} "
            "damaged)") in line, line
    metrics, summary = read_run(run_dir)
    [restart] = summary["restarts"]
    assert restart["resumed_from_samples"] == older.samples, restart
    assert summary["status"] == "completed" and summary["resumed_from"] == str(older.path)
    evaluations = [(row["epoch"], row["split"]) for row in metrics]
    assert len(evaluations) == len(set(evaluations)) and len(evaluations) >= 4, evaluations
