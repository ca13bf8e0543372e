"""A sweep stopped with Ctrl-C continues with resume=auto (runner/commands/sweep_plan.py and
run.py): a 6-job sweep (2 algorithms x 3 seeds, digit_images simulated on 4 learners) is
interrupted while one of its jobs trains; ``launcher.dry_run=true`` lists what the same
command with resume=auto would do and starts nothing; the continued sweep skips the completed
jobs with one line each, resumes the stopped one from its newest checkpoint and runs the
rest, so that every job ends completed, none trained twice from scratch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from runner.checkpoint.files import complete_checkpoints

from conftest import BIN, run_cli

pytestmark = pytest.mark.slow
ALGOS, SEEDS = ("dpsgd", "adpsgd"), (1, 2, 3)


def sweep_args(sweep_dir) -> list[str]:
    return ["-m", "recipe=digit_images", f"algo={','.join(ALGOS)}",
            f"seed={','.join(map(str, SEEDS))}", "launcher=sim", "launcher.nprocs=4",
            "trainer.epochs=6", "trainer.checkpoint_every=5", "trainer.progress=false",
            f"hydra.sweep.dir={sweep_dir}"]


def job_dirs(sweep_dir) -> dict[int, object]:
    return {int(d.name.split("-", 1)[0]): d for d in sweep_dir.iterdir() if d.is_dir()}


def status(run_dir) -> str | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text())["status"] if path.exists() else None


def state(run_dir) -> dict:
    summary = run_dir / "summary.json"
    return {"status": status(run_dir), "evaluated": bool(rows(run_dir)),
            "checkpoint": bool(complete_checkpoints(run_dir)),
            "summary": summary.read_text() if summary.exists() else None}


def rows(run_dir) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.open()] if path.exists() else []


def interrupt_mid_sweep(sweep_dir, cwd) -> subprocess.CompletedProcess:
    """Ctrl-C (SIGINT to the command's process group, as a terminal sends it) once job 1 has
    evaluated: it or a later job is then training."""
    proc = subprocess.Popen([str(BIN / "adpsgd-run"), *sweep_args(sweep_dir)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 240

    def a_later_job_evaluated() -> bool:
        return sweep_dir.is_dir() and any(rows(d) for n, d in job_dirs(sweep_dir).items()
                                          if n >= 1)

    while not a_later_job_evaluated():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """The sweep dir after the Ctrl-C (a copy is kept as it was), the stop's output, and the
    dry run's."""
    root = tmp_path_factory.mktemp("sweep_resume")
    sweep_dir = root / "sweep"
    stop = interrupt_mid_sweep(sweep_dir, root)
    before = {n: state(d) for n, d in job_dirs(sweep_dir).items()}
    dry = run_cli([*sweep_args(sweep_dir), "resume=auto", "launcher.dry_run=true"], cwd=root)
    return sweep_dir, stop, before, dry


def test_ctrl_c_stops_the_sweep_in_one_job_and_says_how_to_continue_it(interrupted):
    sweep_dir, stop, before, _ = interrupted
    assert stop.returncode == 130, stop.stderr[-3000:]
    completed = [n for n, job in before.items() if job["status"] == "completed"]
    assert completed == list(range(len(completed))) and 1 <= len(completed) < 6, before
    assert "to continue the sweep, run the same command with resume=auto" in stop.stderr, \
        stop.stderr[-3000:]


def test_the_dry_run_lists_every_job_and_starts_none(interrupted):
    sweep_dir, _, before, dry = interrupted
    lines = [line for line in dry.stdout.splitlines() if line.startswith("adpsgd-run: job ")]
    assert len(lines) == 6, dry.stdout
    expected = []
    for num in range(6):
        job = before.get(num, {"status": None, "evaluated": False, "checkpoint": False})
        expected.append("skip" if job["status"] == "completed" else
                        "resume" if job["checkpoint"] else
                        "start over" if job["evaluated"] else "run")
    verdicts = [re.match(r"adpsgd-run: job (\d+) (\S+): (skip|resume|start over|run) ", line)
                for line in lines]
    assert all(verdicts), lines
    assert [int(v.group(1)) for v in verdicts] == list(range(6)), lines
    assert [v.group(3) for v in verdicts] == expected, (lines, before)
    assert [v.group(2) for v in verdicts] == [f"algo={a},seed={s}" for a in ALGOS
                                              for s in SEEDS], lines
    assert "resume" in expected and "run" in expected, (expected, before)  # a mid-way stop
    assert dry.stdout.rstrip().endswith("nothing started; " + ", ".join(
        f"{expected.count(v)} {v}" for v in ("run", "resume", "start over", "skip")
        if expected.count(v))), dry.stdout
    # nothing was written: the jobs never started have no dir, the others are as they were
    assert {n: state(d) for n, d in job_dirs(sweep_dir).items()} == before


@pytest.fixture(scope="module")
def continued(interrupted):
    sweep_dir, _, before, _ = interrupted
    return sweep_dir, before, run_cli([*sweep_args(sweep_dir), "resume=auto"],
                                      cwd=sweep_dir.parent, timeout=600)


def test_the_continued_sweep_completes_every_job_once(continued):
    sweep_dir, before, proc = continued
    dirs = job_dirs(sweep_dir)
    assert sorted(dirs) == list(range(6)) and all(status(d) == "completed"
                                                  for d in dirs.values()), proc.stderr[-3000:]
    skipped = re.findall(r"^adpsgd-run: skipped, completed: (\S+) has trained", proc.stdout,
                         flags=re.M)
    completed = [n for n, job in before.items() if job["status"] == "completed"]
    assert skipped == [str(dirs[n]) for n in completed], proc.stdout[-3000:]
    for num, run_dir in dirs.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        if num in completed:  # untouched
            assert (run_dir / "summary.json").read_text() == before[num]["summary"]
            continue
        samples = [r["samples"] for r in rows(run_dir) if r["split"] == "eval"]
        # one evaluation per epoch, in one pass over the run: a second start from scratch
        # would count from 0 again (asynchronous counts run a little past an epoch's end)
        assert samples == sorted(set(samples)) and len(samples) == 6, (num, samples)
        assert samples[-1] >= 6 * 1438, (num, samples)
        if before.get(num, {}).get("checkpoint"):  # stopped: on from its newest checkpoint
            assert summary.get("resumed_from"), (num, summary)
            assert f"resuming from {run_dir / 'checkpoints'}" in proc.stdout, proc.stdout
        else:
            assert not summary.get("resumed_from"), (num, summary)


def test_a_mistyped_dry_run_key_is_one_line_with_a_suggestion(tmp_path):
    proc = run_cli(["-m", "recipe=digit_images", "algo=dpsgd,adpsgd", "launcher=sim",
                    "launcher.dryrun=true", f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path,
                   check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "did you mean launcher.dry_run" in proc.stderr, proc.stderr
