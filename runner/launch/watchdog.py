"""Which ranks are alive: per-rank files in RUN_DIR/logs, and the launcher's watchdog.

Every rank writes ``logs/rank<N>.pid`` (its pid and host) as soon as it can take a forwarded
signal, and ``logs/rank<N>.exit`` (its exit status) when it ends on its own: finished,
preempted, or failed with a message. A rank whose process is gone without an exit record died
from outside: ``kill -9``, the out-of-memory killer, a segfault. MPICH's mpiexec tears the job
down within milliseconds when that happens (even with ``-disable-auto-cleanup``), killing every
rank with the same signal; not every MPI does it at all; and mpiexec starts each rank in a
session of its own, so a job that is simply killed can leave ranks behind. The watchdog
therefore waits on every rank's pidfd (Linux: readable the moment the process ends) in a
thread of its own and records the order of the deaths: the first rank to end without an exit
record is the culprit, whoever killed the others afterwards. The launcher then kills what is
left of the job.

The same files tell the launcher where to forward SIGUSR1/SIGTERM (runner/preemption.py) and
whether every rank stopped for a preemption.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

LOGS = "logs"


def _path(run_dir: str | Path, rank: int, suffix: str) -> Path:
    return Path(run_dir) / LOGS / f"rank{rank}.{suffix}"


def write_pid_file(run_dir: str | Path, rank: int) -> None:
    path = _path(run_dir, rank, "pid")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{os.getpid()} {socket.gethostname()}\n")
    os.replace(tmp, path)  # the launcher never reads half a file


def write_exit_record(run_dir: str | Path, rank: int, status: int) -> None:
    _path(run_dir, rank, "exit").write_text(f"{status}\n")


def clear_rank_files(run_dir: str | Path, nprocs: int) -> None:
    """Before a job starts: records of an earlier job in the same run dir (a resume) must not
    be mistaken for this one's."""
    for rank in range(nprocs):
        for suffix in ("pid", "exit"):
            _path(run_dir, rank, suffix).unlink(missing_ok=True)


def exit_status(run_dir: str | Path, rank: int) -> int | None:
    try:
        return int(_path(run_dir, rank, "exit").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def exit_statuses(run_dir: str | Path, nprocs: int) -> dict[int, int | None]:
    return {rank: exit_status(run_dir, rank) for rank in range(nprocs)}


def failure_times(run_dir: str | Path, nprocs: int) -> dict[int, float]:
    """Ranks that ended with an error message of their own (exit record not 0, 75 or 130
    for a graceful stop, or 3 for a failed communication with a peer, which a dead peer
    causes), and when."""
    from ..errors import EXIT_PEER_LOST, EXIT_PREEMPTED, EXIT_STOPPED

    failed = {}
    for rank in range(nprocs):
        status = exit_status(run_dir, rank)
        if status not in (None, 0, EXIT_PREEMPTED, EXIT_STOPPED, EXIT_PEER_LOST):
            failed[rank] = _path(run_dir, rank, "exit").stat().st_mtime
    return failed


def rank_pid(run_dir: str | Path, rank: int) -> int | None:
    """The rank's pid if it runs on this host (the only pids we can check or signal)."""
    try:
        pid, host = _path(run_dir, rank, "pid").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return int(pid) if host == socket.gethostname() else None


def process_alive(pid: int) -> bool:
    """True for a running process; False once it is gone or a zombie (dead, not yet reaped
    by mpiexec's proxy)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)
    return state not in ("Z", "X")


@dataclass(frozen=True)
class DeadRank:
    rank: int
    pid: int
    when: float  # time.time() at which the watchdog saw it end


class RankWatchdog:
    """Watches the ranks of one job while it runs (see the module docstring)."""

    POLL_MS = 100  # how often the death watcher looks for new pid files

    def __init__(self, run_dir: str | Path, nprocs: int):
        self.run_dir, self.nprocs = Path(run_dir), nprocs
        self.pids: dict[int, int] = {}  # rank -> pid, once its pid file appeared
        self.deaths: list[tuple[float, int]] = []  # (time.time(), rank) in order of death
        self._lock = threading.Lock()
        self._running = True
        self._thread = threading.Thread(target=self._watch, name="rank-deaths", daemon=True)
        self._thread.start()

    def refresh(self) -> list[int]:
        """Read pid files that appeared since the last call; return their ranks."""
        new = []
        with self._lock:
            for rank in range(self.nprocs):
                if rank not in self.pids and (pid := rank_pid(self.run_dir, rank)) is not None:
                    self.pids[rank] = pid
                    new.append(rank)
        return new

    def _watch(self) -> None:
        poller, fds, watched = select.poll(), {}, set()
        while self._running:
            self.refresh()
            for rank, pid in list(self.pids.items()):
                if rank in watched:
                    continue
                try:
                    fd = os.pidfd_open(pid)
                except (AttributeError, OSError):  # no pidfd here: look again next round
                    if not process_alive(pid):
                        watched.add(rank)
                        self._died(rank)
                    continue
                watched.add(rank)
                fds[fd] = rank
                poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll(self.POLL_MS):
                self._died(fds[fd])
                poller.unregister(fd)
        for fd in fds:
            os.close(fd)

    def _died(self, rank: int) -> None:
        with self._lock:
            self.deaths.append((time.time(), rank))

    def stop(self) -> None:
        self._running = False
        self._thread.join(timeout=2)

    def check(self) -> DeadRank | None:
        """The first rank that ended without an exit record, if one did and no rank had
        failed with a message before (ranks that fail because a peer died come after it)."""
        with self._lock:
            deaths = list(self.deaths)
        for when, rank in deaths:
            if exit_status(self.run_dir, rank) is None:
                failed = failure_times(self.run_dir, self.nprocs)
                if any(t < when for t in failed.values()):
                    return None  # an error came first: that rank's message explains it
                return DeadRank(rank, self.pids[rank], when)
        return None

    def rank_of_pid(self, pid: int) -> int | None:
        self.refresh()
        return next((rank for rank, p in self.pids.items() if p == pid), None)

    def signal_ranks(self, signum: int, ranks: list[int] | None = None) -> None:
        for rank in self.pids if ranks is None else ranks:
            try:
                os.kill(self.pids[rank], signum)
            except (ProcessLookupError, PermissionError):
                pass

    def kill_leftovers(self) -> list[int]:
        """SIGKILL every rank process still alive; return their ranks."""
        self.refresh()
        alive = [rank for rank, pid in self.pids.items() if process_alive(pid)]
        self.signal_ranks(signal.SIGKILL, alive)
        return alive

    def exit_statuses(self) -> dict[int, int | None]:
        return exit_statuses(self.run_dir, self.nprocs)
