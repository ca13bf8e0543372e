"""scripts/under_load.py (make test-loaded): the command runs beside busy processes, its status
is the script's, and no busy process outlives the script, even when it is killed."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

SCRIPT = [sys.executable, str(REPO / "scripts" / "under_load.py")]
# The command lists the script's other children (the busy processes), then exits 3.
SIBLINGS = ("import os, subprocess, sys; me = str(os.getpid()); print(' '.join(p for p in "
            "subprocess.run(['pgrep', '-P', str(os.getppid())], capture_output=True, "
            "text=True).stdout.split() if p != me), flush=True); sys.exit(3)")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def gone_soon(pids: list[int], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def test_the_command_runs_beside_the_hogs_and_its_status_is_returned():
    proc = subprocess.run([*SCRIPT, "--hogs", "2", "--", sys.executable, "-c", SIBLINGS],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("under_load: 2 busy process(es) beside: ")
    hogs = [int(p) for p in lines[1].split()]
    assert len(hogs) == 2 and gone_soon(hogs)


def test_killing_the_script_stops_its_hogs():
    proc = subprocess.Popen([*SCRIPT, "--hogs", "2", "--", "sleep", "60"],
                            stdout=subprocess.PIPE, text=True)
    hogs, command = [], []
    try:
        assert proc.stdout.readline().startswith("under_load: 2 busy")
        while len(hogs) < 2 or not command:
            children = subprocess.run(["pgrep", "-a", "-P", str(proc.pid)],
                                      capture_output=True, text=True).stdout.splitlines()
            hogs = [int(c.split()[0]) for c in children if "under_load" in c]
            command = [int(c.split()[0]) for c in children if c.split()[1] == "sleep"]
        # Each hog leads a session of its own, as another user's job does, so that a kernel
        # that shares the CPU by session (autogroup) sets it against every rank, not only
        # against the command's own session. A hog is listed from its fork on: its setsid()
        # may still be to come (seen under make coverage, which slows every process).
        deadline = time.monotonic() + 10
        while not all(os.getsid(h) == h for h in hogs) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(os.getsid(h) == h for h in hogs) and os.getsid(command[0]) != hogs[0]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert gone_soon(hogs), "a busy process outlived the script"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in command:  # the command itself is the caller's to stop after a kill -9
            os.kill(pid, signal.SIGKILL)


def test_a_missing_command_is_one_line():
    proc = subprocess.run([*SCRIPT, "--hogs", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no command" in proc.stderr
