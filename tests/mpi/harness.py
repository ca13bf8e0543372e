"""Run checks on every rank; a failing rank aborts the whole job instead of hanging peers."""

import json
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


def run_cases_on_ranks(check) -> None:
    """Run ``check(world_comm, run_dir, overrides)`` for every case of one job.

    ``sys.argv[1]`` is a run dir and ``sys.argv[2]`` a JSON object {case: [override, ...]}.
    Starting ranks costs seconds (imports), so one job runs many cases. A failed assertion
    after training is reported (``case NAME: FAILED ...``) and the next case runs: the ranks
    are still in step. Any other exception may leave peers inside a collective, so it aborts
    the job.
    """
    world = mpi().COMM_WORLD
    run_dir, cases = sys.argv[1], json.loads(sys.argv[2])
    for name, overrides in cases.items():
        try:
            message = check(world, f"{run_dir}/{name}", overrides)
        except AssertionError as failure:
            report(world, name, f"FAILED {failure}")
        except BaseException:  # noqa: BLE001 - any other failure must end the job
            print(f"rank {world.Get_rank()}: case {name}: FAILED", flush=True)
            traceback.print_exc()
            sys.stderr.flush()
            world.Abort(1)
            sys.exit(1)
        else:
            report(world, name, message)


def report(world, case: str, message: str) -> None:
    # One write per line: mpiexec merges the ranks' output streams.
    sys.stdout.write(f"rank {world.Get_rank()}: case {case}: {' '.join(message.split())}\n")
    sys.stdout.flush()


def compose_config(overrides: list[str]):
    """The validated run config for ``overrides``, as the CLI would compose it (on the
    digit images unless the overrides pick another recipe)."""
    from hydra import compose, initialize_config_module

    from runner.config import validate

    with initialize_config_module(config_module="runner.conf", version_base=None):
        return validate(compose("config", overrides=[
            "recipe=digit_images", "trainer.progress=false", *overrides]))


def build_trainer(world_mpi, comm, run_dir, cfg):
    """A Trainer on this rank for ``cfg``; returns it and the node communicator to close."""
    import torch

    from runner.comm.communicator import Communicator
    from runner.comm.world import detect_world
    from runner.trainer import Trainer

    world, node_mpi = detect_world(world_mpi, cfg.launcher.procs_per_node)
    node = Communicator(node_mpi, "mpi", name="node")
    return Trainer(cfg, run_dir, world, comm, node, torch.device("cpu")), node
