"""Checkpoints written beside training (``trainer.checkpoint_in_background``).

At a scheduled checkpoint each rank takes its part of a consistent cut at its own moment,
without meeting the others (Algorithm.capture_state: AD-PSGD's cut after Chandy and Lamport,
runner/comm/pairwise.py), copies the rest of its state (runner/trainer/rank_state.py) and
goes on training, while a thread of its own writes the checkpoint:

1. waits until the averaging in flight at the capture, if any, has ended (it may still add its
   half to the copy of the model);
2. agrees with the other ranks' threads, over a communicator of their own and in one
   allgather, on whether the state is finite (a poisoned state is never written), on the
   evaluations a run resumed from it owes (those rank 0 had not recorded at its capture: they
   are not waited for), on the cut's exact global sample count (the sum of the learners' own
   counts at their captures: every rank's count once every rank has captured) and on whether
   rank 0 has a complete checkpoint there already;
3. writes the files as a met checkpoint does (runner/checkpoint/checkpointer.py): temporary
   file, fsync, rename, every rank's checksum to rank 0, then the marker. Complete or absent:
   a kill during the write leaves the previous checkpoint the newest complete one.

Two small collectives in all (the agreement, the checksums): on a link the gossip fills, each
waits behind the messages queued there, and the next capture waits for this write.

The next checkpoint waits for this write to end (so captures never run more than one apart),
and so do a stop and the end of the run. A failed write is raised in the training thread at its
next step.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from ..comm import Communicator
from ..train.nonfinite import nonfinite_error
from .checkpointer import Checkpointer
from .files import complete_checkpoints

log = logging.getLogger("adpsgd")


@dataclass
class CapturedCheckpoint:
    """What the training thread took at a checkpoint for the writer: the rank's state (its
    ``algo`` entry still to be made from ``capture``), where, and what else it must wait for."""

    saved: dict[str, Any]
    capture: Any
    algo: Any  # the Algorithm: captured_state_dict(capture)
    step: int
    reason: str
    train_size: int
    finite: bool  # the training loss since the last log, and the weights


class CheckpointWriter:
    """A rank's checkpoint thread: :meth:`submit` one capture, :meth:`wait` for its write."""

    def __init__(self, checkpointer: Checkpointer, comm: Communicator):
        self.checkpointer = checkpointer
        self.comm = comm  # a duplicate of the learners' communicator, this thread's alone
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, job: CapturedCheckpoint) -> None:
        """Write ``job`` beside training (after :meth:`wait` for the previous one)."""
        assert self._thread is None, "a checkpoint is still being written"
        self._thread = threading.Thread(target=self._run, args=(job,), name="checkpoint",
                                        daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the write in progress (if any) has ended; raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.poll()

    def poll(self) -> None:
        """Raise the error of a write that failed (cheap: called every step)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        self.wait()
        self.comm.close()

    def _run(self, job: CapturedCheckpoint) -> None:
        try:
            self._write(job)
        except BaseException as error:  # noqa: BLE001 - raised by the training thread
            self._error = error

    def _write(self, job: CapturedCheckpoint) -> None:
        saved, comm, world = job.saved, self.comm, self.checkpointer.world
        saved["algo"] = job.algo.captured_state_dict(job.capture)
        trainer = saved["trainer"]
        written = ([c.samples for c in complete_checkpoints(self.checkpointer.run_dir)]
                   if world.is_main else None)
        parts = comm.allgather_objects((job.finite, trainer["evaluations_owed"],
                                        int(trainer["local_samples"]), written))
        finite = [bool(part[0]) for part in parts]
        if not all(finite):
            error = nonfinite_error("non-finite training loss or weights", job.step,
                                    [r for r, ok in enumerate(finite) if not ok],
                                    self.checkpointer.last)
            error.quiet = not world.is_main
            raise error
        # Rank 0 records the evaluations: whether a resumed run owes one is its to say (the
        # other ranks' threads may have finished theirs sooner or later).
        trainer["evaluations_owed"] = parts[0][1]
        samples = sum(part[2] for part in parts)
        trainer["samples"] = samples  # the cut's, exact, on every rank
        self.checkpointer.save(samples, job.step, samples / job.train_size, job.reason,
                               lambda: saved, beside=comm, exists=samples in parts[0][3])
