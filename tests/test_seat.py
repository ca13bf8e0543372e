"""A trainer's parts read the world from its Seat (runner/comm/seat.py): when the seat moves
(a regroup under launcher.elastic), the algorithm's context, the checkpointer and the
evaluator are in the new world at once, the held-out set is dealt to its learners and the
new first rank is the one that writes."""

from __future__ import annotations

from pathlib import Path

import torch

from runner.algos import TrainContext
from runner.checkpoint.checkpointer import Checkpointer
from runner.comm import Seat, World
from runner.runlog.timers import Timers
from runner.train.data import ShardedBatches
from runner.train.evaluation import Evaluator


def world(rank: int, size: int) -> World:
    return World(rank=rank, size=size, local_rank=rank, local_size=size, node=0, num_nodes=1)


def test_every_part_follows_the_seat(tmp_path: Path):
    old_comm, old_node, new_comm, new_node = object(), object(), object(), object()
    seat = Seat(world(1, 4), old_comm, old_node)
    ctx = TrainContext(cfg=None, seat=seat, device=torch.device("cpu"), timers=Timers())
    checkpointer = Checkpointer(None, tmp_path, seat, Timers(), None)
    evaluator = Evaluator(None, torch.nn.Linear(2, 2), [], None, seat, None,
                          ShardedBatches(100, 1, 4, 5, seed=0, shuffle=False), tmp_path)
    assert not evaluator.is_main and len(evaluator.shards.epoch_batches(0)) == 5

    # Rank 0 was lost: this learner is the first of 3 now.
    assert seat.move(world(0, 3), new_comm, new_node) == (old_comm, old_node)
    assert ctx.world is checkpointer.world is seat.world and ctx.world.size == 3
    assert ctx.comm is checkpointer.comm is evaluator.comm is new_comm
    assert ctx.node_comm is new_node
    assert evaluator.is_main  # it writes the decoded examples from now on
    shards = evaluator.shards
    assert (shards.rank, shards.size) == (0, 3)
    assert sum(len(b) for b in shards.epoch_batches(0)) == 34  # 100 samples over 3: 34 here
    assert evaluator.shards is shards  # dealt again once, not at every read
