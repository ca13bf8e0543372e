"""Learning rate as a function of global samples seen (GOYAL: linear scaling plus warmup).

Driving the schedule by samples rather than by local steps lets asynchronous algorithms, whose
ranks advance at different rates, use an estimate of global progress.
"""

from __future__ import annotations

import bisect
import math

from .config import OptimConfig


class LRSchedule:
    def __init__(self, optim: OptimConfig, global_batch: int, train_size: int, epochs: int):
        self.optim = optim
        self.train_size = train_size
        self.epochs = epochs
        scale = global_batch / optim.reference_batch if optim.scaling == "linear" else 1.0
        self.peak = optim.lr * scale
        # GOYAL's gradual warmup starts at the reference-batch rate and climbs to the scaled
        # rate (nothing to climb when the global batch is not above reference_batch); without
        # scaling it starts from 0.
        self.start = min(optim.lr, self.peak) if optim.scaling == "linear" else 0.0
        self.warmup_samples = optim.warmup_epochs * train_size

    def lr_at(self, samples: float) -> float:
        if samples < self.warmup_samples:
            return self.start + (self.peak - self.start) * samples / self.warmup_samples
        epoch = samples / self.train_size
        if self.optim.schedule == "step":
            return self.peak * self.optim.decay_factor ** bisect.bisect_right(
                list(self.optim.milestones), epoch)
        if self.optim.schedule == "cosine":
            warm = self.optim.warmup_epochs
            progress = min(1.0, (epoch - warm) / max(self.epochs - warm, 1e-12))
            return 0.5 * self.peak * (1 + math.cos(math.pi * progress))
        return self.peak
