"""Where each learner of an asynchronous elastic job is in its stream of training samples.

Asynchronous learners (AD-PSGD) each go through their own shard at their own pace, so when
one is lost the survivors are at different places of different passes, and nobody waited for
anyone. What the survivors know of a lost learner is how many samples it had trained when one
of them last heard from it (the progress table that rides on every averaging; its gradients up
to then live on in the models it averaged with). :class:`Streams` turns that count into the
samples it had still to train in its pass, which the survivors then share out:

* every learner's stream is one *current pass* (a list of samples, started at a known count
  of samples trained) followed by whole passes of its shard under a sharding (rank, size);
* at a loss, each survivor's new current pass is the rest of its own pass, then its share
  (dealt in turn by new rank) of what the lost learners had still to train of theirs; later
  passes are shards of the survivors' sharding;
* when spares join at the loss (launcher.spares), the survivors keep only their own rest and
  the spares share what the lost learners had still to train: each takes a lost learner's
  place, samples and all; later passes are shards of the sharding of all of them.

Every survivor holds the streams of every learner and updates them from the same numbers (the
survivors' exact counts, gathered, and the lost learners' counts as last heard, the largest
over the survivors), so they agree on every stream without sending one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..train.data import ShardedBatches


@dataclass
class Stream:
    epoch: int  # the pass ``current`` belongs to
    current: np.ndarray  # its samples, in training order
    start: int  # samples the learner had trained when ``current`` began
    rank: int  # later passes: shard ``rank`` of ``size``
    size: int


def stream_of(shards: ShardedBatches, position: tuple[int, int], trained: int) -> Stream:
    """A learner's own stream: the pass it is in (whatever dealt it: the launch's sharding,
    a resized resume's partial pass, a loss's own pass), begun ``trained`` samples ago minus
    what it has trained of it, then its shards."""
    epoch, done = position
    batches = shards.epoch_batches(epoch)
    current = np.concatenate(batches) if batches else np.empty(0, dtype=np.int64)
    begun = sum(len(b) for b in batches[:done])
    return Stream(epoch, current, trained - begun, shards.rank, shards.size)


class Streams:
    def __init__(self, shards: ShardedBatches, streams: dict[int, Stream]):
        """``streams``: every learner's, by learner (see :func:`stream_of`)."""
        self.shards = shards
        self.streams = streams

    def _shard(self, epoch: int, rank: int, size: int) -> np.ndarray:
        return self.shards.dealt_to(rank, size).pass_order(epoch)[rank::size]

    def position(self, learner: int, trained: int) -> tuple[int, np.ndarray]:
        """(the pass, its samples not yet trained) of ``learner`` after ``trained`` samples."""
        stream = self.streams[learner]
        epoch, samples, left = stream.epoch, stream.current, trained - stream.start
        while left >= len(samples) and len(samples):
            left -= len(samples)
            epoch += 1
            samples = self._shard(epoch, stream.rank, stream.size)
        return epoch, samples[left:]

    def deal(self, survivors: dict[int, int], lost: dict[int, int],
             joiners: list[int] = ()) -> dict[int, Stream]:
        """After a loss: ``survivors`` (learner -> samples trained, in their new rank order)
        go on with their own rest and a share of the ``lost`` learners' (learner -> samples
        trained as last heard). With ``joiners`` (spares that replace the lost learners,
        ranked after the survivors), the survivors keep just their own rest and the joiners
        share the lost learners' instead, in the earliest pass of those. Returns
        every learner's new stream (also kept)."""
        held = [self.position(n, trained) for n, trained in lost.items()]
        left = np.concatenate([rest for _, rest in held] or [np.empty(0, dtype=np.int64)])
        size = len(survivors) + len(joiners)
        takers = len(joiners) or size
        new = {}
        for rank, (learner, trained) in enumerate(survivors.items()):
            epoch, rest = self.position(learner, trained)
            share = left[rank::takers] if not joiners else left[:0]
            new[learner] = Stream(epoch, np.concatenate([rest, share]), trained, rank, size)
        epoch = min((e for e, _ in held), default=0)
        for k, learner in enumerate(joiners):
            new[learner] = Stream(epoch, left[k::takers], 0, len(survivors) + k, size)
        self.streams = new
        return new
