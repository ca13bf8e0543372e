"""Asynchronous pairwise model averaging between an active and a passive rank (AD-PSGD,
docs/algorithms.md).

One gossip thread per participant owns the averaging of a shared model ``x`` (flat buffers):

* an **active** takes a snapshot ``s_a`` of x, sends it to a passive peer, receives the peer's
  snapshot ``s_p``, and merges ``x <- x + ((s_a + s_p)/2 - s_a)``;
* a **passive** never initiates: when a request arrives it takes a snapshot ``s_p``, replies
  with it and merges ``x <- x + ((s_a + s_p)/2 - s_p)``.

Both ends average exactly the two vectors that were exchanged, so the pair's sum is preserved
(with ``wire``, a lower precision on the wire, both snapshots are the rounded ones, and what
rounding left out stays in each x) and the result equals "average atomically, then apply the
gradients that arrived meanwhile": the training thread keeps applying its own gradients to x
(under the same short lock) and never waits for a transfer. Every wait is a poll with back-off
(no core spent spinning on an oversubscribed machine) and a timeout whose message names this
rank, its peer and the operation. Waits always go from an active to a passive, and passives
never wait for anyone, so no cycle of waits (deadlock) can form.

Progress rides along: each message carries the sender's table of samples seen per participant
(with when and how fast, runner/comm/global_clock.py), merged row by row, which gives every rank an
estimate of global progress.

**Checkpoints without stopping the gossip** (:meth:`PairwiseAverager.capture`): a consistent cut
taken by each learner at its own moment, after Chandy and Lamport's snapshots. Every header
carries the sender's *generation*, the number of captures it has taken. An averaging belongs to
the generation of the later of its two headers: a learner that receives a header of a later
generation than its own captures first (its gossip thread waits for its training thread, which
reaches the same checkpoint within a step: the milestone was announced to it), so both ends
count the averaging after that capture. A learner that captures while an averaging of an earlier
generation is in flight adds that averaging's half to its copy when it merges, as its partner,
which captures later or did the same, counts it too. Every pair's sum is then the same in the
copies as in a world where the averaging happened wholly before or wholly after the cut.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..lazy import torch
from .global_clock import ProgressTable
from .traffic import Traffic
from .ulfm import (
    free_completed,
    keep_abandoned,
    post_each,
    retire_comm,
    start_recv,
    start_send,
    track,
)
from .world import mpi

REQUEST, REPLY, MODEL_REQUEST, MODEL_REPLY = 21, 22, 23, 24
SWITCH_INTERVAL_S = 2e-4
log = logging.getLogger("adpsgd")


def merge_average_(x: torch.Tensor, mine: torch.Tensor, theirs: torch.Tensor,
                   rows: torch.Tensor | None = None) -> None:
    """``x <- x + ((mine + theirs)/2 - mine)``, computed as ``(theirs - mine)/2`` on both ends
    with the roles swapped, so the pair's sum is unchanged (``theirs`` is overwritten). The
    one merge rule of AD-PSGD: real ranks call it per flat buffer, the simulator on the
    ``rows`` of its stacked models (``mine``, ``theirs``: one row each). Snapshots in a lower
    precision than x are widened first."""
    if theirs.dtype != x.dtype:
        theirs, mine = theirs.to(x.dtype), mine.to(x.dtype)
    delta = theirs.sub_(mine).to(x.device)
    if rows is None:
        x.add_(delta, alpha=0.5)
    else:
        x.index_add_(0, rows, delta, alpha=0.5)


def copy_snapshots(snapshots: list[torch.Tensor], buffers: list[torch.Tensor]) -> None:
    """Snapshot x into the (host) buffers that are sent: blocking copies, so a GPU's pending
    updates to x land first."""
    for snapshot, x in zip(snapshots, buffers):
        snapshot.copy_(x)


def merge_all(buffers: list[torch.Tensor], snapshots: list[torch.Tensor],
              received: list[torch.Tensor]) -> None:
    """:func:`merge_average_` for every flat buffer of x."""
    for x, mine, theirs in zip(buffers, snapshots, received):
        merge_average_(x, mine, theirs)


def header_nbytes(size: int) -> int:
    """Bytes of an averaging's header among ``size`` participants: the sender's progress
    table and its capture generation (one float64)."""
    return ProgressTable.packed_nbytes(size) + np.dtype(np.float64).itemsize


class ExchangeTimeout(RuntimeError):
    pass


@dataclass
class Capture:
    """A learner's part of a checkpoint's cut (:meth:`PairwiseAverager.capture`): the
    ``generation``-th capture, a copy of x, the gossip's counters and the rest of its state."""

    generation: int
    x: list[torch.Tensor]
    gossip: dict
    more: dict = field(default_factory=dict)


class PairwiseAverager:
    def __init__(self, mpi_comm, buffers: list[torch.Tensor], lock: threading.Lock,
                 is_active: bool, next_peer: Callable[[int], int], timeout_s: float = 300.0,
                 rate_limited: bool = True, traffic: Traffic | None = None,
                 wire: torch.dtype | None = None):
        """``mpi_comm``: the participants (a duplicate is used, never shared with other
        threads); ``buffers``: the shared model x; ``next_peer(k)``: the passive peer of this
        active's k-th exchange; ``rate_limited``: an active averages once per :meth:`tick`;
        ``traffic``: where the bytes sent are counted (``world/gossip``); ``wire``: the dtype
        the snapshots travel in (None: x's own)."""
        self.MPI = mpi()
        # Tracked: in an elastic job a failure revokes it, which ends every gossip thread's
        # wait on it (runner/comm/ulfm.py).
        self.comm = track(mpi_comm.Dup())
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.buffers, self.lock = buffers, lock
        # Elastic jobs: a failed exchange is raised at the next step's start
        # (:meth:`raise_if_failed`), not in the middle of one (:meth:`tick`).
        self.defer_errors = False
        self.is_active, self.next_peer = is_active, next_peer
        self.timeout_s, self.rate_limited = timeout_s, rate_limited
        self.traffic = Traffic() if traffic is None else traffic
        # MPI sends host memory: GPU models are staged through page-locked host copies.
        self.snapshots = [_host_like(b, wire) for b in buffers]
        self.received = [_host_like(b, wire) for b in buffers]
        # What staging costs on a GPU: seconds in the snapshot copies out of the device and in
        # the merges (the difference on the host, its copy back and the add), and the bytes of
        # model staged (once per exchange): ms per MB of model, as benchmarks/bench_staging.py.
        self.staged = any(b.is_cuda for b in buffers)
        self.staging_s = 0.0
        self.staged_bytes = 0
        self.progress = ProgressTable(self.size, self.rank)  # everyone's samples seen
        self.exchanges = 0
        self.partners: dict[int, int] = {}
        self.version = 0  # increments with every merge: gradient staleness is measured in it
        self.intervals: list[tuple[float, float, int]] = []  # (start, end, peer), if recorded
        self.record_intervals = False
        # Every snapshot and merge, for a replay (runner/algos/trace.py); None: not recorded.
        self.trace: list[list] | None = None
        self.error: BaseException | None = None
        # Whether an active may start an exchange, and whether one is in flight here: read
        # and written together under one condition, so that quiesce() cannot slip between an
        # active's permission check and the start of its exchange.
        self._state = threading.Condition()
        self._initiate_allowed = True
        self._busy = False
        # Tests only: called between an active's permission check and the start of its
        # exchange, to force a thread switch inside that window.
        self.before_exchange: Callable[[], None] | None = None
        self._ticks = threading.Semaphore(0)
        self._running = True
        # Captures (see the module's docstring): how many taken, those whose copy an averaging
        # in flight may still change (generation -> copy), and the generation of this rank's
        # header in the averaging in flight (None: none sent).
        self.generation = 0
        self._open: dict[int, Capture] = {}
        self._header_generation: int | None = None
        # The gossip thread runs a few Python statements between MPI calls; with CPython's
        # default 5 ms switch interval each of them can wait that long for the GIL while the
        # training thread runs, which made exchanges ~10x rarer than steps.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._loop, name="gossip", daemon=True)
        self._thread.start()

    # ---- called by the training thread ------------------------------------------------------
    def tick(self, local_samples: int) -> None:
        """One local step done: publish progress; a rate-limited active may average once."""
        with self.lock:  # the gossip thread merges progress under the same lock
            self.progress.tick(local_samples)
        if self.rate_limited:
            self._ticks.release()
        if not self.defer_errors:
            self.raise_if_failed()

    def global_samples(self) -> int:
        with self.lock:
            return self.progress.estimate()

    def capture(self, more: Callable[[], dict] = dict) -> Capture:
        """Take this learner's part of a checkpoint's cut now, without waiting for anyone
        (training thread, between two steps): a copy of x and of the gossip's counters, and
        ``more()`` (the rest of the learner's state) read under the same lock. The copy may
        still take the half of the averaging in flight: :meth:`settle` waits for that."""
        with self.lock:
            self.generation += 1
            capture = Capture(self.generation, [b.detach().clone() for b in self.buffers],
                              self.counters(), more())
            if self._busy and self._header_generation is not None:
                self._open[capture.generation] = capture  # an averaging of before is in flight
        with self._state:
            self._state.notify_all()  # a gossip thread may wait for this capture
        return capture

    def counters(self) -> dict:
        """The gossip's counters as a checkpoint keeps them (under the model lock): the
        progress table's counts, the exchange count (the peer schedule is a function of it),
        the merge version and the averagings done with each partner."""
        return {"counts": torch.from_numpy(self.progress.counts.copy()),
                "exchanges": self.exchanges, "version": self.version,
                "partners": dict(self.partners)}

    def settle(self, capture: Capture) -> Capture:
        """Wait until no averaging in flight can change ``capture`` any more (its copy is
        final); any thread."""
        deadline = time.monotonic() + self.timeout_s
        with self._state:
            while capture.generation in self._open:
                self.raise_if_failed()
                if time.monotonic() > deadline:
                    raise ExchangeTimeout(f"participant {self.rank}: the averaging in flight "
                                          f"at a checkpoint did not end in {self.timeout_s:.0f} s")
                self._state.wait(timeout=0.5)
        return capture

    def _catch_up(self, generation: int, peer: int) -> None:
        """Gossip thread: a header of ``generation`` arrived; take part in it only after this
        learner's own capture of it (its training thread is at most a step away)."""
        deadline = time.monotonic() + self.timeout_s
        with self._state:
            while self.generation < generation and self._running:
                if time.monotonic() > deadline:
                    raise ExchangeTimeout(
                        f"participant {self.rank}: participant {peer} took checkpoint "
                        f"{generation} and this learner did not reach it in "
                        f"{self.timeout_s:.0f} s")
                self._state.wait(timeout=0.1)

    def quiesce(self, barrier: Callable[[], None]) -> None:
        """Stop initiating, let every in-flight exchange end everywhere (collective).

        After the barrier no active anywhere has an exchange in flight or can start one (it
        either marked itself busy before this call took the state lock, and this call waited
        for that exchange to end, or it sees the pause); a passive may still be merging the
        last reply it sent, which the second wait covers.
        """
        with self._state:
            self._initiate_allowed = False
        self._ticks.release()  # wake an active waiting for a tick so it can see the pause
        self._wait_idle()
        barrier()
        self._wait_idle()
        self.raise_if_failed()

    def resume(self) -> None:
        with self.lock:
            self.progress.pause_clock()
        with self._state:
            self._initiate_allowed = True
            self._state.notify_all()

    def stop(self, barrier: Callable[[], None]) -> None:
        self.quiesce(barrier)
        with self._state:
            self._running = False
            self._state.notify_all()
        self._ticks.release()
        self._thread.join()
        self.comm.Free()

    def abandon(self) -> None:
        """After a peer was lost (elastic jobs): end the gossip thread without waiting for
        anyone (its communicator is revoked: any wait on it returns) and free what is left."""
        with self._state:
            self._running = False
            self._state.notify_all()
        self._ticks.release()
        self._thread.join(timeout=self.timeout_s)
        retire_comm(self.comm)

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _wait_idle(self) -> None:
        with self._state:
            while self._busy:
                self._state.wait(timeout=0.5)
                self.raise_if_failed()

    def _set_busy(self, busy: bool) -> None:
        with self._state:
            with self.lock:
                self._busy = busy
                if not busy:  # no averaging in flight: every capture's copy is final
                    self._header_generation = None
                    self._open.clear()
            self._state.notify_all()

    # ---- gossip thread -------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._running:
                if self.is_active:
                    self._active_round()
                else:
                    self._serve_one()
        except BaseException as ex:  # noqa: BLE001 - reported to the training thread
            self.error = ex
            log.error("gossip thread of participant %d failed: %s", self.rank, ex)

    def _active_round(self) -> None:
        if self.rate_limited and not self._ticks.acquire(timeout=0.5):
            return
        with self._state:
            if not (self._running and self._initiate_allowed):
                self._state.wait(timeout=0.5)  # until resume() (or stop) wakes us
                return
            if self.before_exchange is not None:
                self.before_exchange()
            self._busy = True
        try:
            peer = self.next_peer(self.exchanges)
            started = time.perf_counter()
            key = [self.rank, peer, self.partners.get(peer, 0)]
            header = self._snapshot(key)
            reply = np.empty_like(header)
            self._wait(post_each([lambda: self._send(header, peer, REQUEST),
                                  lambda: start_recv(self.comm, reply, source=peer, tag=REPLY)]),
                       peer, "request")
            requests = post_each(
                [*(partial(self._send, _np(s), peer, MODEL_REQUEST) for s in self.snapshots),
                 *(partial(start_recv, self.comm, _np(r), source=peer, tag=MODEL_REPLY)
                   for r in self.received)])
            self._wait(requests, peer, "model exchange")
            self._catch_up(int(reply[-1]), peer)
            self._merge(reply, peer, started, key)
        finally:
            self._set_busy(False)

    def _serve_one(self) -> None:
        status = self.MPI.Status()
        delay = 1e-4
        while not self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=REQUEST, status=status):
            if not self._running:
                return
            time.sleep(delay)
            delay = min(delay * 2, 2e-3)
        self._set_busy(True)
        try:
            peer = status.Get_source()
            started = time.perf_counter()
            header = np.empty(3 * self.size + 1)
            self.comm.Recv(header, source=peer, tag=REQUEST)
            self._catch_up(int(header[-1]), peer)
            key = [peer, self.rank, self.partners.get(peer, 0)]
            snapshot = self._snapshot(key)
            requests = post_each(
                [partial(self._send, snapshot, peer, REPLY),
                 *(partial(start_recv, self.comm, _np(r), source=peer, tag=MODEL_REQUEST)
                   for r in self.received),
                 *(partial(self._send, _np(s), peer, MODEL_REPLY) for s in self.snapshots)])
            self._wait(requests, peer, "reply")
            self._merge(header, peer, started, key)
        finally:
            self._set_busy(False)

    def _send(self, data: np.ndarray, peer: int, tag: int):
        """Post one message to ``peer``, counted as sent."""
        self.traffic.count("world/gossip", data.nbytes)
        return start_send(self.comm, data, dest=peer, tag=tag)

    def _snapshot(self, key: list[int]) -> np.ndarray:
        """Copy x into the snapshot buffers; return the progress table of that moment.
        ``key``: (active, passive, how many averagings the pair did before this one)."""
        with self.lock:
            if self.trace is not None:
                self.trace.append(["snap", *key])
            started = time.perf_counter()
            copy_snapshots(self.snapshots, self.buffers)
            self._count_staging(started, exchange=True)
            self._header_generation = self.generation
            return np.append(self.progress.pack(), float(self.generation))

    def _merge(self, their_progress: np.ndarray, peer: int, started: float,
               key: list[int]) -> None:
        with self.lock:
            if self.trace is not None:
                self.trace.append(["merge", *key])
            merge_started = time.perf_counter()
            # Captured since this averaging's headers: their copies count it too.
            belongs = max(self._header_generation or 0, int(their_progress[-1]))
            copies = [c for g, c in self._open.items() if g > belongs]
            for capture in copies:
                for copy, mine, theirs in zip(capture.x, self.snapshots, self.received):
                    copy.add_(theirs.to(copy.dtype).sub(mine.to(copy.dtype)).to(copy.device),
                              alpha=0.5)
                capture.gossip["exchanges"] += 1
                capture.gossip["version"] += 1
                capture.gossip["partners"][peer] = capture.gossip["partners"].get(peer, 0) + 1
            merge_all(self.buffers, self.snapshots, self.received)
            self._count_staging(merge_started, exchange=False)
            self.version += 1
            self.progress.merge(their_progress[:-1])
            self.exchanges += 1
            self.partners[peer] = self.partners.get(peer, 0) + 1
        if self.record_intervals:
            self.intervals.append((started, time.perf_counter(), peer))

    def _count_staging(self, started: float, exchange: bool) -> None:
        if self.staged:
            self.staging_s += time.perf_counter() - started
            if exchange:
                self.staged_bytes += sum(b.numel() * b.element_size() for b in self.buffers)

    def _wait(self, requests, peer: int, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        delay = 2e-5
        try:
            while not self.MPI.Request.Testall(requests):
                if time.monotonic() > deadline:
                    raise ExchangeTimeout(
                        f"participant {self.rank}: {what} with participant {peer} got no "
                        f"answer in {self.timeout_s:.0f} s (is rank {peer} alive?)")
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)
            free_completed(requests)
        except BaseException:
            keep_abandoned(requests)  # freed in flight, a failing send aborts the process
            raise


def _np(tensor: torch.Tensor) -> np.ndarray:
    """A host tensor's bytes for MPI (numpy has no bfloat16)."""
    return tensor.detach().view(-1).view(torch.uint8).numpy()


def _host_like(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised host tensor shaped like ``tensor``, in ``dtype`` (default: its own;
    page-locked if it is on a GPU, so the copies to and from it are fast)."""
    return torch.empty(tensor.shape, dtype=dtype or tensor.dtype, pin_memory=tensor.is_cuda)
