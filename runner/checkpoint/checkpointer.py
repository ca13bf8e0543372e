"""A run's checkpoints: writing them (collectively) and finding the one to resume from.

The trainer (runner/trainer/) decides when (checkpoint milestones, runner/train/milestones.py,
and graceful stops) and hands :meth:`Checkpointer.save` what a rank saves (runner/trainer/
rank_state.py: everything that decides its future); runner/checkpoint/files.py owns the files.
Lockstep algorithms therefore resume bit for bit. A job with another number of ranks (or
``resume_averaged=true``) starts every rank from the mean of the checkpoint's states instead,
and deals the unread rest of the epoch over the new ranks (runner/checkpoint/resize.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import torch
from omegaconf import OmegaConf

from ..comm import Communicator, Seat, Seated
from ..errors import UserError, warn_user
from ..runlog.timers import Timers
from .files import MARKER as CHECKPOINT_MARKER
from .files import (
    Checkpoint,
    DamagedCheckpoint,
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
from .resize import merge_ranks

log = logging.getLogger("adpsgd")


class Checkpointer(Seated):
    """Saves and finds checkpoints for one rank of a run (every method is collective unless it
    says otherwise). ``warn``: where rank 0 says that it falls back from a damaged
    checkpoint."""

    def __init__(self, cfg: Any, run_dir: Path, seat: Seat, timers: Timers,
                 warn: TextIO | None):
        self.cfg, self.run_dir, self.seat = cfg, run_dir, seat
        self.timers, self.warn = timers, warn
        self.last: Path | None = None  # the newest checkpoint written or resumed from

    # ---- resume ------------------------------------------------------------------------
    def resolve(self, train_size: int) -> tuple[Checkpoint | None, dict[str, Any] | None]:
        """The checkpoint ``resume`` selects, chosen by rank 0 for everyone (``auto`` must
        mean the same directory on every rank), after checking it fits this job and that
        every rank's file is intact (each rank checks its own against the marker's checksum),
        with the state this rank starts from: its own, or, when the checkpoint was written
        by another number of ranks (or ``resume_averaged``), the merged state rank 0 built
        from every file (runner/checkpoint/resize.py). ``resume=auto`` falls back to the newest
        intact checkpoint, saying so; an explicit checkpoint that is damaged is an error naming the
        file."""
        if not self.cfg.resume or self.world.spare:  # a spare gets the job's state on joining
            return None, None
        found = self._agree(lambda: resolve_resume(self.cfg.resume, self.run_dir))
        while found is not None:
            resized = found.nprocs != self.world.size or self.cfg.resume_averaged
            problem, state = None, None
            try:
                if not resized:
                    state = load_rank_state(found, self.world.rank)
                elif self.world.is_main:
                    state = merge_ranks(found, train_size, self.cfg.trainer.batch_size,
                                        self.cfg.seed)
            except DamagedCheckpoint as ex:
                problem = (ex.cause, ex.fix, f"{ex.path} is damaged ({ex.problem})")
            damaged = [p for p in self.comm.allgather_objects(problem) if p]
            if not damaged:
                if resized:
                    state = self.comm.bcast_object(state)
                return self._resumed(found), state
            if self.cfg.resume != "auto":
                error = UserError(*damaged[0][:2])
                error.quiet = not self.world.is_main  # rank 0 says it for everyone
                raise error
            damaged_path = found.path
            found = self._agree(partial(complete_before, found))  # checked in the next round
            if self.world.is_main and self.warn is not None:
                then = (f"trying {found.path}, the complete checkpoint before it" if found
                        else "no complete checkpoint is left before it: starting fresh")
                warn_user(f"resume=auto: {damaged[0][2]}; {then}", self.warn)
            log.warning("checkpoint %s is damaged: %s", damaged_path, damaged[0][0])
        log.info("resume=%s: no complete checkpoint in %s, starting fresh", self.cfg.resume,
                 self.run_dir)
        return None, None

    def _agree(self, choose: Callable[[], Checkpoint | None]) -> Checkpoint | None:
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

    def _resumed(self, checkpoint: Checkpoint) -> Checkpoint:
        """Checkpoints past the one resumed from belong to the abandoned continuation: rank 0
        drops their markers so that ``resume=auto`` never picks one of them later."""
        self.last = checkpoint.path
        if self.world.is_main:
            for later in complete_checkpoints(self.run_dir):
                if later.samples > checkpoint.samples:
                    (later.path / CHECKPOINT_MARKER).unlink()
                    fsync_dir(later.path)
                    log.warning("%s is past the checkpoint resumed from; no longer used",
                                later.path)
        return checkpoint

    # ---- save --------------------------------------------------------------------------
    def save(self, samples: int, step: int, epoch: float, reason: str,
             rank_state: Callable[[], dict[str, Any]],
             beside: Communicator | None = None, exists: bool | None = None) -> Path:
        """Write every rank's ``rank_state()``, then (rank 0, once every rank's checksum
        arrived) the marker, and prune old checkpoints. A complete checkpoint at this sample
        count already holds this very state (a stop right at a scheduled checkpoint): it is
        kept, not rewritten. ``beside``: written by a thread beside training
        (runner/checkpoint/background.py), whose collectives go over this communicator and
        whose time is not the training thread's; ``exists``: whether rank 0 has a complete
        checkpoint at ``samples``, where every rank knows it already (else rank 0 says)."""
        comm = beside or self.comm
        directory = checkpoint_path(self.run_dir, samples)
        if exists is None:
            exists = comm.bcast_object(
                read_checkpoint(directory) is not None if self.world.is_main else None)
        if not exists:
            with contextlib.nullcontext() if beside else self.timers.time("checkpoint"):
                written = save_rank_state(directory, self.world.rank, rank_state(),
                                          self.cfg.faults.checkpoint_write_delay_s)
                # Once rank 0 has every rank's checksum, every rank's file is durable.
                files = comm.gather_objects(written)
                if self.world.is_main:
                    mark_complete(directory, step, samples, epoch, self.world.size, reason,
                                  OmegaConf.to_container(self.cfg), files)
                    prune(self.run_dir, self.cfg.trainer.keep_checkpoints)
            log.info("checkpoint (%s) at step %d: %s", reason, step, directory)
        self.last = directory
        return directory


    def save_final(self, model: torch.nn.Module, step: int) -> Path:
        """The scored final model of a completed run (rank 0): checkpoints/final_rank0.pt."""
        path = self.run_dir / "checkpoints" / "final_rank0.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "step": step,
                    "config": OmegaConf.to_container(self.cfg)}, path)
        return path
