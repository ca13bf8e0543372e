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
