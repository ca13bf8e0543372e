"""Run under mpiexec -n 2 on a machine with one CUDA GPU: both ranks share it, so tensors go
over MPI through pinned host memory. Checks the Communicator's collectives and AD-PSGD's
pairwise averaging on CUDA tensors, and that the staging is counted. Exits non-zero on
failure."""

import threading
import time

import torch

from runner.comm.communicator import Communicator, tensor_backend
from runner.comm.pairwise import PairwiseAverager
from runner.comm.world import detect_world
from runner.train.compute_path import resolve_device

from harness import run_on_ranks


def checks(world_mpi):
    rank, size = world_mpi.Get_rank(), world_mpi.Get_size()
    world, _ = detect_world(world_mpi, procs_per_node=1)  # two emulated nodes, one machine
    assert (world.host_rank, world.host_size) == (rank, size), world
    device = resolve_device("auto", world.host_rank)
    assert device == torch.device("cuda", 0), device  # one GPU: dealt to both ranks
    backend = tensor_backend("auto", device.type, world.host_size, torch.cuda.device_count())
    assert backend == "mpi", backend
    comm = Communicator(world_mpi, backend)

    base = torch.arange(100_000, dtype=torch.float32, device=device)
    t = base * (rank + 1)
    comm.allreduce_(t, "sum")
    assert t.is_cuda and torch.equal(t, base * size * (size + 1) / 2), "allreduce on a GPU"
    handles = [comm.iallreduce_(torch.full((50_000,), float(rank + 10 * i), device=device),
                                "mean") for i in range(4)]
    for i, handle in enumerate(handles):
        assert torch.allclose(handle.wait(), torch.full((50_000,), (size - 1) / 2 + 10 * i,
                                                        device=device)), f"iallreduce {i}"
    b = torch.full((33,), float(rank), device=device)
    comm.broadcast_(b, root=1)
    assert torch.equal(b, torch.full((33,), 1.0, device=device)), "broadcast"
    peer = 1 - rank
    send = torch.full((1000,), float(rank), device=device)
    got = {peer: torch.empty(1000, device=device)}
    comm.exchange_(send, [peer], got).wait()
    assert torch.equal(got[peer], torch.full((1000,), float(peer), device=device)), "exchange"
    staged = comm.staging_record()
    assert staged is not None and staged["megabytes"] > 0 and staged["ms_per_mb"] > 0, staged
    comm.close()

    # AD-PSGD: rank 0 active, rank 1 passive, a CUDA model of two flat buffers.
    x = [torch.full((200_000,), float(rank), device=device),
         torch.full((3,), 10.0 * rank, device=device)]
    total = [sum(float(value) for value in world_mpi.allgather(buf.sum().item())) for buf in x]
    averager = PairwiseAverager(world_mpi, x, threading.Lock(), is_active=rank == 0,
                                next_peer=lambda k: 1, timeout_s=60.0)
    assert averager.staged and all(s.is_pinned() for s in averager.snapshots)
    for _ in range(5):
        averager.tick(1)
        time.sleep(0.05)
    averager.stop(world_mpi.Barrier)
    assert averager.exchanges > 0
    after = [sum(float(value) for value in world_mpi.allgather(buf.sum().item())) for buf in x]
    for before_sum, after_sum in zip(total, after):
        assert abs(before_sum - after_sum) <= 1e-3 * max(1.0, abs(before_sum)), (total, after)
    # Only exchanges happened (no gradients): every one averages the pair exactly.
    assert torch.allclose(x[0], torch.full_like(x[0], 0.5)), x[0][:4]
    assert averager.staging_s > 0 and averager.staged_bytes > 0
    ms_per_mb = 1000 * averager.staging_s / (averager.staged_bytes / 2**20)
    return (f"{averager.exchanges} exchanges staged at {ms_per_mb:.3f} ms/MB; collectives "
            f"staged at {staged['ms_per_mb']:.3f} ms/MB")


run_on_ranks(checks)
