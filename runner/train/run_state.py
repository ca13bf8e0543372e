"""A run's counters: what a rank has done so far and where it is in its data.

One object with ``state_dict``/``load_state_dict`` so that a checkpoint stores it whole and a
resumed run continues it (runner/trainer/loop.py builds a rank's checkpoint from it, the model,
the optimizer, the algorithm and the RNGs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RunState:
    step: int = 0
    samples: int = 0  # global samples consumed, as this rank knows it (exact for lockstep)
    lockstep_samples: int = 0  # the same if every rank advanced in lockstep
    local_samples: int = 0  # this rank's own
    position: tuple[int, int] = (0, 0)  # (local epoch, index of the next batch in it)
    elapsed_before: float = 0.0  # training time of the sessions before a resume
    # The training loss since the last log, summed on the device: reading it every step
    # would synchronise a GPU.
    loss_sum: torch.Tensor | float = 0.0
    loss_steps: int = 0
    skipped_batches: int = 0  # steps whose update was dropped (trainer.on_nonfinite=skip_batch)
    consecutive_skips: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # evaluations (rank 0)

    def add_loss(self, loss: torch.Tensor) -> None:
        self.loss_sum = self.loss_sum + loss.detach()
        self.loss_steps += 1

    def take_mean_loss(self) -> float | None:
        """The mean training loss since the last call (None: no step since), reset."""
        if self.loss_steps == 0:
            return None
        mean = float(self.loss_sum) / self.loss_steps
        self.loss_sum, self.loss_steps = 0.0, 0
        return mean

    def loss_is_finite(self) -> bool:
        if isinstance(self.loss_sum, torch.Tensor):
            return bool(torch.isfinite(self.loss_sum).cpu())
        return math.isfinite(self.loss_sum)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "samples": self.samples,
                "lockstep_samples": self.lockstep_samples, "local_samples": self.local_samples,
                "position": list(self.position), "loss_sum": float(self.loss_sum),
                "loss_steps": self.loss_steps, "skipped_batches": self.skipped_batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.samples = state["step"], state["samples"]
        self.lockstep_samples = state["lockstep_samples"]
        self.local_samples = state["local_samples"]
        self.position = tuple(state["position"])
        self.loss_sum, self.loss_steps = state["loss_sum"], state["loss_steps"]
        self.skipped_batches = state["skipped_batches"]
        self.elapsed_before = state["elapsed_s"]
