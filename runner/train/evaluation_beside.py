"""Evaluations beside training (``trainer.eval_in_background``).

A met evaluation stops every learner until the slowest reaches the milestone, quiesces an
asynchronous algorithm's gossip, and holds everyone while the held-out set is scored and the
models are averaged over the network. Beside training, each learner instead copies the model it
would score when its count reaches the milestone (the algorithm's parameters between two steps:
Algorithm.copy_parameters, and the module's buffers) and hands the copy to a thread of its own,
which scores it exactly as a met evaluation scores the live model (runner/train/evaluation.py:
the averaged model, rank 0's, the consensus distance of the copies), over a duplicate of the
learners' communicator. Every learner scores its copies in the order it took them, so the
threads' collectives match. Training goes on meanwhile; the trainer records each evaluation
when it has finished (metrics.jsonl, TensorBoard), at the count, step and time of its copy.

On a GPU the thread works on a CUDA stream of its own, after the copies are made.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..comm import Communicator
from ..comm.deadline import CommTimeout
from ..lazy import torch
from .evaluation import Evaluator, ModelCopy


@dataclass
class Evaluation:
    """One evaluation beside training: what was copied, where, and (once scored) what it
    gave. ``report``: this rank's report at the copy (runner/trainer/report.py)."""

    copy: ModelCopy
    identical_replicas: bool
    where: dict[str, Any]
    report: dict[str, Any]
    samples: int  # this rank's own samples trained at the copy
    ready: Any = None  # a CUDA event after the copies (GPU)
    results: dict[str, dict[str, float]] = field(default_factory=dict)
    consensus: float = 0.0
    per_rank: list[dict[str, Any]] | None = None
    examples: list[tuple[str, str, str]] = field(default_factory=list)
    seconds: float = 0.0  # the thread's time scoring it


class EvaluationsBeside:
    """A rank's evaluation thread: :meth:`submit` a copy, :meth:`collect` those scored."""

    def __init__(self, evaluator: Evaluator, comm: Communicator, train_size: int,
                 heard_counts: Callable[[list[int], list[float]], None],
                 before_scoring: Callable[[], None] = lambda: None):
        """``heard_counts(samples, stamps)``: every rank's own count at its copy, which the
        thread learns (Algorithm.heard_counts); ``before_scoring``: called in the thread
        before each evaluation (the tests' slow held-out set, faults.eval_delay_s)."""
        self.comm = comm  # a duplicate of the learners' communicator, this thread's alone
        self.train_size, self.heard_counts = train_size, heard_counts
        self.before_scoring = before_scoring
        self.evaluator = evaluator.beside(comm)
        self.device = evaluator.compute.device
        self._todo: queue.Queue[Evaluation | None] = queue.Queue()
        self._done: queue.Queue[Evaluation | BaseException] = queue.Queue()
        self.uncollected: list[Evaluation] = []  # submitted, not collected yet, in order
        self._thread: threading.Thread | None = None

    def submit(self, evaluation: Evaluation) -> None:
        """Score ``evaluation`` after those submitted before it."""
        if self.device.type == "cuda":
            evaluation.ready = torch.cuda.Event()
            evaluation.ready.record()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="evaluation", daemon=True)
            self._thread.start()
        self.uncollected.append(evaluation)
        self._todo.put(evaluation)

    def collect(self, leave: int | None = None) -> list[Evaluation]:
        """The evaluations scored since the last call, in the order they were submitted;
        ``leave``: wait until exactly that many are still pending, the last submitted (0: all
        scored). An error of the thread is raised here."""
        finished, wait = [], leave is not None
        while len(self.uncollected) > (leave or 0):
            try:
                # Every collective of the thread is bounded by comm.timeout_s itself.
                item = self._done.get(block=wait, timeout=self.comm.timeout_s + 60 if wait
                                      else None)
            except queue.Empty:
                if not wait:
                    break
                raise CommTimeout(f"an evaluation beside training did not finish in "
                                  f"{self.comm.timeout_s + 60:.0f} s") from None
            if isinstance(item, BaseException):
                self.uncollected.clear()
                raise item
            self.uncollected.remove(item)
            finished.append(item)
        return finished

    def close(self) -> None:
        """End the thread (after :meth:`collect` with ``leave=0``) and free its communicator."""
        if self._thread is not None:
            self._todo.put(None)
            self._thread.join(timeout=self.comm.timeout_s)
            self._thread = None
        self.comm.close()

    def _work(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        while (evaluation := self._todo.get()) is not None:
            try:
                if stream is None:
                    self._score(evaluation)
                else:
                    with torch.cuda.stream(stream):
                        stream.wait_event(evaluation.ready)
                        for tensor in evaluation.copy.params + evaluation.copy.buffers:
                            tensor.record_stream(stream)  # not reused before it is done
                        self._score(evaluation)
                    stream.synchronize()
            except BaseException as error:  # noqa: BLE001 - raised by the training thread
                self._done.put(error)
                return
            evaluation.copy = ModelCopy([], [])  # the memory goes back now
            self._done.put(evaluation)

    def _score(self, evaluation: Evaluation) -> None:
        started = time.perf_counter()
        self.before_scoring()
        evaluator = self.evaluator
        scored = evaluator.score(evaluation.identical_replicas, False, evaluation.copy,
                                 attach=(evaluation.report, evaluation.samples,
                                         evaluation.where["stamp"]))
        evaluation.results, evaluation.consensus = scored.results, scored.consensus
        everyone = scored.attached
        evaluation.per_rank = [report for report, _, _ in everyone]
        samples = [count for _, count, _ in everyone]
        self.heard_counts(samples, [stamp for _, _, stamp in everyone])
        # The copies' count: every learner's own at its copy (exact, where the learners'
        # estimates at their copies were not).
        where = evaluation.where
        where["samples"] = sum(samples)
        where["epoch"] = round(where["samples"] / self.train_size, 4)
        evaluation.examples = evaluator.examples
        evaluation.seconds = time.perf_counter() - started
