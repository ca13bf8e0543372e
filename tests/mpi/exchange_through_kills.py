"""ULFM's mpiexec -n 6 python exchange_through_kills.py: the ranks exchange 40 KB tensors
with both ring neighbours through a Communicator (runner/comm/communicator.py), as CHOCO and
D-PSGD do, while the last rank kills itself at a moment that differs from round to round;
the survivors revoke, shrink and go on, three rounds in all. A message that size goes by
rendezvous, and a survivor whose exchange MPI had freed with the failure was aborted by Open
MPI when the revoke then failed it once more ("Send error after request freed", in about
one round in three): its peers then waited in the next shrink forever."""

import os
import random
import signal
import time

import torch
from mpi4py import MPI
from survivors import leave_together

from runner.comm.communicator import Communicator
from runner.comm.ulfm import revoke_all, shrink

ROUNDS = 3
world = MPI.COMM_WORLD.Dup()
world.Set_errhandler(MPI.ERRORS_RETURN)
me = world.Get_rank()
comm = world
for round_ in range(ROUNDS):
    exchange = Communicator(comm, timeout_s=60)
    rank, size = exchange.rank, exchange.size
    send = torch.full((10_000,), float(me))
    inbox = {peer: torch.empty(10_000) for peer in {(rank - 1) % size, (rank + 1) % size}}
    dies_at = time.monotonic() + random.Random(round_).uniform(0.2, 0.6)
    steps = 0
    try:
        while True:
            if rank == size - 1 and time.monotonic() > dies_at:
                os.kill(os.getpid(), signal.SIGKILL)
            exchange.exchange_(send, list(inbox), inbox).wait()
            steps += 1
    except MPI.Exception:
        pass
    revoke_all()
    shrunk = shrink(comm)
    exchange.close()
    comm = shrunk.comm
    print(f"rank {me}: round {round_}: {steps} exchanges, then went on with "
          f"{comm.Get_size()}", flush=True)
print(f"rank {me}: survived {ROUNDS} losses", flush=True)
leave_together(comm)
