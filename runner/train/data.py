"""Per-rank shards of a dataset: every sample exactly once per epoch, the same step count on
every rank.

Each epoch draws one permutation of the training set from (seed, epoch), identical on all ranks,
and deals it round-robin: rank r gets positions r, r+n, r+2n, ... Step k of rank r is the k-th
block of b of its shard. With this dealing the union over ranks of step k is exactly positions
k*n*b .. (k+1)*n*b - 1 of the permutation, i.e. the batch a single process with batch n*b would
draw, which is what makes SSGD on n ranks equal to one process. Shards differ by at most one
sample, so late batches can be short or empty; every rank still takes the same number of steps
(``ceil(N / (n*b))``), which keeps collectives matched.

After a resume with another number of ranks (runner/checkpoint/resize.py) one epoch is a *partial
pass*: the samples the old ranks had not reached yet in the epoch they were in, dealt round-robin to
the new ranks in the same way; the epochs after it are whole again.

A :class:`~runner.errors.UserError` raised while loading (a damaged data file) reaches the
trainer as itself, also from loader worker processes (see :class:`WorkerUserError`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ..errors import UserError


class ShardedBatches:
    def __init__(self, dataset_size: int, rank: int, size: int, batch_size: int, seed: int,
                 shuffle: bool = True):
        if dataset_size < 1:
            raise ValueError("empty dataset")
        self.n_items, self.rank, self.size = dataset_size, rank, size
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.steps_per_epoch = math.ceil(dataset_size / (size * batch_size))
        # (epoch, the dataset indices of that epoch's pass, in dealing order): a partial pass
        self.partial: tuple[int, np.ndarray] | None = None
        # (epoch, this rank's own samples of that pass, in order): an asynchronous learner's
        # pass after a loss in an elastic job (runner/elastic/streams.py)
        self.own: tuple[int, np.ndarray] | None = None

    def dealt_to(self, rank: int, size: int,
                 partial: tuple[int, np.ndarray] | None = None) -> ShardedBatches:
        """The same data dealt to rank ``rank`` of ``size``; ``partial``: the current epoch
        and the samples nobody has trained on in it (a regrouped elastic job)."""
        shards = ShardedBatches(self.n_items, rank, size, self.batch_size, self.seed,
                                self.shuffle)
        shards.partial = partial
        return shards

    def pass_order(self, epoch: int) -> np.ndarray:
        """The dataset indices that epoch ``epoch`` deals, in order."""
        if self.partial is not None and self.partial[0] == epoch:
            return self.partial[1]
        if not self.shuffle:
            return np.arange(self.n_items)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_items)

    def _pass_size(self, epoch: int | None) -> int:
        if epoch is not None and self.partial is not None and self.partial[0] == epoch:
            return len(self.partial[1])
        return self.n_items

    def steps_in(self, epoch: int) -> int:
        """Steps of epoch ``epoch``, the same on every rank."""
        return math.ceil(self._pass_size(epoch) / (self.size * self.batch_size))

    def shard_size(self, rank: int, epoch: int | None = None) -> int:
        return len(range(rank, self._pass_size(epoch), self.size))

    def local_count(self, rank: int, step: int, epoch: int | None = None) -> int:
        return max(0, min(self.batch_size,
                          self.shard_size(rank, epoch) - step * self.batch_size))

    def counts(self, step: int, epoch: int | None = None) -> list[int]:
        """Samples of every rank at step ``step`` of an epoch."""
        return [self.local_count(rank, step, epoch) for rank in range(self.size)]

    def global_count(self, step: int, epoch: int | None = None) -> int:
        """Samples that all ranks together consume at step ``step`` of an epoch."""
        return min(self.size * self.batch_size,
                   max(0, self._pass_size(epoch) - step * self.size * self.batch_size))

    def epoch_batches(self, epoch: int, rank: int | None = None) -> list[np.ndarray]:
        if rank is None and self.own is not None and self.own[0] == epoch:
            b, own = self.batch_size, self.own[1]
            return [own[k:k + b] for k in range(0, len(own), b)]
        shard = self.pass_order(epoch)[self.rank if rank is None else rank::self.size]
        b = self.batch_size
        return [shard[k * b:(k + 1) * b] for k in range(self.steps_in(epoch))]

    def unread(self, epoch: int, step: int, rank: int) -> np.ndarray:
        """What rank ``rank`` had still to read of epoch ``epoch`` before its step ``step``."""
        return self.pass_order(epoch)[rank::self.size][step * self.batch_size:]

    def state_dict(self) -> dict[str, Any]:
        state = {}
        if self.partial is not None:
            state.update(partial_epoch=self.partial[0],
                         partial_order=torch.from_numpy(self.partial[1].astype(np.int64)))
        if self.own is not None:
            state.update(own_epoch=self.own[0],
                         own_order=torch.from_numpy(self.own[1].astype(np.int64)))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.partial = ((state["partial_epoch"], state["partial_order"].numpy())
                        if "partial_epoch" in state else None)
        self.own = ((state["own_epoch"], state["own_order"].numpy())
                    if "own_epoch" in state else None)


class EpochBatchSampler:
    """The batch sampler of a long-lived DataLoader: the fetcher puts each pass's index
    batches in before iterating. Iterated in the main process, so replacing the batches
    reaches persistent workers too (they only receive indices)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


@dataclass(frozen=True)
class WorkerUserError:
    """A UserError raised in a loader worker, carried to the main process as a batch. torch
    re-raises a worker's exception with the worker's traceback as its message, which would
    turn the one-line error into a traceback wall."""

    cause: str
    fix: str | None


class UserErrorsAsValues(Dataset):
    """The dataset as loader workers see it: a UserError becomes a :class:`WorkerUserError`."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except UserError as ex:
            return WorkerUserError(ex.cause, ex.fix)


class CollateUserErrors:
    """The collate function as loader workers run it: a batch with a failed sample, or whose
    collation raises a UserError, is the :class:`WorkerUserError` itself."""

    def __init__(self, collate: Callable[[list[Any]], Any]):
        self.collate = collate

    def __call__(self, samples: list[Any]) -> Any:
        failed = next((s for s in samples if isinstance(s, WorkerUserError)), None)
        if failed is not None:
            return failed
        try:
            return self.collate(samples)
        except UserError as ex:
            return WorkerUserError(ex.cause, ex.fix)


class BatchFetcher:
    """Turns index batches into collated batches; empty index batches give ``None``.

    One DataLoader serves every pass, so with ``persistent_workers`` its worker processes
    (and whatever they have opened) live for the whole run instead of being forked again for
    every epoch and evaluation. Batches come out in the order given, whatever the workers.
    """

    def __init__(self, dataset: Dataset, collate, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False):
        self.dataset, self.collate = dataset, collate
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.sampler = EpochBatchSampler()
        self._loader: DataLoader | None = None

    @property
    def loader(self) -> DataLoader:
        if self._loader is None:
            workers = self.num_workers > 0
            self._loader = DataLoader(UserErrorsAsValues(self.dataset) if workers
                                      else self.dataset, batch_sampler=self.sampler,
                                      collate_fn=CollateUserErrors(self.collate) if workers
                                      else self.collate, num_workers=self.num_workers,
                                      pin_memory=self.pin_memory,
                                      persistent_workers=self.persistent_workers)
        return self._loader

    def iterate(self, batches: list[np.ndarray]) -> Iterator[Any]:
        if isinstance(self.dataset, TensorDataset) and self.num_workers == 0:
            for idx in batches:  # in-memory tensors: index them directly, no per-item collate
                yield None if len(idx) == 0 else tuple(
                    t[torch.from_numpy(idx)] for t in self.dataset.tensors)
            return
        self.sampler.batches = [idx.tolist() for idx in batches if len(idx)]
        loader = iter(self.loader)
        for idx in batches:
            batch = next(loader) if len(idx) else None
            if isinstance(batch, WorkerUserError):
                raise UserError(batch.cause, batch.fix)
            yield batch
