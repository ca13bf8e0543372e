"""Who am I: rank, size, local rank and node, read once from MPI.

Nodes are real (ranks that share memory, found with ``MPI_Comm_split_type``) unless
``procs_per_node`` is given, in which case consecutive ranks form emulated nodes: that is how a
laptop or a CI machine runs the hierarchical algorithms. Super learners of hadpsgd are nodes.

Under SLURM (``launcher=slurm``) ``procs_per_node`` is the number of tasks per node, so the
consecutive groups are the SLURM nodes; :func:`placement_problem` checks that against where
the ranks really run (host names, and SLURM's task variables when srun started the ranks), so
that a super learner never silently spans two machines.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int  # index within the node
    local_size: int  # ranks in this node
    node: int
    num_nodes: int
    # This rank's index among the ranks on its machine, and how many run there: emulated
    # nodes can share a machine, and GPUs are dealt per machine, not per node.
    host_rank: int = 0
    host_size: int = 1
    # A spare of an elastic job (launcher.spares), waiting alone until it replaces a lost
    # learner: it writes none of the run's records.
    spare: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0 and not self.spare

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


def mpi_environment(allreduce: str) -> dict[str, str]:
    """The MPI library's settings for ``comm.allreduce``, as the environment variables that
    MPICH and Open MPI read when MPI starts."""
    if allreduce != "ring":
        return {}
    return {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring",  # MPICH
            "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",  # Open MPI: algorithm 4 is its ring
            "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}


def emulated_node(rank: int, size: int, procs_per_node: int) -> tuple[int, int]:
    """(node, num_nodes) when consecutive groups of ``procs_per_node`` ranks form a node; the
    last node is smaller when ``procs_per_node`` does not divide ``size`` (algorithms that
    need equal nodes check that before ranks start)."""
    if procs_per_node < 1:
        raise ValueError(f"procs_per_node must be >= 1, got {procs_per_node}")
    return rank // procs_per_node, -(-size // procs_per_node)


def detect_world(comm, procs_per_node: int | None, nodes: Sequence[int] | None = None
                 ) -> tuple[World, object]:
    """Compute this rank's World from an MPI communicator; return it and the node communicator.
    ``nodes``: each rank's node as launched (an elastic job's survivors keep their nodes,
    numbered again in the order of their lowest rank)."""
    MPI = mpi()
    rank, size = comm.Get_rank(), comm.Get_size()
    if nodes is not None:
        order = list(dict.fromkeys(nodes))
        node, num_nodes = order.index(nodes[rank]), len(order)
        node_comm = comm.Split(color=node, key=rank)
    elif procs_per_node:
        node, num_nodes = emulated_node(rank, size, procs_per_node)
        node_comm = comm.Split(color=node, key=rank)
    else:
        node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        # Number the nodes by their lowest world rank so that node ids are consistent.
        leader = node_comm.allreduce(rank, op=MPI.MIN)
        leaders = sorted(set(comm.allgather(leader)))
        node, num_nodes = leaders.index(leader), len(leaders)
    local_rank, local_size = node_comm.Get_rank(), node_comm.Get_size()
    placements = comm.allgather(Placement(node, local_rank, MPI.Get_processor_name(),
                                          slurm_task(os.environ, rank, size)))
    same_host = [r for r, place in enumerate(placements) if place.host == placements[rank].host]
    world = World(rank=rank, size=size, local_rank=local_rank, local_size=local_size, node=node,
                  num_nodes=num_nodes, host_rank=same_host.index(rank), host_size=len(same_host))
    problem = placement_problem(placements, procs_per_node)
    if problem:
        from ..errors import UserError  # every rank sees the same list and raises the same

        raise UserError(problem, "start procs_per_node consecutive ranks on each node (SLURM's "
                        "default block distribution, srun -m block), or set "
                        "launcher.procs_per_node=null to group ranks by real node")
    return world, node_comm


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its node and local rank as computed here, its host, and SLURM's
    view of it, ``(node id, local id)``, when srun started it."""

    node: int
    local_rank: int
    host: str
    slurm: tuple[int, int] | None


def slurm_task(env: Mapping[str, str], rank: int, size: int) -> tuple[int, int] | None:
    """``(SLURM_NODEID, SLURM_LOCALID)`` when srun started this very rank (SLURM's task id is
    the MPI rank and the step has as many tasks as the job has ranks); None otherwise. Under
    mpiexec inside an allocation the variables describe mpiexec's proxy, not the rank."""
    try:
        task, tasks = int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"])
        slurm_node, slurm_local = int(env["SLURM_NODEID"]), int(env["SLURM_LOCALID"])
    except (KeyError, ValueError):
        return None
    return (slurm_node, slurm_local) if (task, tasks) == (rank, size) else None


def placement_problem(placements: Sequence[Placement], procs_per_node: int | None) -> str | None:
    """Why the nodes computed here are not the machines the ranks run on, or None.

    Emulated nodes may share a machine (that is what emulation is for) but one node must not
    span two. When srun started every rank, SLURM's node and local ids must also agree with
    ours wherever a node is a whole SLURM node, which is the case under ``launcher=slurm``.
    """
    by_node: dict[int, list[int]] = {}
    for rank, place in enumerate(placements):
        by_node.setdefault(place.node, []).append(rank)
    for node, ranks in sorted(by_node.items()):
        hosts = sorted({placements[r].host for r in ranks})
        if len(hosts) > 1:
            return (f"ranks {ranks[0]}-{ranks[-1]} form node {node} (launcher.procs_per_node="
                    f"{procs_per_node}) but run on several machines ({', '.join(hosts)})")
    slurm = [place.slurm for place in placements]
    if any(ids is None for ids in slurm):
        return None
    for rank, place in enumerate(placements):
        slurm_node, slurm_local = place.slurm  # type: ignore[misc]
        same_slurm_node = [r for r, ids in enumerate(slurm) if ids[0] == slurm_node]
        if same_slurm_node != by_node[place.node]:
            continue  # emulated nodes inside one SLURM node: nothing to compare
        if slurm_local != place.local_rank:
            return (f"rank {rank} is local rank {place.local_rank} of node {place.node} here but "
                    f"SLURM_LOCALID={slurm_local} (SLURM_NODEID={slurm_node})")
    return None
