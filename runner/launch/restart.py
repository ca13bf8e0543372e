"""Continuing a run in a job that starts again: restarts without a person, and batch reruns.

``launcher.max_restarts=N`` (the local launcher): a job that lost a rank (killed, crashed, its
node gone, or hung until the watchdog's stall timeout) or its mpiexec is started again from
the newest complete checkpoint of the same run dir, up to N times (``Restarts``). Each restart
prints one line (cause, checkpoint, samples lost, attempt k of N) and is recorded in
logs/restarts.json, which summary.json repeats as ``restarts``; metrics.jsonl and TensorBoard
continue as one run, as after ``resume=auto``. Never restarted: a user's error (status 2: bad
config, missing data, a non-finite loss), Ctrl-C, a preemption; nor a failure that repeats
with the same cause before the run saved a newer checkpoint (a crash at a given step, bad
data): the job then ends with that cause, as without restarts.

``python -m runner.launch.restart RUN_DIR``: make a batch job that runs again continue its run.

A batch job runs again in the same run dir when SLURM requeues it (after a preemption or its
time limit's warning, see runner/launch/slurm.py) or when the user resubmits its job.sbatch.
The ranks read ``RUN_DIR/.hydra/run.yaml``; once the run dir holds a checkpoint, this sets its
``resume`` to ``auto`` (the newest complete checkpoint of the run dir), so the job continues
where it stopped instead of starting over. On the first start nothing changes: ``resume``
stays what the user asked for (null for a fresh start, or a checkpoint to start from).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from ..checkpoint_files import complete_checkpoints
from ..run_log import RESTARTS, read_restarts, write_json_atomic
from ..worker import RUN_CONFIG

CHECKPOINTS = "checkpoints"


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run dir holds a checkpoint (one subdirectory of checkpoints/ each; ``auto``
    then picks the newest complete one, or starts fresh when a crash left none complete)."""
    folder = run_dir / CHECKPOINTS
    return folder.is_dir() and any(entry.is_dir() for entry in folder.iterdir())


def prepare_restart(run_dir: str | Path) -> str | None:
    """Set run.yaml's ``resume`` to ``auto`` when the run dir holds a checkpoint; return the
    value the ranks will read."""
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


class Restarts:
    """The restarts of one run (see the module docstring). The launcher calls ``decide`` after
    each failed job and, while a restarted job runs, ``poll`` with every rank's progress."""

    def __init__(self, run_dir: Path, max_restarts: int):
        self.run_dir, self.max_restarts = Path(run_dir), max_restarts
        self.records = read_restarts(run_dir)  # a resumed run keeps its earlier restarts
        self.taken = 0  # by this launcher
        self._waiting: dict | None = None  # the restart whose job has not trained yet
        self._last: tuple[str, int] | None = None  # (cause, resumed_from_samples)

    def decide(self, failure: JobFailure, progress: list[int | None]) -> bool:
        """Whether to start the job again after ``failure``; if so, say so in one line and
        prepare the run dir. ``progress``: each rank's samples at its last heartbeat."""
        if not failure.restartable or self.max_restarts == 0:
            return False
        checkpoints = complete_checkpoints(self.run_dir)
        resumed_from = checkpoints[-1].samples if checkpoints else 0
        if self._last == (failure.cause, resumed_from):
            say(f"not restarting: {failure.cause} again before the run saved a checkpoint past "
                f"{resumed_from} samples: the failure repeats at the same point")
            return False
        if self.taken >= self.max_restarts:
            say(f"not restarting: all {self.max_restarts} restarts "
                f"(launcher.max_restarts={self.max_restarts}) are used")
            return False
        self.taken += 1
        self._last = (failure.cause, resumed_from)
        known = [p for p in progress if p is not None]
        at = max([resumed_from, *known]) if known else None
        if checkpoints:
            prepare_restart(self.run_dir)
            where = f"continuing from {checkpoints[-1].path} ({resumed_from} samples)"
        else:
            start_over(self.run_dir)
            where = "starting over: no checkpoint was complete"
        lost = f"{at - resumed_from} samples lost" if at is not None else "samples lost unknown"
        say(f"restart {self.taken} of {self.max_restarts}: {failure.cause}; {where}, {lost}")
        self._waiting = {"cause": failure.cause, "at_samples": at,
                         "resumed_from_samples": resumed_from, "seconds_down": None,
                         "failed_at": failure.when}
        self.records.append(self._waiting)
        self._write()
        return True

    @property
    def waiting(self) -> bool:
        """A restarted job runs and has not trained yet."""
        return self._waiting is not None

    def poll(self, progress: list[int | None]) -> None:
        """Once every rank of a restarted job reports progress (its trainer has resumed and
        steps), record how long the run was down: from the failure to then, to within one
        heartbeat."""
        if self._waiting is not None and progress and all(p is not None for p in progress):
            self._waiting["seconds_down"] = round(time.time() - self._waiting["failed_at"], 1)
            self._waiting = None
            self._write()

    def _write(self) -> None:
        records = [{k: v for k, v in r.items() if k != "failed_at"} for r in self.records]
        (self.run_dir / RESTARTS).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.run_dir / RESTARTS, {"restarts": records})


def start_over(run_dir: Path) -> None:
    """Before a job that starts the run again from nothing: what the failed one wrote (its
    evaluations, TensorBoard events, a summary) would be read as this run's."""
    for name in ("metrics.jsonl", "summary.json"):
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "tb", ignore_errors=True)
    (run_dir / "tb").mkdir(exist_ok=True)


def say(line: str) -> None:
    print(f"adpsgd-run: {line}", file=sys.stderr, flush=True)


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m runner.launch.restart RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    run_dir = Path(sys.argv[1])
    if not (run_dir / RUN_CONFIG).exists():
        print(f"adpsgd: error: {run_dir / RUN_CONFIG} is missing. Fix: submit the job.sbatch "
              "that adpsgd-run wrote into an existing run dir", file=sys.stderr)
        raise SystemExit(2)
    resume = prepare_restart(run_dir)
    if resume == "auto" and has_checkpoint(run_dir):
        print(f"adpsgd: resume=auto: continuing from the newest complete checkpoint in "
              f"{run_dir / CHECKPOINTS}", flush=True)


if __name__ == "__main__":
    main()
