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
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import ctrl_c
from ..checkpoint.files import remove_partial_checkpoints
from ..comm.hostfile import ranks_per_host, read_hostfile
from ..config.section import require
from ..errors import (
    EXIT_PREEMPTED,
    EXIT_STOPPED,
    EXIT_TOO_FEW_LEARNERS,
    ConfigError,
)
from ..rank_factory import factory_for_job, starts_warm
from ..runlog.console import CONSOLE_IS_TERMINAL
from ..runlog.liveness import (
    HEARTBEAT_TO,
    LAUNCHER_HOST,
    LAUNCHER_PID,
    LINK_TIMEOUT,
    NETWORK_HEARTBEAT_S,
)
from .base import Launcher, LauncherConfig, records_off_the_console
from .hosts import hostfile_args, remote_shell_path, unanswered_host
from .job_reports import JobReports, killed_elsewhere
from .loss_detector import LossDetectionKeys, Sensitivity
from .mpi_flavour import MpiFlavour, flavour_of
from .mpiexec_output import MpiexecOutput, MpiexecStderr
from .registry import LAUNCHERS
from .restart_policy import JobFailure, Restarts, reported_failure
from .stop_forwarding import ForcedStop, StopForwarding, stop_process_group
from .supervision import MPIEXEC_GRACE_S, Supervision
from .ulfm_mpi import (
    find_ulfm_mpiexec,
)
from .watchdog import (
    HeartbeatListener,
    RankWatchdog,
    clear_rank_files,
    empty_blank_exit_records,
    failure_records,
    ranks_progress,
)

# How long each of mpiexec's output readers gets to drain once mpiexec was stopped with
# learners left behind on a host that does not answer (their processes keep its pipes open).
LEFT_BEHIND_DRAIN_S = 1.0


@dataclass
class LocalConfig(LauncherConfig, LossDetectionKeys):
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
    # Fork the ranks from one process that has loaded torch instead of each loading it
    # (about 1.7 CPU s a rank; runner/rank_factory.py). With a hostfile, ranks on other
    # machines start cold.
    warm_start: bool = True

    def check(self, prefix, cfg):
        super().check(prefix, cfg)
        self.check_loss_detection(prefix, across_hosts=bool(self.elastic and self.hostfile))
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


def threads_per_process(sharing: int) -> int:
    """Threads for torch's intra-op (OpenMP) pool of each of ``sharing`` processes on this
    machine's cores: one pool per core, not per process, since oversubscribed pools thrash."""
    return max(1, (os.cpu_count() or 1) // sharing)


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


@dataclass
class EndedJob:
    """What the launcher knows of a job once its mpiexec has ended."""

    run_dir: Path
    proc: subprocess.Popen
    status: int  # mpiexec's exit status
    watchdog: RankWatchdog
    forwarding: StopForwarding
    output: MpiexecOutput
    supervision: Supervision
    ended: float  # when mpiexec's wait returned (time.time())
    lost_daemon_host: str | None  # Open MPI lost its daemon there (either stream says so)


@LAUNCHERS.register("local")
class LocalLauncher(Launcher):
    Config = LocalConfig
    STARTER = "mpiexec"  # what starts the ranks, as the one-line reports name it
    ranks_environment: dict[str, str] = {}  # what sends the ranks to a rank factory

    @property
    def processes(self) -> int:
        """The job's MPI processes: its learners and their spares (launcher.spares)."""
        return self.cfg.nprocs + self.cfg.spares

    @functools.cached_property
    def reports(self) -> JobReports:
        return JobReports(self.processes)

    def command(self, run_dir: Path, session_dirs: str | None = None) -> list[str]:
        return self.mpiexec_command(["-m", "runner.worker", str(run_dir)],
                                    session_dirs=session_dirs)

    def mpiexec(self) -> str:
        """The mpiexec the job starts with: Open MPI 5's for an elastic job."""
        return (find_ulfm_mpiexec(self.cfg.mpiexec) if self.cfg.elastic else
                find_mpiexec(self.cfg.mpiexec))

    @functools.cached_property
    def flavour(self) -> MpiFlavour:
        return flavour_of(self.mpiexec())

    def mpiexec_command(self, program: list[str], cleanup_by_watchdog: bool = True,
                        session_dirs: str | None = None) -> list[str]:
        """``mpiexec -n N [hosts] python PROGRAM...`` as this launcher places ranks (the
        benchmarks' jobs too, benchmarks/harness.py); ``session_dirs``: Open MPI's base for
        them (ulfm_mpi.session_base)."""
        hosts = (hostfile_args(self.flavour.mpiexec, self.cfg.hostfile,
                               remote_shell_path(self.cfg.remote_shell, "launcher.remote_shell"),
                               self.cfg.procs_per_node) if self.cfg.hostfile else [])
        return self.flavour.command(self.cfg, self.processes, hosts, list(program),
                                    cleanup_by_watchdog, session_dirs)

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
        # (With a hostfile, each host is taken to have this machine's cores.)
        env.setdefault("OMP_NUM_THREADS", str(threads_per_process(self.ranks_per_machine())))
        return self.flavour.environment(env)

    def launch(self, run_cfg, run_dir):
        run_dir = Path(run_dir)
        if self.cfg.nprocs == 1:
            from ..rank import run_rank

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
        # Ranks forked from one process that loaded torch (runner/rank_factory.py).
        with factory_for_job(run_dir, self.environment(), starts_warm(self.cfg)) \
                as self.ranks_environment:
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
            with self.flavour.sessions() as base:
                return self._run_job(run_dir, base)
        finally:
            empty_blank_exit_records(run_dir, self.processes)

    def _run_job(self, run_dir: Path, session_dirs: str | None
                 ) -> tuple[int, JobFailure | None]:
        """One MPI job, through its states: starting (the rank files cleared, the heartbeat
        listener, the ranks' environment, signals taken over before mpiexec starts, so that
        a Ctrl-C from then on reaches the ranks as a graceful stop however early), running
        (runner/launch/supervision.py: a rank lost, stalled or stopped), stopped at once by a second
        Ctrl-C, and ended (:meth:`_outcome`)."""
        clear_rank_files(run_dir, self.processes)
        # Ranks on other hosts send their heartbeats over the network (runner/runlog/
        # liveness.py): a host that hangs or loses its link falls silent. An elastic job's
        # launcher answers them with the learners it takes for lost.
        across_hosts_elastic = bool(self.cfg.hostfile and self.cfg.elastic)
        listener = HeartbeatListener(across_hosts_elastic, Sensitivity(
            self.cfg.loss_after_s, self.cfg.loss_spread, self.cfg.link_timeout_s)) \
            if self.cfg.hostfile else None
        watchdog = RankWatchdog(run_dir, self.processes, listener)
        # The ranks on this host stop if this process dies, and every rank leaves printing
        # its failure to it.
        env = {**self.environment(), LAUNCHER_PID: str(os.getpid()),
               LAUNCHER_HOST: socket.gethostname(), **self.ranks_environment,
               **({HEARTBEAT_TO: listener.target} if listener else {}),
               **({LINK_TIMEOUT: f"{self.cfg.link_timeout_s:g}",
                   NETWORK_HEARTBEAT_S: f"{self.cfg.heartbeat_s:g}"} if across_hosts_elastic
                  else {})}
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
                forwarding.as_forwarded = self.flavour.forwards
            watchdog.watch_mpiexec(proc.pid)
            output = MpiexecOutput(proc.stdout, run_dir / "logs" / "mpiexec.log")
            errors = MpiexecStderr(stderr_read, run_dir / "logs" / "mpiexec.log")
            grace = 0.0 if "-disable-auto-cleanup" in proc.args else MPIEXEC_GRACE_S
            supervision = Supervision(self.cfg, listener if across_hosts_elastic else None,
                                      run_dir)
            try:
                status = supervision.supervise(proc, watchdog, forwarding, grace)
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
                    listener.close(run_dir)
                if supervision.probe:
                    supervision.probe.stop()
        ended = time.time()
        # The processes of a host the job went on without hold mpiexec's pipes open and
        # never write again: the readers get what is already there, not 5 s each to wait.
        drain = {"timeout_s": LEFT_BEHIND_DRAIN_S} if supervision.left_behind else {}
        output.join(**drain)
        errors.join(**drain)
        job = EndedJob(run_dir, proc, status, watchdog, forwarding, output, supervision, ended,
                       output.lost_daemon_host or errors.lost_daemon_host)
        watchdog.kill_leftovers()  # a rank that outlived mpiexec would be an orphan
        try:  # and a helper of mpiexec's (an Open MPI prterun outlived an elastic job once)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(2 * RankWatchdog.POLL_MS / 1000)  # the last deaths reach the record
        watchdog.stop()
        if supervision.left_behind:
            self.reports.report_left_behind(run_dir, supervision.left_behind, self.STARTER)
        return self._outcome(job)

    def _outcome(self, job: EndedJob) -> tuple[int, JobFailure | None]:
        """How the ended job went: a stalled rank, a lost daemon, an elastic job that every
        learner left, a completion or a graceful stop, else a failure (:meth:`_failure`)."""
        run_dir, status, ended = job.run_dir, job.status, job.ended
        if job.supervision.stalled is not None:
            stalled = job.supervision.stalled
            where = f" on {stalled.host}" if stalled.host else ""
            return 128 + signal.SIGKILL, JobFailure(
                f"rank {stalled.rank}{where} stalled (no heartbeat for launcher.stall_timeout_s="
                f"{self.cfg.stall_timeout_s:g} s)", True, ended,
                lambda: self.reports.report_stalled(run_dir, stalled), event="stalled",
                learner=stalled.rank, host=stalled.host)
        # The learners this launcher took for lost (a cut link, a hung host) left with an
        # exit record of EXIT_PEER_LOST if they came back before the end (cut_off, in
        # runner/elastic/launcher_link.py): the job is what the others made of it.
        listener = job.watchdog.listener
        cut = listener.declared() if self.cfg.elastic and listener else set()
        exits = [s for r, s in job.watchdog.exit_statuses().items() if r not in cut]
        finished = any(s in (0, EXIT_PREEMPTED, EXIT_STOPPED) for s in exits)
        # Open MPI's runtime ends a job that lost a daemon with SIGTERM to every rank left,
        # which checkpoint and stop as if preempted: a stop nobody forwarded is that end.
        received = job.forwarding.received
        ended_as_asked = any(s == 0 for s in exits) or (bool(received) and finished)
        host = job.lost_daemon_host
        if host and not (status == 0 and ended_as_asked):
            return 128 + signal.SIGKILL, JobFailure(
                f"Open MPI lost its daemon on {host}", True, ended,
                lambda: self.reports.report_daemon_lost(run_dir, host), event="died",
                host=host)
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
            dead = self.reports.dead_rank(job.watchdog, job.output)
            return 128 + signal.SIGKILL, JobFailure(
                "every learner died", True, dead.when if dead else ended,
                lambda: self.reports.report_all_dead(run_dir, dead), event="died",
                learner=dead.rank if dead else None)
        if status == 0:
            if received:  # the signal came after the last chance to stop
                names = ", ".join(signal.Signals(s).name for s in received)
                print(f"adpsgd-run: the run completed before the stop ({names}) took effect: "
                      "it is finished, nothing to resume", file=sys.stderr, flush=True)
            return 0, None
        statuses = set(exits)
        if self.cfg.elastic:  # the learners it lost on the way left no record
            statuses.discard(None)
        if statuses in ({EXIT_PREEMPTED}, {EXIT_STOPPED}):  # every rank stopped gracefully
            return statuses.pop(), None
        if statuses == {0}:
            # Every rank (every one left, elastic) completed the run and said so; mpiexec's
            # own end after that does not undo it: Open MPI's marks the job failed for a
            # replacement it could not start, MPICH's across hosts was seen killed by SIGPIPE
            # at its teardown (a host's remote shell gone first).
            if not self.cfg.elastic:  # (an elastic job's replacement said why already)
                how = (f"was killed by signal {-status} ({signal.Signals(-status).name})"
                       if status < 0 else f"exited with status {status}")
                print(f"adpsgd-run: every rank completed the run; mpiexec {how} after that, "
                      "which changes nothing", file=sys.stderr, flush=True)
            return 0, None
        if status == -signal.SIGINT and signal.SIGINT in received:
            # The user's Ctrl-C itself: a Ctrl-C while mpiexec is being spawned reaches it in
            # the instant between fork and its own session, and it dies of it at once.
            return EXIT_STOPPED, None
        return self._failure(job, status, bool(error_lines))

    def _failure(self, job: EndedJob, status: int, error_line: bool
                 ) -> tuple[int, JobFailure]:
        """The failed job's exit status and failure: a rank killed on another host, mpiexec
        killed from outside, a rank dead here, else the ranks' own lines (``error_line``: an
        elastic job's rank wrote one)."""
        run_dir, ended, output = job.run_dir, job.ended, job.output
        dead = None if error_line else self.reports.dead_rank(job.watchdog, output)
        if dead is None and (killed := killed_elsewhere(run_dir, self.processes,
                                                         output.exit_codes)):
            rank, host, signum, others = killed
            return 128 + signum, JobFailure(
                f"rank {rank} on {host} was killed by signal {signum} "
                f"({signal.Signals(signum).name})", True, ended,
                lambda: self.reports.report_killed_elsewhere(run_dir, rank, host, signum,
                                                             others),
                event="died", learner=rank, host=host)
        if status < 0 and job.supervision.mpiexec_ended_first(job.watchdog, dead, ended):
            # mpiexec itself was killed from outside; its ranks went down after it.
            name = signal.Signals(-status).name
            return 128 - status, JobFailure(
                f"mpiexec was killed by signal {-status} ({name}) from outside", True, ended,
                lambda: self.reports.report_mpiexec_killed(run_dir, job.proc.pid, -status),
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
                lambda: self.reports.report_dead_rank(run_dir, dead, output), event="died",
                learner=dead.rank)
        status = 128 - status if status < 0 else status
        mpiexec_said = self.reports.mpiexec_report(job.watchdog, output)
        report = functools.partial(self.reports.report_failure, run_dir, status, mpiexec_said)
        return status, (reported_failure(run_dir, self.processes, ended, report) or JobFailure(
            f"the MPI job exited with status {status}", True, ended, report))















