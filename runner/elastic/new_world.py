"""What a new set of learners starts from (launcher.elastic; runner/elastic/membership.py and
runner/elastic/spares.py): their communicators, and the rest of the current pass dealt to them.
The Trainer then points itself at them (runner/trainer/regroup.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..comm import Communicator, World
from ..comm.traffic import Traffic
from ..train.data import ShardedBatches


def unread_pass(shards: ShardedBatches, epoch: int, done_steps: int) -> np.ndarray:
    """The samples of ``epoch``'s pass that no rank of ``shards`` has trained on after its
    first ``done_steps`` steps."""
    return np.concatenate([shards.unread(epoch, done_steps, r) for r in range(shards.size)])


def learner_comms(learner_mpi: Any, timeout_s: float, traffic: Traffic,
                  nodes: list[int] | None = None) -> tuple[World, Communicator, Communicator]:
    """The World and the world and node communicators of the learners' MPI communicator
    (collective over it); ``traffic``: this rank's count of bytes sent, which goes on;
    ``nodes``: each rank's node as launched, kept (else the nodes are the machines)."""
    from ..comm.world import detect_world

    comm = Communicator(learner_mpi, "mpi", name="world", timeout_s=timeout_s, traffic=traffic)
    world, node_mpi = detect_world(learner_mpi, None, nodes)
    return world, comm, Communicator(node_mpi, "mpi", name="node", timeout_s=timeout_s,
                                     traffic=traffic)
