"""Print, per rank, the World that detect_world computes and what SLURM says of the rank.

Started by srun or by mpiexec inside a SLURM allocation (tests/test_slurm_cluster.py); one JSON
line per rank: MPI's rank and size, SLURM's task variables, and the World for
``procs_per_node`` given as argv[1] (the tasks per node) and for real nodes (null).
"""

import dataclasses
import json
import os
import sys

from runner.comm.world import detect_world

from harness import run_on_ranks

SLURM_KEYS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NUM_TASKS")


def check(world_mpi) -> str:
    procs_per_node = int(sys.argv[1])
    emulated, _ = detect_world(world_mpi, procs_per_node)
    real, _ = detect_world(world_mpi, None)
    return json.dumps({"mpi_rank": world_mpi.Get_rank(), "mpi_size": world_mpi.Get_size(),
                       "slurm": {key: os.environ.get(key) for key in SLURM_KEYS},
                       "world": dataclasses.asdict(emulated),
                       "world_real_nodes": dataclasses.asdict(real)})


if __name__ == "__main__":
    run_on_ranks(check)
