"""User-facing errors: one line that names the cause and the fix, never a traceback wall."""

from __future__ import annotations

import argparse
from typing import NoReturn

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


class UserError(Exception):
    """A mistake the user can fix (bad override, missing data, impossible value).

    The CLI and the workers print ``str(error)`` as a single line and exit non-zero. A rank
    sets ``quiet`` when the ranks agreed on the error and another rank prints it.
    """

    def __init__(self, cause: str, fix: str | None = None):
        self.cause = cause
        self.fix = fix
        self.quiet = False
        # A cause quoted from a library often ends with its own full stop: keep one.
        ended = cause[:-1] if cause.endswith(".") and not cause.endswith("...") else cause
        super().__init__(cause if not fix else f"{ended}. Fix: {fix}")


class ConfigError(UserError):
    """A composed configuration value that cannot work, tied to its dotted key."""

    def __init__(self, key: str, problem: str, fix: str | None = None):
        self.key = key
        super().__init__(f"{key}: {problem}", fix)


def one_line(text: str) -> str:
    """Collapse a possibly multi-line message into one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class UsageError(Exception):
    """A bad argument to one of the small commands (adpsgd-gap, adpsgd-prepare, adpsgd-report)."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (UsageError), not usage plus message."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)
