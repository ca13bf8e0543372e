"""Launcher interface: start ``launcher.nprocs`` ranks of ``runner.worker`` for one run dir."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

from omegaconf import DictConfig

from ..config.section import Section, require
from ..runlog.liveness import HEARTBEAT_S


@dataclass
class LauncherConfig(Section):
    name: str = ""
    nprocs: int = 1  # total ranks
    procs_per_node: Optional[int] = None  # ranks per node (emulated when launched locally)
    # Start a job that lost a rank, its node or its mpiexec again from the newest complete
    # checkpoint, at most this often over the whole run (its earlier jobs' restarts count:
    # runner/launch/restart_policy.py); 0: never. launcher=sim: the modelled job's restarts
    # after its nodes' failures (cluster.failures).
    max_restarts: int = 0
    # A rank whose heartbeat stopped this long ago (a stopped process, a hung node) ends the
    # job (launcher=local; under SLURM the job script's step watcher); 0: never.
    stall_timeout_s: float = 60.0
    # Go on without a learner that dies, instead of ending the job (runner/elastic/membership.py;
    # launcher=local, with an MPI that has ULFM).
    elastic: bool = False
    # An elastic job ends when fewer learners than this remain.
    min_learners: int = 1
    # Processes started beside the learners of an elastic job that wait and replace lost
    # ones, so that the job grows back to nprocs learners (runner/elastic/spares.py).
    spares: int = 0
    # After a loss, start a replacement for each lost learner no spare takes the place of,
    # in the running job (MPI_Comm_spawn; runner/elastic/respawn.py).
    respawn: bool = False
    # Start nothing: list each job (every combination of a -m sweep) with its run dir and
    # whether it would run, resume or be skipped (runner/commands/sweep_plan.py);
    # launcher=slurm's single job: write its job.sbatch only.
    dry_run: bool = False
    # Mean hours between failures of one node of this machine: trainer.checkpoint_every=auto
    # spaces checkpoints by it (the job's MTBF is this over its nodes). null: the cluster
    # preset's cluster.failures.node_mtbf_hours.
    mtbf_h: Optional[float] = None

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.stall_timeout_s == 0 or self.stall_timeout_s >= 3 * HEARTBEAT_S,
                f"{prefix}.stall_timeout_s", f"must be 0 (never) or at least "
                f"{3 * HEARTBEAT_S:.0f} s (ranks beat every {HEARTBEAT_S:.0f} s), got "
                f"{self.stall_timeout_s}", f"{prefix}.stall_timeout_s=60")
        require(self.nprocs >= 1, f"{prefix}.nprocs", f"must be >= 1, got {self.nprocs}",
                f"{prefix}.nprocs=2")
        require(self.max_restarts >= 0, f"{prefix}.max_restarts",
                f"must be >= 0, got {self.max_restarts}", f"{prefix}.max_restarts=3")
        require(1 <= self.min_learners <= self.nprocs, f"{prefix}.min_learners",
                f"must be between 1 and launcher.nprocs={self.nprocs}, got "
                f"{self.min_learners}", f"{prefix}.min_learners={max(1, self.nprocs // 2)}")
        require(not self.elastic or self.nprocs >= 2, f"{prefix}.elastic",
                "an elastic job needs at least 2 learners", f"{prefix}.nprocs=4")
        require(self.spares >= 0, f"{prefix}.spares", f"must be >= 0, got {self.spares}",
                f"{prefix}.spares=1")
        require(not self.spares or self.elastic, f"{prefix}.spares", "spares replace the "
                "learners an elastic job loses; this job is not elastic",
                f"{prefix}.elastic=true (or {prefix}.spares=0)")
        require(not self.respawn or self.elastic, f"{prefix}.respawn", "replacements take "
                "the places of the learners an elastic job loses; this job is not elastic",
                f"{prefix}.elastic=true (or {prefix}.respawn=false)")
        require(self.mtbf_h is None or self.mtbf_h > 0, f"{prefix}.mtbf_h",
                f"must be > 0 hours (or null), got {self.mtbf_h}", f"{prefix}.mtbf_h=1000")
        if self.procs_per_node is not None:
            require(self.procs_per_node >= 1, f"{prefix}.procs_per_node",
                    f"must be >= 1, got {self.procs_per_node}", f"{prefix}.procs_per_node=2")


class Launcher(ABC):
    Config: ClassVar[type] = LauncherConfig
    # False for batch systems: launch() returns once the job is queued, before any result
    # exists (the CLI then prints no results table).
    blocking: ClassVar[bool] = True
    # Whether adpsgd-run builds the recipe's caches (generated corpora, features) before it
    # launches; a batch launcher leaves it to the job, off the login node.
    prepares_data: ClassVar[bool] = True

    def __init__(self, cfg: Any):
        self.cfg = cfg

    @abstractmethod
    def launch(self, run_cfg: DictConfig, run_dir: Path) -> int:
        """Run the job to the end (or, when not ``blocking``, submit it); return the exit
        status."""


class QuietInfo(logging.Filter):
    """Lets through everything but the adpsgd logger's records below WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("adpsgd") and record.levelno < logging.WARNING)


@contextmanager
def records_off_the_console() -> Iterator[None]:
    """While a rank or a simulation runs inside adpsgd-run's own process: the console shows
    its progress lines and results table, as for ranks of their own; the adpsgd logger's
    records below WARNING (evaluations as Python dicts, checkpoints) go to its log file only,
    and its warnings reach Hydra's console handler as well."""
    quiet = QuietInfo()
    consoles = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)]
    for console in consoles:
        console.addFilter(quiet)
    try:
        yield
    finally:
        for console in consoles:
            console.removeFilter(quiet)
