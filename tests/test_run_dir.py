"""A run dir belongs to one run and one job (runner/launch/run_dir.py), and a job whose
launcher is gone stops: through the real adpsgd-run, mpiexec and ranks."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from runner.checkpoint.files import complete_checkpoints

from conftest import BIN, read_run, run_cli, wait_for

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

JOB = ["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.progress=false"]


def fingerprint(run_dir: Path) -> dict[str, str]:
    """Every file of a run dir and its content's hash."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def start(tmp_path: Path, run_dir: Path, overrides: list[str], job: list[str] = JOB
          ) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "adpsgd-run"), *job, *overrides,
                             f"hydra.run.dir={run_dir}"], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def workers(run_dir: Path, exactly: bool = False) -> list[str]:
    """The job's processes of runner.worker (not mpiexec, whose command line holds theirs):
    the ranks, and with warm start the rank factory and its forks, which carry its command
    line (``... RUN_DIR --rank-factory``). ``exactly``: the ranks as mpiexec started them."""
    end = "$" if exactly else ""
    return subprocess.run(["pgrep", "-f", f"^\\S*python\\S* -m runner.worker {run_dir}{end}"],
                          capture_output=True, text=True).stdout.split()


def test_a_fresh_start_in_another_runs_dir_is_refused_and_touches_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_cli([*JOB, "trainer.epochs=1", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    before = fingerprint(run_dir)
    proc = run_cli([*JOB, "trainer.epochs=2", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                   check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"adpsgd-run: error: hydra.run.dir: {run_dir} holds another run's "
                     "checkpoints (newest: samples-0000001438); a fresh start there would mix "
                     "the two runs. Fix: continue that run with resume=auto, or choose another "
                     "hydra.run.dir"], proc.stderr
    assert fingerprint(run_dir) == before  # .hydra/ included: nothing of the old run changed
    # The same command with resume=auto continues it.
    run_cli([*JOB, "trainer.epochs=2", "resume=auto", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path)
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed" and metrics[-1]["epoch"] >= 2


def test_a_killed_launcher_stops_its_ranks_and_the_dir_has_one_job(tmp_path):
    """kill -9 of adpsgd-run: its ranks notice, checkpoint and stop within seconds; while
    they still run, a second job in the same dir is refused with one line naming the first;
    afterwards resume=auto continues. The job shows its progress, as by default: rank 0's
    last progress line, passed on by an mpiexec whose reader is gone, once killed mpiexec
    and the ranks with it before they wrote summary.json."""
    run_dir = tmp_path / "run"
    with_progress = [word for word in JOB if not word.startswith("trainer.progress=")]
    first = start(tmp_path, run_dir, ["trainer.epochs=300", "trainer.checkpoint_every=50",
                                      "faults.delay_s=0.2"],
                  with_progress)
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").exists(), "the first job never evaluated")
        assert len(workers(run_dir, exactly=True)) == 2
        second = run_cli([*JOB, "trainer.epochs=300", "resume=auto",
                          f"hydra.run.dir={run_dir}"], cwd=tmp_path, check=False, timeout=60)
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert lines[0].startswith(f"adpsgd-run: error: hydra.run.dir: {run_dir} is in use by "
                                   f"the job of adpsgd-run pid {first.pid} on ")
        assert "Fix: wait for that job to end" in lines[0]
        os.kill(first.pid, signal.SIGKILL)  # the launcher alone
        killed = time.monotonic()
        wait_for(lambda: not workers(run_dir), "the orphaned ranks kept running", 60)
        stopped_s = time.monotonic() - killed
    finally:
        for pid in workers(run_dir):
            os.kill(int(pid), signal.SIGKILL)
        first.kill()
    print(f"ranks stopped {stopped_s:.1f} s after their launcher was killed")
    assert stopped_s < 30
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped"
    newest = complete_checkpoints(run_dir)[-1]
    # The stop's own checkpoint, or the scheduled one it came right after (the same state).
    assert summary["checkpoint"] == str(newest.path) and newest.step == summary["steps"]
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"adpsgd-run (pid {first.pid}), which started this job, is gone" in log
    # Nothing holds the dir any more: the run continues.
    run_cli([*JOB, f"trainer.epochs={int(newest.epoch) + 2}", "resume=auto",
             f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    _, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from"] == str(newest.path)


STUCK_RANK = """
import sys, time
from pathlib import Path
from runner.runlog.liveness import write_pid_file
from runner.rank import launcher_gone

run_dir = Path(sys.argv[1])
write_pid_file(run_dir, 0)
launcher_gone(12345, sys.stdout, run_dir, 0)
time.sleep(120)  # as a call to a lost peer that never returns: the stop never comes
"""


def test_a_rank_that_cannot_stop_after_its_launcher_died_leaves_after_comm_timeout(tmp_path):
    """A rank whose launcher died asks itself to stop; if a call to a lost peer never
    returns (a ULFM shrink waiting on a survivor that aborted was seen), the stop never
    comes: comm.timeout_s later the rank leaves with its exit record saying why, instead of
    staying for good."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "run.yaml").write_text("comm:\n  timeout_s: 1.5\n")
    proc = subprocess.run([str(BIN / "python"), "-c", STUCK_RANK, str(run_dir)],
                          capture_output=True, text=True, timeout=60)  # not the stuck 120 s
    record = json.loads((run_dir / "logs" / "rank0.exit").read_text())
    assert proc.returncode == 3 and record["status"] == 3, (proc.stdout, proc.stderr, record)
    assert record["message"] == (
        "rank 0 could not checkpoint and stop within comm.timeout_s=1.5 s of its launcher's "
        "end (a call to a lost peer never returned): it left without a checkpoint; "
        "resume=auto continues from the last complete one")
