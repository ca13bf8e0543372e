"""Stop signals received by the launcher, forwarded to every rank: SIGUSR1/SIGTERM (a
scheduler's warning) and a first Ctrl-C make every rank checkpoint and stop; a second Ctrl-C
stops the job at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from .. import ctrl_c
from .watchdog import RankWatchdog, write_stop_request


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
