"""Links, shared network interfaces and the collectives' costs, in virtual seconds.

A transfer of M bytes over a link costs ``alpha + M / B`` (latency alpha, bandwidth B). A
node's network interface is a :class:`SharedChannel`: transfers in flight at the same time
share its bandwidth equally (processor sharing), so two exchanges leaving one node each take
about twice as long. Collectives are played out transfer by transfer on these channels, so that
contention with other traffic is what the schedule makes it; on idle channels they take their
closed-form times (Thakur, Rabenseifner and Gropp 2005), e.g. the ring allreduce of M bytes over
n ranks::

    2 (n - 1) / n * M / B  +  2 (n - 1) * alpha
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .event_queue import EventQueue


@dataclass(frozen=True)
class Link:
    latency_s: float  # alpha
    bandwidth_Bps: float  # B, bytes per second

    def transfer_s(self, nbytes: float) -> float:
        """An uncontended transfer: alpha + M / B."""
        return self.latency_s + nbytes / self.bandwidth_Bps


def ring_allreduce_s(n: int, nbytes: float, link: Link) -> float:
    """Closed form of the ring allreduce (reduce-scatter, then allgather: 2 (n - 1) steps of
    M / n bytes each)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth_Bps + 2 * (n - 1) * link.latency_s


class SharedChannel:
    """A network interface: transfers wait ``alpha``, then share its bandwidth equally while
    they are in flight."""

    def __init__(self, queue: EventQueue, link: Link):
        self.queue, self.link = queue, link
        self._flows: dict[int, list] = {}  # id -> [bytes left, bytes in all, on_done]
        self._next_id = 0
        self._updated = 0.0
        self._version = 0  # completions scheduled before the last change are stale
        self.bytes_sent = 0.0

    def send(self, nbytes: float, on_done: Callable[[], None]) -> None:
        """Start a transfer of ``nbytes``; ``on_done()`` when its last byte has left."""
        self.queue.after(self.link.latency_s, lambda: self._start(nbytes, on_done))

    def _start(self, nbytes: float, on_done: Callable[[], None]) -> None:
        self._advance()
        self._flows[self._next_id] = [float(nbytes), float(nbytes), on_done]
        self._next_id += 1
        self.bytes_sent += nbytes
        self._reschedule()

    def _advance(self) -> None:
        """Count the bytes each flow moved since the last change."""
        now = self.queue.now
        if self._flows:
            moved = (now - self._updated) * self.link.bandwidth_Bps / len(self._flows)
            for flow in self._flows.values():
                flow[0] -= moved
        self._updated = now

    def _reschedule(self) -> None:
        self._version += 1
        if not self._flows:
            return
        share = self.link.bandwidth_Bps / len(self._flows)
        first = max(0.0, min(flow[0] for flow in self._flows.values()) / share)
        version = self._version
        self.queue.after(first, lambda: self._complete(version))

    def _complete(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        done = [key for key, (left, total, _) in self._flows.items()
                if left <= 1e-9 * max(total, 1.0)]
        callbacks = [self._flows.pop(key)[2] for key in done]
        self._reschedule()
        for callback in callbacks:
            callback()


def ring_allreduce(queue: EventQueue, channels: list[SharedChannel], nbytes: float,
                   on_done: Callable[[], None]) -> None:
    """Play out a ring allreduce of ``nbytes`` over the ranks whose outgoing interfaces are
    ``channels`` (rank r sends to r + 1). Rank r takes step k + 1 once it has received step k's
    chunk from r - 1 (it must reduce or keep it) and its own send of step k has left; the
    collective is done when every rank has taken its 2 (n - 1) steps."""
    n = len(channels)
    if n <= 1:
        queue.after(0.0, on_done)
        return
    steps, chunk = 2 * (n - 1), nbytes / n
    sent = [0] * n  # sends completed, per rank
    received = [0] * n  # chunks received, per rank
    started = [0] * n  # sends started, per rank
    finished = [0]

    def try_step(rank: int) -> None:
        k = started[rank]
        if k < steps and sent[rank] == k and received[rank] >= k:
            started[rank] += 1
            channels[rank].send(chunk, lambda: arrived(rank))

    def arrived(rank: int) -> None:
        sent[rank] += 1
        peer = (rank + 1) % n
        received[peer] += 1
        if sent[rank] == steps:
            finished[0] += 1
        if received[peer] == steps:
            finished[0] += 1
        if finished[0] == 2 * n:
            on_done()
            return
        try_step(rank)
        try_step(peer)

    for rank in range(n):
        try_step(rank)
