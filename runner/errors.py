"""User-facing errors: one line that names the cause and the fix, never a traceback wall."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix (bad override, missing data, impossible value).

    The CLI and the workers print ``str(error)`` as a single line and exit non-zero.
    """

    def __init__(self, cause: str, fix: str | None = None):
        self.cause = cause
        self.fix = fix
        super().__init__(cause if not fix else f"{cause}. Fix: {fix}")


class ConfigError(UserError):
    """A composed configuration value that cannot work, tied to its dotted key."""

    def __init__(self, key: str, problem: str, fix: str | None = None):
        self.key = key
        super().__init__(f"{key}: {problem}", fix)


def one_line(text: str) -> str:
    """Collapse a possibly multi-line message into one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())
