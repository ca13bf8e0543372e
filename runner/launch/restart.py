"""``python -m runner.launch.restart RUN_DIR``: the steps of a batch job's script around its
ranks (runner/launch/slurm.py writes the script).

Before the ranks start: a job that runs again in the same run dir (SLURM requeued it after a
preemption or its time limit's warning, or the user resubmitted its job.sbatch) continues from
the newest complete checkpoint (``resume=auto`` in run.yaml once the run dir holds one); on the
first start ``resume`` stays what the user asked for.

While they run (``--watch-step PID``): the job step (srun or mpiexec) normally ends with its
ranks, but not when the machinery between them is lost. A ``kill -9`` of a node's slurmstepd
leaves srun waiting for a step that can no longer report, for minutes, while its ranks run on
or have already ended. The watcher ends the step when every rank has left its exit record and
the step still runs ``STEP_LINGER_S`` later, or when a rank's heartbeat has stopped for
``launcher.stall_timeout_s`` without an exit record (the ranks died with their stepd, or hang).
It kills the step's launcher, cancels the job's steps that SLURM still lists and the rank
processes left on this host, and says why in one line.

After the step: ``--step-status STATUS`` prints the status the ranks reported when every one
of them reported the same (what a lost srun's own status hides), else STATUS. After the ranks
failed (``--after-failure STATUS``): whether to start them again in the allocation
(``launcher.max_restarts``, runner/launch/restarts.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from ..checkpoint.files import complete_checkpoints
from ..worker import RUN_CONFIG
from .restarts import CHECKPOINTS, Restarts, failure_of_batch_step, has_checkpoint, prepare_restart
from .watchdog import (
    HEARTBEAT_S,
    clear_rank_files,
    empty_blank_exit_records,
    exit_statuses,
    heartbeat_age,
    process_alive,
    rank_pid,
    ranks_progress,
)

STEP_LINGER_S = 20.0  # a step still running this long after every rank ended is lost


def step_problem(run_dir: Path, nprocs: int, stall_s: float, ended_since: float | None,
                 now: float, statuses: dict[int, int | None] | None = None) -> str | None:
    """Why the running step must be ended now, or None (see the module docstring);
    ``statuses``: the ranks' exit statuses, if the caller has just read them."""
    if statuses is None:
        statuses = exit_statuses(run_dir, nprocs)
    if None not in statuses.values():
        if ended_since is not None and now - ended_since >= STEP_LINGER_S:
            return (f"every rank ended {now - ended_since:.0f} s ago but the job step did not "
                    "(its slurmstepd or a proxy was lost)")
        return None
    if stall_s:
        silent = {rank: age for rank in range(nprocs) if statuses[rank] is None
                  and (age := heartbeat_age(run_dir, rank, now)) is not None and age > stall_s}
        if silent:
            rank = max(silent, key=silent.get)
            return (f"rank {rank} stopped responding: no heartbeat for {silent[rank]:.0f} s "
                    f"(launcher.stall_timeout_s={stall_s:g}; its node or slurmstepd lost?)")
    return None


def watch_step(run_dir: Path, step_pid: int, nprocs: int, stall_s: float,
               poll_s: float = HEARTBEAT_S / 2) -> None:
    """Watch the job step ``step_pid`` until it ends; end it if it is lost."""
    ended_since = None
    while process_alive(step_pid):
        now = time.time()
        statuses = exit_statuses(run_dir, nprocs)
        if ended_since is None and None not in statuses.values():
            ended_since = now
        problem = step_problem(run_dir, nprocs, stall_s, ended_since, now, statuses)
        if problem:
            print(f"adpsgd: {problem}: ending the step", flush=True)
            end_step(run_dir, step_pid, nprocs)
            return
        time.sleep(poll_s)


def end_step(run_dir: Path, step_pid: int, nprocs: int) -> None:
    """Kill the step's launcher, cancel the steps SLURM still lists for this job (a stale one
    would hold the next step's CPUs) and the rank processes left on this host."""
    kill(step_pid)
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        listed = subprocess.run(["squeue", "--steps", "--noheader", "--jobs", job,
                                 "--format=%i"], capture_output=True, text=True, timeout=30)
        for step in listed.stdout.split():
            if step.split(".")[-1].isdigit():  # not the batch or extern step
                subprocess.run(["scancel", "--signal=KILL", step], capture_output=True,
                               timeout=30)
    for rank in range(nprocs):
        pid = rank_pid(run_dir, rank)
        if pid is not None:
            kill(pid)


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def step_status(run_dir: Path, nprocs: int, status: int) -> int:
    """The status every rank reported, when they agree; else the step's own ``status``.
    Records a rank never wrote are emptied (the step has ended)."""
    empty_blank_exit_records(run_dir, nprocs)
    reported = set(exit_statuses(run_dir, nprocs).values())
    if len(reported) == 1 and None not in reported:
        return reported.pop()
    return status


def main(argv: list[str] | None = None) -> None:
    """``RUN_DIR``: before a batch job's ranks start (resume=auto once a checkpoint exists).
    ``RUN_DIR --after-failure STATUS --max-restarts N --taken K``: after its ranks failed;
    exits 0 when they should be started again (the line is printed, run.yaml is ready), 1
    when not."""
    parser = argparse.ArgumentParser(prog="python -m runner.launch.restart")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--after-failure", type=int, metavar="STATUS")
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--taken", type=int, default=0)
    parser.add_argument("--watch-step", type=int, metavar="PID")
    parser.add_argument("--step-status", type=int, metavar="STATUS")
    args = parser.parse_args(argv)
    run_dir = args.run_dir
    if not (run_dir / RUN_CONFIG).exists():
        print(f"adpsgd: error: {run_dir / RUN_CONFIG} is missing. Fix: submit the job.sbatch "
              "that adpsgd-run wrote into an existing run dir", file=sys.stderr)
        raise SystemExit(2)
    launcher = OmegaConf.select(OmegaConf.load(run_dir / RUN_CONFIG), "launcher",
                                default=OmegaConf.create({}))
    if args.watch_step is not None:
        watch_step(run_dir, args.watch_step, int(launcher.nprocs),
                   float(launcher.get("stall_timeout_s") or 0))
        return
    if args.step_status is not None:
        print(step_status(run_dir, int(launcher.nprocs), args.step_status))
        return
    if args.after_failure is not None:
        nprocs = int(launcher.nprocs)
        failure = failure_of_batch_step(run_dir, nprocs, args.after_failure)
        progress = ranks_progress(run_dir, nprocs)
        failure.record(run_dir, progress)
        restarts = Restarts(run_dir, args.max_restarts, taken=args.taken)
        raise SystemExit(0 if restarts.decide(failure, progress) else 1)
    # Exit records of an earlier start must not be read as this one's.
    nprocs = launcher.get("nprocs")
    if nprocs:
        clear_rank_files(run_dir, int(nprocs))
    resume = prepare_restart(run_dir)
    if resume == "auto" and has_checkpoint(run_dir):
        print(f"adpsgd: resume=auto: continuing from the newest complete checkpoint in "
              f"{run_dir / CHECKPOINTS}" if complete_checkpoints(run_dir) else
              "adpsgd: resume=auto: no checkpoint is complete yet: the run starts over",
              flush=True)


if __name__ == "__main__":
    main()
