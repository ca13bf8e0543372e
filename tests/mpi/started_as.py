"""mpiexec -n N python [-m runner.warm_script] started_as.py ARGS: each rank prints how its
process started and what the script sees (tests/test_rank_factory.py); with ``--exit-with N``
it then exits with status N."""

import json
import os
import sys

import torch
from mpi4py import MPI

from runner.rank_factory import started_as

print(json.dumps({"rank": MPI.COMM_WORLD.Get_rank(), "size": MPI.COMM_WORLD.Get_size(),
                  "started": started_as(), "argv": sys.argv, "name": __name__,
                  "path0": sys.path[0], "cwd": os.getcwd(), "threads": torch.get_num_threads(),
                  "pid": os.getpid()}), flush=True)
if "--exit-with" in sys.argv:
    raise SystemExit(int(sys.argv[sys.argv.index("--exit-with") + 1]))
