"""Run under mpiexec -n N (N even): python comm_checks.py {mpi|gloo}. Exits non-zero on failure."""

import sys

import numpy as np
import torch

from runner.comm.buffers import flatten, flatten_parameters, unflatten
from runner.comm.communicator import (
    Communicator,
    init_torch_distributed,
    shutdown_torch_distributed,
    torch_subgroups,
)
from runner.comm.ulfm import GarbledMessage, is_mpi_error
from runner.comm.world import detect_world
from runner.train.data import ShardedBatches

from harness import run_on_ranks

backend = sys.argv[1]


class Undecodable:
    """Pickles; unpickling it raises ValueError, as garbled bytes do."""

    def __reduce__(self):
        return int, ("not a number",)


def checks(world_mpi):
    rank, size = world_mpi.Get_rank(), world_mpi.Get_size()
    world, node_mpi = detect_world(world_mpi, procs_per_node=2)
    assert (world.rank, world.size) == (rank, size)
    assert (world.node, world.local_rank, world.local_size) == (rank // 2, rank % 2, 2)
    assert world.num_nodes == size // 2
    node_group = None
    if backend == "gloo":
        init_torch_distributed(world_mpi, "gloo")
        node_group = torch_subgroups([[2 * s, 2 * s + 1] for s in range(size // 2)])[world.node]
    comm = Communicator(world_mpi, backend)
    node = Communicator(node_mpi, backend, torch_group=node_group, name="node")

    base = torch.arange(1000, dtype=torch.float32)
    t = base * (rank + 1)
    comm.allreduce_(t, "sum")
    assert torch.equal(t, base * size * (size + 1) / 2), "allreduce sum"

    # Several reductions in flight on the communication thread while the main thread runs its
    # own control collective: results must be right and in submission order.
    handles = [comm.iallreduce_(torch.full((50_000,), float(rank + 10 * i)), "mean")
               for i in range(5)]
    assert comm.allreduce_numbers([rank, 1.0]).tolist() == [size * (size - 1) / 2, size]
    for i, h in enumerate(handles):
        assert torch.allclose(h.wait(), torch.full((50_000,), (size - 1) / 2 + 10 * i))

    local = torch.full((7,), float(rank))
    node.allreduce_(local, "mean")
    assert torch.allclose(local, torch.full((7,), 2 * world.node + 0.5)), "node mean"

    b = torch.full((33,), float(rank))
    comm.broadcast_(b, root=size - 1)
    assert torch.equal(b, torch.full((33,), float(size - 1))), "broadcast"
    nb = torch.full((5,), float(rank))
    node.broadcast_(nb, root=1)
    assert torch.equal(nb, torch.full((5,), float(2 * world.node + 1))), "node broadcast"

    # Ring exchange: send to both neighbours, receive from both, all posted at once (with 2
    # ranks both neighbours are the same rank).
    left, right = (rank - 1) % size, (rank + 1) % size
    neighbours = sorted({left, right})
    mine = torch.full((1000,), float(rank))
    received = {peer: torch.empty(1000) for peer in neighbours}
    comm.exchange_(mine, neighbours, received).wait()
    assert torch.equal(received[left], torch.full((1000,), float(left))), "exchange left"
    assert torch.equal(received[right], torch.full((1000,), float(right))), "exchange right"
    # Directed: send to the right only, receive from the left only; twice in a row keeps
    # the order.
    first = comm.exchange_(torch.full((8,), 1.0 + rank), [right], {left: torch.empty(8)})
    second = comm.exchange_(torch.full((8,), -1.0 - rank), [right], {left: torch.empty(8)})
    assert torch.equal(first.wait()[left], torch.full((8,), 1.0 + left))
    assert torch.equal(second.wait()[left], torch.full((8,), -1.0 - left))
    # Inside a node, peers are node-local ranks.
    pair = {1 - world.local_rank: torch.empty(3)}
    node.exchange_(torch.full((3,), float(rank)), [1 - world.local_rank], pair).wait()
    assert torch.equal(pair[1 - world.local_rank], torch.full((3,), float(rank ^ 1)))

    lower_precision_checks(comm, rank, size)

    # Shards: what every rank draws in an epoch covers the dataset exactly once.
    for n_items, batch in ((1438, 32), (101, 8)):
        shards = ShardedBatches(n_items, rank, size, batch, seed=7)
        mine = np.concatenate(shards.epoch_batches(2)).tolist()
        everything = sorted(i for part in world_mpi.allgather(mine) for i in part)
        assert everything == list(range(n_items)), "shards do not cover the data once"

    # A model's parameters as one flat buffer: one message reduces the whole model exactly
    # like reducing every tensor on its own.
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    expected = [p.detach().clone() for p in model.parameters()]
    for e in expected:
        comm.allreduce_(e, "sum")
    (flat,) = flatten_parameters(model.parameters())
    comm.allreduce_(flat, "sum")
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p, e, atol=1e-6), "flat allreduce"
    packed = flatten([p.detach() for p in model.parameters()])
    for p, view in zip(model.parameters(), unflatten(packed, list(model.parameters()))):
        assert torch.equal(p, view)
    assert comm.busy_s > 0

    # A result that does not unpickle (what a peer dying inside a collective may leave under
    # ULFM): a GarbledMessage, which elastic training takes for an MPI error; the
    # communicator goes on working.
    assert comm.allgather_objects({"rank": rank}) == [{"rank": r} for r in range(size)]
    for collective in (comm.allgather_objects, comm.bcast_object):
        try:
            collective(Undecodable() if rank == 0 else rank)
        except GarbledMessage as ex:
            assert is_mpi_error(ex) and "did not unpickle (ValueError" in str(ex), ex
        else:
            raise AssertionError(f"{collective.__name__}: no GarbledMessage")
    assert comm.allgather_objects(rank) == list(range(size))
    comm.close()
    node.close()
    shutdown_torch_distributed()
    return f"comm checks passed ({backend})"


def lower_precision_checks(comm, rank, size):
    """comm.exchange_dtype's paths: values rounded once on the wire, received into float64
    buffers; the ring allreduce ends with the same numbers on every rank, within the
    rounding of n partial sums of the exact mean; bytes counted as the wire dtype's."""
    torch.manual_seed(100 + rank)
    for wire, unit in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
        before = comm.traffic.total()
        mine = torch.randn(1001, dtype=torch.float64)
        left, right = (rank - 1) % size, (rank + 1) % size
        received = {left: torch.empty(1001, dtype=torch.float64)}
        comm.exchange_(mine, [right], received, wire=wire).wait()
        theirs = comm.exchange_(mine, [right], {left: torch.empty(1001, dtype=torch.float64)}
                                ).wait()[left]  # full precision, for the error
        assert received[left].dtype == torch.float64
        assert torch.equal(received[left], theirs.to(wire).to(torch.float64)), "rounded once"
        # Relative rounding of at most the unit (float16's subnormals: an absolute 2^-25).
        error = (received[left] - theirs).abs()
        assert bool((error <= unit * theirs.abs() + 2.0**-25).all()), float(error.max())
        exact = mine.clone()
        comm.allreduce_(exact, "mean")
        rounded = mine.clone()
        comm.allreduce_(rounded, "mean", wire=wire)
        everyone = comm.mpi_comm.allgather(rounded.numpy().tobytes())
        assert len(set(everyone)) == 1, "the ranks' results differ"
        scale = float(comm.allreduce_(mine.abs().clone(), "mean").max())
        assert float((rounded - exact).abs().max()) <= 2 * size * unit * scale, (
            float((rounded - exact).abs().max()))
        # Two exchanges (one at 2 bytes a value, one at 8) and the ring's 2 (n - 1) / n.
        sent = comm.traffic.total() - before
        assert sent == 1001 * 2 + 1001 * 8 + 2 * 2 * (size - 1) * 1001 // size + 2 * (
            2 * (size - 1) * 1001 * 8 // size), sent
    # Sizes that do not divide into n chunks, down to fewer values than ranks.
    for count in (1, size - 1, 7):
        t = torch.full((count,), float(rank + 1))
        comm.allreduce_(t, "sum", wire=torch.bfloat16)
        assert torch.equal(t, torch.full((count,), size * (size + 1) / 2)), count


run_on_ranks(checks)
