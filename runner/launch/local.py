"""Local launcher: ``mpiexec -n N python -m runner.worker RUN_DIR`` on this machine.

``launcher.nprocs=1`` runs the rank in this process (no mpiexec), which is what a debugger
wants. The MPI job runs in a session of its own, so a terminal's Ctrl-C reaches only the
launcher, which forwards it to every rank: the ranks checkpoint and stop (status
``stopped``, exit 130); a second Ctrl-C kills the job at once and removes the checkpoint it
left half-written.

While the job runs the launcher supervises it (runner/launch/watchdog.py):

* SIGUSR1 or SIGTERM sent to the launcher is forwarded to every rank, which checkpoint and
  exit with status 75 (runner/checkpoint/preemption.py); the launcher then exits with 75 too.
* a rank that dies without a word (``kill -9``, the out-of-memory killer) is named, with its
  last log lines, and the rest of the job is stopped within a second; no rank process is left
  behind (mpiexec puts each rank in a session of its own, so they are killed by pid). MPICH's
  mpiexec (Hydra) runs with ``-disable-auto-cleanup``: its own clean-up kills every rank at
  once (after a SIGTERM, which now means "checkpoint and stop"), which hides which rank died
  first; the watchdog sees that rank alone die and ends the job itself. Other mpiexecs keep
  their clean-up, and the watchdog steps in after MPIEXEC_GRACE_S.
* with ``launcher.max_restarts=N``, a job that lost a rank or its mpiexec runs again from the
  newest complete checkpoint (runner/launch/restart_policy.py decides, and says so in one line);
  the failure is reported as above only when it is not restarted.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional

from .. import ctrl_c
from ..checkpoint.files import complete_checkpoints, remove_partial_checkpoints
from ..comm.hostfile import ranks_per_host, read_hostfile
from ..config.section import require
from ..errors import (
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    EXIT_STOPPED,
    EXIT_TOO_FEW_LEARNERS,
    ConfigError,
    one_line,
)
from ..runlog.console import CONSOLE_IS_TERMINAL
from ..runlog.failure_events import record_event
from ..runlog.liveness import HEARTBEAT_S, HEARTBEAT_TO, LAUNCHER_HOST, LAUNCHER_PID, LINK_TIMEOUT
from .base import Launcher, LauncherConfig, records_off_the_console
from .hosts import hostfile_args, mpi_flavor, remote_shell_path, unanswered_host
from .registry import LAUNCHERS
from .restart_policy import JobFailure, Restarts, reported_failure
from .ulfm_mpi import (
    find_ulfm_mpiexec,
    has_ulfm,
    open_mpi_args,
    open_mpi_link_args,
    open_mpi_remote_args,
    session_base,
    ulfm_environment,
)
from .watchdog import (
    DeadRank,
    HeartbeatListener,
    RankWatchdog,
    StalledRank,
    clear_rank_files,
    empty_blank_exit_records,
    exit_status,
    failure_records,
    failure_times,
    rank_host,
    rank_progress,
    ranks_progress,
    write_stop_request,
)

POLL_S = 0.25  # how often the watchdog looks at the ranks
# After the watchdog sees a rank die, mpiexec gets this long to end the job by itself.
MPIEXEC_GRACE_S = 3.0
# What a rank needs from the launcher's environment, which Open MPI passes to ranks on other
# hosts only when named (see environment() and run_job()).
RANK_ENVIRONMENT = ["PATH", "LD_LIBRARY_PATH", "MPI4PY_LIBMPI", "PYTHONUNBUFFERED",
                    "OMP_NUM_THREADS", CONSOLE_IS_TERMINAL, LAUNCHER_PID, LAUNCHER_HOST,
                    HEARTBEAT_TO, LINK_TIMEOUT]
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


@dataclass
class LocalConfig(LauncherConfig):
    name: str = "local"
    nprocs: int = 4  # total ranks; 1 runs in-process without mpiexec (for debugging)
    # Ranks per node: emulated nodes on this machine, or ranks per host with a hostfile;
    # null with a hostfile: each host's slots, the ranks of a host forming one node.
    procs_per_node: Optional[int] = 2
    mpiexec: Optional[str] = None  # path or name; null: the mpiexec installed next to Python
    mpiexec_args: list[str] = field(default_factory=list)  # placed before the program
    # The hosts to run on, one per line (MPI's hostfile: NAME, NAME:SLOTS or NAME slots=N;
    # runner/comm/hostfile.py); null: every rank on this machine.
    hostfile: Optional[str] = None
    # How mpiexec enters a host of the hostfile (ssh's calling convention); null: ssh.
    remote_shell: Optional[str] = None
    # An elastic job across hosts takes learners whose heartbeats it has not heard for this
    # long for lost (a cut link, a host gone down or hung) and tells the others, which MPI
    # would not (runner/comm/ulfm.py: declare_failed).
    link_timeout_s: float = 10.0

    def check(self, prefix, cfg):
        super().check(prefix, cfg)
        require(self.link_timeout_s >= 2.5 * HEARTBEAT_S, f"{prefix}.link_timeout_s",
                f"must be at least {2.5 * HEARTBEAT_S:g} s (a learner's heartbeat goes every "
                f"{HEARTBEAT_S:g} s), got {self.link_timeout_s:g}",
                f"{prefix}.link_timeout_s=10")
        require(not (self.elastic and self.hostfile and self.stall_timeout_s)
                or self.link_timeout_s < self.stall_timeout_s,
                f"{prefix}.link_timeout_s", f"must be below {prefix}.stall_timeout_s="
                f"{self.stall_timeout_s:g} (an elastic job takes a silent learner for lost "
                f"before the launcher ends the job for it), got {self.link_timeout_s:g}",
                f"{prefix}.link_timeout_s={max(2.5 * HEARTBEAT_S, self.stall_timeout_s / 2):g}")
        if self.elastic:
            require(cfg.comm.backend in ("auto", "mpi"), "comm.backend", "an elastic run "
                    f"moves tensors over MPI, whose communicators shrink; {cfg.comm.backend}'s "
                    "groups cannot", "comm.backend=auto")
            find_ulfm_mpiexec(self.mpiexec, f"{prefix}.elastic")
        elif self.nprocs > 1:
            find_mpiexec(self.mpiexec, key=f"{prefix}.mpiexec")
        if self.hostfile:
            self.check_hosts(prefix)
        elif cfg.comm.backend == "nccl" and cfg.trainer.device != "cpu":
            check_gpus_for_nccl(self.nprocs)
        elif cfg.trainer.device == "cuda":
            # Every rank runs here: a missing GPU is found once, before they start (torch is
            # imported for it only when a GPU was asked for).
            from ..train.compute_path import require_a_visible_gpu

            require_a_visible_gpu()

    def check_hosts(self, prefix: str) -> None:
        """A hostfile that places every rank, a command that enters its hosts, and every host
        it uses answering through that command (before any rank starts)."""
        require(self.nprocs > 1, f"{prefix}.nprocs", "a hostfile needs at least 2 ranks "
                "(launcher.nprocs=1 runs the rank inside adpsgd-run)", f"{prefix}.nprocs=2")
        hosts = read_hostfile(self.hostfile, f"{prefix}.hostfile")
        used = ranks_per_host(hosts, self.nprocs + self.spares, self.procs_per_node,
                              f"{prefix}.hostfile")
        shell = remote_shell_path(self.remote_shell, f"{prefix}.remote_shell")
        hostfile_args(find_mpiexec(self.mpiexec), self.hostfile, shell, self.procs_per_node,
                      f"{prefix}.hostfile")
        silent = unanswered_host(shell, [h for h in hosts if h.name in dict(used)])
        if silent:
            host, why = silent
            raise ConfigError(f"{prefix}.hostfile", f"host {host} does not answer "
                              f"({Path(shell).name} {host} true: {why})",
                              f"bring {host} back, or remove it from {self.hostfile}")


def check_gpus_for_nccl(ranks: int) -> None:
    """comm.backend=nccl with every rank on this machine: one GPU per rank, found here
    before ranks start (NCCL itself fails inside the first collective)."""
    import torch

    from ..comm.communicator import NCCL_SHARED_FIX, nccl_shared_gpu_problem

    gpus = torch.cuda.device_count()
    require(gpus > 0, "comm.backend", "nccl needs GPUs and this machine has none",
            "comm.backend=auto")
    require(ranks <= gpus, "comm.backend", nccl_shared_gpu_problem(ranks, gpus),
            NCCL_SHARED_FIX)


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

    def join(self) -> None:
        self.thread.join(timeout=5)


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

    def join(self) -> None:
        self.thread.join(timeout=5)


class ForcedStop(Exception):
    """A second Ctrl-C while the job runs: stop every rank at once."""


# What a first Ctrl-C says, however early it comes (runner/commands/run.py too).
FIRST_CTRL_C = "Ctrl-C: every rank checkpoints and stops (Ctrl-C again stops at once)"


# Open MPI's mpiexec forwards SIGUSR1 and SIGUSR2 to every rank but kills them on SIGINT and
# SIGTERM: through it a Ctrl-C travels as SIGUSR2, a user's stop, and a SIGTERM as SIGUSR1, a
# preemption, as the ranks read them (runner/checkpoint/preemption.py).
OPEN_MPI_FORWARDS = {signal.SIGINT: signal.SIGUSR2, signal.SIGTERM: signal.SIGUSR1}


class StopForwarding:
    """While the job runs, SIGUSR1/SIGTERM (a scheduler's warning) and SIGINT (Ctrl-C)
    received here go to every rank, which checkpoint and stop (runner/checkpoint/preemption.py);
    ranks whose pid file appears later get them then (a rank writes it once it can take the signal,
    so a rank still importing never sees a signal it would print a traceback for), and find
    them noted in the run dir before their first step (``write_stop_request``), in case they
    get there before this process next looks for pid files. A second Ctrl-C raises
    :class:`ForcedStop`; any after it are ignored."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)

    def __init__(self, watchdog: RankWatchdog):
        self.watchdog = watchdog
        self.received: list[int] = []  # signals to forward, in the order they came
        self.delivered: dict[int, set[int]] = {}
        self.forced = False
        self.arrived: list[int] = []  # every signal, as it came (the handler may nest)
        self.announced: set[int] = set()  # the signals whose line was printed
        # A job across hosts: mpiexec (this pid) forwards each signal to every rank, since
        # ranks on other hosts cannot be signalled by pid from here; ``as_forwarded`` says
        # which signal carries each (Open MPI's: OPEN_MPI_FORWARDS).
        self.via_mpiexec: int | None = None
        self.as_forwarded: dict[int, int] = {}
        self.sent_via_mpiexec: set[int] = set()

    def __enter__(self) -> StopForwarding:
        self.previous = {sig: signal.signal(sig, self._received) for sig in self.SIGNALS}
        if ctrl_c.unanswered():  # a Ctrl-C pressed earlier, whose KeyboardInterrupt was lost
            self._received(signal.SIGINT, None)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _received(self, signum: int, frame) -> None:
        # Two quick Ctrl-Cs run this handler again inside itself, at any point of it. Each
        # press is counted first, by one list append (which a nested run cannot split), so
        # that whichever run sees two presses stops at once, whatever the other had done.
        self.arrived.append(signum)
        if self.forced:
            return
        if self.arrived.count(signal.SIGINT) >= 2:
            self.forced = True
            self.announce(signal.SIGINT)
            raise ForcedStop
        if signum not in self.received:
            self.received.append(signum)
            write_stop_request(self.watchdog.run_dir, self.received)
        self.announce(signum)
        self.deliver()

    def announce(self, signum: int) -> None:
        """A Ctrl-C's line, once; another stop signal's, if it came first. A nested run of the
        handler may print a line twice, never drop it: it is marked after being written."""
        if signum == signal.SIGINT and signal.SIGINT not in self.announced:
            line = FIRST_CTRL_C
        elif signum != signal.SIGINT and not self.announced:
            line = f"got {signal.Signals(signum).name}: every rank checkpoints and stops"
        else:
            return
        sys.stderr.write(f"\nadpsgd-run: {line}\n")  # one call: a nested run cannot split it
        sys.stderr.flush()
        self.announced.add(signum)

    def deliver(self) -> None:
        if not self.received:
            return
        if self.via_mpiexec is not None:
            if self.watchdog.all_started():  # once every rank can take it
                for signum in self.received:
                    if signum not in self.sent_via_mpiexec:
                        self.sent_via_mpiexec.add(signum)
                        os.kill(self.via_mpiexec, self.as_forwarded.get(signum, signum))
            return
        self.watchdog.refresh()
        for signum in self.received:
            done = self.delivered.setdefault(signum, set())
            pending = [rank for rank in self.watchdog.pids if rank not in done]
            self.watchdog.signal_ranks(signum, pending)
            done.update(pending)


# Signals that kill a rank from outside (or by its own crash) as opposed to the signals a dying
# peer causes in the ranks that lose it (MPI libraries crash on a lost connection: SIGSEGV,
# SIGABRT, SIGBUS) or that mpiexec's clean-up sends (SIGTERM, SIGINT, SIGUSR1).
OUTSIDE_SIGNALS = (signal.SIGKILL, signal.SIGILL, signal.SIGFPE, signal.SIGQUIT, signal.SIGHUP)


def killed_elsewhere(run_dir: Path, nprocs: int, exit_codes: dict[str, list[int]]
                     ) -> tuple[int, str, int, str] | None:
    """From mpiexec's exit codes per host (``-print-all-exitcodes``): the first rank, by rank,
    that a signal from outside ended and that left no exit record, with its host, the signal
    and a phrase on how the others ended; None when no such rank is found."""
    ranks_of: dict[str, list[int]] = {}
    for rank in range(nprocs):
        if (host := rank_host(run_dir, rank)) is not None:
            ranks_of.setdefault(host, []).append(rank)
    ended = {rank: code for host, codes in exit_codes.items()
             for rank, code in zip(ranks_of.get(host, []), codes)}
    for rank, code in sorted(ended.items()):
        if code in OUTSIDE_SIGNALS and exit_status(run_dir, rank) is None:
            crashed = sorted(r for r, c in ended.items() if r != rank and 0 < c < 65)
            others = (f"; rank(s) {', '.join(map(str, crashed))} then ended by signal(s) "
                      f"{', '.join(sorted({str(ended[r]) for r in crashed}))} when their "
                      "MPI lost it" if crashed else "")
            return rank, rank_host(run_dir, rank) or "?", code, others
    return None


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the job's process group until it is gone (with
    ``grace_s=0``, SIGKILL at once)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL) if grace_s else (signal.SIGKILL,):
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

    @property
    def processes(self) -> int:
        """The job's MPI processes: its learners and their spares (launcher.spares)."""
        return self.cfg.nprocs + self.cfg.spares

    def command(self, run_dir: Path, session_dirs: str | None = None) -> list[str]:
        return self.mpiexec_command(["-m", "runner.worker", str(run_dir)],
                                    session_dirs=session_dirs)

    def mpiexec(self) -> str:
        """The mpiexec the job starts with: Open MPI 5's for an elastic job."""
        return (find_ulfm_mpiexec(self.cfg.mpiexec) if self.cfg.elastic else
                find_mpiexec(self.cfg.mpiexec))

    def mpiexec_command(self, program: list[str], cleanup_by_watchdog: bool = True,
                        session_dirs: str | None = None) -> list[str]:
        """``mpiexec -n N [hosts] python PROGRAM...`` as this launcher places ranks (the
        benchmarks' jobs too, benchmarks/harness.py); ``session_dirs``: Open MPI's base for
        them (ulfm_mpi.session_base)."""
        mpiexec = self.mpiexec()
        hosts = (hostfile_args(mpiexec, self.cfg.hostfile,
                               remote_shell_path(self.cfg.remote_shell, "launcher.remote_shell"),
                               self.cfg.procs_per_node) if self.cfg.hostfile else [])
        if has_ulfm(mpiexec):  # Open MPI 5, e.g. .venv/ulfm's (every elastic job)
            if self.cfg.hostfile:
                hosts += open_mpi_remote_args(mpiexec, [*RANK_ENVIRONMENT, *(
                    name for name in ("PYTHONPATH",) if name in os.environ)])
                if self.cfg.elastic:
                    hosts += open_mpi_link_args()
            return [mpiexec, "-n", str(self.processes),
                    *open_mpi_args(self.cfg.elastic, session_dirs), *hosts,
                    *self.cfg.mpiexec_args, sys.executable, *program]
        cleanup = self.cleanup_args(mpiexec) if cleanup_by_watchdog else []
        if self.cfg.hostfile and mpi_flavor(mpiexec) == "hydra":
            # How each rank on another host ended: the watchdog sees no pid there.
            cleanup.append("-print-all-exitcodes")
        return [mpiexec, "-n", str(self.processes), *hosts, *cleanup, *self.cfg.mpiexec_args,
                sys.executable, *program]

    def cleanup_args(self, mpiexec: str) -> list[str]:
        """Leave the clean-up after a dead rank to the watchdog where mpiexec allows it."""
        if mpi_flavor(mpiexec) == "hydra" and "-disable-auto-cleanup" not in \
                self.cfg.mpiexec_args:
            return ["-disable-auto-cleanup"]
        return []

    def ranks_per_machine(self) -> int:
        """The most ranks that share one machine's cores."""
        if not self.cfg.hostfile:
            return self.processes
        used = ranks_per_host(read_hostfile(self.cfg.hostfile), self.processes,
                              self.cfg.procs_per_node)
        return max(count for _, count in used)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # Rank 0's progress reaches our stderr through a pipe: a bar only if that is a terminal.
        env[CONSOLE_IS_TERMINAL] = "1" if sys.stderr.isatty() else "0"
        # One BLAS/OpenMP pool per core, not per rank: oversubscribed ranks thrash otherwise.
        # (With a hostfile, each host is taken to have this machine's cores.)
        env.setdefault("OMP_NUM_THREADS",
                       str(max(1, (os.cpu_count() or 1) // self.ranks_per_machine())))
        mpiexec = self.mpiexec()
        if has_ulfm(mpiexec):  # mpi4py loads that Open MPI's libmpi, not the venv's MPICH
            env.update(ulfm_environment(mpiexec, env))
        return env

    def launch(self, run_cfg, run_dir):
        run_dir = Path(run_dir)
        if self.cfg.nprocs == 1:
            from ..worker import run_rank

            if self.cfg.max_restarts:
                print("adpsgd-run: note: launcher.max_restarts does not apply to "
                      "launcher.nprocs=1 (the rank runs inside adpsgd-run)", file=sys.stderr,
                      flush=True)
            with records_off_the_console():  # they go to logs/rank0.log
                return run_rank(run_dir, in_process=True)
        restarts = Restarts(run_dir, self.cfg.max_restarts)
        sharing, cores = self.ranks_per_machine(), os.cpu_count() or 1
        if sharing > cores:  # their start-up alone (each imports torch) takes a while
            print(f"adpsgd-run: starting {sharing} ranks on {cores} core(s) (oversubscribed): "
                  f"they load and start together before the first step, which takes longer "
                  f"the more ranks share a core", file=sys.stderr, flush=True)
        while True:
            status, failure = self.run_job(run_dir)
            if failure is None:
                return status
            progress = ranks_progress(run_dir, self.processes)
            failure.record(run_dir, progress)
            try:
                restarting = restarts.decide(failure, progress)
            except KeyboardInterrupt:  # between two jobs: no rank to forward it to
                ctrl_c.answered()
                return EXIT_STOPPED
            if not restarting:
                failure.report()
                return status

    def run_job(self, run_dir: Path) -> tuple[int, JobFailure | None]:
        """Run the MPI job once; its exit status, and how it failed (None: it completed or
        stopped as asked). Open MPI's session directories go in a base of the job's own."""
        try:
            if not has_ulfm(self.mpiexec()):
                return self._run_job(run_dir, None)
            with session_base() as base:
                return self._run_job(run_dir, base)
        finally:
            empty_blank_exit_records(run_dir, self.processes)

    def _run_job(self, run_dir: Path, session_dirs: str | None
                 ) -> tuple[int, JobFailure | None]:
        clear_rank_files(run_dir, self.processes)
        # Ranks on other hosts send their heartbeats over the network (runner/launch/
        # watchdog.py): a host that hangs or loses its link falls silent.
        # An elastic job's launcher answers them with the learners it takes for lost.
        across_hosts_elastic = bool(self.cfg.hostfile and self.cfg.elastic)
        listener = HeartbeatListener(answer=across_hosts_elastic) if self.cfg.hostfile else None
        watchdog = RankWatchdog(run_dir, self.processes, listener)
        # The ranks on this host stop if this process dies, and every rank leaves printing
        # its failure to it.
        env = {**self.environment(), LAUNCHER_PID: str(os.getpid()),
               LAUNCHER_HOST: socket.gethostname(),
               **({HEARTBEAT_TO: listener.target} if listener else {}),
               **({LINK_TIMEOUT: f"{self.cfg.link_timeout_s:g}"} if across_hosts_elastic
                  else {})}
        # Signals are taken over before mpiexec starts: a Ctrl-C from here on reaches the
        # ranks as a graceful stop, however early.
        with StopForwarding(watchdog) as forwarding:
            stderr_read, stderr_write = os.pipe()
            try:
                proc = subprocess.Popen(self.command(run_dir, session_dirs), env=env,
                                        start_new_session=True, stdout=subprocess.PIPE,
                                        stderr=stderr_write, text=True, errors="replace")
            finally:
                os.close(stderr_write)
            if self.cfg.hostfile:
                forwarding.via_mpiexec = proc.pid
                if mpi_flavor(proc.args[0]) == "openmpi":
                    forwarding.as_forwarded = OPEN_MPI_FORWARDS
            watchdog.watch_mpiexec(proc.pid)
            output = MpiexecOutput(proc.stdout, run_dir / "logs" / "mpiexec.log")
            errors = MpiexecStderr(stderr_read, run_dir / "logs" / "mpiexec.log")
            grace = 0.0 if "-disable-auto-cleanup" in proc.args else MPIEXEC_GRACE_S
            try:
                status = self.supervise(proc, watchdog, forwarding, grace)
            except (ForcedStop, KeyboardInterrupt):
                print("adpsgd-run: second Ctrl-C: stopping every rank at once", file=sys.stderr,
                      flush=True)
                stop_process_group(proc, grace_s=0.0)
                watchdog.kill_leftovers()
                watchdog.stop()
                remove_partial_checkpoints(run_dir)
                return EXIT_STOPPED, None
            finally:
                if listener:
                    listener.close()
        ended = time.time()
        output.join()
        errors.join()
        watchdog.kill_leftovers()  # a rank that outlived mpiexec would be an orphan
        try:  # and a helper of mpiexec's (an Open MPI prterun outlived an elastic job once)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(2 * RankWatchdog.POLL_MS / 1000)  # the last deaths reach the record
        watchdog.stop()
        if self.left_behind:
            self.report_left_behind(run_dir)
        if self.stalled is not None:
            stalled = self.stalled
            where = f" on {stalled.host}" if stalled.host else ""
            return 128 + signal.SIGKILL, JobFailure(
                f"rank {stalled.rank}{where} stalled (no heartbeat for launcher.stall_timeout_s="
                f"{self.cfg.stall_timeout_s:g} s)", True, ended,
                lambda: self.report_stalled(run_dir, stalled), event="stalled",
                learner=stalled.rank, host=stalled.host)
        # The learners this launcher took for lost (a cut link, a hung host) left with an
        # exit record of EXIT_PEER_LOST if they came back before the end (runner/worker.py's
        # cut_off): the job is what the others made of it.
        cut = watchdog.listener.declared() if self.cfg.elastic and watchdog.listener else set()
        exits = [s for r, s in watchdog.exit_statuses().items() if r not in cut]
        finished = any(s in (0, EXIT_PREEMPTED, EXIT_STOPPED) for s in exits)
        # Open MPI's runtime ends a job that lost a daemon with SIGTERM to every rank left,
        # which checkpoint and stop as if preempted: a stop nobody forwarded is that end.
        ended_as_asked = any(s == 0 for s in exits) or (bool(forwarding.received) and finished)
        host = output.lost_daemon_host or errors.lost_daemon_host
        if host and not (status == 0 and ended_as_asked):
            return 128 + signal.SIGKILL, JobFailure(
                f"Open MPI lost its daemon on {host}", True, ended,
                lambda: self.report_daemon_lost(run_dir, host), event="died", host=host)
        # An elastic job outlives its dead ranks: what ended it is a rank's own error line
        # (too few learners left, no topology for them), if one wrote it.
        error_lines = [r for r in failure_records(run_dir, self.processes) if r.message
                       and r.status in (2, EXIT_TOO_FEW_LEARNERS)] if self.cfg.elastic else []
        learners_lines = [r for r in error_lines if r.rank < self.cfg.nprocs]
        if status == 0 and not finished and learners_lines:
            # A surviving learner's line ends the job through MPI_Abort, whose status Open
            # MPI's mpiexec sometimes loses (0, seen under load): the line is the job's end, as
            # when the status arrives. (A spare's line, that no learner is left, is not: every
            # learner died.)
            status = learners_lines[0].status
        if status == 0 and self.cfg.elastic and not finished:
            # Under ULFM a death is the job's to handle, so Open MPI's mpiexec ends with 0 when
            # every rank died: nobody finished the run.
            dead = self.dead_rank(watchdog, output)
            return 128 + signal.SIGKILL, JobFailure(
                "every learner died", True, dead.when if dead else ended,
                lambda: self.report_all_dead(run_dir, dead), event="died",
                learner=dead.rank if dead else None)
        if status == 0:
            if forwarding.received:  # the signal came after the last chance to stop
                names = ", ".join(signal.Signals(s).name for s in forwarding.received)
                print(f"adpsgd-run: the run completed before the stop ({names}) took effect: "
                      "it is finished, nothing to resume", file=sys.stderr, flush=True)
            return 0, None
        statuses = set(exits)
        if self.cfg.elastic:  # the learners it lost on the way left no record
            statuses.discard(None)
        if statuses in ({EXIT_PREEMPTED}, {EXIT_STOPPED}):  # every rank stopped gracefully
            return statuses.pop(), None
        if status == -signal.SIGINT and signal.SIGINT in forwarding.received:
            # The user's Ctrl-C itself: a Ctrl-C while mpiexec is being spawned reaches it in
            # the instant between fork and its own session, and it dies of it at once.
            return EXIT_STOPPED, None
        dead = None if error_lines else self.dead_rank(watchdog, output)
        if dead is None and (killed := killed_elsewhere(run_dir, self.processes,
                                                         output.exit_codes)):
            rank, host, signum, others = killed
            return 128 + signum, JobFailure(
                f"rank {rank} on {host} was killed by signal {signum} "
                f"({signal.Signals(signum).name})", True, ended,
                lambda: self.report_killed_elsewhere(run_dir, rank, host, signum, others),
                event="died", learner=rank, host=host)
        if status < 0 and self.mpiexec_ended_first(watchdog, dead, ended):
            # mpiexec itself was killed from outside; its ranks went down after it.
            name = signal.Signals(-status).name
            return 128 - status, JobFailure(
                f"mpiexec was killed by signal {-status} ({name}) from outside", True, ended,
                lambda: self.report_mpiexec_killed(run_dir, proc.pid, -status),
                event="mpiexec killed")
        if dead is not None:
            # The shell's convention for "killed by a signal", whether mpiexec or the watchdog
            # ended the job (mpiexec would return the bare signal number).
            code = output.bad_code if output.bad_pid == dead.pid else None
            signum = code if code is not None and 0 < code < 65 else None
            how = (f"was killed by signal {signum} ({signal.Signals(signum).name})" if signum
                   else "died without reporting an error")
            return 128 + (signum or signal.SIGKILL), JobFailure(
                f"rank {dead.rank} {how}", True, dead.when,
                lambda: self.report_dead_rank(run_dir, dead, output), event="died",
                learner=dead.rank)
        status = 128 - status if status < 0 else status
        mpiexec_said = self.mpiexec_report(watchdog, output)
        report = functools.partial(self.report_failure, run_dir, status, mpiexec_said)
        return status, (reported_failure(run_dir, self.processes, ended, report) or JobFailure(
            f"the MPI job exited with status {status}", True, ended, report))

    def supervise(self, proc: subprocess.Popen, watchdog: RankWatchdog,
                  forwarding: StopForwarding, grace_s: float) -> int:
        """Wait for mpiexec; if a rank dies and mpiexec does not end the job within
        ``grace_s``, or a rank stalls (no heartbeat for ``stall_timeout_s``), end it here.
        Returns mpiexec's status."""
        seen_dead = left_since = None
        self.stalled = None
        self.left_behind: list[int] = []
        self.mpiexec_killed_first = False
        self.stalled_killed: set[int] = set()  # pids killed for silence (kill_stalled)
        while True:
            try:
                return proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            forwarding.deliver()
            if self.cfg.elastic and self.cfg.hostfile and (
                    silent := watchdog.newly_silent(self.cfg.link_timeout_s)):
                # No MPI sees a peer behind a cut link fail: the survivors learn it from here.
                watchdog.listener.declare_lost(silent)
            if self.cfg.elastic and (behind := watchdog.lost_behind(2 * HEARTBEAT_S)):
                left_since = left_since or time.monotonic()
                if time.monotonic() - left_since >= MPIEXEC_GRACE_S:
                    # Every learner left has ended; mpiexec would wait for the lost ones.
                    self.left_behind = behind
                    stop_process_group(proc, grace_s=0.0)
                    statuses = watchdog.exit_statuses()
                    return next((s for r, s in statuses.items() if s and r not in behind), 0)
            else:
                left_since = None
            if self.cfg.stall_timeout_s and (stalled := watchdog.stalled(
                    self.cfg.stall_timeout_s)) is not None:
                if self.cfg.elastic and stalled.host is None:
                    # A hung process on this host is made a lost one: its death is what the
                    # others' MPI notices and goes on without (runner/train/elastic.py), as
                    # they go on without a learner behind a cut link.
                    self.kill_stalled(watchdog.run_dir, stalled)
                    continue
                self.stalled = stalled
                return self.end_job(proc, watchdog)
            if self.cfg.elastic or watchdog.check() is None:
                # Nobody died, or a rank failed first with a message (and aborts); in an
                # elastic job the survivors go on without the dead (runner/train/elastic.py).
                continue
            seen_dead = seen_dead or time.monotonic()
            if (status := proc.poll()) is not None:
                # mpiexec ended between the wait and the check: killed by a signal, it took
                # its ranks down after it (Hydra never ends by a signal for a rank's death).
                self.mpiexec_killed_first = status < 0
                return status
            if time.monotonic() - seen_dead >= grace_s:
                return self.end_job(proc, watchdog)

    def mpiexec_ended_first(self, watchdog: RankWatchdog, dead: DeadRank | None,
                            ended: float) -> bool:
        """Whether mpiexec ended before the first rank that died (it then took its ranks
        down). The watchdog's thread saw both ends, in order, unless they came while it
        waited for the CPU; without it, what this thread saw decides, which a loaded machine
        can get wrong (the ranks die milliseconds after mpiexec, before its wait returns)."""
        if dead is None:
            return True
        seen = watchdog.mpiexec_ended_first(dead)
        if seen is not None:
            return seen
        return dead.when >= ended or self.mpiexec_killed_first

    def kill_stalled(self, run_dir: Path, stalled: StalledRank) -> None:
        """kill -9 of a rank of an elastic job on this host that stopped responding, in one
        line and an event (its loss is the survivors' to record)."""
        # Killed already but not yet reaped: a zombie stays silent, and was recorded once.
        if stalled.pid in self.stalled_killed:
            return
        try:
            os.kill(stalled.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended meanwhile: its death is noticed as any other
            return
        self.stalled_killed.add(stalled.pid)
        cause = (f"no heartbeat for {stalled.silent_s:.0f} s (launcher.stall_timeout_s="
                 f"{self.cfg.stall_timeout_s:g}): killed, the job goes on without it")
        who = "learner" if stalled.rank < self.cfg.nprocs else "spare"
        print(f"adpsgd-run: {who} {stalled.rank} (pid {stalled.pid}) stopped responding: "
              f"{cause}", file=sys.stderr, flush=True)
        record_event(run_dir, {"time": round(time.time(), 3), "event": "stalled",
                               "learner": stalled.rank, "host": socket.gethostname(),
                               "at_samples": rank_progress(run_dir, stalled.rank),
                               "cause": cause})

    @staticmethod
    def end_job(proc: subprocess.Popen, watchdog: RankWatchdog) -> int:
        """Kill every rank; mpiexec ends once they are gone."""
        watchdog.kill_leftovers()
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            stop_process_group(proc, grace_s=2.0)
        return 128 + signal.SIGKILL

    def resume_hint(self, run_dir: Path) -> str:
        checkpoints = complete_checkpoints(run_dir)
        return (f"continue from {checkpoints[-1].path} with resume=auto hydra.run.dir={run_dir}"
                if checkpoints else "start it again")

    def report_stalled(self, run_dir: Path, stalled: StalledRank) -> None:
        if stalled.host:  # heard over the network: the host, its link or the rank is gone
            print(f"adpsgd-run: rank {stalled.rank} on host {stalled.host} (pid "
                  f"{stalled.pid} there) stopped responding: no heartbeat for "
                  f"{stalled.silent_s:.0f} s (the rank died or stopped, the host hung, or its "
                  "network link is down); the job was stopped here, and processes of it may "
                  f"be left on {stalled.host}. Fix: check {stalled.host} and its link, then "
                  f"{self.resume_hint(run_dir)}", file=sys.stderr, flush=True)
            return
        print(f"adpsgd-run: rank {stalled.rank} (pid {stalled.pid}) stopped responding: no "
              f"heartbeat for {stalled.silent_s:.0f} s (a stopped process, a hung node or a "
              "rank stuck outside Python); every rank was stopped. Fix: look for the cause in "
              f"{run_dir}/logs/rank{stalled.rank}.log and on its host, raise "
              f"launcher.stall_timeout_s if ranks are only busy that long, then "
              f"{self.resume_hint(run_dir)}", file=sys.stderr, flush=True)

    def report_left_behind(self, run_dir: Path) -> None:
        ranks = self.left_behind
        hosts = sorted({rank_host(run_dir, rank) or "?" for rank in ranks})
        print(f"adpsgd-run: learner(s) {', '.join(map(str, ranks))} on {', '.join(hosts)}, "
              "which the job went on without, never answered again: mpiexec, which waited "
              f"for them after the others had ended, was stopped here; processes of the job "
              f"may be left on {', '.join(hosts)} until it answers again", file=sys.stderr,
              flush=True)

    def report_mpiexec_killed(self, run_dir: Path, pid: int, signum: int) -> None:
        print(f"adpsgd-run: mpiexec (pid {pid}) was killed by signal {signum} "
              f"({signal.Signals(signum).name}) from outside; every rank was stopped with it. "
              f"Fix: {self.resume_hint(run_dir)}", file=sys.stderr, flush=True)

    def dead_rank(self, watchdog: RankWatchdog, output: MpiexecOutput) -> DeadRank | None:
        """The rank that died first, as the watchdog saw the deaths happen (mpiexec's report
        names whichever rank its clean-up listed first); mpiexec's pid when the watchdog never
        saw the rank's pid file."""
        dead = watchdog.check()
        if dead is None and output.bad_pid is not None and not failure_times(
                watchdog.run_dir, self.processes):
            rank = watchdog.rank_of_pid(output.bad_pid)
            dead = DeadRank(rank, output.bad_pid, time.time()) if rank is not None else None
        return dead

    def report_dead_rank(self, run_dir: Path, dead: DeadRank, output: MpiexecOutput) -> None:
        code = output.bad_code if output.bad_pid == dead.pid else None
        if code is not None and 0 < code < 65:  # hydra reports a killing signal as the code
            how = f"killed by signal {code} ({signal.Signals(code).name})"
        else:
            how = "killed from outside"
        print(f"--- last lines of {run_dir}/logs/rank{dead.rank}.log ---\n"
              f"{log_tail(run_dir, dead.rank)}", file=sys.stderr)
        # A peer that gave up on it first: it died, or it hung and went down with the job.
        gave_up = [r for r in failure_records(run_dir, self.processes)
                   if r.status == EXIT_PEER_LOST and r.message]
        hung = ""
        if gave_up:
            print(gave_up[0].message, file=sys.stderr)
            hung = f", or hung until rank {gave_up[0].rank} gave up on it (line above)"
        print(f"adpsgd-run: rank {dead.rank} (pid {dead.pid}) died without reporting an error "
              f"({how}: kill -9, the out-of-memory killer or a crash{hung}); the other ranks "
              f"were stopped. Fix: find the cause in its log above and the kernel log (dmesg), "
              f"then {self.resume_hint(run_dir)}", file=sys.stderr, flush=True)

    def report_daemon_lost(self, run_dir: Path, host: str) -> None:
        print(f"adpsgd-run: Open MPI lost its daemon on {host} (the host went down, or its "
              f"processes were killed), and its runtime ends the whole job then, elastic or "
              f"not; every rank was stopped. Fix: check {host}, then "
              f"{self.resume_hint(run_dir)} (launcher.max_restarts=N does it by itself)",
              file=sys.stderr, flush=True)

    def report_all_dead(self, run_dir: Path, first: DeadRank | None) -> None:
        which = (f", rank {first.rank} (pid {first.pid}) first" if first else "")
        print(f"adpsgd-run: every learner of the elastic job died without reporting an error"
              f"{which} (kill -9, the out-of-memory killer or a crash): none was left to go "
              f"on. Fix: find the cause in {run_dir}/logs/rank*.log and the kernel log "
              f"(dmesg), then {self.resume_hint(run_dir)}", file=sys.stderr, flush=True)

    def report_killed_elsewhere(self, run_dir: Path, rank: int, host: str, signum: int,
                                others: str) -> None:
        print(f"--- last lines of {run_dir}/logs/rank{rank}.log ---\n"
              f"{log_tail(run_dir, rank)}", file=sys.stderr)
        print(f"adpsgd-run: rank {rank} on host {host} was killed by signal {signum} "
              f"({signal.Signals(signum).name}: kill -9, the out-of-memory killer or a crash)"
              f"{others}; the job was stopped. Fix: find the cause in its log above and in "
              f"{host}'s kernel log (dmesg), then {self.resume_hint(run_dir)}",
              file=sys.stderr, flush=True)

    @staticmethod
    def mpiexec_report(watchdog: RankWatchdog, output: MpiexecOutput) -> str:
        """What mpiexec said about the process that ended badly, as one phrase."""
        if output.bad_pid is None:
            return ""
        rank = watchdog.rank_of_pid(output.bad_pid)
        who = f"rank {rank}" if rank is not None else "a process"
        code = output.bad_code
        how = (f"exit code {code}" + (f" (as if killed by {signal.Signals(code).name})"
                                      if code is not None and 0 < code < 32 else ""))
        return f"; mpiexec reports {who} (pid {output.bad_pid}) ended with {how}"

    def report_failure(self, run_dir: Path, status: int, mpiexec_said: str = "") -> None:
        """Print the one line of the rank that failed first with one (from its exit record:
        its own print may have died with MPI_Abort); ranks that failed after it with lines of
        their own (e.g. every rank found the disk full) are named in one short line, their
        lines stay in their logs. With none, say so and show rank 0's last log lines."""
        lines, later = [], []
        for record in failure_records(run_dir, self.processes):
            if record.message and not lines:
                lines.append(record.message)
            elif record.message and record.message not in lines:
                later.append(record.rank)
        for line in lines:
            print(line, file=sys.stderr, flush=True)
        if later:
            which = ", ".join(f"logs/rank{rank}.log" for rank in later)
            print(f"adpsgd-run: {len(later)} more rank(s) failed after it with lines of their "
                  f"own: see {which}", file=sys.stderr, flush=True)
        started = any((run_dir / "logs" / f"rank{r}.log").exists()
                      for r in range(self.processes))
        if not lines and not started and (notice := mpiexec_notice(run_dir)):
            # mpiexec itself gave up before starting a rank (a bad mpiexec argument, its
            # runtime failing to start): its own notice is the cause.
            print(f"adpsgd-run: mpiexec exited with status {status} before any rank "
                  f"started; it said: {notice} (all of it in {run_dir}/logs/mpiexec.log)",
                  file=sys.stderr, flush=True)
            return
        if not lines:
            print(f"--- last lines of {run_dir}/logs/rank0.log ---\n{log_tail(run_dir, 0)}",
                  file=sys.stderr)
            print(f"adpsgd-run: the MPI job exited with status {status} without a rank "
                  f"reporting an error{mpiexec_said}; see {run_dir}/logs", file=sys.stderr)
