"""Wall-clock accounting per activity (compute, comm, idle, data, eval)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Timers:
    """Accumulated seconds per activity name, for one thread."""

    REPORTED = ("compute", "comm", "idle", "data", "eval")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        for name in self.REPORTED:  # always present in reports, even when zero
            self.seconds[name] = 0.0
        self.active: list[str] = []  # the activities being timed, innermost last

    @property
    def current(self) -> str | None:
        """The innermost activity being timed now (read by the heartbeat's thread: a list's
        last item is read atomically)."""
        try:
            return self.active[-1]
        except IndexError:
            return None

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self.active.append(name)
        try:
            yield
        finally:
            self.active.pop()
            self.seconds[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)


ACTIVITIES = {"compute": "computing", "comm": "communicating", "idle": "waiting for peers",
              "data": "loading a batch", "eval": "evaluating", "checkpoint": "checkpointing",
              "milestone_wait": "waiting for peers at a milestone"}


def activity(timers: Timers, step: int, waiting: str | None = None) -> str:
    """What a rank is doing, in a few words: its step and the activity being timed, or the
    watched MPI call it waits in (``waiting``); its heartbeat carries this to the launcher,
    which names it when the rank stalls or dies."""
    doing = waiting or ACTIVITIES.get(timers.current or "", timers.current or "between phases")
    return f"step {step}: {doing}"
