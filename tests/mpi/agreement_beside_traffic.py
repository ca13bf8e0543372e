"""ULFM's mpiexec -n 4 python agreement_beside_traffic.py ROUNDS: in every round a thread of
each rank runs 3 allreduces of 200 KB on a communicator of its own (as a communication
thread averages a model, or a checkpoint is written beside training) while the main thread
asks runner.comm.ulfm.agree over the world whether every rank's step succeeded (each says
yes, with a flag). No process fails: every answer must be yes with the flag. Open MPI
5.0.11's MPIX_Comm_agree alone answered 0 on every rank in 4-17 of 2,000-6,000 such rounds;
agree asks again."""

import sys
import threading

import numpy as np
from mpi4py import MPI
from survivors import leave_together

from runner.comm.ulfm import agree

world = MPI.COMM_WORLD.Dup()
world.Set_errhandler(MPI.ERRORS_RETURN)
beside = world.Dup()  # the thread's own communicator, as a Communicator's _tensor_comm
rank, rounds = world.Get_rank(), int(sys.argv[1])
model, averaged = np.ones(25_000), np.empty(25_000)


def average_three_times() -> None:
    for _ in range(3):
        beside.Allreduce(model, averaged)


wrong = []
for round_ in range(rounds):
    thread = threading.Thread(target=average_three_times)
    thread.start()
    answer = agree(world, True, flags=1, timeout_s=60, who=f"rank {rank}")
    if answer != 3:
        wrong.append((round_, answer))
    thread.join()
print(f"rank {rank}: {rounds} agreements beside a thread's allreduces, wrong: {wrong}",
      flush=True)
leave_together(world)
