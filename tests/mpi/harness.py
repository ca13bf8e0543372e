"""Run a check on every rank; a failing rank aborts the whole job instead of hanging peers."""

import sys
import traceback

from runner.comm.world import mpi


def run_on_ranks(check) -> None:
    """Call ``check(world_comm)`` on this rank; print its message, or abort every rank."""
    world = mpi().COMM_WORLD
    try:
        message = check(world)
    except BaseException:  # noqa: BLE001 - any failure must end the job with a non-zero status
        print(f"rank {world.Get_rank()}: FAILED", flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)
        sys.exit(1)  # in case Abort returns before the process is killed
    print(f"rank {world.Get_rank()}: {message}", flush=True)


def compose_config(overrides: list[str]):
    """The validated run config for ``overrides``, as the CLI would compose it."""
    from hydra import compose, initialize_config_module

    from runner.config import validate

    with initialize_config_module(config_module="runner.conf", version_base=None):
        return validate(compose("config", overrides=["trainer.progress=false", *overrides]))


def build_trainer(world_mpi, comm, run_dir, cfg):
    """A Trainer on this rank for ``cfg``; returns it and the node communicator to close."""
    import torch

    from runner.comm.communicator import Communicator
    from runner.comm.world import detect_world
    from runner.trainer import Trainer

    world, node_mpi = detect_world(world_mpi, cfg.launcher.procs_per_node)
    node = Communicator(node_mpi, "mpi", name="node")
    return Trainer(cfg, run_dir, world, comm, node, torch.device("cpu")), node
