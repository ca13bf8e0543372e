"""summary.json for a job whose ranks could not write one (runner/runlog/summary.py writes
the ranks' own): the launcher's account of how far the run got, from the run dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoint.files import complete_checkpoints
from ..errors import UserError
from ..runlog.failure_events import read_events, write_events_text
from ..runlog.records import read_metrics, read_restarts, write_json_atomic
from ..runlog.summary import session_summary
from ..runlog.writer import hparams_of, write_session_end, write_session_start


def write_failure_summary(run_dir: str | Path, cfg: Any, exit_status: int,
                          status: str = "failed", samples_reached: int | None = None) -> None:
    """summary.json of a job that ended without a summary of its own (a rank failed or died,
    or a second Ctrl-C stopped it at once): ``status``, the exit status, the checkpoint to
    resume from and how far the run got by its newest checkpoint or evaluation (``steps``,
    ``samples``; 0 before the first step), so that a script scanning run dirs sees every
    run's outcome; and its TensorBoard hparams session, with the last evaluation's metrics.
    A summary the ranks wrote in this session is kept (then they got far enough to say
    more), with the job's status and exit status: ranks that the MPI runtime stopped as it
    ended a failed job wrote "preempted", but the job failed. ``samples_reached``: the global
    samples the ranks had trained by their last heartbeats (None: unknown), which a job
    stopped at once reaches beyond its newest checkpoint; written as ``samples_reached``."""
    from torch.utils.tensorboard.writer import FileWriter

    if (written := session_summary(run_dir)) is not None:
        if (written.get("status"), written.get("exit_status")) != (status, exit_status):
            write_json_atomic(Path(run_dir) / "summary.json",
                              {**written, "status": status, "exit_status": exit_status})
        return
    checkpoints = complete_checkpoints(run_dir)
    try:
        evals = [r for r in read_metrics(run_dir) if r.get("split") == "eval"]
    except UserError:  # a damaged file must not hide why the job failed: left out here
        evals = []
    events = read_events(run_dir)
    nprocs = cfg.launcher.nprocs
    # How far the run dir shows the run got: its newest checkpoint or evaluation (0 for a
    # job stopped before its first step), so that every summary.json has steps and samples.
    reached = [(c.step, c.samples) for c in checkpoints[-1:]]
    reached += [(e["step"], e["samples"]) for e in evals[-1:]
                if isinstance(e.get("step"), int) and isinstance(e.get("samples"), int)]
    steps, samples = max(reached, default=(0, 0))
    write_json_atomic(Path(run_dir) / "summary.json", {
        "status": status, "exit_status": exit_status, "algo": cfg.algo.name,
        "recipe": cfg.recipe.name, "nprocs": nprocs, "steps": steps, "samples": samples,
        "samples_reached": max(samples_reached or 0, samples),
        "checkpoint": str(checkpoints[-1].path) if checkpoints else None,
        "last_eval": evals[-1] if evals else None, "logs": str(Path(run_dir) / "logs"),
        "restarts": read_restarts(run_dir), "events": events,
        # An elastic job's losses and joins before it failed, as its summary lists them.
        "membership": [{k: v for k, v in e.items() if k not in ("time", "cause", "operation")}
                       for e in events if e.get("event") in ("lost", "joined", "spare lost")]})
    last = {k: v for k, v in (evals[-1] if evals else {}).items()
            if k not in ("epoch", "step", "samples", "train_s", "split")}
    writer = FileWriter(str(Path(run_dir) / "tb"))
    write_session_start(writer, hparams_of(cfg))  # none if the run died before
    write_session_end(writer, last, status)
    write_events_text(writer, events, evals[-1]["step"] if evals else 0)
    writer.close()
