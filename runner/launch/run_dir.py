"""A run dir belongs to one run, and to one job at a time.

* **One run.** A fresh start (``resume=null``) in a directory that already holds a run's
  checkpoints or results would mix two runs: its own checkpoints would be pruned against the
  old ones, a crash message would point at the old run's checkpoint, and a later
  ``resume=auto`` would load the old run's state. adpsgd-run refuses it with one line before
  anything is written there (continue the old run with ``resume=auto``, or choose another
  ``hydra.run.dir``).
* **One job.** The run dir's lock: runner/runlog/run_lock.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError


def check_fresh_start(run_dir: str | Path) -> None:
    """ConfigError if a fresh start in ``run_dir`` would mix with a run already there."""
    from ..checkpoint.files import checkpoints_dir

    run_dir = Path(run_dir)
    checkpoints = sorted(checkpoints_dir(run_dir).glob("samples-*")) \
        if checkpoints_dir(run_dir).is_dir() else []
    results = [p for p in (run_dir / "metrics.jsonl", run_dir / "summary.json")
               if p.exists() and not (p.name == "summary.json" and never_trained(p))]
    if not (checkpoints or results):
        return
    what = (f"another run's checkpoints (newest: {checkpoints[-1].name})" if checkpoints else
            f"another run's results ({results[0].name})")
    raise ConfigError("hydra.run.dir", f"{run_dir} holds {what}; a fresh start there would mix "
                      "the two runs", "continue that run with resume=auto, or choose another "
                      "hydra.run.dir")


def never_trained(summary_path: Path) -> bool:
    """Whether summary.json is that of a run that stopped or failed before its first step (a
    Ctrl-C while the ranks started, a rank that failed at start-up): nothing of it would mix
    with a fresh start (:func:`start_fresh` clears it). An unreadable one counts as a run."""
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(summary, dict) and summary.get("status") in ("stopped", "failed")
            and not summary.get("steps"))


def start_fresh(run_dir: str | Path) -> None:
    """:func:`check_fresh_start`, then clear what a run that never trained left there (its
    summary.json and TensorBoard session), so that the new run's are the only ones; its logs
    stay, appended to."""
    check_fresh_start(run_dir)
    run_dir = Path(run_dir)
    (run_dir / "summary.json").unlink(missing_ok=True)
    for events in (run_dir / "tb").glob("events.out.tfevents.*"):
        events.unlink(missing_ok=True)
