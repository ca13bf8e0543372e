"""Held-out evaluation, exact over every rank: each rank scores a strided shard of the held-out
set and one reduction of the recipe's sums gives the global metrics.

What is scored depends on the algorithm: with identical replicas (SSGD) the model itself, with
its BatchNorm statistics averaged over the ranks (they stay local in training); otherwise the
averaged model (``eval``, what the theory analyses) and rank 0's own (``eval_rank0``), in a
scratch copy so that training state is never touched. The final evaluation of a speech recipe
also writes every hypothesis to ``decode/`` (Kaldi text files for adpsgd-score or sclite).

Rank 0's own model is scored where it costs less: sent to every rank, each scoring its shard
(the model's bytes over the network, a tree of log2 n hops), or scored by rank 0 alone on the
whole held-out set (n - 1 more shards of compute on one rank), as the last broadcast and this
evaluation's shards measured it. Both give the same numbers (the sums in another order).
On 4 hosts at 100 Mbit/s the broadcast of a 4.3 MB model took about 0.7 s, and scoring 359
digits a few milliseconds; ResNet-50 on 50,000 images over InfiniBand goes the other way.

Apart from the models' bytes (the average, and rank 0's model where it is sent), an evaluation
is two small collectives: the two maxima that decide where rank 0's model is scored (asked of
everyone: a learner that joined an elastic job has measured no broadcast yet), then every
rank's sums, its part of the consensus distance, the broadcast's time, rank 0's own metrics
where it scored alone and what the caller attaches (each rank's report) in one allgather
(for identical replicas, that allgather alone). Each round costs a latency, and on a link the
gossip fills it waits behind the messages queued there (about 0.35 s for a 4.3 MB one at
100 Mbit/s): it used to be five.

What is scored is the live model, or a :class:`ModelCopy` taken earlier (an evaluation beside
training, runner/train/evaluation_beside.py); the two give the same numbers for the same weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..comm import Communicator, Seat, Seated
from ..comm.buffers import flatten, flatten_parameters, unflatten
from .compute_path import ComputePath
from .data import BatchFetcher, ShardedBatches


@dataclass
class Scored:
    """What :meth:`Evaluator.score` found: ``{split: metrics}``, the consensus distance of
    the models scored (0.0 where not measured) and what every rank attached, in rank order."""

    results: dict[str, dict[str, float]]
    consensus: float
    attached: list[Any]


@dataclass
class ModelCopy:
    """A learner's model at one moment: its flat parameter buffers and every buffer of the
    module (BatchNorm's running statistics), in ``model.buffers()`` order."""

    params: list[torch.Tensor]
    buffers: list[torch.Tensor]


class Evaluator(Seated):
    def __init__(self, recipe: Any, model: torch.nn.Module, param_buffers: list[torch.Tensor],
                 compute: ComputePath, seat: Seat, fetch: BatchFetcher,
                 shards: ShardedBatches, run_dir: Path, comm: Communicator | None = None):
        """``comm``: the communicator its collectives use (default: the seat's, all
        learners); an evaluation beside training has a duplicate of its own."""
        self.recipe, self.model, self.param_buffers = recipe, model, param_buffers
        self.compute, self.seat = compute, seat
        self.fetch, self._shards = fetch, shards
        self.run_dir = run_dir
        # Running statistics (BatchNorm) stay local in training; evaluations average them.
        self.running_stats = any(b.is_floating_point() for b in model.buffers())
        self._scratch: torch.nn.Module | None = None
        self.examples: list[tuple[str, str, str]] = []  # rank 0's decoded samples, last scored
        self._comm = comm
        # Seconds the last broadcast of rank 0's model took (the slowest rank's; None: none
        # yet, so the first eval_rank0 broadcasts and measures). inf scores alone, 0 sends.
        self.broadcast_s: float | None = None

    @property
    def comm(self) -> Communicator:
        return self._comm or self.seat.comm

    def beside(self, comm: Communicator) -> Evaluator:
        """A second evaluator of the same held-out set and model structure whose collectives
        go over ``comm``, with a scratch model of its own (it scores copies while this one's
        owner trains)."""
        return Evaluator(self.recipe, self.model, self.param_buffers, self.compute, self.seat,
                         self.fetch, self._shards, self.run_dir, comm=comm)

    def copy_model(self, params: list[torch.Tensor]) -> ModelCopy:
        """The model as it is now: ``params``, copies of the flat parameters the algorithm
        scores (Algorithm.copy_parameters), and copies of the module's buffers."""
        return ModelCopy(params, [b.detach().clone() for b in self.model.buffers()])

    @property
    def is_main(self) -> bool:
        return self.seat.world.is_main

    @property
    def shards(self) -> ShardedBatches:
        """The held-out set dealt to the learners of the seat's world (dealt again when
        they change)."""
        world = self.seat.world
        if (self._shards.rank, self._shards.size) != (world.rank, world.size):
            self._shards = self._shards.dealt_to(world.rank, world.size)
        return self._shards

    def score(self, identical_replicas: bool, final: bool, copy: ModelCopy | None = None,
              attach: Any = None, consensus: bool = True) -> Scored:
        """Every split this algorithm reports (collective), of the live model or of
        ``copy``, with the consensus distance of the models scored (measured for identical
        replicas too unless ``consensus`` is false) and every rank's ``attach``."""
        comm = self.comm
        mean = lambda t: comm.allreduce_(t, op="mean")  # noqa: E731
        source, distance = copy or self._live(), 0.0
        if identical_replicas and not self.running_stats:
            averaged = self.model if copy is None else self._fill_scratch(source, None)
        elif identical_replicas:  # the same weights, each rank's own BatchNorm statistics
            averaged = self._fill_scratch(source, mean, weights=False)
        else:  # the mean is there now: the distance to it needs no second reduction
            averaged = self._fill_scratch(source, mean)
            distance = self._distance(source, self._scratch_params)
        if identical_replicas and consensus:  # should be 0; measured, not assumed
            distance = self._distance_to_mean(source)
        started = time.perf_counter()
        sums = {"eval": self._sums(averaged, examples=True,
                                   decode_split="eval" if final else None)}
        shard_s, broadcast_s, rank0 = time.perf_counter() - started, None, None
        if not identical_replicas:
            if self._rank0_alone(shard_s):
                if comm.rank == 0:
                    rank0 = self.recipe.metrics(self._sums(self._fill_scratch(source, None),
                                                           alone=True))
            else:
                started = time.perf_counter()
                model = self._fill_scratch(source, lambda t: comm.broadcast_(t, root=0))
                broadcast_s = time.perf_counter() - started
                sums["eval_rank0"] = self._sums(model)
        parts = comm.allgather_objects((sums, broadcast_s, distance, rank0, attach))
        results = {split: self.recipe.metrics(self._total([p[0][split] for p in parts]))
                   for split in sums}
        if parts[0][3] is not None:  # rank 0's own, scored alone
            results["eval_rank0"] = parts[0][3]
        if broadcast_s is not None:
            self.broadcast_s = max(p[1] for p in parts)
        return Scored(results, sum(p[2] for p in parts) / comm.size, [p[4] for p in parts])

    def _rank0_alone(self, shard_s: float) -> bool:
        """Whether rank 0 scores its own model alone: ``n - 1`` more shards (each as long as
        the slowest rank's ``shard_s`` of the averaged model just now) cost less than the last
        broadcast (collective). Every rank decides from the same two maxima: a learner that
        joined an elastic job knows no broadcast yet, the others do."""
        last_broadcast_s, slowest_shard_s = self.comm.allreduce_numbers(
            [self.broadcast_s or 0.0, shard_s], op="max")
        return (self.comm.size - 1) * slowest_shard_s < last_broadcast_s

    def consensus_distance(self) -> float:
        """Xi = (1/n) sum_i ||x_i - xbar||^2 over all parameters of the live models
        (docs/algorithms.md), on its own (collective); an evaluation measures it in
        :meth:`score`."""
        local = self._distance_to_mean(self._live())
        return float(self.comm.allreduce_numbers([local])[0]) / self.comm.size

    def _distance_to_mean(self, source: ModelCopy) -> float:
        """This rank's ||x_i - xbar||^2, xbar reduced here (collective)."""
        return self._distance(source, [self.comm.allreduce_(flat.detach().clone(), op="mean")
                                       for flat in source.params])

    @staticmethod
    def _distance(source: ModelCopy, mean: list[torch.Tensor]) -> float:
        """This rank's ||x_i - xbar||^2, in double precision."""
        return sum(float((mine.detach() - avg).double().pow(2).sum())
                   for mine, avg in zip(source.params, mean))

    def _live(self) -> ModelCopy:
        """The model itself (not copied)."""
        return ModelCopy(self.param_buffers, list(self.model.buffers()))

    def _scratch_model(self) -> torch.nn.Module:
        """A second model for averaged or broadcast weights (flat, like ours)."""
        if self._scratch is None:
            self._scratch = self.compute.copy_model(self.model)
            self._scratch_params = flatten_parameters(self._scratch.parameters())
        return self._scratch

    def _fill_scratch(self, source: ModelCopy, reduce: Callable[[torch.Tensor], Any] | None,
                      weights: bool = True) -> torch.nn.Module:
        """Copy ``source``'s weights and buffers into the scratch model, then ``reduce``
        each flat parameter buffer (unless ``weights`` is false) and the floating buffers in
        place (no reduction: ``reduce`` None)."""
        target = self._scratch_model()
        for src, dst in zip(source.params, self._scratch_params):
            dst.copy_(src)
            if weights and reduce:
                reduce(dst)
        floats = [b for b in target.buffers() if b.is_floating_point()]
        for mine, theirs in zip(source.buffers, target.buffers()):
            theirs.copy_(mine)
        if floats and reduce:  # running statistics (BatchNorm) travel as one message too
            flat = flatten(floats)
            reduce(flat)
            for buf, value in zip(floats, unflatten(flat, floats)):
                buf.copy_(value)
        return target

    def _sums(self, model: torch.nn.Module, examples: bool = False,
              decode_split: str | None = None, alone: bool = False) -> dict[str, float]:
        """This rank's sums of the recipe's metrics over its shard of the held-out set;
        ``examples``: keep rank 0's first decoded samples; ``decode_split``: write every
        hypothesis to ``decode/`` (collective); ``alone``: over the whole held-out set."""
        shards = self.shards.dealt_to(0, 1) if alone else self.shards
        was_training = model.training
        model.eval()
        sums: dict[str, float] = {}
        decoded: list[tuple[str, str, str]] = []
        with torch.no_grad():
            for batch in self.fetch.iterate(shards.epoch_batches(0)):
                if batch is None:
                    continue
                batch = self.compute.batch(self.recipe, batch)
                with self.compute.autocast():
                    for key, value in self.recipe.eval_sums(model, batch).items():
                        sums[key] = sums.get(key, 0.0) + float(value)
                    if examples and self.is_main:
                        self.examples = self.recipe.examples(model, batch)
                        examples = False
                    if decode_split:
                        decoded += self.recipe.decode(model, batch)
        model.train(was_training)
        if decode_split:
            self._write_decoded(decode_split, self.comm.gather_objects(decoded))
        return sums

    @staticmethod
    def _total(parts: list[dict[str, float]]) -> dict[str, float]:
        total: dict[str, float] = {}
        for part in parts:
            for key, value in part.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def _write_decoded(self, split: str, parts: list | None) -> None:
        """decode/<split>.hyp.txt and .ref.txt: Kaldi text files of every held-out sample."""
        rows = sorted(row for part in parts or [] for row in part)
        if not self.is_main or not rows:
            return
        out = self.run_dir / "decode"
        out.mkdir(exist_ok=True)
        for suffix, column in (("ref", 1), ("hyp", 2)):
            (out / f"{split}.{suffix}.txt").write_text(
                "".join(f"{row[0]} {row[column]}".rstrip() + "\n" for row in rows))
