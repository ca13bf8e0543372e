"""Continuing a run in a job that starts again: restarts without a person, and batch reruns.

``launcher.max_restarts=N`` (the local launcher; under SLURM, the job script inside its
allocation): a job that lost a rank (killed, crashed, its node gone, or hung until the
watchdog's stall timeout) or its mpiexec is started again from
the newest complete checkpoint of the same run dir, up to N times (``Restarts``). Each restart
prints one line (cause, checkpoint, samples lost, attempt k of N) and is recorded in
logs/restarts.json, which summary.json repeats as ``restarts``; metrics.jsonl and TensorBoard
continue as one run, as after ``resume=auto``. Never restarted: a user's error (status 2: bad
config, missing data, a non-finite loss), Ctrl-C, a preemption; nor a failure that repeats
with the same cause before the run saved a newer checkpoint (a crash at a given step, bad
data): the job then ends with that cause, as without restarts.

``prepare_restart``: a batch job runs again in the same run dir when SLURM requeues it (after
a preemption or its time limit's warning, see runner/launch/slurm.py) or when the user
resubmits its job.sbatch. The ranks read ``RUN_DIR/.hydra/run.yaml``; once the run dir holds
a checkpoint, this sets its ``resume`` to ``auto`` (the newest complete checkpoint of the run
dir), so the job continues where it stopped instead of starting over. On the first start
nothing changes: ``resume`` stays what the user asked for (null for a fresh start, or a
checkpoint to start from).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from ..checkpoint.files import complete_checkpoints, newest_intact
from ..errors import EXIT_PEER_LOST, EXIT_TOO_FEW_LEARNERS, UserError
from ..runlog.failure_events import record_event
from ..runlog.records import read_metrics, read_restarts, write_restarts
from .watchdog import exit_record, failure_records, rank_host, rank_operation

CHECKPOINTS = "checkpoints"


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run dir holds a checkpoint (one subdirectory of checkpoints/ each; ``auto``
    then picks the newest complete one, or starts fresh when a crash left none complete)."""
    folder = run_dir / CHECKPOINTS
    return folder.is_dir() and any(entry.is_dir() for entry in folder.iterdir())


def prepare_restart(run_dir: str | Path) -> str | None:
    """Set run.yaml's ``resume`` to ``auto`` when the run dir holds a checkpoint; return the
    value the ranks will read."""
    from ..runlog.records import RUN_CONFIG

    run_dir = Path(run_dir)
    path = run_dir / RUN_CONFIG
    cfg = OmegaConf.load(path)
    resume = cfg.get("resume")
    if resume == "auto" or not has_checkpoint(run_dir):
        return resume
    with open_dict(cfg):
        cfg.resume = "auto"
    tmp = path.with_name(path.name + ".tmp")
    OmegaConf.save(cfg, tmp)
    os.replace(tmp, path)  # a job killed here leaves the old or the new file, never half of one
    return "auto"


@dataclass(frozen=True)
class JobFailure:
    """How a job ended badly, as its launcher saw it."""

    cause: str  # one phrase without pids, e.g. "rank 1 was killed by signal 9 (SIGKILL)"
    restartable: bool  # a lost rank, process or node; False for a user's error
    when: float  # time.time() of the failure
    report: Callable[[], None]  # the launcher's full report, when the job is not restarted
    # For the run's events (runner/runlog/failure_events.py): what happened and to which rank.
    event: str = "failed"  # died | stalled | gave up | error | failed | mpiexec killed
    learner: int | None = None
    host: str | None = None  # where the launcher heard of it; else the rank's pid file's

    def record(self, run_dir: Path, progress: list[int | None]) -> None:
        """Add this failure to the run's events, with what the rank was doing at its last
        heartbeat (HEARTBEAT_S apart) and the most samples any rank had reported; a peer that
        gave up waiting on it first (a hung rank, taken down by that peer's abort) is an event
        of its own, before it."""
        gave_up = [r for r in failure_records(run_dir, len(progress))
                   if r.status == EXIT_PEER_LOST and r.message]
        if gave_up and (self.event, self.learner) != ("gave up", gave_up[0].rank):
            peer = gave_up[0]
            self._record(run_dir, progress, "gave up", peer.rank, None,
                         peer.message.removeprefix("adpsgd-run: "))
        self._record(run_dir, progress, self.event, self.learner, self.host, self.cause)

    def _record(self, run_dir: Path, progress: list[int | None], event: str,
                rank: int | None, host: str | None, cause: str) -> None:
        record_event(run_dir, {
            "time": round(self.when, 3),  # Unix seconds, as an elastic job's membership
            "event": event, "learner": rank,
            "host": host or (rank_host(run_dir, rank) if rank is not None else None),
            "operation": rank_operation(run_dir, rank) if rank is not None else None,
            "at_samples": samples_reached(run_dir, progress),
            "cause": cause})


def samples_reached(run_dir: Path, progress: list[int | None]) -> int | None:
    """How far a failed job got: the most samples a rank reported (``progress``: heartbeats,
    exit records), its newest checkpoint's or last evaluation's (a job can fail before its
    first heartbeat); None where nothing says."""
    known = [p for p in progress if p is not None]
    known += [c.samples for c in complete_checkpoints(run_dir)[-1:]]
    try:
        known += [row["samples"] for row in read_metrics(run_dir)[-1:]
                  if isinstance(row.get("samples"), int)]
    except UserError:  # a damaged metrics.jsonl must not hide the failure
        pass
    return max(known, default=None)


class Restarts:
    """The restarts of one run (see the module docstring): the launcher calls ``decide`` after
    each failed job; the restarted job's rank 0 records when it trained again
    (runner/runlog/records.py, ``record_training_again``)."""

    def __init__(self, run_dir: Path, max_restarts: int, taken: int = 0):
        """``taken``: restarts already made by this launcher (a batch job's script counts
        them across the calls it makes). launcher.max_restarts limits the run's restarts, not
        a job's: those of its earlier jobs (a resume=auto, a requeue) count too."""
        self.run_dir, self.max_restarts = Path(run_dir), max_restarts
        try:  # a resumed run keeps its earlier restarts
            self.records = read_restarts(run_dir, strict=True)
        except ValueError as ex:
            say(f"warning: {ex}: the run's earlier restarts are not kept")
            self.records = []
        self.taken = max(taken, len(self.records))
        last = self.records[-1] if self.records else None
        # (cause, resumed_from_samples) of the last restart: the same again is no progress.
        self._last = (last["cause"], last["resumed_from_samples"]) if last else None

    def decide(self, failure: JobFailure, progress: list[int | None]) -> bool:
        """Whether to start the job again after ``failure``; if so, say so in one line and
        prepare the run dir. ``progress``: each rank's samples at its last heartbeat."""
        if not failure.restartable or self.max_restarts == 0:
            return False
        checkpoints = complete_checkpoints(self.run_dir)
        # What resume=auto will load: a newest checkpoint damaged since it was written is
        # passed over, and the record and the line say what the job continues from.
        resume = newest_intact(self.run_dir)
        resumed_from = resume.samples if resume else 0
        if self._last == (failure.cause, resumed_from):
            say(f"not restarting: {failure.cause} again before the run saved a checkpoint past "
                f"{resumed_from} samples: the failure repeats at the same point")
            return False
        if self.taken >= self.max_restarts:
            say(f"not restarting: the run has used all {self.max_restarts} of its restarts "
                f"(launcher.max_restarts={self.max_restarts} counts them across the run's "
                "jobs; logs/restarts.json lists them)")
            return False
        self.taken += 1
        self._last = (failure.cause, resumed_from)
        reached = samples_reached(self.run_dir, progress)
        at = max(resumed_from, reached) if reached is not None else None
        damaged = [c.path.name for c in checkpoints if resume is None or c.samples > resume.samples]
        passed_over = f" ({', '.join(damaged)} damaged)" if damaged else ""
        if resume is not None:
            prepare_restart(self.run_dir)
            where = f"continuing from {resume.path} ({resumed_from} samples){passed_over}"
        else:
            start_over(self.run_dir)
            where = ("starting over: no checkpoint was complete" if not checkpoints else
                     f"starting over: no checkpoint is intact{passed_over}")
        lost = f"{at - resumed_from} samples lost" if at is not None else "samples lost unknown"
        say(f"restart {self.taken} of {self.max_restarts}: {failure.cause}; {where}, {lost}")
        self.records.append({"cause": failure.cause, "at_samples": at,
                             "resumed_from_samples": resumed_from, "failed_at": failure.when,
                             "seconds_down": None})
        write_restarts(self.run_dir, self.records)
        return True


def start_over(run_dir: Path) -> None:
    """Before a job that starts the run again from nothing: what the failed one wrote (its
    evaluations, TensorBoard events, a summary) would be read as this run's."""
    for name in ("metrics.jsonl", "summary.json"):
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "tb", ignore_errors=True)
    (run_dir / "tb").mkdir(exist_ok=True)


def say(line: str) -> None:
    print(f"adpsgd-run: {line}", file=sys.stderr, flush=True)


def reported_failure(run_dir: Path, nprocs: int, when: float,
                     report: Callable[[], None] = lambda: None) -> JobFailure | None:
    """The first rank's own failure line as the cause, worth a restart unless it is a user's
    error (status 2: a bad config, missing data, a non-finite loss fail again); None when no
    rank reported one."""
    failed = [r for r in failure_records(run_dir, nprocs) if r.message]
    if not failed:
        return None
    first = failed[0]
    event = {2: "error", EXIT_PEER_LOST: "gave up",
             EXIT_TOO_FEW_LEARNERS: "too few learners"}.get(first.status, "failed")
    # The cause as a restart line and the events quote it: the line without its prefixes
    # and its fix, which the rank printed already.
    cause = first.message.removeprefix("adpsgd-run: ").removeprefix("error: ")
    return JobFailure(cause.split(". Fix: ")[0], first.status != 2, when, report, event=event,
                      learner=first.rank)


# python -m runner.launch.batch_steps --after-failure's answer: start the ranks again, in a new
# allocation (a node of this one is lost).
REQUEUE = 3
STEP_ENDED = Path("logs") / "step_ended.json"  # why the job script's watcher ended a step


def record_step_ended(run_dir: Path, cause: str, rank: int | None) -> None:
    """The watcher's reason for ending a batch job's step (runner/launch/batch_steps.py), and the
    rank it blames, for the failure's record and summary."""
    path = run_dir / STEP_ENDED
    tmp = path.with_name(path.name + ".tmp")
    host = rank_host(run_dir, rank) if rank is not None else None
    tmp.write_text(json.dumps({"time": time.time(), "cause": cause, "rank": rank,
                               "host": host}))
    os.replace(tmp, path)


def step_ended(run_dir: Path) -> dict | None:
    """What :func:`record_step_ended` wrote for the step that just ended (None: the watcher
    did not end it; the file is removed before every step)."""
    try:
        record = json.loads((run_dir / STEP_ENDED).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("cause"), str) else None


def failure_of_batch_step(run_dir: Path, nprocs: int, status: int) -> JobFailure:
    """How a batch job's ranks ended: a rank's own error; else the rank the step's watcher
    found silent (a lost node or slurmstepd takes its rank with it, and the watcher kills the
    others); else a rank's giving up on a peer; else every rank that left no exit record
    (srun or mpiexec inside the allocation: no watchdog saw the order of the deaths)."""
    reported = reported_failure(run_dir, nprocs, time.time())
    if reported is not None and reported.event != "gave up":
        return reported
    if (ended := step_ended(run_dir)) is not None:
        rank = ended.get("rank") if isinstance(ended.get("rank"), int) else None
        return JobFailure(ended["cause"], True, float(ended.get("time") or time.time()),
                          lambda: None, event="stalled" if rank is not None else "failed",
                          learner=rank, host=ended.get("host"))
    if reported is not None:
        return reported
    silent = [r for r in range(nprocs) if exit_record(run_dir, r) is None]
    if silent:
        ranks = ", ".join(map(str, silent))
        return JobFailure(f"rank(s) {ranks} ended without a word (killed, crashed, or their "
                          "node was lost)", True, time.time(), lambda: None, event="died",
                          learner=silent[0] if len(silent) == 1 else None)
    return JobFailure(f"the ranks' job step exited with status {status}", True, time.time(),
                      lambda: None)
