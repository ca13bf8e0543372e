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

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)
