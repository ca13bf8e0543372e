"""A local job while it runs: the launcher waits for mpiexec, forwards the stop signals it
gets, tells the survivors of an elastic job across hosts which learners went silent behind a
cut link, kills a hung learner of an elastic job on this host, and ends a job whose rank died
(when mpiexec does not within MPIEXEC_GRACE_S) or stalled, or whose learners left behind
keep mpiexec waiting, and stops an mpiexec that outlives every rank (MPIEXEC_HANG_S)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..comm.hostfile import read_hostfile
from ..runlog.failure_events import record_event
from ..runlog.liveness import HEARTBEAT_S
from .host_probe import HostProbe
from .hosts import remote_shell_path
from .stop_forwarding import StopForwarding, stop_process_group
from .watchdog import DeadRank, HeartbeatListener, RankWatchdog, StalledRank, rank_progress

POLL_S = 0.25  # how often the watchdog looks at the ranks
# After the watchdog sees a rank die, mpiexec gets this long to end the job by itself.
MPIEXEC_GRACE_S = 3.0
# After the last rank ended, mpiexec gets this long to end too. Open MPI 5's prterun was seen
# to deadlock (its main thread waiting on a mutex of its own, no process left to watch) after
# the survivors of an elastic job aborted: 1 run in 8 on 2 loaded cores. Its teardown takes
# well under a second otherwise.
MPIEXEC_HANG_S = 10.0


class Supervision:
    """One job's supervision, under the launcher's settings ``cfg`` (launcher.*), and what
    it saw: a rank that stalled, learners left behind, whether mpiexec was killed first."""

    def __init__(self, cfg: Any, listener: HeartbeatListener | None = None,
                 run_dir: Path | None = None):
        self.cfg = cfg
        self.stalled: StalledRank | None = None
        self.left_behind: list[int] = []
        self.mpiexec_killed_first = False
        self.stalled_killed: set[int] = set()  # pids killed for silence (kill_stalled)
        # Asks the hosts whether they answer (launcher.respawn across hosts).
        self.probe = (HostProbe(listener, remote_shell_path(cfg.remote_shell,
                                                            "launcher.remote_shell"),
                                [host.name for host in read_hostfile(cfg.hostfile)], run_dir)
                      if listener is not None and getattr(cfg, "respawn", False) else None)

    def supervise(self, proc: subprocess.Popen, watchdog: RankWatchdog,
                  forwarding: StopForwarding, grace_s: float) -> int:
        """Wait for mpiexec; if a rank dies and mpiexec does not end the job within
        ``grace_s``, or a rank stalls (no heartbeat for ``stall_timeout_s``), end it here.
        Returns mpiexec's status."""
        seen_dead = left_since = None
        while True:
            try:
                return proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            forwarding.deliver()
            if self.cfg.elastic and self.cfg.hostfile and (
                    silent := watchdog.newly_silent(self.cfg.nprocs)):
                # No MPI sees a peer behind a cut link fail: the survivors learn it from here.
                self.declare_lost(watchdog, silent)
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
            if (ended := watchdog.last_rank_ended()) is not None and \
                    time.time() - ended >= MPIEXEC_HANG_S:
                return self.end_hung_mpiexec(proc, watchdog)
            if self.cfg.stall_timeout_s and (stalled := watchdog.stalled(
                    self.cfg.stall_timeout_s)) is not None:
                if self.cfg.elastic and stalled.host is None:
                    # A hung process on this host is made a lost one: its death is what the
                    # others' MPI notices and goes on without (runner/elastic/membership.py), as
                    # they go on without a learner behind a cut link.
                    self.kill_stalled(watchdog.run_dir, stalled)
                    continue
                self.stalled = stalled
                return self.end_job(proc, watchdog)
            if self.cfg.elastic or watchdog.check() is None:
                # Nobody died, or a rank failed first with a message (and aborts); in an
                # elastic job the survivors go on without the dead (runner/elastic/membership.py).
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

    def declare_lost(self, watchdog: RankWatchdog, silent: dict[int, float]) -> None:
        """Tell every answer from now on that ``silent`` (rank -> seconds) are lost, with an
        event saying how long each was silent against what its heartbeats let expect; their
        hosts take no replacement until they answer again (host_probe.py)."""
        listener = watchdog.listener
        now = time.monotonic()
        thresholds = {rank: listener.detector.threshold(rank, now) for rank in silent}
        # In the answer that names the loss: no replacement goes to their host for now.
        listener.set_away({heard[1] for rank in silent if (heard := listener.last(rank))})
        listener.declare_lost(sorted(silent))
        listener.detector.recovering(now)
        for rank, silent_s in sorted(silent.items()):
            heard = listener.last(rank)
            record_event(watchdog.run_dir, {
                "time": round(time.time(), 3), "event": "silent", "learner": rank,
                "host": heard[1] if heard else None,
                "at_samples": rank_progress(watchdog.run_dir, rank),
                "cause": f"no heartbeat for {silent_s:.2f} s, past the threshold its "
                         f"heartbeats set, {thresholds[rank]:.2f} s: taken "
                         "for lost"})

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

    def end_hung_mpiexec(self, proc: subprocess.Popen, watchdog: RankWatchdog) -> int:
        """Every rank has ended but mpiexec has not, for MPIEXEC_HANG_S: kill it, and take
        the ranks' own ends for the job's (the first failure among their exit records, else 0),
        as mpiexec would have reported them."""
        print(f"adpsgd-run: note: every rank of the job had ended {MPIEXEC_HANG_S:g} s before "
              f"and {os.path.basename(str(proc.args[0]))} (pid {proc.pid}) still ran, with no "
              "process left to wait for: stopped it; the job ends as its ranks did",
              file=sys.stderr, flush=True)
        stop_process_group(proc, grace_s=0.0)
        statuses = watchdog.exit_statuses()
        failed = next((s for s in statuses.values() if s), None)
        if failed is None and None in statuses.values() and not self.cfg.elastic:
            return 128 + signal.SIGKILL  # a rank died without a record: the job failed
        return failed or 0

    @staticmethod
    def end_job(proc: subprocess.Popen, watchdog: RankWatchdog) -> int:
        """Kill every rank; mpiexec ends once they are gone."""
        watchdog.kill_leftovers()
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            stop_process_group(proc, grace_s=2.0)
        return 128 + signal.SIGKILL
