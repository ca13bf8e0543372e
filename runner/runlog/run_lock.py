"""A run dir belongs to one job at a time: the run dir's lock, held by the launcher and by every
one of its ranks (runner/launch/run_dir.py refuses a fresh start that would mix two runs).

While a job runs, its launcher and every one of its ranks hold a shared ``flock`` on
``RUN_DIR/.adpsgd.lock``; a new job must first take it exclusively, so a second job in the same
dir ends with one line naming the running one (recorded in the lock file: pid, host, start
time, command). The operating system drops a lock with the process that held it, so a killed
job never leaves a stale lock; its surviving ranks keep the dir locked until they are gone.
Filesystems without ``flock`` (some network filesystems) skip the lock.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import IO

from ..errors import ConfigError

LOCK = ".adpsgd.lock"
# Errors of a filesystem that does not support flock: run without the lock.
NO_LOCKING = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
_held: dict[Path, IO[str]] = {}  # this process's open lock files (closing drops the lock)


def lock_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOCK


def _owner(handle: IO[str]) -> str:
    handle.seek(0)
    try:
        owner = json.loads(handle.read() or "{}")
    except ValueError:
        owner = {}
    if not owner:
        return "another adpsgd-run job"
    return (f"the job of adpsgd-run pid {owner.get('pid')} on {owner.get('host')}, started "
            f"{owner.get('started')} ({owner.get('command')})")


def claim(run_dir: str | Path, check=None) -> None:
    """Make this process the run dir's job: take the lock exclusively (ConfigError naming the
    running job if another one holds it), run ``check()`` (which may refuse the dir: nothing
    is written then), record who we are, then hold it shared so that our ranks can hold it
    too. Kept until this process ends."""
    run_dir = Path(run_dir)
    if run_dir.resolve() in _held:  # claimed already (a single run: before Hydra started)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(lock_path(run_dir), "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _owner(handle)
        handle.close()
        raise ConfigError("hydra.run.dir", f"{run_dir} is in use by {owner}",
                          "wait for that job to end (or stop it), or choose another "
                          "hydra.run.dir") from None
    except OSError as ex:
        handle.close()
        if ex.errno in NO_LOCKING:
            if check is not None:
                check()
            return
        raise
    try:
        if check is not None:
            check()
    except BaseException:
        handle.close()
        raise
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": datetime.datetime.now().isoformat(timespec="seconds"),
                             "command": shlex.join(["adpsgd-run", *sys.argv[1:]])}))
    handle.flush()
    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)  # our ranks take it shared too
    _held[run_dir.resolve()] = handle


def hold_shared(run_dir: str | Path, timeout_s: float = 10.0) -> None:
    """A rank's share of its job's lock (the launcher holds it shared already; a moment's
    wait covers another job probing it exclusively). Never fails the rank."""
    try:
        handle = open(lock_path(run_dir), "a+")
    except OSError:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            _held[Path(run_dir).resolve()] = handle
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                return
            time.sleep(0.05)
        except OSError:
            handle.close()
            return
