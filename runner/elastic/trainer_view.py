"""What elastic training reads and changes of the Trainer (runner/trainer/), declared: the
Trainer hands itself to :class:`~runner.elastic.membership.Membership` and to the spares'
code, which use these parts and nothing else of it."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import torch
from omegaconf import DictConfig

from ..algos.base import Algorithm
from ..comm import Communicator, World
from ..runlog.throughput import Throughput
from ..runlog.writer import RunLog
from ..train.data import ShardedBatches
from ..train.faults import FaultInjector
from ..train.lr_schedule import LRSchedule
from ..train.milestones import Milestones
from ..train.run_state import RunState


class ElasticTrainer(Protocol):
    cfg: DictConfig
    run_dir: Path
    world: World
    comm: Communicator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    algo: Algorithm
    algo_finished: bool
    state: RunState
    shards: ShardedBatches
    milestones: Milestones
    schedule: LRSchedule
    faults: FaultInjector
    ledger: Any  # an EpochLedger (lockstep algorithms), else None
    stop: Any  # the StopAgreement (runner/checkpoint/preemption.py)
    stop_status: str | None
    runlog: RunLog | None
    throughput: Throughput
    start_time: float
    progress_stream: IO[str] | None

    def save_checkpoint(self, reason: str) -> None: ...

    def regroup(self, world: World, comm: Communicator, node_comm: Communicator,
                partial: tuple[int, np.ndarray] | None, algo_state: dict[str, Any] | None = None,
                rate: float | None = None, own: tuple[int, np.ndarray] | None = None
                ) -> None: ...
