"""What mpiexec says, read as the job runs: its stdout and stderr relayed to ours without the
process manager's own lines (kept in logs/mpiexec.log), and what they tell the launcher (which
rank MPICH's report names, the exit codes per host, a lost Open MPI daemon)."""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import IO

from ..errors import one_line

# Hydra's report of a rank that ended badly (MPICH's mpiexec, on its stdout).
BANNER_PID = re.compile(r"^=\s+PID (\d+) RUNNING AT")


BANNER_CODE = re.compile(r"^=\s+EXIT CODE: (\d+)")


BANNER_LINES = re.compile(r"^(=|YOUR APPLICATION TERMINATED|This typically refers|"
                          r"Please see the FAQ|\[mpiexec@|\[proxy:|\[[^\]@ ]+\] [\d,]+$)")


# Open MPI's runtime (PRRTE) frames its notices on stdout in lines of dashes; two of them say
# that it lost a host's daemon (a host gone down, or its processes killed), after which it
# ends the whole job whatever the job is (ULFM too).
DASHES = re.compile(r"^-{20,}$")


LOST_DAEMON = re.compile(r"^\s*(?:Remote host:|Remote daemon: .* on node)\s+(\S+)\s*$")


# Hydra's -print-all-exitcodes (a job across hosts): "[mpiexec@head] Exit codes: [host] 0,9"
# and a line "[host] codes" for each further host, the codes of the host's ranks in order.
EXIT_CODES = re.compile(r"(?:^\[mpiexec@[^\]]*\] Exit codes: |^)\[([^\]@ ]+)\] ([\d,]+)$")


# MPICH's mpiexec: "[mpiexec@HOST] function (file:line): what went wrong".
HYDRA_LINE = re.compile(r"^\[mpiexec@[^\]]*\]\s*(?:\S+ \([^)]*\):\s*)?(.+)$")


def mpiexec_notice(run_dir: Path, limit: int = 400) -> str | None:
    """What mpiexec said first in logs/mpiexec.log, as one line of at most ``limit``
    characters: Open MPI's first notice (framed in lines of dashes), else MPICH's first line
    of its own; None without either."""
    try:
        lines = (run_dir / "logs" / "mpiexec.log").read_text(errors="replace").splitlines()
    except OSError:
        return None
    frame: list[str] | None = None
    for line in lines:
        if DASHES.match(line.strip()):
            if frame:  # the frame's end
                break
            frame = []
        elif frame is not None:
            frame.append(line)
    notice = one_line("\n".join(frame or []))
    if not notice:
        notice = next((m.group(1).strip() for m in map(HYDRA_LINE.match, lines) if m), "")
    return (notice[:limit - 3] + "...") if len(notice) > limit else (notice or None)


def log_tail(run_dir: Path, rank: int, lines: int = 12) -> str:
    path = run_dir / "logs" / f"rank{rank}.log"
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class MpiexecOutput:
    """Relays mpiexec's stdout (the ranks write theirs to logs/), keeping back MPICH's
    multi-line report of a rank that ended badly (remembering its pid and exit code) and the
    process manager's own notices, which go to logs/mpiexec.log."""

    def __init__(self, stream: IO[str], report_path: Path):
        self.stream = stream
        self.report_path = report_path  # the report as mpiexec wrote it, for the curious
        self.bad_pid: int | None = None
        self.bad_code: int | None = None
        self.exit_codes: dict[str, list[int]] = {}  # host -> its ranks' exit codes, in order
        self.lost_daemon_host: str | None = None  # Open MPI lost its daemon there
        self.in_frame = False
        self.thread = threading.Thread(target=self._relay, name="mpiexec-output", daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        for line in self.stream:
            if DASHES.match(line.rstrip("\n")) or self.in_frame:  # an Open MPI notice
                self.in_frame = self.in_frame != bool(DASHES.match(line.rstrip("\n")))
                if (match := LOST_DAEMON.match(line)) and self.lost_daemon_host is None:
                    self.lost_daemon_host = match.group(1)
                with open(self.report_path, "a") as report:
                    report.write(line)
                continue
            if (match := BANNER_PID.match(line)) and self.bad_pid is None:
                self.bad_pid = int(match.group(1))
            elif (match := BANNER_CODE.match(line)) and self.bad_code is None:
                self.bad_code = int(match.group(1))
            elif match := EXIT_CODES.match(line.rstrip("\n")):
                self.exit_codes[match.group(1)] = [int(c) for c in match.group(2).split(",")]
            if not BANNER_LINES.match(line):
                sys.stdout.write(line)
                sys.stdout.flush()
            elif line.strip("=\n "):
                with open(self.report_path, "a") as report:
                    report.write(line)

    def join(self, timeout_s: float = 5.0) -> None:
        self.thread.join(timeout=timeout_s)


class MpiexecStderr:
    """Relays mpiexec's stderr (rank 0's progress bar and the ranks' last words) to ours as
    it comes, byte for byte, but sends the process manager's own lines (``[mpiexec@HOST]``,
    ``[proxy:...]``: its complaints while a job is taken down, its Ctrl-C notices) to
    ``log_path`` instead: the launcher says what happened in one line of its own."""

    OWN = (b"[mpiexec@", b"[proxy:")
    # Open MPI's runtime tags its own diagnostics with its host and pid ("[vm:07137] plm:ssh:
    # Warning: setpgid(...) failed", "[vm:26839] pmix_ptl_base: send_msg: write failed").
    TAGGED = re.compile(rb"^\[[\w.-]+:\d+\] ")
    # Open MPI (elastic jobs) frames its notices (an MPI_ABORT, a lost process) in lines of
    # dashes: the whole frame goes to the log.
    FRAME = re.compile(rb"^-{20,}\r?\n$")

    def __init__(self, fd: int, log_path: Path):
        self.fd, self.log_path = fd, log_path
        self.in_frame = False
        self.lost_daemon_host: str | None = None  # as MpiexecOutput's
        self.thread = threading.Thread(target=self._relay, name="mpiexec-stderr", daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        pending = b""
        while chunk := os.read(self.fd, 65536):
            pending += chunk
            # Lines end at \n, and a progress bar's updates at \r.
            *lines, pending = re.split(rb"(?<=[\r\n])", pending)
            for line in lines:
                self._emit(line)
            # A partial line (a progress bar's \r updates) goes out at once, unless it may
            # be the start of one of mpiexec's own lines.
            if pending and not any(own.startswith(pending[:len(own)])
                                   for own in (*self.OWN, b"-" * 20)):
                self._emit(pending)
                pending = b""
        if pending:
            self._emit(pending)
        os.close(self.fd)

    def _emit(self, data: bytes) -> None:
        data = data.replace(b"\0", b"")  # Open MPI forwards a NUL as a rank's stderr closes
        if not data:
            return
        framing = bool(self.FRAME.match(data))
        if framing or self.in_frame or data.startswith(self.OWN) or self.TAGGED.match(data):
            self.in_frame = self.in_frame != framing
            # Open MPI writes its lost-daemon notice on either stream.
            if self.lost_daemon_host is None and (
                    match := LOST_DAEMON.match(data.decode(errors="replace"))):
                self.lost_daemon_host = match.group(1)
            with open(self.log_path, "ab") as log:
                log.write(data)
            return
        sys.stderr.buffer.write(data)
        sys.stderr.flush()

    def join(self, timeout_s: float = 5.0) -> None:
        self.thread.join(timeout=timeout_s)
