"""What the loop does about a NaN or Inf loss (``trainer.on_nonfinite``): ``stop`` ends the job
at the next log or checkpoint, before a poisoned model can be saved; ``skip_batch`` drops the
step's update on the ranks that share it (one device sync per step) and gives up after
MAX_CONSECUTIVE_SKIPS in a row."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from ..comm import Communicator
from ..errors import UserError
from .run_state import RunState

log = logging.getLogger("adpsgd")
MAX_CONSECUTIVE_SKIPS = 10  # the model diverges: stop


def nonfinite_error(what: str, step: int, ranks: list[int],
                    last_checkpoint: Path | None) -> UserError:
    """The one line for a diverged run: where, and how to continue from the last good
    checkpoint (none is ever written of a non-finite model)."""
    where = (f"continue from the last good checkpoint ({last_checkpoint}) with resume=auto"
             if last_checkpoint else "start again")
    on = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    return UserError(f"{what} at step {step} on {on}",
                     f"lower optim.lr or raise optim.warmup_epochs, then {where}")


def update_is_nonfinite(model: torch.nn.Module, loss: torch.Tensor | None,
                        group: Communicator | None) -> bool:
    """Whether this step's loss or the gradient its update would apply is not finite; ranks
    that apply the same averaged update (``group``) decide together, so their replicas stay
    identical."""
    checks = [torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None]
    if loss is not None:
        checks.append(torch.isfinite(loss.detach()).all())
    bad = bool(checks) and not bool(torch.stack(checks).all())
    if group is not None and group.size > 1:
        bad = bool(group.allreduce_numbers([float(bad)], op="max")[0])
    return bad


def refuse_poisoned_state(buffers: list[torch.Tensor], loss_is_finite: bool,
                          comm: Communicator, rank: int, step: int,
                          last_checkpoint: Path | None) -> None:
    """Before a checkpoint (collective): a non-finite loss since the last log, or non-finite
    weights, on any rank end the job here, so that the checkpoint on disk stays the last good
    one; the ranks agree, so that the job says it once (rank 0), naming every rank."""
    flags = [torch.isfinite(flat).all() for flat in buffers]
    poisoned = not loss_is_finite or (
        bool(flags) and not bool(torch.stack([f.cpu() for f in flags]).all()))
    ranks = [r for r, bad in enumerate(comm.allgather_objects(poisoned)) if bad]
    if ranks:
        error = nonfinite_error("non-finite training loss or weights", step, ranks,
                                last_checkpoint)
        error.quiet = rank != 0
        raise error


class BatchSkipper:
    """``skip_batch``: drop a step whose loss or gradient is not finite. The floating buffers
    (BatchNorm statistics) are saved before the forward pass, so that a dropped step leaves
    none of its statistics behind; after MAX_CONSECUTIVE_SKIPS in a row the job stops."""

    def __init__(self, model: torch.nn.Module, state: RunState, rank: int,
                 last_checkpoint: Callable[[], Path | None]):
        self.model, self.state, self.rank = model, state, rank
        self.last_checkpoint = last_checkpoint
        self._saved: list[torch.Tensor] = []

    def before_forward(self) -> None:
        self._saved = [b.clone() for b in self.model.buffers() if b.is_floating_point()]

    def skips(self, loss: torch.Tensor | None, group: Communicator | None) -> bool:
        """Whether to drop this step's update (then the buffers are as before the step)."""
        saved, self._saved, state = self._saved, [], self.state
        if not update_is_nonfinite(self.model, loss, group):
            state.consecutive_skips = 0
            return False
        floats = [b for b in self.model.buffers() if b.is_floating_point()]
        for buf, before in zip(floats, saved):
            buf.copy_(before)
        state.skipped_batches += 1
        state.consecutive_skips += 1
        log.warning("non-finite loss or gradient at step %d: update skipped (%d so far)",
                    state.step, state.skipped_batches)
        if state.consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
            raise nonfinite_error(f"{MAX_CONSECUTIVE_SKIPS} steps in a row had a non-finite "
                                  "loss or gradient", state.step, [self.rank],
                                  self.last_checkpoint())
        return True
