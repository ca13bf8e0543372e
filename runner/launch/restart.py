"""``python -m runner.launch.restart RUN_DIR``: make a job that runs again continue its run.

A batch job runs again in the same run dir when SLURM requeues it (after a preemption or its
time limit's warning, see runner/launch/slurm.py) or when the user resubmits its job.sbatch.
The ranks read ``RUN_DIR/.hydra/run.yaml``; once the run dir holds a checkpoint, this sets its
``resume`` to ``auto`` (the newest complete checkpoint of the run dir), so the job continues
where it stopped instead of starting over. On the first start nothing changes: ``resume``
stays what the user asked for (null for a fresh start, or a checkpoint to start from).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import OmegaConf, open_dict

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
