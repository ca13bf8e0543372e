"""What a rank's checkpoint holds, and how a rank continues from one.

A rank's file holds everything that decides its future (:func:`capture_rank_state`):

* the model (decentralized replicas differ) and the optimizer state (momentum buffers);
* the algorithm's state (runner/algos/*: counters, gossip progress, a completed in-flight
  exchange or reduction), taken after ``algo.pause()``;
* the RNG states (runner/train/rng.py);
* the data position (this rank's epoch and next batch: the shard order is a function of
  (seed, epoch)), the sample counters (the learning rate is a function of them), the step,
  the milestones passed, the running loss, the time spent;
* on rank 0, the evaluation history (metrics.jsonl is rewritten from it on resume, and
  TensorBoard events after the checkpoint are dropped), so a resumed run continues the
  same files.

Both functions take the Trainer (runner/trainer/loop.py), whose parts they read and restore;
the files themselves are runner/checkpoint/'s.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from ..checkpoint.files import Checkpoint
from ..checkpoint.resize import RESIZED, start_here
from ..comm.buffers import detached_copy
from ..errors import UserError, one_line
from ..train.rng import capture_rng, restore_rng

if TYPE_CHECKING:
    from .loop import Trainer

log = logging.getLogger("adpsgd")


def capture_rank_state(trainer: Trainer, capture: Any = None) -> dict[str, Any]:
    """Everything that decides this rank's future (what Checkpointer.save writes).
    ``capture``: a checkpoint written beside training (Algorithm.capture_state): a copy that
    training may go on from, its algorithm entry left for the writer to make from the capture
    (runner/checkpoint/background.py)."""
    t = trainer
    saved = {"model": t.model.state_dict(), "optimizer": t.optimizer.state_dict(),
             "algo": t.algo.state_dict() if capture is None else None,
             "rng": capture_rng(t.faults.rng),
             "data": t.shards.state_dict(),
             "trainer": {**t.state.state_dict(),
                         "last_milestone": t.milestones.last_passed(),
                         "lr": t.lr, "lr_ramp": t.schedule.ramp,
                         "elapsed_s": time.perf_counter() - t.start_time,
                         "timers": t.timers.snapshot(),
                         # Evaluations copied at this checkpoint's meeting and not recorded
                         # yet: a resumed run scores them first (trainer.eval_in_background).
                         "evaluations_owed": t.evaluations_owed,
                         "bytes_sent": t.comm.traffic.state_dict()}}
    if t.ledger is not None:  # collective: the samples used so far in the epoch, every rank's
        saved["ledger"] = t.ledger.state_dict(t.comm, t.state.position[1])
    if t.world.is_main:
        saved["history"] = t.state.history
    return saved if capture is None else detached_copy(saved)


def restore_rank_state(trainer: Trainer, saved: dict[str, Any]) -> None:
    """Continue from the checkpoint resumed from (after the model, optimizer and algorithm
    exist): from this rank's own state, or from the state merged from every rank's when the
    checkpoint was written by another number of ranks (runner/checkpoint/resize.py)."""
    t = trainer
    checkpoint, state, train_size = t.resumed_from, t.state, len(t.train_set)
    load_model(t.model, saved["model"], checkpoint)
    t.optimizer.load_state_dict(saved["optimizer"])
    if RESIZED in saved:
        start_here(saved, state, t.shards)
        if saved["algo_name"] == t.cfg.algo.name:
            t.algo.load_merged_state(saved["algo"], state.step, state.samples / train_size)
        t.milestones.resume_after(saved["trainer"]["last_milestone"])
        if saved["trainer"]["lr"] is not None:  # climb to a higher rate, not jump
            t.schedule.start_ramp(state.samples, saved["trainer"]["lr"])
        t.timers.seconds.update({k: saved["trainer"]["timers"].get(k, 0.0)
                                 for k in ("eval", "checkpoint")})
        # Another number of ranks sent other bytes: this world counts from here.
        t.comm.traffic.load_state_dict(None, state.step)
        # Asynchronous learners learn each other's counts in the new world.
        t.algo.global_samples(state.local_samples, state.lockstep_samples)
        t.algo.sync_global_samples(state.samples)
    else:
        t.algo.load_state_dict(saved["algo"])
        t.shards.load_state_dict(saved.get("data", {}))
        restore_rng(saved["rng"], t.faults.rng)
        state.load_state_dict(saved["trainer"])
        t.milestones.resume_after(saved["trainer"]["last_milestone"])
        t.schedule.ramp = saved["trainer"].get("lr_ramp")
        t.timers.seconds.update(saved["trainer"]["timers"])
        # The bytes sent before the checkpoint (absent from checkpoints before it counted).
        t.comm.traffic.load_state_dict(saved["trainer"].get("bytes_sent"), state.step)
        state.history = saved.get("history", [])
        t.owed_at_resume = saved["trainer"].get("evaluations_owed", [])
    if saved.get("ledger") is not None and t.ledger is not None:
        t.ledger.load_state_dict(saved["ledger"], resized=RESIZED in saved)
    log.info("resumed from %s: step %d, %d samples (epoch %.2f)%s", checkpoint.path,
             state.step, state.samples, state.samples / train_size,
             f", merged from {checkpoint.nprocs} ranks" if RESIZED in saved else "")


def load_model(model: torch.nn.Module, state: dict[str, Any], checkpoint: Checkpoint) -> None:
    """Load a checkpoint's model state, as one line when it does not fit."""
    try:
        model.load_state_dict(state)
    except RuntimeError as ex:
        raise UserError(f"checkpoint {checkpoint.path} does not fit this model "
                        f"({one_line(ex)[:200]})", "resume with the recipe options of the "
                        "run that wrote it, or start a new run dir (hydra.run.dir=NEW_DIR)"
                        ) from None
