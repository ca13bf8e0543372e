"""Local launcher: ``mpiexec -n N python -m runner.worker RUN_DIR`` on this machine.

``launcher.nprocs=1`` runs the rank in this process (no mpiexec), which is what a debugger
wants. Ctrl-C stops every rank: the MPI job runs in its own session, so the launcher forwards
the interrupt to the whole process group and escalates to SIGKILL if ranks do not exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ConfigError
from . import LAUNCHERS
from .base import Launcher, LauncherConfig


@dataclass
class LocalConfig(LauncherConfig):
    name: str = "local"
    mpiexec: Optional[str] = None  # default: the mpiexec installed next to this Python
    mpiexec_args: list[str] = field(default_factory=list)

    def check(self, prefix, cfg):
        super().check(prefix, cfg)
        if self.nprocs > 1:
            find_mpiexec(self.mpiexec, key=f"{prefix}.mpiexec")


def find_mpiexec(requested: str | None, key: str = "launcher.mpiexec") -> str:
    if requested:
        found = shutil.which(requested)
        if not found:
            raise ConfigError(key, f"mpiexec {requested!r} not found",
                              "give the path of an existing mpiexec, or null for the venv's")
        return found
    beside_python = Path(sys.executable).parent / "mpiexec"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("mpiexec")
    if not found:
        raise ConfigError(key, "no mpiexec next to Python or on PATH",
                          "run `make install` (installs the mpich wheel) or set "
                          "launcher.mpiexec=/path/to/mpiexec")
    return found


def log_tail(run_dir: Path, rank: int, lines: int = 12) -> str:
    path = run_dir / "logs" / f"rank{rank}.log"
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the job's process group until it is gone."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s / 2
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.wait()
    try:  # children that outlived mpiexec
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@LAUNCHERS.register("local")
class LocalLauncher(Launcher):
    Config = LocalConfig

    def command(self, run_dir: Path) -> list[str]:
        return [find_mpiexec(self.cfg.mpiexec), "-n", str(self.cfg.nprocs),
                *self.cfg.mpiexec_args, sys.executable, "-m", "runner.worker", str(run_dir)]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # One BLAS/OpenMP pool per core, not per rank: oversubscribed ranks thrash otherwise.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.cfg.nprocs)))
        return env

    def launch(self, run_cfg, run_dir):
        run_dir = Path(run_dir)
        if self.cfg.nprocs == 1:
            from ..worker import run_rank

            return run_rank(run_dir, in_process=True)
        proc = subprocess.Popen(self.command(run_dir), env=self.environment(),
                                start_new_session=True)
        try:
            status = proc.wait()
        except KeyboardInterrupt:
            print("\nadpsgd-run: interrupted, stopping all ranks", file=sys.stderr, flush=True)
            stop_process_group(proc)
            return 130
        if status != 0:
            self.report_failure(run_dir, status)
        return status

    def report_failure(self, run_dir: Path, status: int) -> None:
        failed = [r for r in range(self.cfg.nprocs)
                  if "ERROR" in log_tail(run_dir, r, lines=200)]
        for rank in failed or [0]:
            print(f"--- last lines of {run_dir}/logs/rank{rank}.log ---\n"
                  f"{log_tail(run_dir, rank)}", file=sys.stderr)
        if not failed:
            print(f"adpsgd-run: the MPI job exited with status {status} without a rank "
                  f"reporting an error; see {run_dir}/logs", file=sys.stderr)
