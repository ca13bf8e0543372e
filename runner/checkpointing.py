"""The trainer's side of checkpoints: what a rank saves, and how a job resumes.

Mixed into :class:`runner.trainer.Trainer`, which owns the loop and calls
:meth:`save_checkpoint` at checkpoint milestones (runner/milestones.py) and on a graceful stop;
runner/checkpoint.py owns the files. A rank's file holds everything that decides its future:

* the model (decentralized replicas differ) and the optimizer state (momentum buffers);
* the algorithm's state (runner/algos/*: counters, gossip progress, a completed in-flight
  exchange or reduction), taken after ``algo.pause()``;
* the RNG states (Python, NumPy, torch, CUDA, the straggler delays): dropout, augmentation and
  any random choice continue as if nothing happened;
* the data position (this rank's epoch and next batch: the shard order is a function of
  (seed, epoch)), the sample counters (the learning rate is a function of them), the step,
  the milestones passed, the running loss, the time spent;
* on rank 0, the evaluation history (metrics.jsonl is rewritten from it on resume, and
  TensorBoard events after the checkpoint's step are purged), so a resumed run continues the
  same files.

Lockstep algorithms therefore resume bit for bit. ``resume_averaged=true`` instead starts every
rank from the mean of the checkpoint's models at its global sample count (fresh optimizer and
algorithm state): the way to continue with another number of ranks.
"""

from __future__ import annotations

import logging
import math
import random
import time
from functools import partial
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from .checkpoint import MARKER as CHECKPOINT_MARKER
from .checkpoint import (
    Checkpoint,
    DamagedCheckpoint,
    averaged_model_state,
    check_compatible,
    checkpoint_path,
    complete_before,
    complete_checkpoints,
    fsync_dir,
    load_rank_state,
    mark_complete,
    prune,
    read_checkpoint,
    resolve_resume,
    save_rank_state,
)
from .errors import UserError, one_line

log = logging.getLogger("adpsgd")


def capture_rng(delays: random.Random) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "delays": delays.getstate(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], delays: random.Random) -> None:
    random.setstate(state["python"])
    delays.setstate(state["delays"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointing:
    """Checkpoint and resume methods of the Trainer (see the module docstring)."""

    # ---- resume ------------------------------------------------------------------------
    def _resolve_resume(self) -> Checkpoint | None:
        """The checkpoint ``resume`` selects, chosen by rank 0 for everyone (``auto`` must
        mean the same directory on every rank), after checking it fits this job and that
        every rank's file is intact (each rank checks its own against the marker's checksum;
        the state it read is kept for :meth:`_restore`). ``resume=auto`` falls back to the
        newest intact checkpoint, saying so; an explicit checkpoint that is damaged is an
        error naming the file."""
        self._resume_state = None
        if not self.cfg.resume:
            return None
        found = self._agree(lambda: resolve_resume(self.cfg.resume, self.run_dir))
        while found is not None:
            if self.cfg.resume_averaged:  # rank 0 reads (and checks) every file to average
                return found
            problem = None
            try:
                self._resume_state = load_rank_state(found, self.world.rank)
            except DamagedCheckpoint as ex:
                problem = (ex.cause, ex.fix, f"{ex.path} is damaged ({ex.problem})")
            damaged = [p for p in self.comm.allgather_objects(problem) if p]
            if not damaged:
                return found
            if self.cfg.resume != "auto":
                error = UserError(*damaged[0][:2])
                error.quiet = not self.world.is_main  # rank 0 says it for everyone
                raise error
            damaged_path = found.path
            found = self._agree(partial(complete_before, found))  # checked in the next round
            if self.world.is_main and self.progress_stream is not None:
                then = (f"trying {found.path}, the complete checkpoint before it" if found
                        else "no complete checkpoint is left before it: starting fresh")
                print(f"adpsgd-run: warning: resume=auto: {damaged[0][2]}; {then}",
                      file=self.progress_stream, flush=True)
            log.warning("checkpoint %s is damaged: %s", damaged_path, damaged[0][0])
        log.info("resume=%s: no complete checkpoint in %s, starting fresh", self.cfg.resume,
                 self.run_dir)
        return None

    def _agree(self, choose) -> Checkpoint | None:
        """Rank 0 runs ``choose()`` and checks that the checkpoint fits this job; every rank
        gets the result (or the same one-line error)."""
        found, error = None, None
        if self.world.is_main:
            try:
                found = choose()
                if found is not None:
                    check_compatible(found, OmegaConf.to_container(self.cfg),
                                     self.cfg.resume_averaged)
            except UserError as ex:
                error = (ex.cause, ex.fix)
        found, error = self.comm.bcast_object((found, error))
        if error:
            raise UserError(*error)
        return found

    def _load_model(self, state: dict[str, Any], checkpoint: Checkpoint) -> None:
        try:
            self.model.load_state_dict(state)
        except RuntimeError as ex:
            raise UserError(f"checkpoint {checkpoint.path} does not fit this model "
                            f"({one_line(ex)[:200]})", "resume with the recipe options of the "
                            "run that wrote it, or start a new run dir (hydra.run.dir=NEW_DIR)"
                            ) from None

    def _load_averaged_model(self, checkpoint: Checkpoint) -> None:
        """Rank 0 averages the checkpoint's models; everyone takes its copy."""
        if self.world.is_main:
            self._load_model(averaged_model_state(checkpoint), checkpoint)
        self._broadcast_model()

    def _restore(self, checkpoint: Checkpoint) -> None:
        """Continue from ``checkpoint`` (after the model, optimizer and algorithm exist)."""
        if self.cfg.resume_averaged:
            self._restore_position(checkpoint.samples, checkpoint.step)
            first = load_rank_state(checkpoint, 0) if self.world.is_main else None
            if first is not None:
                self.history = first.get("history", [])
            # The restored samples took the earlier sessions' time: count it (rank 0's
            # clock, with its evaluation and checkpoint seconds), or samples/s would divide
            # every sample by this session's time alone.
            before = self.comm.bcast_object(first and {
                "elapsed_s": first["trainer"]["elapsed_s"],
                "timers": {k: first["trainer"]["timers"].get(k, 0.0)
                           for k in ("eval", "checkpoint")}})
            self.elapsed_before = before["elapsed_s"]
            self.timers.seconds.update(before["timers"])
        else:
            state = self._resume_state  # read and checked by _resolve_resume
            self._resume_state = None
            self._load_model(state["model"], checkpoint)
            self.optimizer.load_state_dict(state["optimizer"])
            self.algo.load_state_dict(state["algo"])
            restore_rng(state["rng"], self.delays)
            t = state["trainer"]
            self.step, self.samples = t["step"], t["samples"]
            self.lockstep_samples, self.local_samples = t["lockstep_samples"], t["local_samples"]
            self.position = tuple(t["position"])
            self.milestones.resume_after(t["last_milestone"])
            self.elapsed_before = t["elapsed_s"]
            self.timers.seconds.update(t["timers"])
            self._loss_sum, self._loss_steps = t["loss_sum"], t["loss_steps"]
            self.skipped_batches = t["skipped_batches"]
            self.history = state.get("history", [])
        self.resumed_from = checkpoint
        self.last_checkpoint = checkpoint.path
        if self.world.is_main:
            self._forget_later_checkpoints(checkpoint)
        log.info("resumed from %s: step %d, %d samples (epoch %.2f)", checkpoint.path,
                 self.step, self.samples, self.samples / len(self.train_set))

    def _restore_position(self, samples: int, step: int) -> None:
        """Counters and data position at a global sample count (lockstep view): the next
        batch of the epoch that ``samples`` falls in, rounded up to a whole step."""
        n_train, steps = len(self.train_set), self.shards.steps_per_epoch
        global_batch = self.world.size * self.cfg.trainer.batch_size
        epoch, within = divmod(samples, n_train)
        k = math.ceil(within / global_batch)
        if k >= steps:
            epoch, k = epoch + 1, 0
        consumed = epoch * n_train + min(k * global_batch, n_train)
        self.step, self.samples, self.lockstep_samples = step, consumed, consumed
        share, extra = divmod(consumed, self.world.size)
        self.local_samples = share + (self.world.rank < extra)
        self.position = (epoch, k)
        self.milestones.resume_at(consumed)

    def _forget_later_checkpoints(self, checkpoint: Checkpoint) -> None:
        """Checkpoints past the one resumed from belong to the abandoned continuation: drop
        their markers so that ``resume=auto`` never picks one of them later."""
        for later in complete_checkpoints(self.run_dir):
            if later.samples > checkpoint.samples:
                (later.path / CHECKPOINT_MARKER).unlink()
                fsync_dir(later.path)
                log.warning("%s is past the checkpoint resumed from; no longer used", later.path)

    # ---- save --------------------------------------------------------------------------
    def _rank_state(self) -> dict[str, Any]:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "algo": self.algo.state_dict(),
            "rng": capture_rng(self.delays),
            "trainer": {
                "step": self.step, "samples": self.samples,
                "lockstep_samples": self.lockstep_samples, "local_samples": self.local_samples,
                "position": list(self.position),
                "last_milestone": self.milestones.last_passed(),
                "elapsed_s": time.perf_counter() - self.start_time,
                "timers": self.timers.snapshot(), "loss_sum": float(self._loss_sum),
                "loss_steps": self._loss_steps, "skipped_batches": self.skipped_batches,
            },
        }
        if self.world.is_main:
            state["history"] = self.history
        return state

    def save_checkpoint(self, reason: str) -> None:
        """Collective: quiesce the algorithm, refuse a poisoned state, write every rank's file,
        then (rank 0, after a barrier) the marker, and prune old checkpoints."""
        self._meet()
        self._refuse_nonfinite_state()
        directory = checkpoint_path(self.run_dir, self.samples)
        # A complete checkpoint at this sample count holds this very state (a stop right at a
        # scheduled checkpoint): keep it rather than rewrite it.
        exists = self.comm.bcast_object(
            read_checkpoint(directory) is not None if self.world.is_main else None)
        if not exists:
            with self.timers.time("checkpoint"):
                written = save_rank_state(directory, self.world.rank, self._rank_state(),
                                          self.cfg.faults.checkpoint_write_delay_s)
                # Once rank 0 has every rank's checksum, every rank's file is durable.
                files = self.comm.gather_objects(written)
                if self.world.is_main:
                    mark_complete(directory, self.step, self.samples,
                                  self.samples / len(self.train_set), self.world.size, reason,
                                  OmegaConf.to_container(self.cfg), files)
                    prune(self.run_dir, self.cfg.trainer.keep_checkpoints)
            log.info("checkpoint (%s) at step %d: %s", reason, self.step, directory)
        self.last_checkpoint = directory
        self._leave()
