"""What differs between the MPIs the local launcher starts jobs with, in one object per
flavour: the mpiexec command, the ranks' environment, where Open MPI's session files go, and
which signal carries a stop through mpiexec to ranks on other hosts.

* MPICH's mpiexec (Hydra, the venv's): run with ``-disable-auto-cleanup``, since its own
  clean-up kills every rank at once and hides which one died first (the watchdog ends the job
  itself); across hosts with ``-print-all-exitcodes``, how each rank there ended.
* Open MPI 5 with ULFM (.venv/ulfm's, every elastic job): its own arguments
  (runner/launch/ulfm_mpi.py), the environment that makes mpi4py load its libmpi, session
  files in a base of the job's own, and the environment named for ranks on other hosts.
* Another Open MPI: started plainly; through its mpiexec a Ctrl-C travels as SIGUSR2 and a
  SIGTERM as SIGUSR1 (it kills the ranks on SIGINT and SIGTERM).
* Any other mpiexec: started plainly, its clean-up kept.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from ..rank_factory import FACTORY_ADDRESS, starts_warm
from ..runlog.console import CONSOLE_IS_TERMINAL
from ..runlog.liveness import (
    HEARTBEAT_TO,
    LAUNCHER_HOST,
    LAUNCHER_PID,
    LINK_TIMEOUT,
    NETWORK_HEARTBEAT_S,
)
from .hosts import mpi_flavor
from .stop_forwarding import OPEN_MPI_FORWARDS
from .ulfm_mpi import (
    has_ulfm,
    open_mpi_args,
    open_mpi_link_args,
    open_mpi_remote_args,
    session_base,
    ulfm_environment,
)

# What a rank needs from the launcher's environment, which Open MPI passes to ranks on other
# hosts only when named.
RANK_ENVIRONMENT = ["PATH", "LD_LIBRARY_PATH", "MPI4PY_LIBMPI", "PYTHONUNBUFFERED",
                    "OMP_NUM_THREADS", CONSOLE_IS_TERMINAL, LAUNCHER_PID, LAUNCHER_HOST,
                    HEARTBEAT_TO, LINK_TIMEOUT, NETWORK_HEARTBEAT_S]


class MpiFlavour:
    """An mpiexec the launcher knows nothing special of."""

    # Through mpiexec (a job across hosts): the signal that carries each stop signal.
    forwards: dict[int, int] = {}

    def __init__(self, mpiexec: str):
        self.mpiexec = mpiexec

    def command(self, cfg: Any, processes: int, hosts: list[str], program: list[str],
                cleanup_by_watchdog: bool, session_dirs: str | None) -> list[str]:
        """``mpiexec -n PROCESSES [hosts] python PROGRAM...``; ``cleanup_by_watchdog``: the
        launcher's watchdog, not mpiexec, ends the job after a rank's death."""
        return [self.mpiexec, "-n", str(processes), *hosts,
                *self.job_args(cfg, cleanup_by_watchdog), *cfg.mpiexec_args, sys.executable,
                *program]

    def job_args(self, cfg: Any, cleanup_by_watchdog: bool) -> list[str]:
        return []

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """The ranks' environment, from the launcher's."""
        return env

    @contextlib.contextmanager
    def sessions(self) -> Iterator[str | None]:
        """Where the job's runtime keeps its session files (None: its default)."""
        yield None


class Hydra(MpiFlavour):
    def job_args(self, cfg: Any, cleanup_by_watchdog: bool) -> list[str]:
        args = (["-disable-auto-cleanup"] if cleanup_by_watchdog
                and "-disable-auto-cleanup" not in cfg.mpiexec_args else [])
        if cfg.hostfile:  # how each rank on another host ended: the watchdog sees no pid there
            args.append("-print-all-exitcodes")
        return args


class OpenMpi(MpiFlavour):
    forwards = OPEN_MPI_FORWARDS


class OpenMpiUlfm(OpenMpi):
    def command(self, cfg: Any, processes: int, hosts: list[str], program: list[str],
                cleanup_by_watchdog: bool, session_dirs: str | None) -> list[str]:
        if cfg.hostfile:
            hosts = [*hosts, *open_mpi_remote_args(self.mpiexec, [*RANK_ENVIRONMENT, *(
                name for name in ("PYTHONPATH",) if name in os.environ),
                *([FACTORY_ADDRESS] if starts_warm(cfg) else [])])]
            if cfg.elastic:
                hosts += open_mpi_link_args()
        return [self.mpiexec, "-n", str(processes), *open_mpi_args(cfg.elastic, session_dirs),
                *hosts, *cfg.mpiexec_args, sys.executable, *program]

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        # mpi4py loads this Open MPI's libmpi, not the venv's MPICH.
        return {**env, **ulfm_environment(self.mpiexec, env)}

    def sessions(self) -> contextlib.AbstractContextManager[str | None]:
        return session_base()


def flavour_of(mpiexec: str) -> MpiFlavour:
    if has_ulfm(mpiexec):  # Open MPI 5, e.g. .venv/ulfm's (every elastic job)
        return OpenMpiUlfm(mpiexec)
    return {"hydra": Hydra, "openmpi": OpenMpi}.get(mpi_flavor(mpiexec), MpiFlavour)(mpiexec)
