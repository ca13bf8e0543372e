"""Faults injected on purpose (``faults.*``): a straggler, random per-step delays, a NaN loss,
a rank that kills itself at a step or before a given sample.
Tests and benchmarks use them to show what an algorithm does when a rank is slow or diverges;
the slow checkpoint write (``faults.checkpoint_write_delay_s``) lives with the writes
(runner/checkpoint/files.py)."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import numpy as np
import torch


class FaultInjector:
    def __init__(self, cfg: Any, rank: int, seed: int):
        """``cfg``: the ``faults`` section."""
        self.slowdown = cfg.straggler.factor if rank in cfg.straggler.ranks else 1.0
        self.delay_s = cfg.delay_s
        self.rng = random.Random(seed * 7919 + rank)  # the delays (a checkpoint keeps it)
        nan = cfg.nonfinite_loss
        self.poisoned_steps = set(nan.steps) if rank in nan.ranks else set()
        self.sigkill_step = cfg.sigkill.step if rank in cfg.sigkill.ranks else None
        self.sigkill_sample = cfg.sigkill.get("sample")  # configs saved before it: none
        self.sigkill_in_recovery = rank in (cfg.sigkill.get("recovering_ranks") or [])
        self.ends_by_exit = cfg.sigkill.get("how") == "exit"
        self.eval_delay_s = cfg.eval_delay_s

    def poison(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        """NaN at the steps ``faults.nonfinite_loss`` names for this rank."""
        return loss * float("nan") if step in self.poisoned_steps else loss

    def crash(self, step: int) -> None:
        """kill -9 of this rank as it starts ``faults.sigkill.step``: a crash that leaves no
        word, the same at every attempt (a resumed run reaches that step again)."""
        if step == self.sigkill_step:
            self._die()

    def crash_in_recovery(self) -> None:
        """kill -9 of this rank as an elastic job starts recovering from a loss
        (``faults.sigkill.recovering_ranks``): a second loss in the middle of the first's
        recovery."""
        if self.sigkill_in_recovery:
            self._die()

    def crash_on(self, samples: np.ndarray) -> None:
        """kill -9 of this rank before it trains ``faults.sigkill.sample``: a sample that kills
        whichever learner it is dealt to."""
        if self.sigkill_sample is not None and (samples == self.sigkill_sample).any():
            self._die()

    def _die(self) -> None:
        """kill -9 of this rank; with ``faults.sigkill.how=exit``, an exit with status 1
        that skips everything Python would do on its way out (the exit record too)."""
        if self.ends_by_exit:
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)

    def straggle(self, started: float) -> None:
        """A straggler does the same work ``factor`` times slower: sleep the difference."""
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * (time.perf_counter() - started))

    def jitter(self) -> None:
        if self.delay_s:
            time.sleep(self.rng.uniform(0, self.delay_s))

    def slow_evaluation(self) -> None:
        """Every rank's evaluation takes ``faults.eval_delay_s`` longer."""
        if self.eval_delay_s:
            time.sleep(self.eval_delay_s)
