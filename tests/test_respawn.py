"""Replacements spawned into the running job (launcher.respawn, runner/elastic/respawn.py):
real Open MPI 5 ranks, a learner killed, a new process started by the survivors, which takes
a learner's state and the job ends on as many learners as it was launched with."""

from __future__ import annotations

import json
import os
import re

import pytest
from test_elastic import DIGITS, assert_every_sample_once, assert_spare_4_replaced_learner_2

from conftest import run_cli


def respawned_run(tmp_path, algo: str, *options: str):
    run_dir = tmp_path / "respawned"
    proc = run_cli([*DIGITS, f"algo={algo}", "seed=1", "launcher.respawn=true",
                    "faults.sigkill.ranks=[2]", *options, f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path, timeout=240)
    return proc, run_dir


def assert_4_was_spawned(run_dir, summary: dict) -> None:
    """Learner 4 is a process the survivors started (no spare was launched): its log says
    so, its join counts from the spawn, and its exit record is its own."""
    log = (run_dir / "logs" / "rank4.log").read_text()
    assert "spare 4: waiting to replace a lost learner" in log, log[-2000:]
    survivor_log = (run_dir / "logs" / "rank0.log").read_text()
    assert "respawned learner(s) [4]" in survivor_log, survivor_log[-2000:]
    joined = next(m for m in summary["membership"] if m["event"] == "joined")
    assert joined["host"] == os.uname().nodename and joined["joined_s"] > 0, joined
    assert json.loads((run_dir / "logs" / "rank4.exit").read_text())["status"] == 0


@pytest.mark.mpi
@pytest.mark.slow
def test_a_replacement_is_spawned_for_a_killed_lockstep_learner_and_the_job_ends_on_4(
        tmp_path):
    """D-PSGD on 4, learner 2 killed at step 10: the 3 survivors start learner 4, which
    builds its trainer while they train and joins at the next step they agree on, with a
    survivor's model and optimizer and its share of the rest of the pass: every sample of
    each epoch is used once, and the job learns."""
    # 4 epochs of slowed steps (the survivors sleep, the replacement gets the cores): time
    # for it to start even on a busy machine.
    proc, run_dir = respawned_run(tmp_path, "dpsgd", "faults.sigkill.step=10",
                                  "trainer.epochs=4", "faults.delay_s=0.3")
    # The survivors train on while it starts: it joins some steps after the loss.
    joined_at = re.search(r"learner 4 \(.*\) joined at ([\d,]+) samples", proc.stderr)
    assert joined_at and int(joined_at[1].replace(",", "")) > 1152, proc.stderr[-3000:]
    history, summary = assert_spare_4_replaced_learner_2(proc, run_dir, "1,152", joined_at[1])
    assert_4_was_spawned(run_dir, summary)
    assert_every_sample_once(summary, epochs=4)
    assert summary["top1"] > 70, history


@pytest.mark.mpi
@pytest.mark.slow
def test_a_replacement_is_spawned_for_a_killed_asynchronous_learner(tmp_path):
    """AD-PSGD: learner 2 killed at its step 5; the survivors spawn learner 4 in the
    recovery and it joins there (asynchronous learners meet nowhere else), from the
    survivors' mean, with what learner 2 had still to train of its pass."""
    proc, run_dir = respawned_run(tmp_path, "adpsgd", "faults.sigkill.step=5",
                                  "launcher.min_learners=4", "faults.delay_s=0.2")
    history, summary = assert_spare_4_replaced_learner_2(proc, run_dir)  # at the loss
    assert_4_was_spawned(run_dir, summary)
    # It learns (chance: 10 %). Its 25 asynchronous steps end anywhere from 57 % (a loaded
    # suite, 2026-12-04) to 92 % (79.7-92.5 in 7 runs alone, quiet or beside 2 busy loops).
    assert summary["top1"] > 45, history


@pytest.mark.mpi
@pytest.mark.slow
def test_a_replacement_that_cannot_be_started_is_one_line_and_the_job_goes_on(tmp_path):
    """MPI_Comm_spawn fails (faults.respawn_fails: the program to start does not exist): one
    line names it, the job goes on and completes on the 3 survivors, and it is not tried
    again."""
    proc, run_dir = respawned_run(tmp_path, "dpsgd", "faults.sigkill.step=10",
                                  "faults.respawn_fails=true", "trainer.epochs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "could not be started" in line]
    assert len(said) == 1 and re.fullmatch(
        r"adpsgd-run: 1 replacement learner\(s\) could not be started \(MPI_Comm_spawn "
        r"failed: .+\): 3 learner\(s\) go on", said[0]), proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["learners_at_end"] == 3, summary
    assert [(m["event"], m["learner"]) for m in summary["membership"]] == [("lost", 2)]
    events = [json.loads(line) for line in (run_dir / "logs" / "events.jsonl").open()]
    assert [e["event"] for e in events if "respawn" in e["event"]] == ["respawn failed"]
    assert_every_sample_once(summary, epochs=2)
