"""Bytes on the wire: what a rank hands to the network for training, counted where it sends.

Every path that moves a training tensor to another rank counts its bytes at the call that
sends them, in the dtype they travel in (a compressed or lower-precision message counts its
own size):

* ``exchange`` (runner/comm/communicator.py): point-to-point messages of D-PSGD, SGP,
  CHOCO-SGD and delay-by-one, once per destination;
* ``gossip`` (runner/comm/pairwise.py): AD-PSGD's snapshots and the progress table sent with
  each, by the active and the passive end alike;
* ``allreduce``: 2 (n - 1) / n of the buffer reduced over n ranks (SSGD's gradients, local
  SGD's and DiLoCo's averages, a super learner's internal averaging): what each rank sends in
  the bandwidth-optimal reduction (a ring, or reduce-scatter then allgather) that MPI
  libraries use for large buffers. MPI's own choice is not visible to this process; the
  lower-precision ring (``comm.exchange_dtype``) is ours, and sends exactly that;
* ``broadcast``: the buffer, counted once, by the root.

Keys are ``<communicator>/<kind>`` (``world/allreduce``, ``node/allreduce``, ``world/gossip``),
so a hierarchical run shows its intra-node traffic apart. Evaluation, the first model
broadcast and a joining learner's state are not training traffic: code that sends them runs
inside :meth:`Traffic.aside`. Control messages (a few numbers) are not counted.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Traffic:
    """One rank's training bytes sent, by ``<communicator>/<kind>``; shared by the rank's
    communicators and its gossip thread (counts are added under a lock)."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        # The step counting began at: 0, or the step of a checkpoint written before bytes
        # were counted (per step is then over the steps since).
        self.since_step = 0
        self._lock = threading.Lock()
        self._aside = threading.local()

    def count(self, key: str, nbytes: int) -> None:
        """Add ``nbytes`` sent under ``key``, unless the calling thread is inside ``aside()``."""
        if getattr(self._aside, "depth", 0):
            return
        with self._lock:
            self.sent[key] = self.sent.get(key, 0) + int(nbytes)

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Sends from this thread meanwhile are not training traffic (evaluation, set-up)."""
        self._aside.depth = getattr(self._aside, "depth", 0) + 1
        try:
            yield
        finally:
            self._aside.depth -= 1

    def total(self) -> int:
        with self._lock:
            return sum(self.sent.values())

    def report(self, steps: int) -> dict[str, object]:
        """What summary.json and TensorBoard show for this rank after ``steps`` local steps."""
        with self._lock:
            sent = dict(self.sent)
        return traffic_report(sent, steps - self.since_step)

    def state_dict(self) -> dict[str, object]:
        with self._lock:
            return {"sent": dict(self.sent), "since_step": self.since_step}

    def load_state_dict(self, state: dict[str, object] | None, step: int) -> None:
        """Continue the counts of a checkpoint at ``step``; one without them (written before
        bytes were counted) starts counting there."""
        with self._lock:
            if state is None:
                self.sent, self.since_step = {}, step
            else:
                self.sent = {key: int(value) for key, value in state["sent"].items()}
                self.since_step = int(state["since_step"])


def traffic_report(sent: dict[str, int], steps: int) -> dict[str, object]:
    """A rank's (or a simulated learner's) bytes sent by key after ``steps`` local steps: the
    total, per step, and by key (keys with nothing sent are left out)."""
    by_kind = {key: int(value) for key, value in sent.items() if value}
    total = sum(by_kind.values())
    return {"total": total, "per_step": total / max(steps, 1), "by_kind": by_kind}
