"""One rank: ``python -m runner.worker RUN_DIR``.

Workers never re-parse the command line: they read the validated config that the CLI saved in
``RUN_DIR/.hydra/run.yaml``. Each rank's stdout and stderr (Python and C level) go to
``RUN_DIR/logs/rank<N>.log``; rank 0 keeps the launcher's stderr for the progress bar. Any
error on any rank is logged, printed as one line, and aborts the whole MPI job, so that no peer
is left waiting.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import TextIO

from omegaconf import DictConfig, OmegaConf

from .errors import UserError, one_line

RUN_CONFIG = Path(".hydra") / "run.yaml"
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
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s")
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


def _tensor_backend(requested: str, device_type: str) -> str:
    if requested == "auto":
        return "nccl" if device_type == "cuda" else "mpi"
    if requested == "mpi" and device_type == "cuda":
        raise UserError("comm.backend=mpi cannot move GPU tensors", "use comm.backend=nccl")
    if requested == "nccl" and device_type != "cuda":
        raise UserError("comm.backend=nccl needs GPUs", "use comm.backend=auto on CPU")
    return requested


def run_rank(run_dir: str | Path, in_process: bool = False) -> int:
    """Train as one rank of the job; return the exit status (0 on success)."""
    import torch

    from .comm.communicator import Communicator, init_torch_distributed, torch_subgroups
    from .comm.world import detect_world, mpi
    from .trainer import Trainer, resolve_device

    run_dir = Path(run_dir)
    MPI = mpi()
    world_mpi = MPI.COMM_WORLD
    rank = world_mpi.Get_rank()
    console = setup_logging(run_dir, rank, redirect_fds=not in_process)
    try:
        cfg = load_run_config(run_dir)
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads:
            torch.set_num_threads(int(threads))
        world, node_mpi = detect_world(world_mpi, cfg.launcher.procs_per_node)
        log.info("rank %d of %d, node %d (local rank %d of %d), pid %d", world.rank, world.size,
                 world.node, world.local_rank, world.local_size, os.getpid())
        device = resolve_device(cfg.trainer.device, world.local_rank)
        backend = _tensor_backend(cfg.comm.backend, device.type)
        node_group = None
        if backend != "mpi":
            init_torch_distributed(world_mpi, backend)
            members = world_mpi.allgather(world.node)
            groups = [[r for r, n in enumerate(members) if n == node]
                      for node in range(world.num_nodes)]
            node_group = torch_subgroups(groups)[world.node]
        comm = Communicator(world_mpi, backend, name="world")
        node_comm = Communicator(node_mpi, backend, torch_group=node_group, name="node")
        Trainer(cfg, run_dir, world, comm, node_comm, device, progress_stream=console).run()
        comm.close()
        node_comm.close()
        log.info("rank %d finished", world.rank)
        return 0
    except UserError as ex:
        log.error("%s", ex)
        message = f"adpsgd-run: error: {ex}"
        status = 2
    except BaseException as ex:  # noqa: BLE001 - every failure must end the job, never hang it
        log.error("unhandled exception:\n%s", traceback.format_exc())
        message = (f"adpsgd-run: rank {rank} failed: {type(ex).__name__}: {one_line(ex)} "
                   f"(traceback in {run_dir / 'logs' / f'rank{rank}.log'})")
        status = 1
    print(message, file=console, flush=True)
    if world_mpi.Get_size() > 1:
        world_mpi.Abort(status)  # take every peer down with us instead of leaving it waiting
    return status


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m runner.worker RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(run_rank(sys.argv[1]))


if __name__ == "__main__":
    main()
