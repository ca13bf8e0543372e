"""``python -m runner.launch.batch_steps RUN_DIR``: the steps of a batch job's script around its
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
(``launcher.max_restarts``, runner/launch/restart_policy.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from ..checkpoint.files import complete_checkpoints
from ..runlog.liveness import HEARTBEAT_S, process_alive
from ..runlog.records import RUN_CONFIG
from .restart_policy import (
    CHECKPOINTS,
    REQUEUE,
    STEP_ENDED,
    Restarts,
    failure_of_batch_step,
    has_checkpoint,
    prepare_restart,
    record_step_ended,
)
from .watchdog import (
    clear_rank_files,
    empty_blank_exit_records,
    exit_statuses,
    heartbeat_age,
    rank_host,
    rank_pid,
    ranks_progress,
    samples_reported,
)

STEP_LINGER_S = 20.0  # a step still running this long after every rank ended is lost
SLURMD_ANSWER_S = 5.0  # a node's slurmd that does not accept a connection this soon is lost


def slurmd_unanswered(node: str) -> str | None:
    """Why ``node``'s slurmd is taken for lost (its address and port refused a connection or
    did not answer), or None: it answers, or this is no SLURM node that scontrol knows."""
    try:
        shown = subprocess.run(["scontrol", "--oneliner", "show", "node", node],
                               capture_output=True, text=True, timeout=30)
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
    port = next((line.split("=", 1)[1].strip() for line in config.stdout.splitlines()
                 if line.split("=", 1)[0].strip() == "SlurmdPort"), "6818")
    address = fields.get("NodeAddr")
    if shown.returncode != 0 or not address or not port.isdigit():
        return None
    try:
        socket.create_connection((address, int(port)), timeout=SLURMD_ANSWER_S).close()
    except OSError as ex:
        return f"its slurmd at {address}:{port}: {ex.strerror or 'no answer'}"
    return None


def step_problem(run_dir: Path, nprocs: int, stall_s: float, ended_since: float | None,
                 now: float, statuses: dict[int, int | None] | None = None
                 ) -> tuple[str, int | None] | None:
    """Why the running step must be ended now and the rank to blame (None: no one rank), or
    None (see the module docstring); ``statuses``: the ranks' exit statuses, if the caller
    has just read them."""
    if statuses is None:
        statuses = exit_statuses(run_dir, nprocs)
    if None not in statuses.values():
        if ended_since is not None and now - ended_since >= STEP_LINGER_S:
            return (f"every rank ended {now - ended_since:.0f} s ago but the job step did not "
                    "(its slurmstepd or a proxy was lost)", None)
        return None
    if stall_s:
        silent = {rank: age for rank in range(nprocs) if statuses[rank] is None
                  and (age := heartbeat_age(run_dir, rank, now)) is not None and age > stall_s}
        if silent:
            rank = max(silent, key=silent.get)
            host = rank_host(run_dir, rank)
            return (f"rank {rank}{f' on {host}' if host else ''} stopped responding: no "
                    f"heartbeat for {silent[rank]:.0f} s (launcher.stall_timeout_s={stall_s:g}; "
                    "its node or slurmstepd lost?)", rank)
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
            cause, rank = problem
            print(f"adpsgd: {cause}: ending the step", flush=True)
            record_step_ended(run_dir, cause, rank)  # before the kills: then rank 0 dies too
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
    exits 0 when they should be started again (the line is printed, run.yaml is ready),
    ``REQUEUE`` when so but the node of the rank to blame does not answer (the job is to be
    requeued), 1 when not. ``RUN_DIR --failed STATUS``: the job ends failed: summary.json
    says so."""
    parser = argparse.ArgumentParser(prog="python -m runner.launch.batch_steps")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--after-failure", type=int, metavar="STATUS")
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--taken", type=int, default=0)
    parser.add_argument("--watch-step", type=int, metavar="PID")
    parser.add_argument("--step-status", type=int, metavar="STATUS")
    parser.add_argument("--failed", type=int, metavar="STATUS")
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
        if not restarts.decide(failure, progress):
            raise SystemExit(1)
        if failure.host and failure.host != socket.gethostname() and \
                (unanswered := slurmd_unanswered(failure.host)) is not None:
            # srun cannot start a rank there: the allocation has lost that node.
            print(f"adpsgd: node {failure.host} does not answer ({unanswered}): the job is "
                  "requeued rather than restarted in this allocation", flush=True)
            raise SystemExit(REQUEUE)
        raise SystemExit(0)
    if args.failed is not None:
        from .failure_summary import write_failure_summary  # TensorBoard's writer: only here
        from .slurm import JOB_SCRIPT

        write_failure_summary(run_dir, OmegaConf.load(run_dir / RUN_CONFIG), args.failed,
                              samples_reached=samples_reported(run_dir, int(launcher.nprocs)))
        checkpoints = complete_checkpoints(run_dir)
        then = (f"continue from {checkpoints[-1].path} with: sbatch {run_dir / JOB_SCRIPT}"
                if checkpoints else f"no checkpoint is complete: sbatch "
                f"{run_dir / JOB_SCRIPT} starts the run again")
        print(f"adpsgd: job failed (exit status {args.failed}; status failed in "
              f"{run_dir / 'summary.json'}); {then}", flush=True)
        return
    # Exit records of an earlier start must not be read as this one's, nor a summary.json
    # that an earlier start wrote (this start's session begins with run.yaml's time).
    nprocs = launcher.get("nprocs")
    if nprocs:
        clear_rank_files(run_dir, int(nprocs))
    (run_dir / STEP_ENDED).unlink(missing_ok=True)
    os.utime(run_dir / RUN_CONFIG)
    resume = prepare_restart(run_dir)
    if resume == "auto" and has_checkpoint(run_dir):
        print(f"adpsgd: resume=auto: continuing from the newest complete checkpoint in "
              f"{run_dir / CHECKPOINTS}" if complete_checkpoints(run_dir) else
              "adpsgd: resume=auto: no checkpoint is complete yet: the run starts over",
              flush=True)


if __name__ == "__main__":
    main()
