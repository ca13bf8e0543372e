"""Per-rank shards of a dataset: every sample exactly once per epoch, the same step count on
every rank.

Each epoch draws one permutation of the training set from (seed, epoch), identical on all ranks,
and deals it round-robin: rank r gets positions r, r+n, r+2n, ... Step k of rank r is the k-th
block of b of its shard. With this dealing the union over ranks of step k is exactly positions
k*n*b .. (k+1)*n*b - 1 of the permutation, i.e. the batch a single process with batch n*b would
draw, which is what makes SSGD on n ranks equal to one process. Shards differ by at most one
sample, so late batches can be short or empty; every rank still takes the same number of steps
(``ceil(N / (n*b))``), which keeps collectives matched.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class ShardedBatches:
    def __init__(self, dataset_size: int, rank: int, size: int, batch_size: int, seed: int,
                 shuffle: bool = True):
        if dataset_size < 1:
            raise ValueError("empty dataset")
        self.n_items, self.rank, self.size = dataset_size, rank, size
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.steps_per_epoch = math.ceil(dataset_size / (size * batch_size))

    def shard_size(self, rank: int) -> int:
        return len(range(rank, self.n_items, self.size))

    def local_count(self, rank: int, step: int) -> int:
        return max(0, min(self.batch_size, self.shard_size(rank) - step * self.batch_size))

    def counts(self, step: int) -> list[int]:
        """Samples of every rank at step ``step`` of an epoch."""
        return [self.local_count(rank, step) for rank in range(self.size)]

    def global_count(self, step: int) -> int:
        """Samples that all ranks together consume at step ``step`` of an epoch."""
        return min(self.size * self.batch_size,
                   max(0, self.n_items - step * self.size * self.batch_size))

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n_items)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_items)

    def epoch_batches(self, epoch: int, rank: int | None = None) -> list[np.ndarray]:
        shard = self.order(epoch)[self.rank if rank is None else rank::self.size]
        b = self.batch_size
        return [shard[k * b:(k + 1) * b] for k in range(self.steps_per_epoch)]


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
            self._loader = DataLoader(self.dataset, batch_sampler=self.sampler,
                                      collate_fn=self.collate, num_workers=self.num_workers,
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
            yield next(loader) if len(idx) else None
