"""One rank's life, from MPI's start to its exit record (``python -m runner.worker RUN_DIR``
starts it: runner/worker.py).

Workers never re-parse the command line: they read the validated config that the CLI saved in
``RUN_DIR/.hydra/run.yaml``. Each rank's stdout and stderr (Python and C level) go to
``RUN_DIR/logs/rank<N>.log``; rank 0 keeps the launcher's stderr for the progress bar. Any
error on any rank is logged, printed as one line, and aborts the whole MPI job, so that no peer
is left waiting. A communication that outlives ``comm.timeout_s`` does the same. With a rank
factory (runner/rank_factory.py) the process mpiexec started hands its place to a fork of the
factory, which runs :func:`run_from_command_line` from there on.

SIGUSR1/SIGTERM request a graceful stop (runner/checkpoint/preemption.py): the rank exits with
status 75 (``EXIT_PREEMPTED``) after the job's checkpoint; SIGINT (Ctrl-C, forwarded by the
launcher; SIGUSR2 where it came through Open MPI's mpiexec) likewise with status 130
(``EXIT_STOPPED``). The handlers are installed before anything
slow, and only then does the rank write ``logs/rank<N>.pid``, which is where the launcher
forwards signals; ``logs/rank<N>.exit`` records how the rank ended (runner/runlog/liveness.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from omegaconf import DictConfig, OmegaConf

from . import rank_factory
from .checkpoint.preemption import PREEMPTED, STOPPED, install_stop_handlers, request_stop
from .comm.deadline import DEADLINES, CommTimeout
from .elastic.launcher_link import cut_off, learners_lost_elsewhere
from .elastic.peer_exits import watch_peer_exits
from .elastic.respawn import RESPAWNED, Joined, join_the_job
from .errors import (
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    EXIT_STOPPED,
    UserError,
    disk_full,
    one_line,
)
from .runlog.liveness import (
    LAUNCHER_PID,
    launcher_here,
    start_heartbeat,
    stop_requests,
    watch_launcher,
    write_exit_record,
    write_pid_file,
)
from .runlog.records import RUN_CONFIG
from .runlog.run_lock import hold_shared

if TYPE_CHECKING:  # imported in the rank, after MPI starts: it loads torch
    from .trainer import Trainer

QUIET_ABORT_DELAY_S = 5.0  # a rank whose error another rank reports waits this long
log = logging.getLogger("adpsgd")


def load_run_config(run_dir: Path) -> DictConfig:
    path = run_dir / RUN_CONFIG
    if not path.exists():
        raise UserError(f"{path} is missing", "start runs with adpsgd-run, which writes it")
    return OmegaConf.load(path)


def setup_logging(run_dir: Path, rank: int, redirect_fds: bool) -> TextIO:
    """Send this rank's output to logs/rank<N>.log; return the stream for the progress bar."""
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"rank{rank}.log"
    # Host and rank on every line: the logs of a job across hosts read merged (sort -m).
    fmt = logging.Formatter(f"%(asctime)s rank{rank}@{socket.gethostname()} %(levelname)s "
                            "%(message)s")
    logger = logging.getLogger("adpsgd")
    logger.setLevel(logging.INFO)
    if redirect_fds:
        console = os.fdopen(os.dup(2), "w", buffering=1)
        log_file = open(path, "a", buffering=1)
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(fmt)
        logger.addHandler(handler)
        logger.propagate = False
        return console
    handler = logging.FileHandler(path)
    handler.setFormatter(fmt)
    logger.addHandler(handler)  # in-process: Hydra's console handler still shows the messages
    return sys.stderr


def log_error_to_file(message: str, *args: object) -> None:
    """Log an error to this rank's log file only: the console gets one line of it. (A rank in
    the launcher's process also passes its records to Hydra's console handler, which would
    show a traceback there.)"""
    propagate, log.propagate = log.propagate, False
    try:
        log.error(message, *args)
    finally:
        log.propagate = propagate


def comm_timeout_line(what: str) -> str:
    """The one line for a communication that got no answer (``what`` names rank and peers)."""
    return (f"adpsgd-run: error: {what}. Fix: look for the rank that stopped answering in the "
            "other logs (a hung or dead node, a stopped process); raise comm.timeout_s "
            "(algo.timeout_s for gossip) if peers are only slow; then continue with "
            "resume=auto")


def mpi_failure_line(rank: int, ex: Exception, log_path: Path) -> str:
    """The line for an MPI call that failed on this rank, which mostly means that a peer died
    or its connection broke. MPI's own text can say nothing of use (for MPI_ERR_IN_STATUS,
    MPICH's answer to a peer lost in a collective, it is "See the MPI_ERROR field in
    MPI_Status for the error code"), so the line names the error class and its likely cause;
    the launcher's next line names the rank that ended, where it knows it."""
    from .comm.world import mpi

    MPI = mpi()
    code = ex.Get_error_class()
    name = next((f"MPI_{n}" for n in sorted(dir(MPI)) if n.startswith("ERR_")
                 and n != "ERR_LASTCODE" and getattr(MPI, n) == code), f"MPI error class {code}")
    detail = "" if code == MPI.ERR_IN_STATUS else f": {one_line(ex)[:200]}"
    return (f"adpsgd-run: rank {rank} gave up: an MPI call failed ({name}{detail}), most "
            "often because a peer rank died or its connection broke; the launcher names the "
            f"rank that ended where it can (traceback in {log_path})")


def start_failure(ex: OSError, run_dir: Path) -> str:
    """The line for a rank that cannot even open its log or records."""
    full = disk_full(ex, run_dir)
    if full is not None:
        return str(full)
    return (f"rank cannot write its log in {run_dir / 'logs'} ({ex.strerror or ex}). Fix: "
            "make the run dir writable, or choose another hydra.run.dir")


def tune_mpi(cfg: DictConfig | None) -> None:
    """Put the MPI settings the run config ``cfg`` asks for (comm.allreduce) in the environment
    that MPI reads when it starts, which is next; a setting exported by the user wins. Nothing
    when the config could not be read (None: the error comes, as one line, once MPI runs)."""
    from .comm.world import mpi_environment

    allreduce = _comm_value(cfg, "allreduce", "auto")
    for name, value in mpi_environment(allreduce).items():
        os.environ.setdefault(name, value)


def readable_run_config(run_dir: Path) -> DictConfig | None:
    """The run config, or None where it cannot be read (:func:`load_run_config`, which the rank
    calls once its log is open, says why). A rank reads it once: parsing its YAML takes
    0.05 CPU s here."""
    try:
        return OmegaConf.load(Path(run_dir) / RUN_CONFIG)
    except Exception:  # noqa: BLE001 - reported where the config is loaded for real
        return None


def comm_setting(run_dir: Path, name: str, default: Any) -> Any:
    """The run config's ``comm.NAME``, read beside the trainer's own copy; ``default`` when the
    config cannot be read."""
    return _comm_value(readable_run_config(run_dir), name, default)


def _comm_value(cfg: DictConfig | None, name: str, default: Any) -> Any:
    try:
        return default if cfg is None else cfg.comm.get(name, default)
    except Exception:  # noqa: BLE001 - a config without comm: reported where it is used
        return default


def launcher_gone(pid: int | None, console: TextIO, run_dir: Path, rank: int) -> None:
    """The launcher that supervises this job died (kill -9, a closed session): without it
    nobody watches the ranks, so they checkpoint and stop (status stopped). ``pid``: None
    when it ran on another host (its host said so, runner/runlog/liveness.py). What the rank
    would print on ``console`` (the progress bar, its last line) goes to its log from now
    on: nobody reads mpiexec's output any more, and mpiexec, killed by the first line it
    passes on (SIGPIPE), would take the ranks down before they wrote summary.json. A rank
    that has not stopped ``comm.timeout_s`` later leaves without a checkpoint: nobody would
    end it otherwise (:func:`leave_if_still_running`)."""
    log.warning("adpsgd-run (%s), which started this job, is gone: checkpointing and "
                "stopping", f"pid {pid}" if pid else "on another host")
    try:
        console.flush()
    except (OSError, ValueError):  # a console already broken: nothing more reaches it
        pass
    try:
        os.dup2(sys.stderr.fileno(), console.fileno())  # fd 2 is the rank's log
    except (OSError, ValueError):
        pass
    request_stop(signal.SIGINT)
    threading.Thread(target=leave_if_still_running, args=(run_dir, rank), daemon=True,
                     name="launcher-gone").start()


def leave_if_still_running(run_dir: Path, rank: int) -> None:
    """End this process if it is still here ``comm.timeout_s`` after the launcher's end:
    a call that waits on a peer lost with the launcher (a ULFM agreement with a rank that
    aborted) never returns, and the stop could not happen. The last complete checkpoint
    stays what resume=auto loads."""
    from .config.run_schema import CommConfig

    bound_s = float(comm_setting(run_dir, "timeout_s", CommConfig.timeout_s))
    time.sleep(bound_s)
    line = (f"rank {rank} could not checkpoint and stop within comm.timeout_s={bound_s:g} s "
            "of its launcher's end (a call to a lost peer never returned): it left without "
            "a checkpoint; resume=auto continues from the last complete one")
    log.error("%s", line)
    write_exit_record(run_dir, rank, EXIT_PEER_LOST, line)
    logging.shutdown()
    os._exit(EXIT_PEER_LOST)


def run_rank(run_dir: str | Path, in_process: bool = False, respawned: bool = False) -> int:
    """Train as one rank of the job; return the exit status (0 on success, 75 after a
    graceful stop). ``respawned``: a replacement the learners spawned into the running job
    (runner/elastic/respawn.py)."""
    restore_signals = install_stop_handlers()  # first: SIGUSR1's default action kills
    rank_factory.ready()  # a forked rank: signals from its stand-in may come now
    try:
        return _run_rank(Path(run_dir), in_process, respawned)
    finally:
        if in_process:  # the launcher's process goes on (a sweep's next job)
            restore_signals()
        else:
            # The work is done, and the process is about to exit. MPICH's mpiexec, run with
            # -disable-auto-cleanup, sends SIGUSR1 to the ranks still alive when one exits;
            # Python's shutdown puts back SIGUSR1's default action (terminate), which would
            # turn a clean finish into "killed by signal 10".
            # (SIGUSR2 likewise: a Ctrl-C forwarded through Open MPI's mpiexec.)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _run_rank(run_dir: Path, in_process: bool, respawned: bool) -> int:
    run_config = readable_run_config(run_dir)
    joined = None
    if respawned:  # merge with the job at once: its learners wait for it in MPI_Comm_spawn
        tune_mpi(run_config)
        joined = join_the_job()
    import torch  # noqa: F401 - loaded before its threads are sized (use_environment_threads)

    import recipes  # noqa: F401 - fills the recipe registry (runner/recipe.py)

    from .comm.communicator import shutdown_torch_distributed
    from .comm.pairwise import ExchangeTimeout
    from .comm.world import mpi
    from .runlog.timers import activity
    from .trainer import Trainer

    if not respawned:
        tune_mpi(run_config)
    MPI = mpi()
    world_mpi = MPI.COMM_WORLD
    rank = world_mpi.Get_rank() if joined is None else joined.me
    trainer = None
    main_thread = threading.get_ident()
    try:
        # The heartbeat says how far this rank got, for a launcher that restarts a failed job.
        console = start_rank_files(
            run_dir, rank, in_process,
            progress=lambda: trainer.state.samples if trainer is not None else None,
            doing=lambda: activity(trainer.timers, trainer.state.step,
                                   DEADLINES.waiting(main_thread)),
            training=lambda: trainer is not None and trainer.past_start_up)
    except OSError as ex:  # nowhere to write: say it on the terminal, end the job
        print(f"adpsgd-run: error: {start_failure(ex, run_dir)}", file=sys.stderr, flush=True)
        if world_mpi.Get_size() > 1:
            world_mpi.Abort(2)
        return 2
    say = speaking_to_the_launcher(run_dir, rank, world_mpi, console, in_process)
    try:
        cfg = run_config if run_config is not None else load_run_config(run_dir)
        if cfg.launcher.get("elastic") and not in_process:
            watch_peer_exits(run_dir, rank)  # peers that end unseen by MPI: taken for failed
        rank_factory.use_environment_threads()
        world, comm, node_comm, device, started_torch_group = learner_world(cfg, world_mpi,
                                                                            joined)
        trainer = Trainer(cfg, run_dir, world, comm, node_comm, device, progress_stream=console)
        if not in_process:
            # A signal the launcher took before this rank wrote its pid file may still be on
            # its way here: its note decides, and the ranks agree on it before the first step.
            for signum in stop_requests(run_dir):
                request_stop(signum)
        trainer.run()
        if trainer.membership is not None:
            trainer.membership.close()  # the spares still waiting go
        trainer.comm.close()  # the survivors' communicators, after a loss in an elastic run
        trainer.ctx.node_comm.close()
        if started_torch_group:
            shutdown_torch_distributed()
        status = {None: 0, PREEMPTED: EXIT_PREEMPTED, STOPPED: EXIT_STOPPED}[
            trainer.stop_status]
        log.info("rank %d %s", world.rank, f"stopped ({trainer.stop_status})"
                 if trainer.stop_status else "finished")
        write_exit_record(run_dir, rank, status, samples=trainer.state.samples)
        return status
    except UserError as ex:
        log_error_to_file("%s", ex)
        message = None if ex.quiet else f"adpsgd-run: error: {ex}"
        status = ex.exit_status
    except (CommTimeout, ExchangeTimeout) as ex:  # a peer hung or died: no traceback
        log_error_to_file("%s", ex)
        message = comm_timeout_line(one_line(ex))
        status = EXIT_PEER_LOST
    except KeyboardInterrupt:  # a second Ctrl-C (runner/checkpoint/preemption.py): stop at once
        log_error_to_file("stopped at once by a second Ctrl-C:\n%s", traceback.format_exc())
        message, status = None, EXIT_STOPPED
    except BaseException as ex:  # noqa: BLE001 - every failure must end the job, never hang it
        log_error_to_file("unhandled exception:\n%s", traceback.format_exc())
        message, status = unexpected_failure(ex, run_dir, rank, trainer)
    return end_failed_rank(run_dir, rank, world_mpi, trainer, message, status, say)


def start_rank_files(run_dir: Path, rank: int, in_process: bool,
                     progress: Callable[[], int | None], doing: Callable[[], str | None],
                     training: Callable[[], bool]) -> TextIO:
    """The rank's log, and (a rank of its own process) its pid file, heartbeat (``progress``:
    the global samples it has seen; ``doing``: what it does now; ``training``: its start-up
    is over) and share of the run dir's lock; returns the console stream. Raises OSError where
    the run dir takes no file."""
    console = setup_logging(run_dir, rank, redirect_fds=not in_process)
    if not in_process:
        write_pid_file(run_dir, rank)
        start_heartbeat(run_dir, rank, progress, doing, training,
                        on_lost=partial(learners_lost_elsewhere, run_dir, rank),
                        on_cut_off=lambda silent_s: cut_off(
                            run_dir, rank, f"no answer from the launcher for "
                            f"{silent_s:.0f} s"),
                        on_launcher_gone=partial(launcher_gone, None, console, run_dir,
                                                 rank))
        hold_shared(run_dir)
    return console


def speaking_to_the_launcher(run_dir: Path, rank: int, world_mpi: Any, console: TextIO,
                             in_process: bool) -> Callable[[str], None]:
    """How this rank says a failure's line: under the local launcher, which prints it from
    the exit record (a print here can die with MPI_Abort before mpiexec forwards it), not at
    all; else on the console. The rank also stops when the launcher on its host dies (the
    others lose their peers with it), and a communication that times out ends the job."""
    launcher = os.environ.get(LAUNCHER_PID)
    watched = launcher_here()
    if watched and not in_process:
        watch_launcher(watched, lambda: launcher_gone(watched, console, run_dir, rank))

    def say(message: str) -> None:
        if in_process:
            print(message, file=console, flush=True)
        elif not launcher:  # the ranks' lines meet in one output (SLURM's): whose is each
            print(f"{message} [rank {rank} on {socket.gethostname()}]", file=console,
                  flush=True)

    def give_up(message: str) -> None:  # a communication timed out (monitor thread)
        log.error("%s", message)
        write_exit_record(run_dir, rank, EXIT_PEER_LOST, comm_timeout_line(message))
        say(comm_timeout_line(message))
        world_mpi.Abort(EXIT_PEER_LOST)

    DEADLINES.on_expired = give_up
    return say


def learner_world(cfg: DictConfig, world_mpi: Any, joined: Joined | None = None
                  ) -> tuple[Any, Any, Any, Any, bool]:
    """This rank's learners (an elastic job's spares wait apart: launcher.spares; so does a
    replacement ``joined`` to it, runner/elastic/respawn.py): their World, world and node
    communicators, the rank's device, and whether torch.distributed was started for them
    (a tensor backend other than MPI)."""
    import torch

    from .comm.communicator import (
        Communicator,
        init_torch_distributed,
        tensor_backend,
        torch_subgroups,
    )
    from .comm.traffic import Traffic
    from .comm.world import detect_world
    from .elastic.spares import split_spares, waiting_alone
    from .train.compute_path import resolve_device

    learner_mpi, world, node_mpi = (split_spares(world_mpi, cfg.launcher) if joined is None
                                    else waiting_alone(joined))
    if world is None:
        world, node_mpi = detect_world(learner_mpi, cfg.launcher.procs_per_node)
    log.info("rank %d of %d, node %d (local rank %d of %d), pid %d, started %s", world.rank,
             world.size, world.node, world.local_rank, world.local_size, os.getpid(),
             rank_factory.started_as())
    device = resolve_device(cfg.trainer.device, world.host_rank)
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    # Elastic runs move tensors over MPI, whose communicators shrink (NCCL's cannot).
    backend = ("mpi" if cfg.launcher.get("elastic") else
               tensor_backend(cfg.comm.backend, device.type, world.host_size, gpus))
    if device.type == "cuda" and backend == "mpi" and world.rank == 0:
        if cfg.launcher.get("elastic"):
            why = "an elastic run's communicators must shrink, which NCCL's cannot"
        elif cfg.comm.backend == "auto":
            why = (f"{world.host_size} ranks share {gpus} GPU(s) on a machine and NCCL "
                   "needs one GPU per rank")
        else:
            why = "comm.backend=mpi"
        log.info("%s: tensors go over MPI through pinned host memory", why)
    node_group, started_torch_group = None, False
    if backend != "mpi":
        started_torch_group = init_torch_distributed(world_mpi, backend)
        members = world_mpi.allgather(world.node)
        groups = [[r for r, n in enumerate(members) if n == node]
                  for node in range(world.num_nodes)]
        node_group = torch_subgroups(groups)[world.node]
    timeout = cfg.comm.timeout_s
    traffic = Traffic()  # the bytes this rank sends, over either communicator
    comm = Communicator(learner_mpi, backend, name="world", timeout_s=timeout, traffic=traffic)
    node_comm = Communicator(node_mpi, backend, torch_group=node_group, name="node",
                             timeout_s=timeout, traffic=traffic)
    return world, comm, node_comm, device, started_torch_group


def unexpected_failure(ex: BaseException, run_dir: Path, rank: int, trainer: Trainer | None
                       ) -> tuple[str, int]:
    """The line and exit status of a failure nobody raised on purpose: a full disk, an MPI
    error (a lost connection to a peer, mostly), anything else."""
    from .comm.world import mpi

    if (full := disk_full(ex, run_dir)) is not None:
        last = trainer.checkpointer.last if trainer else None
        return f"adpsgd-run: error: {full.with_checkpoint(last)}", 2
    if isinstance(ex, mpi().Exception):
        return mpi_failure_line(rank, ex, run_dir / "logs" / f"rank{rank}.log"), EXIT_PEER_LOST
    return (f"adpsgd-run: rank {rank} failed: {type(ex).__name__}: {one_line(ex)} "
            f"(traceback in {run_dir / 'logs' / f'rank{rank}.log'})"), 1


def end_failed_rank(run_dir: Path, rank: int, world_mpi: Any, trainer: Trainer | None,
                    message: str | None, status: int, say: Callable[[str], None]) -> int:
    """A failed rank's end: its exit record and line, then the job taken down with it."""
    state = getattr(trainer, "state", None)  # None before the trainer had one
    write_exit_record(run_dir, rank, status, message,
                      samples=state.samples if state is not None else None)
    if message is not None:
        progress = getattr(trainer, "progress", None)
        if progress is not None:  # end the bar's line, or the bar overwrites the error's start
            try:
                progress.close()
            except OSError:
                pass
        say(message)
    if message is None and status != EXIT_STOPPED:
        # The rank that prints the shared error aborts the job; give it time to do so first
        # (the abort ends this sleep).
        time.sleep(QUIET_ABORT_DELAY_S)
    if world_mpi.Get_size() > 1:
        world_mpi.Abort(status)  # take every peer down with us instead of leaving it waiting
    return status


def exit_at_once(status: int) -> None:
    """End a rank that finished or stopped gracefully without Python's own shutdown, which
    with torch loaded takes about a second (4 ranks on 2 cores: 1.1-1.4 s of every job's wall
    time) and frees nothing the OS would not. Logs and streams are flushed and MPI finalized
    first. Not with child processes alive (data loader workers): their shutdown is Python's."""
    import multiprocessing

    from mpi4py import MPI

    if multiprocessing.active_children():
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more to say
            pass
    from .comm import ulfm

    if MPI.Is_initialized() and not MPI.Is_finalized() and not ulfm.lost_peers():
        MPI.Finalize()
    os._exit(status)


def prepare_data(run_dir: str | Path) -> int:
    """Build the recipe's caches for the run in ``run_dir`` (a batch job does, once, before
    its ranks start); 0, or 2 after one line naming the cause."""
    import recipes  # noqa: F401 - fills the recipe registry

    from .recipe import RECIPES

    try:
        cfg = load_run_config(Path(run_dir))
        RECIPES.get(cfg.recipe.name)(cfg.recipe).prepare()
    except UserError as ex:
        print(f"adpsgd: error: {ex}", file=sys.stderr, flush=True)
        return 2
    return 0


def load_what_ranks_train_with() -> None:
    """Import what :func:`_run_rank` does (torch, the recipes, the trainer) but MPI, which
    initializes as it is imported: what a rank factory loads before it forks."""
    import numpy.ma  # noqa: F401 - NumPy loads these two on first use (np.unique, the
    import numpy.random  # noqa: F401 - shards' order): 0.05 CPU s of every rank here
    import torch  # noqa: F401
    import torch.utils.tensorboard  # noqa: F401 - rank 0's events (0.1 CPU s a job)

    import recipes  # noqa: F401

    from .comm import communicator, pairwise  # noqa: F401
    from .trainer import Trainer  # noqa: F401


def run_from_command_line(argv: list[str]) -> None:
    """Be the rank that ``python -m runner.worker`` was asked for (``argv``: its arguments,
    ``RUN_DIR [--prepare | --respawned]``) and end the process as it ends."""
    if len(argv) == 2 and argv[1] == "--prepare":
        rank_factory.ready()
        raise SystemExit(prepare_data(argv[0]))
    respawned = argv[1:] == [RESPAWNED]
    if len(argv) != 1 and not respawned:
        rank_factory.ready()
        print(f"usage: python -m runner.worker RUN_DIR [--prepare | {RESPAWNED}]",
              file=sys.stderr)
        raise SystemExit(2)
    status = run_rank(argv[0], respawned=respawned)
    from .comm import ulfm

    # Every rank ended normally, or this one goes without the peers it lost (MPI_Finalize
    # would wait for them).
    if status in (0, EXIT_PREEMPTED, EXIT_STOPPED) or ulfm.lost_peers():
        exit_at_once(status)
    raise SystemExit(status)
