"""ULFM's mpiexec -n 3 python declare_failed.py: ranks 0 and 1 declare rank 2 failed while it
is alive but silent (as behind a cut link, which no MPI reports), from a thread, while their
main thread waits on it: the wait fails as for a dead peer, and the shrink leaves 0 and 1."""

import os
import threading
import time

from mpi4py import MPI
from survivors import leave_together

from runner.comm.ulfm import declare_failed, shrink

world = MPI.COMM_WORLD.Dup()
world.Set_errhandler(MPI.ERRORS_RETURN)
rank = world.Get_rank()
world.Barrier()
if rank == 2:  # silent: no message, no exit, until the others are done
    time.sleep(3)
    os._exit(0)
declared = []
declaring = threading.Timer(0.5, lambda: declared.append(declare_failed([2])))
declaring.start()
started = time.monotonic()
try:
    world.recv(source=2)
    print(f"rank {rank}: got a message from rank 2", flush=True)
except MPI.Exception as ex:
    error = MPI.Get_error_string(ex.Get_error_class())
    print(f"rank {rank}: waiting on rank 2 failed with {error} after "
          f"{time.monotonic() - started:.1f} s", flush=True)
# Every survivor declares (the launcher tells them all): on a loaded machine the other
# rank's declaration and revoke can end this wait before this rank's own timer fires.
declaring.join()
world.Revoke()
shrunk = shrink(world)
total = shrunk.comm.allreduce(1)
print(f"rank {rank}: declared {declared}, survivors {shrunk.survivors}, lost {shrunk.lost}, "
      f"allreduce {total}", flush=True)
leave_together(shrunk.comm)
