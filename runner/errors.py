"""User-facing errors: one line that names the cause and the fix, never a traceback wall."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TextIO

# Exit status of a job stopped by SIGUSR1/SIGTERM after writing a checkpoint: sysexits'
# EX_TEMPFAIL ("try again later"), which tells a scheduler the job should be requeued and
# resumed with resume=auto, not counted as a failure.
EXIT_PREEMPTED = 75
# Exit status of a job stopped by the user (Ctrl-C), the shell's 128 + SIGINT: after a
# checkpoint when the ranks stopped gracefully (summary status "stopped"), or at once after a
# second Ctrl-C.
EXIT_STOPPED = 130
# Exit status of a rank whose communication with a peer failed (no answer in time, or the MPI
# library reporting a lost connection): the peer is the cause, so the launcher's watchdog still
# looks for a rank that died first and names that one.
EXIT_PEER_LOST = 3
# Exit status of an elastic job left with fewer learners than launcher.min_learners: lost
# machines, not a user's mistake, so launcher.max_restarts restarts it (from the checkpoint the
# survivors wrote as they ended: nothing trained is lost).
EXIT_TOO_FEW_LEARNERS = 4


class UserError(Exception):
    """A mistake the user can fix (bad override, missing data, impossible value).

    The CLI and the workers print ``str(error)`` as a single line and exit non-zero. A rank
    sets ``quiet`` when the ranks agreed on the error and another rank prints it.
    """

    exit_status = 2  # what a rank that raised it exits with

    def __init__(self, cause: str, fix: str | None = None):
        self.cause = cause
        self.fix = fix
        self.quiet = False
        # A cause quoted from a library often ends with its own full stop: keep one.
        ended = cause[:-1] if cause.endswith(".") and not cause.endswith("...") else cause
        super().__init__(cause if not fix else f"{ended}. Fix: {fix}")


class TooFewLearners(UserError):
    """An elastic job that lost learners until fewer than ``launcher.min_learners`` remain:
    one line like a user's error, but the job is worth restarting."""

    exit_status = EXIT_TOO_FEW_LEARNERS


class ConfigError(UserError):
    """A composed configuration value that cannot work, tied to its dotted key."""

    def __init__(self, key: str, problem: str, fix: str | None = None):
        self.key = key
        super().__init__(f"{key}: {problem}", fix)


def one_line(text: str) -> str:
    """Collapse a possibly multi-line message into one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def warn_user(message: str, stream: TextIO | None = None) -> None:
    """One line for a run that goes on but may not mean what its user thinks:
    ``adpsgd-run: warning: MESSAGE`` on ``stream`` (a rank's progress stream; stderr)."""
    print(f"adpsgd-run: warning: {one_line(message)}", file=stream or sys.stderr, flush=True)


class UsageError(Exception):
    """A bad argument to one of the small commands (adpsgd-gap, adpsgd-prepare, adpsgd-report)."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (UsageError), not usage plus message."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def command_status(prog: str, body: Callable[[], int]) -> int:
    """A command's exit status: ``body()``'s, or 2 after one line on stderr for a mistake
    (a usage mistake points at ``--help``), or --help's own 0."""
    try:
        return body()
    except UsageError as ex:
        print(f"{prog}: error: {one_line(ex)}. Fix: see {prog} --help", file=sys.stderr)
    except UserError as ex:
        print(f"{prog}: error: {one_line(ex)}", file=sys.stderr)
    except SystemExit as ex:  # --help
        return ex.code if isinstance(ex.code, int) else 0
    return 2


# Errors of a write that found no room (a full disk, an exhausted quota).
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def mount_of(path: str | Path) -> tuple[str, str]:
    """(device, mount point) of the filesystem holding ``path`` (Linux /proc/self/mounts)."""
    target = os.path.realpath(path)
    best = ("?", "/")
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                device, point = line.split()[:2]
                point = point.replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[1]):
                    best = (device, point)
    except OSError:
        pass
    return best


class DiskFull(UserError):
    """A write that found no room: names the filesystem and what was being written."""

    def __init__(self, filename: str | Path | None, run_dir: str | Path):
        self.filename = Path(filename) if filename else Path(run_dir)
        device, point = mount_of(self.filename.parent if filename else self.filename)
        self.where = f"{device} ({point})"
        super().__init__(f"no space left on {self.where} while writing {self.filename}",
                         f"free space on {point}, or give the run a disk with room "
                         "(hydra.run.dir=...), then continue with resume=auto")

    def with_checkpoint(self, checkpoint: str | Path | None) -> str:
        """The one line, saying which complete checkpoint is intact."""
        kept = (f"; the last complete checkpoint ({checkpoint}) is intact" if checkpoint
                else "; no checkpoint was complete yet")
        return f"{self.cause}{kept}. Fix: {self.fix}"


def disk_full(ex: BaseException, run_dir: str | Path) -> DiskFull | None:
    """A DiskFull for an error that means the disk (or quota) is full, else None."""
    if isinstance(ex, DiskFull):
        return ex
    if isinstance(ex, OSError) and ex.errno in NO_SPACE:
        return DiskFull(ex.filename, run_dir)
    return None
