"""ULFM's mpiexec -n 3 python unseen_exit_bounded_shrink.py: rank 2 exits (status 1, not
killed), which ULFM does not count as a failure, and nobody declares it failed; the
survivors' shrink, which waits for it, is bounded: after timeout_s one line names the rank
and the call, and the job ends instead of waiting for good."""

import os
import time

from mpi4py import MPI
from survivors import leave_together

from runner.comm.ulfm import shrink

world = MPI.COMM_WORLD.Dup()
world.Set_errhandler(MPI.ERRORS_RETURN)
rank = world.Get_rank()
world.Barrier()
if rank == 2:
    os._exit(1)
time.sleep(0.5)
world.Revoke()
shrunk = shrink(world, timeout_s=2.0, who=f"process {rank}")
print(f"rank {rank}: the shrink returned with {shrunk.comm.Get_size()}", flush=True)
leave_together(shrunk.comm)
