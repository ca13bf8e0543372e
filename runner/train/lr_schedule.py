"""Learning rate as a function of global samples seen (GOYAL: linear scaling plus warmup).

Driving the schedule by samples rather than by local steps lets asynchronous algorithms, whose
ranks advance at different rates, use an estimate of global progress.

A job resumed with more ranks than its checkpoint's (runner/checkpoint/resize.py) has a larger
global batch, so a higher scaled rate: jumping to it from a state trained at the lower one can
diverge (seen on the digits: resumed from 2 ranks on 4 at twice the rate, a run fell to
chance level), so the rate climbs from the old one to the new over
``optim.resize_warmup_epochs``, as GOYAL's warmup does at the start.
"""

from __future__ import annotations

import bisect
import math

from ..config.run_schema import OptimConfig


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
        # (samples where it starts, the factor on the schedule's rate there): after a resize
        self.ramp: tuple[float, float] | None = None

    def start_ramp(self, samples: float, from_rate: float) -> None:
        """Climb from ``from_rate`` (the rate before a resize) at ``samples`` to this
        schedule's rate over ``optim.resize_warmup_epochs``; a lower rate applies at once."""
        scheduled = self.scheduled(samples)
        factor = from_rate / scheduled if scheduled > 0 else 1.0  # the schedule's very end
        self.ramp = ((samples, factor) if factor < 1 and self.optim.resize_warmup_epochs > 0
                     else None)

    def lr_at(self, samples: float) -> float:
        rate = self.scheduled(samples)
        if self.ramp is not None:
            start, factor = self.ramp
            done = (samples - start) / (self.optim.resize_warmup_epochs * self.train_size)
            rate *= factor + (1 - factor) * min(1.0, max(0.0, done))
        return rate

    def scheduled(self, samples: float) -> float:
        """The rate without a resize's ramp."""
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
