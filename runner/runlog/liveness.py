"""What a rank tells its launcher: the rank side of runner/launch/watchdog.py.

Every rank writes ``logs/rank<N>.pid`` (its pid and host) as soon as it can take a forwarded
signal, with a blank exit record beside it that it overwrites in place as it ends (so that a
rank can still say how it ended on a full disk); a heartbeat thread touches the pid file every
HEARTBEAT_S, with the global samples the rank has seen once it trains, and on a job across
hosts sends the same beat to the launcher as a UDP datagram (:class:`LauncherLink` when the
job is elastic: the launcher's answers name the learners it takes for lost). A rank on the
launcher's host watches the launcher's pid, and reads the stop signals the launcher noted
before the rank's first step. The launcher reads all of this (runner/launch/watchdog.py);
the files' names and formats are defined here, once.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

LOGS = "logs"


def rank_file(run_dir: str | Path, rank: int, suffix: str) -> Path:
    """``logs/rank<N>.<suffix>``: ``pid`` (pid, host, samples, what it does), ``exit``."""
    return Path(run_dir) / LOGS / f"rank{rank}.{suffix}"


RECORD_BYTES = 4096  # an exit record's fixed size: its blocks exist before the rank needs them


HEARTBEAT_S = 2.0  # how often a rank touches its pid file


def write_pid_file(run_dir: str | Path, rank: int) -> None:
    """The rank's pid and host, and its exit record, still blank (raises OSError when the
    run dir cannot take them: a full disk at the start)."""
    path = rank_file(run_dir, rank, "pid")
    path.parent.mkdir(parents=True, exist_ok=True)
    record = rank_file(run_dir, rank, "exit")
    with open(record, "wb") as f:
        f.write(b" " * RECORD_BYTES)
        f.flush()
        os.fsync(f.fileno())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{os.getpid()} {socket.gethostname()}\n")
    os.replace(tmp, path)  # the launcher never reads half a file


def write_exit_record(run_dir: str | Path, rank: int, status: int,
                      message: str | None = None, samples: int | None = None) -> None:
    """Overwrite the rank's blank exit record in place (no new blocks: this works on a full
    disk); never raises, since it runs on the way out of every failure. ``samples``: the
    global samples the rank had seen as it ended (fresher than its last heartbeat)."""
    record = {"status": status, "message": message, "samples": samples}
    payload = json.dumps(record).encode()
    if len(payload) > RECORD_BYTES:
        cut = message[:RECORD_BYTES // 2] + "..." if message else None
        payload = json.dumps({**record, "message": cut}).encode()
    try:
        with open(rank_file(run_dir, rank, "exit"), "r+b") as f:
            f.write(payload.ljust(RECORD_BYTES))
    except OSError:
        try:
            rank_file(run_dir, rank, "exit").write_bytes(payload)
        except OSError:
            pass


def rank_pid(run_dir: str | Path, rank: int) -> int | None:
    """The rank's pid if it runs on this host (the only pids we can check or signal)."""
    try:
        pid, host = rank_file(run_dir, rank, "pid").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return int(pid) if host == socket.gethostname() else None


def exit_record_written(run_dir: str | Path, rank: int) -> bool:
    """Whether the rank has written its exit record (False while it is blank or missing)."""
    try:
        with open(rank_file(run_dir, rank, "exit"), "rb") as f:
            return bool(f.read(RECORD_BYTES).strip())
    except OSError:
        return False


# The local launcher's pid and host, in its ranks' environment: ranks on its host stop when
# it is gone (a pid means nothing on another host).
LAUNCHER_PID = "ADPSGD_LAUNCHER_PID"


LAUNCHER_HOST = "ADPSGD_LAUNCHER_HOST"


# Where ranks send their heartbeats over the network (HOST:PORT), when the job spans hosts.
HEARTBEAT_TO = "ADPSGD_HEARTBEAT_TO"


# An elastic job across hosts: the seconds without the launcher's answer after which a rank
# takes itself for cut off (launcher.link_timeout_s); the answer's first word.
LINK_TIMEOUT = "ADPSGD_LINK_TIMEOUT"


# An elastic job across hosts: how often a rank sends its network heartbeat
# (launcher.heartbeat_s), which the launcher's loss detector learns from.
NETWORK_HEARTBEAT_S = "ADPSGD_NETWORK_HEARTBEAT_S"


LOST_ANSWER = "lost"


ANSWERS_MARK = "+"  # before a host in the launcher's answer: it answers (host_probe.py)


TRAINING = "training"  # a heartbeat's last word once the rank trains (its start-up is over)


def launcher_here() -> int | None:
    """The launcher's pid when it runs on this rank's host, else None."""
    pid, host = os.environ.get(LAUNCHER_PID), os.environ.get(LAUNCHER_HOST)
    return int(pid) if pid and host in (None, socket.gethostname()) else None


def watch_launcher(pid: int, on_gone) -> None:
    """Call ``on_gone()`` (from a daemon thread) when process ``pid`` ends."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            select.select([fd], [], [])  # readable once the process has ended
            os.close(fd)
        else:
            while process_alive(pid):
                time.sleep(1.0)
        on_gone()

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def start_heartbeat(run_dir: str | Path, rank: int,
                    progress: Callable[[], int | None] = lambda: None,
                    operation: Callable[[], str | None] = lambda: None,
                    training: Callable[[], bool] | None = None,
                    on_lost: Callable[[list[int]], None] | None = None,
                    on_cut_off: Callable[[float], None] | None = None,
                    on_launcher_gone: Callable[[], None] = lambda: None) -> None:
    """A daemon thread that touches the rank's pid file every HEARTBEAT_S. Once
    ``progress()`` (the global samples the rank has seen) has a value, each beat rewrites the
    file with it as a third field, which a launcher that restarts a failed job reads (see
    ``rank_progress``), and what ``operation()`` says the rank is doing as the rest of the
    line (``rank_operation``: named when the rank stalls or dies); on a full disk the beat only
    touches the file (its time changes). Its network heartbeats say TRAINING once
    ``training()`` (default: once ``progress()`` has a value): the rank's start-up is over,
    and its silence may be taken for a loss.

    In an elastic job across hosts (``ADPSGD_LINK_TIMEOUT`` set), the network heartbeats go
    from a :class:`LauncherLink` thread instead, which hears the launcher's answers and calls
    ``on_lost``, ``on_cut_off`` and ``on_launcher_gone``; they never wait on the run dir's
    file system."""
    path = rank_file(run_dir, rank, "pid")
    tmp = path.with_name(path.name + ".beat")
    identity = f"{os.getpid()} {socket.gethostname()}"
    target, link_timeout = os.environ.get(HEARTBEAT_TO), os.environ.get(LINK_TIMEOUT)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    beat_words = f"{rank} {identity}"
    past_start_up = training or (lambda: progress() is not None)
    send = datagram_sender(target, lambda: (f"{beat_words} {TRAINING}" if past_start_up()
                                            else beat_words).encode(), sock)
    linked = bool(target and link_timeout and on_lost and on_cut_off)
    if linked:  # the launcher takes a silent rank for lost first, and the rank learns it
        LauncherLink(sock, target, send, float(link_timeout) + 2 * HEARTBEAT_S, on_lost,
                     on_cut_off, on_launcher_gone,
                     float(os.environ.get(NETWORK_HEARTBEAT_S) or HEARTBEAT_S))

    def beat() -> None:
        while True:
            if not linked:
                send()
            try:
                samples = progress()
                if samples is None:
                    os.utime(path)
                else:
                    doing = " ".join((operation() or "").split())  # one line
                    tmp.write_text(f"{identity} {samples} {doing}".rstrip() + "\n")
                    os.replace(tmp, path)
            except OSError:
                try:
                    os.utime(path)
                except OSError:
                    pass
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def datagram_sender(target: str | None, payload: bytes | Callable[[], bytes],
                    sock: socket.socket | None = None) -> Callable[[], None]:
    """A function that sends ``payload`` (or what it returns) to ``target`` (HOST:PORT) as one
    UDP datagram (from ``sock``, else a socket of its own), never raising (a lost datagram is
    a missed beat); a no-op without a target."""
    if not target:
        return lambda: None
    address = None
    sock = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def send() -> None:
        nonlocal address
        try:
            address = address or udp_address(target)
            sock.sendto(payload() if callable(payload) else payload, address)
        except (OSError, ValueError, AttributeError):  # AttributeError: a rank's state
            address = None  # resolve again next time (the network may come back)

    return send


def udp_address(target: str) -> tuple:
    """The socket address of ``target`` (HOST:PORT) for UDP (raises OSError or ValueError)."""
    host, _, port = target.rpartition(":")
    return socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_DGRAM)[0][4]


# This rank's link to the launcher of an elastic job across hosts, once started.
LINK: LauncherLink | None = None


def the_launcher_hears_us() -> bool:
    """In an elastic job across hosts, whether the launcher still answers this rank (waits
    for its next answer, at most the link's time-out), and has not named it lost (an answer
    naming it stops the rank first). From this side a cut link looks like every peer across
    it lost, so a rank that MPI tells of failed peers goes on only if the launcher, which
    decides which side goes on, hears it. True where there is no such link."""
    link = LINK
    return link is None or link.answered_after(time.monotonic())


def hosts_answering() -> frozenset[str] | None:
    """In an elastic job across hosts with launcher.respawn, the hosts the launcher last
    found answering, less those of learners it took for lost since (a replacement may go
    there); None where there is no such link."""
    link = LINK
    return link.answering if link is not None else None


class LauncherLink:
    """A rank's end of the answered heartbeats (:class:`HeartbeatListener`), in a thread of
    its own: ``on_lost(ranks)`` for the learners the launcher newly takes for lost (this
    rank among them if the launcher lost it); ``on_cut_off(seconds)`` once when no answer
    came for ``timeout_s`` (from this side, a cut link looks like every peer across it gone:
    the launcher decides which side goes on); ``on_launcher_gone()`` once when the launcher's
    host says that nobody listens there any more (the launcher died; its socket is connected
    to hear that ICMP answer). A heartbeat goes every ``beat_s``: the launcher learns from
    their gaps when a silence means a loss (runner/launch/loss_detector.py)."""

    def __init__(self, sock: socket.socket, target: str, send: Callable[[], None],
                 timeout_s: float, on_lost: Callable[[list[int]], None],
                 on_cut_off: Callable[[float], None],
                 on_launcher_gone: Callable[[], None], beat_s: float = HEARTBEAT_S) -> None:
        global LINK
        self.sock, self.target, self.send, self.timeout_s = sock, target, send, timeout_s
        self.beat_s = beat_s
        self.on_lost, self.on_cut_off, self.on_launcher_gone = (on_lost, on_cut_off,
                                                                on_launcher_gone)
        self.answered = time.monotonic()  # when the launcher's last answer came
        self.answering: frozenset[str] = frozenset()  # as the last answer said
        self._answer = threading.Condition()
        LINK = self
        threading.Thread(target=self._listen, name="launcher-link", daemon=True).start()

    def answered_after(self, since: float) -> bool:
        """Wait until an answer that came after ``since`` (time.monotonic()) was handled,
        at most this link's time-out: whether one did. Its lost learners were passed to
        ``on_lost`` first (which stops this rank if it is among them). A heartbeat goes
        at once, so the answer takes a round trip, not a beat."""
        self.send()
        with self._answer:
            return self._answer.wait_for(lambda: self.answered > since, self.timeout_s)

    def _connect(self) -> bool:
        try:
            self.sock.connect(udp_address(self.target))
            return True
        except (OSError, ValueError):  # no route or no name yet: silence, for now
            return False

    def _listen(self) -> None:
        self.sock.settimeout(self.beat_s / 4)
        answered = sent = time.monotonic()
        connected = self._connect()
        self.send()
        known: set[int] = set()
        while True:
            if time.monotonic() - sent >= self.beat_s:
                sent = time.monotonic()
                connected = connected or self._connect()
                self.send()
            try:
                words = self.sock.recv(65536).split()
            except TimeoutError:
                words = []
            except ConnectionRefusedError:
                self.on_launcher_gone()
                return
            except OSError:  # an unreachable network: an answer that did not come
                time.sleep(self.beat_s / 4)
                words = []
            now = time.monotonic()
            if words[:1] == [LOST_ANSWER.encode()]:
                answered = now
                lost = {int(word) for word in words[1:] if word.isdigit()}
                self.answering = frozenset(word[1:].decode(errors="replace")
                                           for word in words[1:]
                                           if word.startswith(ANSWERS_MARK.encode()))
                if lost - known:
                    self.on_lost(sorted(lost - known))
                    known |= lost
                with self._answer:
                    self.answered = now
                    self._answer.notify_all()
            elif now - answered > self.timeout_s:
                self.on_cut_off(now - answered)
                return


def stop_request_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOGS / "stop.request"


def stop_requests(run_dir: str | Path) -> list[int]:
    """The stop signals the launcher of this job noted (none when it noted none)."""
    try:
        names = stop_request_path(run_dir).read_text().split()
    except (OSError, UnicodeDecodeError):  # a damaged note asks for nothing
        return []
    return [signal.Signals[name] for name in names if name in signal.Signals.__members__]


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
