"""ULFM's mpiexec -n 3 python abandoned_agreement.py: ranks 0 and 1 post a stop agreement's
check (a non-blocking allreduce) that rank 2 never joins, and abandon it while it is in
flight, as a recovery does; then rank 2 is killed. The survivors shrink and go on with
collectives of their own, which drive MPI's progress through the abandoned check's failing
schedule. With its request dropped or its communicator freed under it, that schedule
crashes the process (a segfault in NBC_Progress, or "Send error after request freed")."""

import os
import signal
import time

from mpi4py import MPI
from survivors import leave_together

from runner.checkpoint.preemption import StopAgreement
from runner.comm.ulfm import revoke_all, shrink

world = MPI.COMM_WORLD.Dup()
world.Set_errhandler(MPI.ERRORS_RETURN)
rank = world.Get_rank()
stop = StopAgreement(world, rank, timeout_s=60)
world.Barrier()
if rank == 2:  # killed with the survivors' check in flight (an exit is no failure to ULFM)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
assert stop.check(step=1) is None and stop._pending is not None
stop.abandon()
time.sleep(1.5)
revoke_all()
shrunk = shrink(world)
for _ in range(100):  # 2 s of MPI's progress, which runs the abandoned schedule
    total = shrunk.comm.allreduce(1)
    time.sleep(0.02)
print(f"rank {rank}: went on with survivors {shrunk.survivors}, allreduce {total}", flush=True)
leave_together(shrunk.comm)
