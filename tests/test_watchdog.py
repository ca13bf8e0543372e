"""The launcher's watchdog (runner/launch/watchdog.py) orders the deaths it sees, mpiexec's
with the ranks', on real processes: which ended first decides the line a user reads ("mpiexec
was killed from outside" or "rank N died"), and a loaded machine once made the launcher's own
clock name a rank for a kill of mpiexec."""

import signal
import socket
import subprocess
import sys
import time

import pytest

from runner.launch.watchdog import RankWatchdog

pytestmark = pytest.mark.slow


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def seen(condition, what: str):
    deadline = time.monotonic() + 10
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert value, f"the watchdog never saw {what}"
    return value


@pytest.fixture
def job(tmp_path):
    """A stand-in mpiexec and one rank (real processes with a pid file), and the watchdog."""
    mpiexec, rank = sleeper(), sleeper()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.pid").write_text(f"{rank.pid} {socket.gethostname()}\n")
    watchdog = RankWatchdog(tmp_path, 1)
    watchdog.watch_mpiexec(mpiexec.pid)
    # Two wake-ups after it read the pid file, the thread watches the rank and mpiexec.
    seen(lambda: 0 in watchdog.pids, "the pid file")
    start = watchdog.wakeups
    seen(lambda: watchdog.wakeups >= start + 2, "two wake-ups")
    yield watchdog, mpiexec, rank
    for proc in (mpiexec, rank):
        proc.kill()
        proc.wait()
    watchdog.stop()


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def first_death(watchdog: RankWatchdog):
    return seen(watchdog.check, "the rank die")


def test_mpiexec_killed_before_its_rank_is_seen_first(job):
    watchdog, mpiexec, rank = job
    kill(mpiexec)
    seen(lambda: watchdog.mpiexec_wakeup is not None, "mpiexec end")
    kill(rank)
    assert watchdog.mpiexec_ended_first(first_death(watchdog)) is True


def test_a_rank_killed_before_mpiexec_is_seen_first(job):
    watchdog, mpiexec, rank = job
    kill(rank)
    dead = first_death(watchdog)
    kill(mpiexec)
    seen(lambda: watchdog.mpiexec_wakeup is not None, "mpiexec end")
    assert watchdog.mpiexec_ended_first(dead) is False


def test_without_mpiexec_seen_ending_the_order_is_unknown(job):
    watchdog, _, rank = job
    kill(rank)  # mpiexec still runs
    assert watchdog.mpiexec_ended_first(first_death(watchdog)) is None
