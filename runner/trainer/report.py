"""What a Trainer reports (runner/runlog/summary.py builds and writes it): each rank's
report, at every evaluation and at the end, and the end-of-run gathering into summary.json."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..comm.buffers import parameter_digest
from ..runlog.failure_events import read_events
from ..runlog.records import read_restarts
from ..runlog.summary import build_summary, host_record
from ..train.compute_path import device_record

if TYPE_CHECKING:
    from .loop import Trainer


def rank_report(trainer: Trainer) -> dict[str, Any]:
    """What one rank of the Trainer reports, at every evaluation (TensorBoard's
    per-rank charts) and at the end (summary.json): time split, algorithm numbers, steps,
    skipped batches, milestones met, host, device and how its tensors travelled."""
    t = trainer
    membership = getattr(t, "membership", None)
    return {"time": {**t.timers.snapshot(), "comm_busy": t.comm.busy_s},
            # The number it was launched with (an elastic run renumbers the ranks).
            "learner": (membership.learners[t.world.rank] if membership is not None
                        else t.world.rank),
            "node": t.world.node, "algo": t.algo.stats(), "steps": t.state.step,
            "skipped_batches": t.state.skipped_batches, "milestones": t.milestone_waits,
            "host": host_record(), "device": device_record(t.compute.device),
            "comm_backend": t.comm.backend, "comm_staging": t.comm.staging_record(),
            "bytes_sent": t.comm.traffic.report(t.state.step)}


def gather_summary(trainer: Trainer, status: str) -> dict[str, Any]:
    """Collective, at the end of a run of the Trainer: every rank's report,
    totals and parameter digest go to rank 0, which saves the final model of a completed run
    and writes summary.json and the hparams session; returns the summary (empty elsewhere)."""
    t = trainer
    seconds = t.timers.seconds
    elapsed = time.perf_counter() - t.start_time - seconds["eval"] - seconds["checkpoint"]
    train_time = t.comm.allreduce_numbers([elapsed], op="max")[0]
    membership = t.membership  # elastic runs: the learners lost on the way
    samples = (t.comm.allreduce_numbers([t.state.local_samples])[0]
               + (membership.lost_samples if membership else 0))
    digests = t.comm.gather_objects((t.world.node, parameter_digest(t.param_buffers)))
    recipe_reports = t.comm.gather_objects(t.recipe.rank_report())
    per_rank = t.comm.gather_objects(rank_report(t))
    if not t.world.is_main:
        return {}
    if status == "completed":
        t.checkpointer.save_final(t.model, t.state.step)
    last = t.checkpointer.last
    run = {"steps": t.state.step, "samples": int(samples), "train_s": train_time,
           "wall_s": time.perf_counter() - t.start_time,
           # The newest checkpoint, and the one this session resumed from (if any).
           "checkpoint": str(last) if last else None,
           "resumed_from": str(t.resumed_from.path) if t.resumed_from else None,
           "restarts": read_restarts(t.run_dir),
           # Ranks lost, stalled or failed in earlier jobs of this run (restarts).
           "events": read_events(t.run_dir),
           # The ranks launched, learners lost and joined (launcher.elastic), distinct
           # samples used per epoch (lockstep algorithms).
           "nprocs": t.cfg.launcher.nprocs, "learners_at_end": t.world.size,
           "membership": membership.events if membership else [],
           "epoch_samples": t.ledger.closed if t.ledger is not None else None,
           # trainer.checkpoint_every=auto: each planned period with its inputs
           # (runner/checkpoint/period.py).
           "checkpoint_periods": t.checkpoint_periods if t.auto_checkpoints else None}
    summary = build_summary(status, t.cfg, t.world, run, t.state.history, per_rank, digests,
                            t.recipe, recipe_reports)
    t.runlog.finish(summary)
    return summary
