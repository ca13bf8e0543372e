"""Failures of a running job through the real adpsgd-run and mpiexec: a rank killed with
kill -9 (mid-run, or in the middle of a checkpoint write), a non-finite loss, a stop signal to
the launcher; and resuming from what such a job left behind.

The kills use benchmarks/bench_dead_rank.py's function, so the benchmark measures what the tests
check. Times are printed (``-s``), never asserted beyond the issue's 60 s bound on a hang.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from runner.checkpoint.files import complete_checkpoints, load_rank_state
from runner.errors import EXIT_PREEMPTED
from runner.launch.watchdog import rank_operation

from conftest import BIN, REPO, SMALL_DIGITS_MODEL, read_run, run_cli, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

_spec = importlib.util.spec_from_file_location("bench_dead_rank",
                                               REPO / "benchmarks" / "bench_dead_rank.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

DEAD_RANK_BOUND_S = 60  # the bound from a rank's death to the job's exit
# A small, exactly reproducible SSGD job (float64: resumed == uninterrupted bit for bit).
EXACT = ["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.dtype=float64",
         "trainer.batch_size=32", "trainer.progress=false", "trainer.eval_every=10"]


# Every algorithm at 4 ranks (suite time: a 2-rank adpsgd or hadpsgd job is one gossip pair,
# which the 4-rank hadpsgd job's two nodes also are; the 2-rank ssgd kill is what
# `bench_dead_rank.py --quick` runs in tests/test_benchmarks.py, and a 2-rank dasgd job
# reduces as ssgd's does).
KILL_CASES = sorted(case for case in bench.CASES if case[1] == 4)


def reported_its_operation(victim: int):
    """Ready to kill: a checkpoint is complete and the victim's heartbeat has said what it is
    doing (its first such beat comes HEARTBEAT_S into training)."""
    return lambda run_dir: (bench.has_complete_checkpoint(run_dir)
                            and rank_operation(run_dir, victim) is not None)


def failure_events(run_dir: str | Path) -> list[dict]:
    """The events of a failed job, from summary.json; TensorBoard's text panel shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = json.loads((Path(run_dir) / "summary.json").read_text())["events"]
    board = EventAccumulator(str(Path(run_dir) / "tb"), size_guidance={"tensors": 0})
    board.Reload()
    shown = [t.tensor_proto.string_val[0].decode()
             for t in board.Tensors("events/text_summary")]
    for event in events:
        assert shown and f"| {event['event']} | {event['learner']} |" in shown[-1], shown
        # One type for every event's time (an elastic job's membership writes it too).
        assert isinstance(event["time"], float) and event["time"] > 1.7e9, event
    return events


@pytest.mark.parametrize("algo,nprocs", KILL_CASES)
def test_a_killed_rank_ends_the_job_naming_it(tmp_path, algo, nprocs):
    victim, overrides = bench.CASES[(algo, nprocs)]
    result = bench.kill_one_rank(tmp_path, algo, nprocs, victim, overrides,
                                 ready=reported_its_operation(victim))
    stderr = result["stderr"]
    assert result["verdict_s"] is not None, f"rank {victim} was not named:\n{stderr}"
    print(f"{algo} x{nprocs}: killed rank {victim}; named after {result['verdict_s']:.2f} s, "
          f"exit after {result['exit_s']:.2f} s")
    assert result["status"] not in (0, EXIT_PREEMPTED), stderr
    assert result["exit_s"] < DEAD_RANK_BOUND_S, stderr
    assert f"rank {victim} (pid" in stderr and "died without reporting an error" in stderr, \
        stderr
    assert f"--- last lines of {result['run_dir']}/logs/rank{victim}.log ---" in stderr
    assert "resume=auto" in stderr  # how to continue
    assert "Traceback" not in stderr, stderr
    assert "MPI_ERROR field" not in stderr, stderr  # a peer's failed call says what it means
    assert result["leftover_pids"] == [], "orphan rank processes"
    assert result["checkpoint"], "the newest complete checkpoint does not load"
    # The killed rank wrote no exit record: none is left, not a blank one.
    assert (Path(result["run_dir"]) / "logs" / f"rank{victim}.exit").read_bytes() == b""
    # A peer whose call failed on the lost connection before the launcher saw the death is
    # an event of its own, first (the launcher's report prints its line too).
    *peers, event = failure_events(result["run_dir"])
    assert (event["event"], event["learner"]) == ("died", victim), event
    assert [(e["event"], e["learner"] != victim) for e in peers] in ([], [("gave up", True)]), peers
    assert event["host"] and event["operation"].startswith("step "), event


def kill_and_wait(pid: int) -> None:
    """kill -9 and return once the process has ended (however busy the machine), so that
    what is killed next ends after it; at once if it has already gone."""
    try:
        ended = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        signal.pidfd_send_signal(ended, signal.SIGKILL)
        select.select([ended], [], [], 60)  # readable once the process has ended
    except ProcessLookupError:  # it ended between the two calls
        pass
    finally:
        os.close(ended)


def test_ranks_that_die_in_one_wakeup_of_the_launcher_are_told_apart_by_their_order(tmp_path):
    """MPICH ends a job within a millisecond of a rank's death (a peer reading the dead rank's
    memory aborts, and mpiexec kills the rest), and on a busy machine the launcher's watchdog
    wakes to find every rank dead (CI once named rank 0 for a kill of rank 1 so). Held with
    SIGSTOP while rank 1 is killed and then rank 0, the launcher must still name rank 1."""
    run_dir = tmp_path / "run"
    job = subprocess.Popen([str(BIN / "adpsgd-run"), *EXACT, "trainer.epochs=200",
                            "trainer.checkpoint_every=4", f"hydra.run.dir={run_dir}"],
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not reported_its_operation(1)(run_dir):
            assert job.poll() is None and time.monotonic() < deadline, job.stderr.read()
            time.sleep(0.05)
        pids = [int((run_dir / "logs" / f"rank{r}.pid").read_text().split()[0]) for r in (1, 0)]
        job.send_signal(signal.SIGSTOP)
        for pid in pids:  # the dead rank first, then the one the teardown kills
            kill_and_wait(pid)
        job.send_signal(signal.SIGCONT)
        stderr = job.communicate(timeout=DEAD_RANK_BOUND_S)[1]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 128 + signal.SIGKILL, stderr
    assert f"adpsgd-run: rank 1 (pid {pids[0]}) died without reporting an error" in stderr, stderr
    assert "rank 0 (pid" not in stderr, stderr
    assert bench.worker_pids(run_dir) == []


def test_a_failed_mpi_call_names_its_error_class_and_its_likely_cause():
    """The peer of a killed rank often fails first, in a collective, with MPICH's
    MPI_ERR_IN_STATUS, whose own text is "See the MPI_ERROR field in MPI_Status": its line
    says instead what failed and why, and keeps MPI's text where that says something."""
    in_status, other = run_mpi(1, "mpi_failure_line.py").stdout.splitlines()
    for line in (in_status, other):
        assert line.startswith("adpsgd-run: rank 0 gave up: an MPI call failed (MPI_ERR_"), line
        assert "a peer rank died or its connection broke" in line, line
        assert line.endswith("(traceback in /runs/x/logs/rank0.log)"), line
    assert "(MPI_ERR_IN_STATUS)" in in_status and "MPI_ERROR field" not in in_status
    assert "(MPI_ERR_OTHER: " in other


@pytest.mark.parametrize("algo", ["ssgd", "adpsgd"])
def test_a_hung_rank_ends_the_job_through_communication_timeouts(tmp_path, algo):
    """A rank that is alive but silent (SIGSTOP: a hung node) is what the watchdog cannot see:
    its peers' bounded waits end the job, naming the waiting rank and the operation."""
    timeouts = ["comm.timeout_s=5"] + (["algo.timeout_s=5"] if algo == "adpsgd" else [])
    result = bench.kill_one_rank(tmp_path, algo, 2, 1, timeouts, signum=signal.SIGSTOP)
    stderr = result["stderr"]
    print(f"{algo}: rank 1 stopped; job ended after {result['exit_s']:.1f} s")
    assert result["status"] != 0 and result["exit_s"] < DEAD_RANK_BOUND_S, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("adpsgd-run: error:")]
    assert len(errors) == 1, stderr
    # SSGD waits in a collective. AD-PSGD's rank 0 waits either in a gossip exchange with the
    # silent rank (its request, or the model exchange after an answered request, depending on
    # where the stop lands) or, when the stop lands at an evaluation/checkpoint milestone, in
    # that milestone's collective; either way the line names the waiting rank and the
    # operation (it comes from the waiting rank's exit record, runner/launch/watchdog.py).
    collective = "rank 0 of the world communicator (2 ranks)"
    # At an evaluation or checkpoint the ranks also agree on a stop (preemption.py's now()).
    at_milestone = "rank 0: agreement on a stop at a milestone with every rank"
    gossip = [f"participant 0: {phase} with participant 1"
              for phase in ("request", "model exchange")]
    waiting = [collective, at_milestone] + (gossip if algo == "adpsgd" else [])
    assert any(text in errors[0] for text in waiting), errors[0]
    assert "got no answer in 5 s" in errors[0] and "raise comm.timeout_s" in errors[0]
    # The silent rank went down with the job (MPI_Abort): the launcher names it too.
    if "died without reporting" in stderr:
        assert "rank 1 (pid" in stderr and "or hung until rank 0 gave up on it" in stderr
    assert "Traceback" not in stderr
    assert result["leftover_pids"] == [], "the stopped rank was left behind"
    # The waiting rank and the call it waited in; then the silent rank, taken down with it.
    events = failure_events(result["run_dir"])
    assert (events[0]["event"], events[0]["learner"]) == ("gave up", 0), events
    assert any(text in events[0]["cause"] for text in waiting), events
    assert [(e["event"], e["learner"]) for e in events[1:]] in ([], [("died", 1)]), events


def test_a_stopped_rank_with_default_timeouts_ends_the_job_by_its_heartbeat(tmp_path):
    """SIGSTOP of an SSGD rank with the default communication timeouts (900 s): the
    launcher's watchdog misses its heartbeat and ends the job after launcher.stall_timeout_s
    (10 s here; 60 s by default, docs/failures.md), naming it."""
    result = bench.kill_one_rank(tmp_path, "ssgd", 2, 1, ["launcher.stall_timeout_s=10"],
                                 signum=signal.SIGSTOP, ready=reported_its_operation(1))
    stderr = result["stderr"]
    print(f"ssgd: rank 1 stopped; job ended after {result['exit_s']:.1f} s")
    # The stall is counted from the last heartbeat (the pid file's time, untouched since the
    # stop), which came HEARTBEAT_S or more before the stop: more on a loaded machine, where
    # the heartbeat thread waits for a core (the suite once measured 9.2 s).
    last_beat = (Path(result["run_dir"]) / "logs" / "rank1.pid").stat().st_mtime
    before_stop = result["killed_at"] - last_beat
    assert result["status"] != 0 and result["exit_s"] < 30, stderr
    assert result["exit_s"] >= 10 - before_stop - 0.5, (result["exit_s"], before_stop)
    lines = [line for line in stderr.splitlines() if line.startswith("adpsgd-run: ")]
    assert lines[0].startswith(f"adpsgd-run: rank 1 (pid {result['pid']}) stopped responding: "
                               "no heartbeat for 1"), stderr
    assert "Fix: look for the cause in" in lines[0] and "resume=auto" in lines[0]
    assert "Traceback" not in stderr
    assert result["leftover_pids"] == [], "the stopped rank was left behind"
    [event] = failure_events(result["run_dir"])
    assert (event["event"], event["learner"]) == ("stalled", 1), event
    assert event["operation"].startswith("step "), event  # what it did at its last beat


def test_kill_9_of_mpiexec_names_mpiexec(tmp_path):
    result = bench.kill_one_rank(tmp_path, "ssgd", 2, None, [], victim_process="mpiexec")
    stderr = result["stderr"]
    assert result["status"] == 128 + signal.SIGKILL, stderr
    assert f"adpsgd-run: mpiexec (pid {result['pid']}) was killed by signal 9 (SIGKILL) from " \
           "outside" in stderr
    assert "died without reporting" not in stderr and "Traceback" not in stderr
    assert result["leftover_pids"] == []


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, list[str]]:
    """The uninterrupted small SSGD job, 2 epochs, that the checkpoint-write kill resumes to;
    started through an mpiexec that leaves a helper process behind (one job for two tests: a
    job start costs more CPU than its training). Returns its run dir and the helper pids
    found after the job."""
    work = tmp_path_factory.mktemp("uninterrupted")
    wrapper = work / "mpiexec"
    marker = f"sleep {4000 + os.getpid() % 1000}"  # this job's helper, by its command line
    wrapper.write_text(f"#!/bin/bash\n# the job (not a version probe) leaves a helper\n"
                       f"[ \"$1\" = -n ] && {marker} &\nexec {BIN / 'mpiexec'} \"$@\"\n")
    wrapper.chmod(0o755)
    run_dir = work / "run"
    run_cli([*EXACT, "trainer.epochs=2", f"launcher.mpiexec={wrapper}",
             f"hydra.run.dir={run_dir}"], cwd=work)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    return run_dir, left


def test_a_helper_process_that_outlives_mpiexec_is_ended_with_the_job(uninterrupted):
    """An mpiexec that leaves a process of its job behind (Open MPI's prterun outlived an
    elastic job once, childless): the launcher ends mpiexec's whole process group after it,
    so nothing of the job is left."""
    _, left = uninterrupted
    assert left == [], "the helper outlived the job"


@pytest.fixture(scope="module")
def nonfinite_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The SSGD job on 4 ranks whose rank 2 gets a non-finite loss at step 6, checkpointing
    every 4 steps, with restarts allowed; the two tests below read it (one job, not a 4-rank
    and a 2-rank one: each holds for any number of ranks, and all 4 ranks' checkpoints are
    checked where 2 were)."""
    work = tmp_path_factory.mktemp("nonfinite")
    run_dir = work / "run"
    proc = run_cli([*EXACT[:2], "launcher.nprocs=4", *EXACT[3:], "trainer.epochs=2",
                    "trainer.checkpoint_every=4", "faults.nonfinite_loss.ranks=[2]",
                    "faults.nonfinite_loss.steps=[6]", "launcher.max_restarts=2",
                    f"hydra.run.dir={run_dir}"], cwd=work, check=False, timeout=120)
    return proc, run_dir


def test_the_failing_ranks_line_reaches_the_terminal(nonfinite_run):
    """A rank's one-line error used to die with MPI_Abort before mpiexec forwarded it (3 of 4
    NaN runs, so one run catches it coming back most of the time; tests/test_cli.py's failing
    rank is a second): the launcher prints it from the rank's exit record, every time."""
    proc, _ = nonfinite_run
    errors = [line for line in proc.stderr.splitlines() if line.startswith("adpsgd-run: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "non-finite training loss or weights at step 8 on ranks 0, 1, 2, 3" in errors[0]
    assert "(line above)" not in proc.stderr


def final_model(run_dir: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    """The model of the last checkpoint (written at the end of training)."""
    return load_rank_state(complete_checkpoints(run_dir)[-1], rank)["model"]


def writing_a_later_checkpoint(run_dir: Path) -> bool:
    """A checkpoint is complete and rank 1 is inside the write of a later one."""
    complete = {c.path for c in complete_checkpoints(run_dir)}
    return bool(complete) and any(tmp.parent not in complete for tmp in
                                  (run_dir / "checkpoints").glob("samples-*/.rank1.pt.tmp"))


def killed_inside_a_write(tmp_path: Path, algo: str, overrides: list[str],
                          epochs: int) -> tuple[Path, list]:
    """Kill rank 1 (of 2) inside the write of a checkpoint after a complete one; the job
    ends, leaves no process, and the half-written checkpoint has no marker. Returns the run
    dir and its complete checkpoints."""
    result = bench.kill_one_rank(tmp_path, algo, 2, 1, overrides,
                                 ready=writing_a_later_checkpoint, name="killed", epochs=epochs)
    run_dir = Path(result["run_dir"])
    assert result["status"] != 0 and result["leftover_pids"] == [], result["stderr"]
    complete = complete_checkpoints(run_dir)
    half_written = [p for p in (run_dir / "checkpoints").glob("samples-*")
                    if p not in {c.path for c in complete}]
    assert complete and half_written, sorted((run_dir / "checkpoints").rglob("*"))
    assert all(not (p / "COMPLETE").exists() for p in half_written)
    return run_dir, complete


def test_kill_during_a_checkpoint_write_keeps_the_previous_one_and_ssgd_resumes_exactly(
        tmp_path, uninterrupted):
    reference, _ = uninterrupted

    # Every write pauses inside the temporary file: rank 1 is killed in that window.
    slow_writes = [*EXACT[3:], "faults.checkpoint_write_delay_s=1.5"]
    run_dir, complete = killed_inside_a_write(tmp_path, "ssgd", slow_writes, epochs=2)
    for rank in range(2):  # the previous checkpoint loads on every rank
        state = load_rank_state(complete[-1], rank)
        assert all(torch.isfinite(v).all() for v in state["model"].values())

    proc = run_cli([*EXACT, "trainer.epochs=2", "resume=auto", f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path)
    assert f"resuming from {complete[-1].path}" in proc.stdout + proc.stderr
    _, summary = read_run(run_dir)
    assert summary["status"] == "completed"
    resumed, whole = final_model(run_dir), final_model(reference)
    assert resumed.keys() == whole.keys()
    difference = max((resumed[k] - whole[k]).abs().max().item() for k in whole)
    assert difference <= 1e-6, f"resumed SSGD differs from the uninterrupted run by {difference}"
    # The bytes sent before the checkpoint are kept: the resumed run reports the whole run's.
    _, reference_summary = read_run(reference)
    assert summary["bytes_sent"] == reference_summary["bytes_sent"]


def test_kill_during_a_checkpoint_written_beside_training_keeps_the_previous_one(tmp_path):
    """AD-PSGD writes its checkpoints beside training (runner/checkpoint/background.py): a
    rank killed inside the write of a later one leaves the earlier the newest complete one,
    which every rank loads, and resume=auto finishes the run from it. (Its cut is consistent:
    tests/test_resume_mpi.py.)"""
    slow_writes = ["faults.checkpoint_write_delay_s=1.5", "trainer.checkpoint_in_background=true",
                   *SMALL_DIGITS_MODEL]
    run_dir, complete = killed_inside_a_write(tmp_path, "adpsgd", slow_writes, epochs=3)
    for rank in range(2):
        state = load_rank_state(complete[-1], rank)
        assert all(torch.isfinite(x).all() for x in state["algo"]["x"])
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "checkpoint beside training at step" in log, log[-2000:]
    proc = run_cli(["recipe=digit_images", "algo=adpsgd", "launcher.nprocs=2",
                    "trainer.epochs=3", "trainer.checkpoint_every=4", *slow_writes[1:],
                    "resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert f"resuming from {complete[-1].path}" in proc.stdout + proc.stderr
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from"] == str(complete[-1].path)
    assert metrics[-1]["epoch"] >= 3


# Held-out top-1 (%) of uninterrupted runs of the jobs below (docs/RESULTS.md, "Resuming an
# asynchronous run"): mean, standard deviation, range of 18 runs each (seed 0 five times, seeds
# 1-4; once on a quiet machine and once beside 2 busy processes, as make test-loaded runs),
# 2026-11-28. A resumed run must land within 3 standard deviations of the mean (one held-out
# sample is 0.28%). hadpsgd runs at half the recipe's rate: at the recipe's, its own
# uninterrupted runs sometimes lose many points mid-run and end low (80.8% in one of 9 runs of
# 6 epochs under load), and a resumed run that did so failed a loaded suite (91.36%).
UNINTERRUPTED_TOP1 = {"adpsgd": (96.89, 0.53, "95.82-98.05"),
                      "hadpsgd": (94.26, 0.83, "92.20-95.26")}
ASYNC_KILLS = {"adpsgd": (2, 0, []),
               "hadpsgd": (4, 2, ["launcher.procs_per_node=2", "optim.lr=0.2"])}


@pytest.mark.parametrize("algo", sorted(ASYNC_KILLS))
def test_an_asynchronous_run_killed_and_resumed_reaches_the_uninterrupted_accuracy(tmp_path,
                                                                                   algo):
    """kill -9 of a rank right after the first checkpoint, then resume=auto: the run ends at
    the same epochs with a held-out accuracy inside the uninterrupted runs' spread (the
    invariants across a resume are tests/test_resume_mpi.py's)."""
    nprocs, victim, extra = ASYNC_KILLS[algo]
    job = ["trainer.progress=false", "trainer.eval_every=20", *extra]
    result = bench.kill_one_rank(tmp_path, algo, nprocs, victim, job, name="killed", epochs=4)
    run_dir = Path(result["run_dir"])
    assert result["status"] != 0 and result["checkpoint"], result["stderr"]
    run_cli(["recipe=digit_images", f"algo={algo}", f"launcher.nprocs={nprocs}",
             "trainer.epochs=4", *job, "resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from"] == result["checkpoint"]
    last = [m for m in metrics if m["split"] == "eval"][-1]
    # Asynchronous ranks stop once their estimate of the global count passes the budget.
    assert 4 <= last["epoch"] < 4.5, last
    assert_like_uninterrupted(algo, last["top1"], "killed and resumed")


def assert_like_uninterrupted(algo: str, top1: float, how: str) -> None:
    """A held-out top-1 within 3 standard deviations of the uninterrupted runs' mean."""
    mean, sd, spread = UNINTERRUPTED_TOP1[algo]
    print(f"{algo}: {how} top-1 {top1:.2f}% (uninterrupted {spread})")
    assert top1 >= mean - 3 * sd, f"{top1:.2f}% against uninterrupted {spread}"


def test_a_nonfinite_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(
        nonfinite_run):
    """...and is not restarted (a user's error: it would fail again), restarts or not."""
    proc, run_dir = nonfinite_run
    assert proc.returncode == 2, proc.stderr
    assert "restart" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("adpsgd-run: error:")]
    assert len(errors) == 1 and "non-finite training loss" in errors[0], proc.stderr
    assert "Fix: lower optim.lr" in errors[0] and "Traceback" not in proc.stderr
    [checkpoint] = complete_checkpoints(run_dir)  # the step-4 one; none of a poisoned model
    assert checkpoint.step == 4 and str(checkpoint.path) in errors[0]
    for rank in range(4):
        model = load_rank_state(checkpoint, rank)["model"]
        assert all(torch.isfinite(v).all() for v in model.values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_status"] == 2
    assert summary["checkpoint"] == str(checkpoint.path) and summary["restarts"] == []


def test_a_stop_signal_to_the_launcher_checkpoints_exits_75_and_resume_finishes(tmp_path):
    run_dir = tmp_path / "run"
    job = ["recipe=digit_images", "algo=hadpsgd", "launcher.nprocs=4",
           "launcher.procs_per_node=2", "trainer.epochs=3", "trainer.progress=false",
           "faults.delay_s=0.05"]
    launcher = subprocess.Popen([str(BIN / "adpsgd-run"), *job, f"hydra.run.dir={run_dir}"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "metrics.jsonl").exists():  # the first evaluation is logged
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.1)
        os.kill(launcher.pid, signal.SIGUSR1)
        _, stderr = launcher.communicate(timeout=DEAD_RANK_BOUND_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == EXIT_PREEMPTED, stderr
    assert "got SIGUSR1: every rank checkpoints and stops" in stderr
    assert "resume=auto" in stderr
    _, summary = read_run(run_dir)
    stopped_at = complete_checkpoints(run_dir)[-1]
    assert summary["status"] == "preempted" and summary["checkpoint"] == str(stopped_at.path)
    assert stopped_at.nprocs == 4 and stopped_at.epoch < 3
    run_cli([*job, "resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from"] == str(stopped_at.path)
    assert 3 <= metrics[-1]["epoch"] < 3.5 and metrics[-1]["step"] > stopped_at.step
