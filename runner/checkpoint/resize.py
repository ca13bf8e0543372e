"""Resuming with another number of ranks: a checkpoint written by n ranks continued by n'.

A preempted 16-node job that comes back on 12, or a 4-rank run continued on 2: ``resume=auto
launcher.nprocs=N'`` (or ``resume_averaged=true`` at the same size, to start from the mean of
the replicas). Rank 0 reads every rank's file once and builds one start state
(:func:`merge_ranks`); every new rank takes its part of it (:func:`start_here`):

* **model and optimizer**: the mean over the old ranks of every floating tensor (the models,
  the momentum buffers); integers (BatchNorm's batch counter) are old rank 0's. Replicas
  that were identical (SSGD) stay what they were.
* **algorithm state**: each algorithm brings the mean of its saved states to a consistent
  point (``Algorithm.load_merged_state``): AD-PSGD's shared model and momentum are averaged
  and its gossip starts afresh among the new pairs; DaSGD's average in flight needs no merge
  first, since merging it leaves the mean unchanged (mean_i (abar + x_i - s_i) = mean_i x_i);
  local SGD keeps whether it has switched and moves its switch step to the new step length.
* **data**: every old rank's unread rest of the epoch it was in is collected, in rank order,
  into one *partial pass* (runner/train/data.py) that the new ranks deal round-robin, so each of
  those samples is used exactly once; whole epochs follow.
* **counters**: the global sample count is the checkpoint's (exact: taken at a milestone
  where the ranks met), dealt over the new ranks as their own counts; the step, the
  milestones passed, the evaluation history and the time spent are old rank 0's.
* **learning rate**: more ranks make a larger global batch and a higher scaled rate; it is
  reached by a ramp from the old rate (runner/train/lr_schedule.py), not a jump.

Warning: the mean of decentralized replicas is a new point, not a state any old rank held;
the first steps after the resume differ from an uninterrupted run (the tests bound the
held-out metric, not the trajectory). Random streams start afresh per rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..train.data import ShardedBatches
from ..train.run_state import RunState
from .files import Checkpoint, load_rank_state

RESIZED = "resized"  # the key that marks a merged start state


def _accumulate(total: Any, value: Any) -> Any:
    """``total`` plus ``value`` for floating tensors (in float64), nested in dicts, lists and
    tuples; anything else keeps ``total``'s (the first rank's) value."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double() if total is None else total.add_(value.double())
    if isinstance(value, dict):  # ranks may differ in keys (only leaders gossip)
        total = dict(total) if total is not None else {}
        total.update({key: _accumulate(total.get(key), item) for key, item in value.items()})
        return total
    if isinstance(value, (list, tuple)):
        total = total if total is not None else [None] * len(value)
        return type(value)(_accumulate(t, v) for t, v in zip(total, value))
    return value if total is None else total


def _divided(total: Any, count: int, like: Any) -> Any:
    """``total / count`` back in the dtype of ``like`` (the first rank's value)."""
    if isinstance(like, torch.Tensor) and like.is_floating_point():
        return (total / count).to(like.dtype)
    if isinstance(like, dict):
        return {key: _divided(total[key], count, item) for key, item in like.items()}
    if isinstance(like, (list, tuple)):
        return type(like)(_divided(t, count, item) for t, item in zip(total, like))
    return total


def merge_ranks(checkpoint: Checkpoint, train_size: int, batch_size: int, seed: int
                ) -> dict[str, Any]:
    """Rank 0: the state every rank of a resized job starts from (one read of each file,
    raising DamagedCheckpoint like any resume)."""
    old = ShardedBatches(train_size, 0, checkpoint.nprocs, batch_size, seed)
    total: dict[str, Any] | None = None
    first: dict[str, Any] = {}
    unread, positions, whole = [], set(), True
    for rank in range(checkpoint.nprocs):
        state = load_rank_state(checkpoint, rank)
        averaged = {key: state[key] for key in ("model", "optimizer", "algo")}
        total = _accumulate(total, averaged)
        if rank == 0:
            first = {**averaged, "trainer": state["trainer"], "history": state.get("history"),
                     "ledger": state.get("ledger")}  # the same on every rank
        old.load_state_dict(state.get("data", {}))
        epoch, step = state["trainer"]["position"]
        unread.append(old.unread(epoch, step, rank))
        positions.add((epoch, step))
        whole = whole and (old.partial is None or old.partial[0] != epoch)
    merged = {key: _divided(total[key], checkpoint.nprocs, first[key])
              for key in ("model", "optimizer", "algo")}
    trainer = first["trainer"]
    merged["trainer"] = {key: trainer[key] for key in ("step", "skipped_batches", "elapsed_s",
                                                        "timers", "last_milestone")}
    merged["trainer"]["samples"] = checkpoint.samples
    merged["trainer"]["lr"] = trainer.get("lr")  # the rate old rank 0 last stepped with
    merged["history"] = first["history"] or []
    merged["ledger"] = first["ledger"]
    epoch = max(epoch for epoch, _ in positions)
    if whole and positions == {(epoch, 0)}:  # all at the start of one epoch: deal it whole
        merged["data"] = {"epoch": epoch, "partial": {}}
    else:
        merged["data"] = {"epoch": epoch, "partial": {
            "partial_epoch": epoch, "partial_order": torch.from_numpy(np.concatenate(unread))}}
    merged["algo_name"] = checkpoint.config["algo"]["name"]
    merged[RESIZED] = True
    return merged


def dealt(total: int, size: int, rank: int) -> int:
    """Rank ``rank``'s share when ``total`` is dealt over ``size`` ranks."""
    share, extra = divmod(total, size)
    return share + (rank < extra)


def start_here(merged: dict[str, Any], state: RunState, shards: ShardedBatches) -> None:
    """This rank's counters and data position in the merged start state."""
    trainer = merged["trainer"]
    state.step, state.samples = trainer["step"], trainer["samples"]
    state.lockstep_samples = trainer["samples"]
    state.local_samples = dealt(trainer["samples"], shards.size, shards.rank)
    state.skipped_batches = trainer["skipped_batches"]
    state.elapsed_before = trainer["elapsed_s"]
    state.history = merged["history"]
    shards.load_state_dict(merged["data"]["partial"])
    state.position = (merged["data"]["epoch"], 0)
