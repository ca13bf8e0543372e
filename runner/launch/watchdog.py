"""The launcher's watchdog: which ranks are alive, from the files and heartbeats of
runner/runlog/liveness.py (the rank side: what every rank writes and sends).

Every rank writes ``logs/rank<N>.pid`` (its pid and host) as soon as it can take a forwarded
signal, and ``logs/rank<N>.exit`` when it ends on its own: its exit status and, when it failed
with a message, that one line. The exit record is created (a fixed number of blank bytes)
together with the pid file and later overwritten in place, so that a rank can still say how it
ended on a full disk. A rank whose process is gone without an exit record died from outside:
``kill -9``, the out-of-memory killer, a segfault. MPICH's mpiexec tears the job down within
milliseconds when that happens (even with ``-disable-auto-cleanup``), killing every rank with
the same signal; not every MPI does it at all; and mpiexec starts each rank in a session of its
own, so a job that is simply killed can leave ranks behind. The watchdog therefore waits on
every rank's pidfd (Linux: readable the moment the process ends) in a thread of its own and
records the order of the deaths, as the kernel signalled them (:class:`ExitPoller`): the first
rank to end without an exit record is the culprit, whoever killed the others afterwards. The
launcher then kills what is left of the job.

A rank that is alive but silent (a stopped process, a hung node) is found by its heartbeat: a
thread of every rank touches its pid file every few seconds, and the launcher ends a job whose
rank has not done so for ``launcher.stall_timeout_s``.

A rank on another host than the launcher (``launcher.hostfile``) cannot be watched by its pid:
it also sends its heartbeat to the launcher over the network (a UDP datagram to
``ADPSGD_HEARTBEAT_TO``, :class:`HeartbeatListener`), so that a rank killed there, a host that
hung or a host whose link is cut falls silent and is named, with its host, within the stall
timeout (its pid file may still be touched: the run dir's file system need not share the
host's fate).

The same files tell the launcher where to forward SIGUSR1/SIGTERM/SIGINT
(runner/checkpoint/preemption.py) and whether every rank stopped gracefully; a failed rank's record
holds the line the launcher prints (the rank's own print may die with MPI_Abort before mpiexec
forwards it).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..runlog.liveness import (
    ANSWERS_MARK,
    LOST_ANSWER,
    TRAINING,
    process_alive,
    rank_file,
    rank_pid,
    stop_request_path,
)
from ..runlog.records import write_json_atomic
from .loss_detector import LossDetector, Sensitivity

# An elastic job across hosts: how near each learner came to being taken for lost.
HEARTBEATS = Path("logs") / "heartbeats.json"


def empty_blank_exit_records(run_dir: str | Path, nprocs: int) -> None:
    """After a job: a rank that never wrote its exit record (kill -9, a lost host) left it as
    it was made, RECORD_BYTES of blanks; it is emptied, so that what a user opens reads as
    what it is, no record. A written record is left alone."""
    for rank in range(nprocs):
        try:
            with open(rank_file(run_dir, rank, "exit"), "r+b") as f:
                if not f.read().strip():
                    f.truncate(0)
        except OSError:  # no record (the rank never started), or an unreadable run dir
            pass


class HeartbeatListener:
    """The launcher's end of the ranks' network heartbeats: when it last heard each rank,
    from which host. ``target`` is what the ranks are given as ``ADPSGD_HEARTBEAT_TO``.

    ``answer``: an elastic job across hosts. Every heartbeat is answered with the learners
    the launcher takes for lost (:meth:`declare_lost`): the survivors learn of a loss that
    MPI cannot see (a cut link, a host gone silent), and a rank that hears no answer is cut
    off (:class:`LauncherLink`); and with the hosts that answer (:meth:`set_answering`), where
    replacements may go (runner/elastic/respawn.py). Its :class:`LossDetector`
    (``sensitivity``) learns each learner's heartbeats from its first one in training on,
    and says who is silent for too long (:meth:`suspected`)."""

    def __init__(self, answer: bool = False, sensitivity: Sensitivity | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("", 0))
        self.target = f"{socket.gethostname()}:{self.sock.getsockname()[1]}"
        self.heard: dict[int, tuple[float, str, int]] = {}  # rank -> (time.time(), host, pid)
        self.answer = answer
        self.detector = LossDetector(sensitivity or Sensitivity())
        self._declared: set[int] = set()
        # launcher.respawn across hosts (runner/launch/host_probe.py): the hosts that answered
        # the last round of questions, and those of learners taken for lost since (host ->
        # when), which only a later round brings back. Replacements go to the first only.
        self._answering: set[str] = set()
        self._silent: set[str] = set()  # in the last round
        self._away: dict[str, float] = {}
        self._training: set[int] = set()  # ranks heard to say so (past their start-up)
        self._lock = threading.Lock()
        threading.Thread(target=self._listen, name="heartbeats", daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                data, sender = self.sock.recvfrom(512)
            except OSError:  # closed
                return
            try:
                rank, pid, host, *state = data.decode().split()
                rank = int(rank)
                training = state[:1] == [TRAINING]
                with self._lock:
                    self.heard[rank] = (time.time(), host, int(pid))
                    started = training and rank not in self._training
                    if training:
                        self._training.add(rank)
                    declared = sorted(self._declared)
                    answering = sorted(self._answering - set(self._away))
            except ValueError:
                continue  # not one of ours
            if started:
                self.detector.forget(rank)
            self.detector.heard(rank, time.monotonic())
            if self.answer:
                try:
                    self.sock.sendto(" ".join([LOST_ANSWER, *map(str, declared),
                                               *(ANSWERS_MARK + host for host in answering)]
                                              ).encode(), sender)
                except OSError:  # the sender's network went away meanwhile
                    pass

    def last(self, rank: int) -> tuple[float, str, int] | None:
        with self._lock:
            return self.heard.get(rank)

    def silent_for(self, seconds: float) -> set[int]:
        """The ranks heard before whose last heartbeat is older than ``seconds``."""
        now = time.time()
        with self._lock:
            return {rank for rank, (heard, _, _) in self.heard.items() if now - heard > seconds}

    def suspected(self) -> dict[int, float]:
        """The ranks silent past what their heartbeats so far let the detector expect:
        rank -> seconds silent. Heartbeats that have arrived but are not read yet are read
        first (:meth:`_catch_up`)."""
        self._catch_up()
        return self.detector.suspected(time.monotonic())

    def _catch_up(self, within_s: float = 1.0) -> None:
        """Wait (up to ``within_s``) until the heartbeat thread has read every datagram the
        host has received. A launcher that a loaded machine held up for a second would
        otherwise judge before reading the heartbeats waiting for it, and take its own
        delay for the learners' silence (a false loss, seen in CI at a load of about 8)."""
        deadline = time.monotonic() + within_s
        try:
            while select.select([self.sock], [], [], 0)[0] and time.monotonic() < deadline:
                time.sleep(0.005)
        except (OSError, ValueError):  # closed
            pass

    def declare_lost(self, ranks: list[int]) -> None:
        """From now on, every answer names ``ranks`` among the lost."""
        with self._lock:
            self._declared.update(ranks)

    def declared(self) -> set[int]:
        with self._lock:
            return set(self._declared)

    def set_away(self, hosts: set[str]) -> None:
        """``hosts`` (of learners taken for lost) are not named answering from now on, until
        a round of questions asked after this one says they answer."""
        with self._lock:
            self._away.update(dict.fromkeys(hosts, time.monotonic()))

    def set_answering(self, hosts: set[str], asked: set[str], asked_at: float) -> set[str]:
        """The hosts that answered a round of questions to ``asked`` (time.monotonic()
        ``asked_at``); returns those it brings back: silent in the round before, or away."""
        with self._lock:
            back = {h for h, since in self._away.items() if h in hosts and asked_at > since}
            for host in back:
                del self._away[host]
            back |= (hosts & self._silent) - set(self._away)
            self._answering, self._silent = set(hosts), asked - hosts
            return back

    def training(self) -> set[int]:
        with self._lock:
            return set(self._training)

    def host_heard_after(self, rank: int, by_s: float) -> bool:
        """Whether another rank on ``rank``'s host was heard ``by_s`` or more after ``rank``'s
        last heartbeat: the host and its link outlived it (those behind one cut link fall
        silent within a beat of each other)."""
        with self._lock:
            if (last := self.heard.get(rank)) is None:
                return False
            return any(heard >= last[0] + by_s and host == last[1]
                       for other, (heard, host, _) in self.heard.items() if other != rank)

    def close(self, run_dir: Path | None = None) -> None:
        """Stop listening. An elastic job across hosts (one this listener answered) writes
        its learners' closest calls (LossDetector.closest_calls) to ``run_dir``'s
        logs/heartbeats.json, so that a user sees how much room the detector's settings
        left (docs/failures.md)."""
        self.sock.close()
        if run_dir is not None and self.answer:
            try:
                write_json_atomic(Path(run_dir) / HEARTBEATS, {
                    "sensitivity": asdict(self.detector.sensitivity),
                    "closest_calls": {str(rank): call for rank, call in
                                      self.detector.closest_calls().items()}})
            except OSError as ex:  # a full disk: the job's own outcome matters more
                print(f"adpsgd-run: could not write {HEARTBEATS}: {ex}", file=sys.stderr)


def rank_host(run_dir: str | Path, rank: int) -> str | None:
    """The host the rank runs on, from its pid file (None before it wrote one)."""
    try:
        return rank_file(run_dir, rank, "pid").read_text().split()[1]
    except (OSError, IndexError):
        return None


def clear_rank_files(run_dir: str | Path, nprocs: int) -> None:
    """Before a job starts: records of an earlier job in the same run dir (a resume) must not
    be mistaken for this one's (nor its replacements, launcher.respawn, for this one's)."""
    rank = 0
    while rank < nprocs or rank_file(run_dir, rank, "pid").exists():
        for suffix in ("pid", "exit"):
            rank_file(run_dir, rank, suffix).unlink(missing_ok=True)
        rank += 1
    stop_request_path(run_dir).unlink(missing_ok=True)


def write_stop_request(run_dir: str | Path, signums: list[int]) -> None:
    """The launcher's note of the stop signals it received. A rank reads it before its first
    step (:func:`stop_requests`): a signal that came while the ranks started reaches every
    rank in time, however little time passed between a rank's pid file and its first step
    (a fifth of a second on a fast machine, less than the launcher's poll). A note that
    cannot be written is left out: the signals still follow the pid files."""
    path = stop_request_path(run_dir)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text("".join(f"{signal.Signals(s).name}\n" for s in signums))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def exit_record(run_dir: str | Path, rank: int) -> dict | None:
    """``{"status", "message", "samples"}`` once the rank wrote its exit record, else None
    (a record written before ``samples`` was: none)."""
    try:
        text = rank_file(run_dir, rank, "exit").read_text().strip()
        record = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("status"), int) \
        else None


def lost_learners(run_dir: Path) -> set[int]:
    """The learners an elastic job has gone on without (logs/events.jsonl): silence from
    them is expected."""
    from ..runlog.failure_events import read_events

    return {e["learner"] for e in read_events(run_dir) if e.get("event") == "lost"}


def exit_status(run_dir: str | Path, rank: int) -> int | None:
    record = exit_record(run_dir, rank)
    return record["status"] if record else None


def exit_statuses(run_dir: str | Path, nprocs: int) -> dict[int, int | None]:
    return {rank: exit_status(run_dir, rank) for rank in range(nprocs)}


@dataclass(frozen=True)
class FailureRecord:
    rank: int
    status: int
    message: str | None  # the rank's one line (None: another rank says it)
    when: float  # the record's mtime


def failure_records(run_dir: str | Path, nprocs: int) -> list[FailureRecord]:
    """Exit records of ranks that did not end well (any status but 0, 75 and 130), oldest
    first."""
    from ..errors import EXIT_PREEMPTED, EXIT_STOPPED

    found = []
    for rank in range(nprocs):
        record = exit_record(run_dir, rank)
        if record and record["status"] not in (0, EXIT_PREEMPTED, EXIT_STOPPED):
            when = rank_file(run_dir, rank, "exit").stat().st_mtime
            found.append(FailureRecord(rank, record["status"], record.get("message"), when))
    return sorted(found, key=lambda r: r.when)


def failure_times(run_dir: str | Path, nprocs: int) -> dict[int, float]:
    """Ranks that ended with an error message of their own (exit record not 0, 75 or 130
    for a graceful stop, or 3 for a failed communication with a peer, which a dead peer
    causes), and when."""
    from ..errors import EXIT_PEER_LOST, EXIT_PREEMPTED, EXIT_STOPPED

    failed = {}
    for rank in range(nprocs):
        status = exit_status(run_dir, rank)
        if status not in (None, 0, EXIT_PREEMPTED, EXIT_STOPPED, EXIT_PEER_LOST):
            failed[rank] = rank_file(run_dir, rank, "exit").stat().st_mtime
    return failed


def rank_progress(run_dir: str | Path, rank: int) -> int | None:
    """The global samples the rank had seen at its last heartbeat, or as it ended when it
    wrote an exit record (None: neither reported)."""
    reported = []
    try:
        fields = rank_file(run_dir, rank, "pid").read_text().split()
        if len(fields) > 2:
            reported.append(int(fields[2]))
    except (OSError, ValueError):
        pass
    if isinstance(ended := (exit_record(run_dir, rank) or {}).get("samples"), int):
        reported.append(ended)
    return max(reported, default=None)


def ranks_progress(run_dir: str | Path, nprocs: int) -> list[int | None]:
    """:func:`rank_progress` of ranks 0 to ``nprocs - 1``."""
    return [rank_progress(run_dir, rank) for rank in range(nprocs)]


def samples_reported(run_dir: str | Path, nprocs: int) -> int | None:
    """The most global samples any of ranks 0 to ``nprocs - 1`` reported (heartbeat or exit
    record); None where none did (a simulation, or ranks that never started)."""
    return max((s for s in ranks_progress(run_dir, nprocs) if s is not None), default=None)


def rank_operation(run_dir: str | Path, rank: int) -> str | None:
    """What the rank was doing at its last heartbeat (None: not reported)."""
    try:
        fields = rank_file(run_dir, rank, "pid").read_text().split()
    except OSError:
        return None
    return " ".join(fields[3:]) or None


def heartbeat_age(run_dir: str | Path, rank: int, now: float) -> float | None:
    """Seconds since the rank's last heartbeat (its pid file's time); None before its first.
    Read from the shared run dir, so it works for ranks on other nodes too."""
    try:
        return now - rank_file(run_dir, rank, "pid").stat().st_mtime
    except OSError:
        return None


# How long the launcher waits for the ranks it killed to exit before it returns.
LEFTOVER_EXIT_S = 10.0


@dataclass(frozen=True)
class StalledRank:
    rank: int
    pid: int  # on its host
    silent_s: float  # seconds since its last heartbeat
    host: str | None = None  # set for a rank on another host than the launcher


@dataclass(frozen=True)
class DeadRank:
    rank: int
    pid: int
    when: float  # time.time() at which the watchdog saw it end
    # Which wake-up of the watchdog's thread saw it end (-1: not seen by it). Deaths seen in
    # one wake-up happened while the thread waited for the CPU: their order is unknown.
    wakeup: int = -1


class ExitPoller:
    """Waits on pidfds and returns the ended processes in the order they ended.

    Several processes often end between two wake-ups of the watcher: MPICH tears a job down
    within a millisecond of a peer's death (a rank that reads from the dead one's memory
    aborts, and mpiexec kills the rest), which on a busy machine is sooner than this thread is
    scheduled. poll() then reports them in the order they were registered, rank 0 first;
    epoll's ready list keeps the order in which the kernel signalled the exits, so the first
    rank to die stays first. poll() where epoll does not exist."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._poll = None if self._epoll else select.poll()

    def register(self, fd: int) -> None:
        if self._epoll is not None:
            self._epoll.register(fd, select.EPOLLIN)
        else:
            self._poll.register(fd, select.POLLIN)

    def unregister(self, fd: int) -> None:
        (self._poll if self._epoll is None else self._epoll).unregister(fd)

    def ended(self, timeout_s: float) -> list[int]:
        """The fds of the processes that ended, first-ended first; [] after ``timeout_s``."""
        if self._epoll is not None:
            return [fd for fd, _ in self._epoll.poll(timeout_s)]
        return [fd for fd, _ in self._poll.poll(timeout_s * 1000)]

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()


# A killed mpiexec's sockets close before the kernel reports its end, and its proxies kill
# the ranks on that EOF: on a loaded machine a rank's death can be seen first, by a few
# scheduling rounds (seen: kill -9 of mpiexec named as a rank's death once in 5 suite runs). A
# rank seen dead less than this before mpiexec's end counts as taken down with it.
MPIEXEC_END_SLACK_S = 0.5


class RankWatchdog:
    """Watches the ranks of one job while it runs (see the module docstring)."""

    POLL_MS = 100  # how often the death watcher looks for new pid files

    def __init__(self, run_dir: str | Path, nprocs: int,
                 listener: HeartbeatListener | None = None):
        self.run_dir, self.nprocs = Path(run_dir), nprocs
        self.listener = listener  # the network heartbeats of ranks on other hosts
        self._lost_seen: set[int] = set()  # recorded losses not declared here (kills) seen
        self._changes_seen = 0  # the recorded changes of membership newly_silent() has seen
        self.pids: dict[int, int] = {}  # rank -> pid, once its pid file appeared (this host)
        self.deaths: list[tuple[float, int, int]] = []  # (time.time(), rank, wake-up), in order
        self.mpiexec_wakeup: int | None = None  # the wake-up that saw mpiexec end
        self.mpiexec_ended_at: float | None = None  # and its time.time()
        self.wakeups = 0  # of the thread, so far
        self._mpiexec_fd: int | None = None
        self._lock = threading.Lock()
        self._running = True
        self._thread = threading.Thread(target=self._watch, name="rank-deaths", daemon=True)
        self._thread.start()

    def refresh(self) -> list[int]:
        """Read pid files that appeared since the last call; return their ranks. The job's
        ranks grow by the replacements it spawns (launcher.respawn), numbered from nprocs on."""
        new = []
        with self._lock:
            while rank_file(self.run_dir, self.nprocs, "pid").exists():
                self.nprocs += 1
            for rank in range(self.nprocs):
                if rank not in self.pids and (pid := rank_pid(self.run_dir, rank)) is not None:
                    self.pids[rank] = pid
                    new.append(rank)
        return new

    def watch_mpiexec(self, pid: int) -> None:
        """Also watch ``pid`` (mpiexec), to tell whether it ended before the first rank did.
        Call it right after starting the process: its pidfd is opened here, before anyone
        reaps it."""
        try:
            self._mpiexec_fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._mpiexec_fd = None

    def mpiexec_ended_first(self, dead: DeadRank) -> bool | None:
        """Whether mpiexec ended before ``dead``: in an earlier or the same wake-up of the
        watchdog (their order is then unknown), or less than MPIEXEC_END_SLACK_S after it; None
        when the watchdog did not see mpiexec end."""
        with self._lock:
            if self.mpiexec_wakeup is None or self.mpiexec_ended_at is None or dead.wakeup < 0:
                return None
            return (self.mpiexec_wakeup <= dead.wakeup
                    or self.mpiexec_ended_at - dead.when < MPIEXEC_END_SLACK_S)

    def _watch(self) -> None:
        poller, fds, watched = ExitPoller(), {}, set()
        mpiexec_fd = None
        while self._running:
            if mpiexec_fd is None and self._mpiexec_fd is not None:
                mpiexec_fd = self._mpiexec_fd
                poller.register(mpiexec_fd)
            self.refresh()
            for rank, pid in list(self.pids.items()):
                if rank in watched:
                    continue
                try:
                    fd = os.pidfd_open(pid)
                except (AttributeError, OSError):  # no pidfd here: look again next round
                    if not process_alive(pid):
                        watched.add(rank)
                        self._died(rank, -1)
                    continue
                watched.add(rank)
                fds[fd] = rank
                poller.register(fd)
            ready = poller.ended(self.POLL_MS / 1000)
            self.wakeups += 1
            wakeup = self.wakeups
            for fd in ready:
                poller.unregister(fd)
                if fd == mpiexec_fd:
                    with self._lock:
                        self.mpiexec_wakeup, self.mpiexec_ended_at = wakeup, time.time()
                else:
                    self._died(fds[fd], wakeup)
        poller.close()
        for fd in fds:
            os.close(fd)

    def _died(self, rank: int, wakeup: int) -> None:
        with self._lock:
            self.deaths.append((time.time(), rank, wakeup))

    def stop(self) -> None:
        self._running = False
        self._thread.join(timeout=2)
        if self._mpiexec_fd is not None and not self._thread.is_alive():
            os.close(self._mpiexec_fd)
            self._mpiexec_fd = None

    def last_rank_ended(self) -> float | None:
        """When (time.time()) the last of the job's ranks ended, once every one of them ran on
        this host and has ended; None while one runs, or runs on another host (its death is not
        seen here)."""
        self.refresh()
        with self._lock:
            ended = {rank: when for when, rank, _ in self.deaths}
            every = set(range(self.nprocs))
        if set(self.pids) != every or set(ended) != every:
            return None
        return max(ended.values())

    def check(self) -> DeadRank | None:
        """The first rank that ended without an exit record, if one did and no rank had
        failed with a message before (ranks that fail because a peer died come after it)."""
        with self._lock:
            deaths = list(self.deaths)
        for when, rank, wakeup in deaths:
            if exit_status(self.run_dir, rank) is None:
                failed = failure_times(self.run_dir, self.nprocs)
                if any(t < when for t in failed.values()):
                    return None  # an error came first: that rank's message explains it
                return DeadRank(rank, self.pids[rank], when, wakeup)
        return None

    def stalled(self, timeout_s: float) -> StalledRank | None:
        """The live rank, still without an exit record, whose heartbeat (its pid file's time,
        runner/rank.py; a rank on another host: its last datagram) is older than
        ``timeout_s``; of several, the one silent longest (the others may only wait for
        it)."""
        now = time.time()
        stalled = []
        for rank, pid in list(self.pids.items()):
            silent = heartbeat_age(self.run_dir, rank, now)
            if silent is not None and silent > timeout_s \
                    and exit_status(self.run_dir, rank) is None and process_alive(pid):
                stalled.append(StalledRank(rank, pid, silent))
        silent = []
        for rank in self.silent_remote(timeout_s):
            heard = self.listener.last(rank)
            if exit_status(self.run_dir, rank) is None:
                silent.append(StalledRank(rank, heard[2], now - heard[0], heard[1]))
        if silent:  # read only then (every poll otherwise): an elastic job went on without
            lost = self.lost()  # these, whose silence is expected
            stalled += [s for s in silent if s.rank not in lost]
        return max(stalled, key=lambda s: s.silent_s, default=None)

    def lost_behind(self, silent_s: float) -> list[int]:
        """The learners on other hosts that an elastic job went on without and that have been
        silent for ``silent_s``, once every other rank has ended (written its exit record):
        mpiexec waits for them forever when they are behind a cut link or on a host that went
        down. [] while any other rank runs."""
        silent = self.silent_remote(silent_s)
        if not silent:
            return []
        lost = self.lost()
        # One that ended (its exit record) on a host heard after it (taken for lost while
        # alive, it stopped on hearing so) was seen to end by mpiexec, which waits no more.
        behind = [rank for rank in silent if rank in lost and not (
            exit_status(self.run_dir, rank) is not None
            and self.listener.host_heard_after(rank, silent_s))]
        running = [rank for rank in range(self.nprocs)
                   if rank not in behind and exit_status(self.run_dir, rank) is None]
        return [] if running else behind

    def lost(self) -> set[int]:
        """The learners an elastic job goes on without: those the survivors recorded, and
        those the launcher declared lost (they may not have recorded them yet)."""
        return lost_learners(self.run_dir) | (self.listener.declared() if self.listener
                                              else set())

    def newly_silent(self, learners: int) -> dict[int, float]:
        """Ranks on other hosts, heard training, silent for longer than their heartbeats so
        far let the launcher expect (runner/launch/loss_detector.py), without having ended as
        asked, that are not taken for lost yet: a cut link, a host that went down or hung.
        rank -> seconds silent. (A rank cut off writes an exit record where the run dir is
        still reached.) None before every one of the ``learners`` (ranks 0 to learners - 1)
        has taken a step: no learner survives a loss in the job's start-up (it ends at
        launcher.stall_timeout_s), which can hold a rank's heartbeats up for seconds on a
        loaded host."""
        from ..errors import EXIT_PREEMPTED, EXIT_STOPPED

        if self.listener is None:
            return {}
        suspected = self.listener.suspected()
        training = self.listener.training()
        if not suspected or not training >= set(range(learners)):
            return {}
        if self._membership_changed():
            return {}  # judged again at the next look, with the calm it began
        # Not one the survivors recorded lost (a kill MPI saw): named to them again after
        # their recovery, it would fail their next agreement with every learner alive.
        candidates = ((training - self.listener.declared() - self._lost_seen)
                      & set(self.remote_ranks()))
        return {rank: silent_s for rank, silent_s in suspected.items() if rank in candidates
                and exit_status(self.run_dir, rank) not in (0, EXIT_PREEMPTED, EXIT_STOPPED)}

    def _membership_changed(self) -> bool:
        """Whether the learners recorded a change of membership (logs/events.jsonl) since the
        last look: the detector then waits everyone for the ceiling for link_timeout_s from
        the time each was recorded, and a loss that was not declared here (a kill) begins a
        recovery then, as a declared one began it when it was declared."""
        from ..runlog.failure_events import read_events

        changes = [event for event in read_events(self.run_dir)
                   if event.get("event") in ("lost", "joined")]
        if len(changes) <= self._changes_seen:
            return False
        detector, now, wall_now = self.listener.detector, time.monotonic(), time.time()
        declared = self.listener.declared()
        for event in changes[self._changes_seen:]:
            recorded_at = event.get("time")
            ago = wall_now - recorded_at if isinstance(recorded_at, (int, float)) else 0.0
            at = now - max(0.0, ago)  # a host's clock ahead: from now
            if event["event"] == "lost" and event.get("learner") not in declared:
                self._lost_seen.add(event.get("learner"))  # a kill, which MPI saw
                if at + detector.sensitivity.link_timeout_s > now:  # (a declared loss began
                    detector.recovering(at)                         # recovering then)
            else:
                detector.calm_after(at)
        self._changes_seen = len(changes)
        return True

    def silent_remote(self, silent_s: float) -> list[int]:
        """The ranks on other hosts whose last network heartbeat is older than ``silent_s``
        (heard at least once), in rank order. The launcher asks at every poll: the pid files
        that say where ranks run are read only when some rank is that silent."""
        silent = self.listener.silent_for(silent_s) if self.listener else set()
        return [rank for rank in self.remote_ranks() if rank in silent] if silent else []

    def remote_ranks(self) -> list[int]:
        """Ranks that run on another host than this one (their pid file says so)."""
        here = socket.gethostname()
        return [rank for rank in range(self.nprocs) if rank not in self.pids
                and (host := rank_host(self.run_dir, rank)) is not None and host != here]

    def all_started(self) -> bool:
        """Every rank wrote its pid file (so every rank can take a forwarded signal)."""
        return all(rank_file(self.run_dir, rank, "pid").exists() for rank in range(self.nprocs))

    def rank_of_pid(self, pid: int) -> int | None:
        self.refresh()
        return next((rank for rank, p in self.pids.items() if p == pid), None)

    def signal_ranks(self, signum: int, ranks: list[int] | None = None) -> None:
        for rank in self.pids if ranks is None else ranks:
            try:
                os.kill(self.pids[rank], signum)
            except (ProcessLookupError, PermissionError):
                pass

    def kill_leftovers(self, exit_wait_s: float = LEFTOVER_EXIT_S) -> list[int]:
        """SIGKILL every rank process still alive and wait, up to ``exit_wait_s``, until they
        are gone; return their ranks. A killed process still has to run its exit (unmap its
        memory, close its files), and on a busy machine that waits for a core: without the
        wait the job returned while a rank still held its memory (a test saw it as an
        orphan). One that outlasts the wait (stuck in the kernel) is named on stderr."""
        self.refresh()
        alive = [rank for rank, pid in self.pids.items() if process_alive(pid)]
        self.signal_ranks(signal.SIGKILL, alive)
        deadline = time.monotonic() + exit_wait_s
        while (left := [rank for rank in alive if process_alive(self.pids[rank])]) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        for rank in left:
            print(f"adpsgd-run: rank {rank} (pid {self.pids[rank]}) was killed but has not "
                  f"exited after {exit_wait_s:g} s (stuck in the kernel: I/O to a hung "
                  f"file system?); look at it with: ps -o pid,stat,wchan -p "
                  f"{self.pids[rank]}", file=sys.stderr, flush=True)
        return alive

    def exit_statuses(self) -> dict[int, int | None]:
        return exit_statuses(self.run_dir, self.nprocs)
