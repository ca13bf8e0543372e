"""The one line (and the log lines behind it) that says how a job failed, as the launcher
saw it end: a rank killed here or on another host, a stalled rank, a lost Open MPI daemon,
mpiexec killed from outside, every learner dead, or a rank's own error line."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from ..checkpoint.files import complete_checkpoints
from ..errors import EXIT_PEER_LOST
from .mpiexec_output import MpiexecOutput, log_tail, mpiexec_notice
from .watchdog import (
    DeadRank,
    RankWatchdog,
    StalledRank,
    exit_status,
    failure_records,
    failure_times,
    rank_host,
)

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


class JobReports:
    """The failure lines of the job of ``processes`` ranks (learners and spares) of a run
    dir; each ends with the fix, which names the checkpoint to continue from."""

    def __init__(self, processes: int):
        self.processes = processes

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

    def report_left_behind(self, run_dir: Path, ranks: list[int],
                           starter: str = "mpiexec") -> None:
        """``starter``: what started the ranks and waited for the lost ones (mpiexec, srun)."""
        hosts = sorted({rank_host(run_dir, rank) or "?" for rank in ranks})
        print(f"adpsgd-run: learner(s) {', '.join(map(str, ranks))} on {', '.join(hosts)}, "
              f"which the job went on without, never answered again: {starter}, which waited "
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
