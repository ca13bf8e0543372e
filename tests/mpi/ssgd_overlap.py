"""Run under mpiexec -n 2: SSGD launches its bucket allreduces while backward is still running
(every bucket but the last, at every step) and they finish there too (at least one, in the
best of a few steps: on a machine whose cores other jobs share, a step's communication thread
may get no CPU until backward is over), and the averaged gradient equals the mean of the
ranks' gradients."""

import time
from types import SimpleNamespace

import torch
from torch import nn

from runner.algos import TrainContext
from runner.algos.ssgd import SSGD
from runner.comm.communicator import Communicator
from runner.comm.seat import Seat
from runner.comm.world import detect_world, mpi
from runner.runlog.timers import Timers

from harness import run_on_ranks

STEPS = 3


def checks(world_mpi):
    torch.set_num_threads(1)
    world, _ = detect_world(world_mpi, procs_per_node=None)
    comm = Communicator(world_mpi, "mpi")
    # The keys SSGD reads: its bucket size, and the dtype gradients travel in (their own).
    cfg = SimpleNamespace(comm=SimpleNamespace(bucket_mb=0.25, exchange_dtype=None),
                          trainer=SimpleNamespace(dtype="float32"))
    ctx = TrainContext(cfg=cfg, seat=Seat(world, comm, comm), device=torch.device("cpu"),
                       timers=Timers())
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(12)])
    algo = SSGD(None, ctx)
    algo.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))

    launched, finished = [], []
    launch = comm.iallreduce_

    def recording_iallreduce(tensor, op="sum", wire=None):
        launched.append(time.perf_counter())
        handle = launch(tensor, op, wire)
        handle._future.add_done_callback(lambda _: finished.append(time.perf_counter()))
        return handle

    comm.iallreduce_ = recording_iallreduce
    torch.manual_seed(100 + world.rank)
    x = torch.randn(4096, 256)  # backward long enough (~10 ms a layer) to overlap with
    buckets = len(algo.buckets.buckets)
    early = []  # per step: reductions finished before its backward ended
    for step in range(1, STEPS + 1):
        launched.clear()
        finished.clear()
        model.zero_grad(set_to_none=False)
        algo.before_backward(step)
        loss = model(x).square().mean()
        world_mpi.Barrier()  # start backward together: skew between ranks is not measured
        loss.backward()
        backward_end = time.perf_counter()
        algo.after_backward(step)
        assert len(finished) == len(launched) == buckets > 3
        assert sum(t < backward_end for t in launched) >= buckets - 1, \
            f"step {step}: reductions launched only after backward"
        early.append(sum(t < backward_end for t in finished))
    assert max(early) >= 1, f"no bucket reduction finished before backward ended: {early}"

    # The averaged gradient is the mean of every rank's local gradient.
    averaged = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])
    model.zero_grad(set_to_none=False)
    model(x).square().mean().backward()
    total = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    world_mpi.Allreduce(mpi().IN_PLACE, total.numpy(), op=mpi().SUM)
    assert torch.allclose(averaged, total / world.size, atol=1e-6)
    comm.close()
    return f"{early} of {buckets} bucket reductions done before backward ended, per step"


run_on_ranks(checks)
