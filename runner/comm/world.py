"""Who am I: rank, size, local rank and node, read once from MPI.

Nodes are real (ranks that share memory, found with ``MPI_Comm_split_type``) unless
``procs_per_node`` is given, in which case consecutive ranks form emulated nodes: that is how a
laptop or a CI machine runs the hierarchical algorithms. Super learners of hadpsgd are nodes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int  # index within the node
    local_size: int  # ranks in this node
    node: int
    num_nodes: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def single(cls) -> World:
        return cls(rank=0, size=1, local_rank=0, local_size=1, node=0, num_nodes=1)


def mpi():
    """Import mpi4py's MPI module (initialises MPI with MPI_THREAD_MULTIPLE on first use)."""
    import mpi4py

    mpi4py.rc.thread_level = "multiple"  # communication threads call MPI concurrently
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError("the MPI library does not provide MPI_THREAD_MULTIPLE, which the "
                           "communication threads need; use an MPI built with thread support")
    return MPI


def emulated_node(rank: int, size: int, procs_per_node: int) -> tuple[int, int]:
    """(node, num_nodes) when consecutive groups of ``procs_per_node`` ranks form a node; the
    last node is smaller when ``procs_per_node`` does not divide ``size`` (algorithms that
    need equal nodes check that before ranks start)."""
    if procs_per_node < 1:
        raise ValueError(f"procs_per_node must be >= 1, got {procs_per_node}")
    return rank // procs_per_node, -(-size // procs_per_node)


def detect_world(comm, procs_per_node: int | None) -> tuple[World, object]:
    """Compute this rank's World from an MPI communicator; return it and the node communicator."""
    MPI = mpi()
    rank, size = comm.Get_rank(), comm.Get_size()
    if procs_per_node:
        node, num_nodes = emulated_node(rank, size, procs_per_node)
        node_comm = comm.Split(color=node, key=rank)
    else:
        node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        # Number the nodes by their lowest world rank so that node ids are consistent.
        leader = node_comm.allreduce(rank, op=MPI.MIN)
        leaders = sorted(set(comm.allgather(leader)))
        node, num_nodes = leaders.index(leader), len(leaders)
    world = World(rank=rank, size=size, local_rank=node_comm.Get_rank(),
                  local_size=node_comm.Get_size(), node=node, num_nodes=num_nodes)
    return world, node_comm
