"""Run a command beside busy processes, as on a shared workstation or CI machine.

    python scripts/under_load.py [--hogs N] [--max-s S] -- COMMAND [ARG ...]

Starts N processes that spin on the CPU (default: one per core), runs COMMAND, stops them
and exits with COMMAND's status. The hogs are bounded: each stops by itself after --max-s
seconds (default 2 hours) and when this script goes away, even by kill -9, so none outlives
the run. `make test-loaded` runs the suite this way: a test that passes only on a quiet
machine fails there.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def spin(parent: int, max_s: float) -> None:
    """Busy-loop until max_s has passed or the parent is gone (checked every ~50 ms)."""
    end = time.monotonic() + max_s
    while time.monotonic() < end and os.getppid() == parent:
        deadline = time.monotonic() + 0.05
        while time.monotonic() < deadline:
            pass


def start_hogs(count: int, max_s: float) -> list[int]:
    parent, pids = os.getpid(), []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the command; we stop these
            # A session of its own, as another user's job has: where the kernel shares the
            # CPU between sessions first (sched_autogroup), hogs in the command's session
            # would only compete with it and with the ranks that share it (Open MPI's), not
            # with MPICH's ranks, each of which hydra starts in a session of its own.
            os.setsid()
            try:
                spin(parent, max_s)
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def stop_hogs(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1,
                        help="busy processes beside the command (default: one per core)")
    parser.add_argument("--max-s", type=float, default=7200.0,
                        help="each hog stops by itself after this many seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: give it after --, e.g. -- python -m pytest")
    if args.hogs < 0 or args.max_s <= 0:
        parser.error("--hogs must be >= 0 and --max-s > 0")
    hogs = start_hogs(args.hogs, args.max_s)
    print(f"under_load: {len(hogs)} busy process(es) beside: {' '.join(command)}", flush=True)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        stop_hogs(hogs)


if __name__ == "__main__":
    sys.exit(main())
