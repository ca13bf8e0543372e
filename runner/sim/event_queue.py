"""A discrete-event queue in virtual seconds.

A heap of ``(time, sequence, callback)``: the sequence number breaks ties in the order events
were scheduled, so a simulation is deterministic (the same seed, the same run). A small heap
rather than a process library (simpy): the simulator's events are few kinds of plain callbacks,
and at 1,024 learners there are millions of them, where generator-based processes cost more
than the callbacks themselves.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class EventQueue:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = 0

    def at(self, time: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` at virtual time ``time`` (not before now)."""
        if time < self.now:
            raise ValueError(f"event at {time} is before now ({self.now})")
        heapq.heappush(self._heap, (time, self._sequence, callback))
        self._sequence += 1

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        self.at(self.now + delay, callback)

    def run(self, until: float | None = None) -> float:
        """Process events in time order (until the queue is empty, or up to ``until``); returns
        the virtual time reached."""
        while self._heap and (until is None or self._heap[0][0] <= until):
            self.now, _, callback = heapq.heappop(self._heap)
            callback()
        if until is not None:
            self.now = max(self.now, until)
        return self.now

    def run_while(self, condition: Callable[[], bool]) -> float:
        """Process events in time order while ``condition()`` holds (and events remain)."""
        while self._heap and condition():
            self.now, _, callback = heapq.heappop(self._heap)
            callback()
        return self.now

    def __len__(self) -> int:
        return len(self._heap)
