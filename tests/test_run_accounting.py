"""What a run reports about itself at its edges: a stop signal that comes too late to act on,
evaluations due several at once, and the throughput of a run resumed on fewer ranks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from conftest import BIN, read_run, run_cli

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def test_a_stop_signal_after_the_last_check_says_the_run_completed(tmp_path):
    """SIGTERM once the final evaluation is being written: no preemption check is left, the
    run completes, and adpsgd-run says so instead of promising a stop it cannot make."""
    run_dir = tmp_path / "run"
    # One epoch: its checkpoint is the final one (an earlier one would only add a delayed write).
    job = ["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.epochs=1",
           "trainer.progress=false", "faults.checkpoint_write_delay_s=1.0"]
    launcher = subprocess.Popen([str(BIN / "adpsgd-run"), *job, f"hydra.run.dir={run_dir}"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        deadline = time.monotonic() + 300
        final = run_dir / "checkpoints" / "samples-0000001438"  # the budget: 1 x 1,438
        while not list(final.glob(".rank*.pt.tmp")):  # the last checkpoint is being written
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.02)
        os.kill(launcher.pid, signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, stderr
    assert "got SIGTERM: every rank checkpoints and stops" in stderr
    assert ("adpsgd-run: the run completed before the stop (SIGTERM) took effect: it is "
            "finished, nothing to resume") in stderr
    _, summary = read_run(run_dir)
    assert summary["status"] == "completed"


def test_evaluations_due_at_once_give_one_row(tmp_path):
    """AD-PSGD with an evaluation every step: an exact count that passed several evaluation
    points scores the model once, not once per point."""
    run_dir = tmp_path / "run"
    run_cli(["recipe=digit_images", "algo=adpsgd", "launcher.nprocs=4", "trainer.epochs=2",
             "trainer.eval_every=1", "trainer.progress=false", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path, timeout=300)
    metrics, summary = read_run(run_dir)
    evals = [(m["samples"], m["split"]) for m in metrics]
    assert len(evals) == len(set(evals)), "the same evaluation twice"
    assert summary["status"] == "completed" and metrics[-1]["epoch"] >= 2


def test_a_resumed_run_on_fewer_ranks_counts_the_earlier_sessions_time(tmp_path):
    """resume=auto with another launcher.nprocs starts every rank from the mean of the
    checkpoint's states at its sample count (runner/checkpoint/resize.py): samples/s must count the
    time those samples took, not this session's alone (41,825 samples/s was reported before)."""
    run_dir = tmp_path / "run"
    job = ["recipe=digit_images", "algo=dpsgd", "trainer.progress=false"]
    # 3 ranks, not 4: a rank fewer to start (its imports cost more than the 4 epochs' training).
    run_cli([*job, "launcher.nprocs=3", "trainer.epochs=4", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path, timeout=300)
    _, first = read_run(run_dir)
    proc = run_cli([*job, "launcher.nprocs=2", "trainer.epochs=5", "resume=auto",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    assert "written by 3 ranks, so 2 start from the mean of their states" in proc.stdout, \
        proc.stdout
    _, resumed = read_run(run_dir)
    assert resumed["status"] == "completed" and resumed["train_s"] > first["train_s"]
    assert resumed["nprocs"] == 2 and resumed["samples"] == 5 * 1438
    # 4 of 5 epochs were trained at the first session's pace: the whole run's rate is close
    # to it, never the 5x that dividing all samples by the last epoch's time gives.
    ratio = resumed["samples_per_s"] / first["samples_per_s"]
    print(f"samples/s: first session {first['samples_per_s']:.0f}, after the resume on 2 ranks "
          f"{resumed['samples_per_s']:.0f} (ratio {ratio:.2f})")
    assert 0.4 < ratio < 2.0, ratio


def test_asynchronous_runs_end_at_their_budget_and_evaluate_near_epoch_ends(tmp_path):
    """AD-PSGD's estimate of the global count extrapolates every learner's last reported
    progress at its rate (runner/comm/global_clock.py), and the final evaluation waits until the
    exact count has reached the budget: runs end at or just past it (before: 3.17-3.35 epochs
    for 3 on these 4 ranks, and the first evaluation at 1.13-1.24)."""
    for seed in range(2):
        run_dir = tmp_path / f"run{seed}"
        run_cli(["recipe=digit_images", "algo=adpsgd", "launcher.nprocs=4", "trainer.epochs=3",
                 f"seed={seed}", "trainer.progress=false", f"hydra.run.dir={run_dir}"],
                cwd=tmp_path, timeout=300)
        metrics, _ = read_run(run_dir)
        epochs = [m["epoch"] for m in metrics if m["split"] == "eval"]
        print(f"seed {seed}: evaluations at epochs {epochs}")
        assert 3 <= epochs[-1] < 3.15, epochs
        # One meeting per epoch end: its checkpoint is taken where its evaluation was, at
        # the count agreed there, even one short of the epoch end (a second meeting a few
        # steps later quiesced the gossip again: runner/trainer/meetings.py).
        log = (run_dir / "logs" / "rank0.log").read_text()
        evaluated = {int(s) for s in re.findall(r"evaluating at step \d+ \((\d+) samples", log)}
        checkpointed = [int(s) for s in re.findall(r"checkpoint \(scheduled\) at step \d+: "
                                                   r"\S*samples-(\d+)", log)]
        assert len(checkpointed) == 3 and set(checkpointed) <= evaluated, \
            (checkpointed, sorted(evaluated))
