"""``python -m runner.launch.restart RUN_DIR``: the steps of a batch job's script around its
ranks (runner/launch/slurm.py writes the script).

Before the ranks start: a job that runs again in the same run dir (SLURM requeued it after a
preemption or its time limit's warning, or the user resubmitted its job.sbatch) continues from
the newest complete checkpoint (``resume=auto`` in run.yaml once the run dir holds one); on the
first start ``resume`` stays what the user asked for. After the ranks failed
(``--after-failure STATUS``): whether to start them again in the allocation
(``launcher.max_restarts``, runner/launch/restarts.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ..checkpoint_files import complete_checkpoints
from ..worker import RUN_CONFIG
from .restarts import CHECKPOINTS, Restarts, failure_of_batch_step, has_checkpoint, prepare_restart
from .watchdog import clear_rank_files, rank_progress


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
    args = parser.parse_args(argv)
    run_dir = args.run_dir
    if not (run_dir / RUN_CONFIG).exists():
        print(f"adpsgd: error: {run_dir / RUN_CONFIG} is missing. Fix: submit the job.sbatch "
              "that adpsgd-run wrote into an existing run dir", file=sys.stderr)
        raise SystemExit(2)
    if args.after_failure is not None:
        nprocs = int(OmegaConf.load(run_dir / RUN_CONFIG).launcher.nprocs)
        failure = failure_of_batch_step(run_dir, nprocs, args.after_failure)
        progress = [rank_progress(run_dir, r) for r in range(nprocs)]
        restarts = Restarts(run_dir, args.max_restarts, taken=args.taken)
        raise SystemExit(0 if restarts.decide(failure, progress) else 1)
    # Exit records of an earlier start must not be read as this one's.
    nprocs = OmegaConf.select(OmegaConf.load(run_dir / RUN_CONFIG), "launcher.nprocs")
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
