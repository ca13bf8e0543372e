"""Who averages with whom in AD-PSGD's pairwise gossip (docs/algorithms.md, Peer patterns).

Participants (ranks for adpsgd, super learners for hadpsgd) have one of two roles, and this
module holds the project's one convention for them: **even participants are active** (they
start averagings), **odd ones passive** (they only answer). Every averaging joins an active
and a passive, so every wait goes from an active to a passive and no cycle of waits can form.

An active's peers are its passive neighbours in a topology's graph (``topology=``): the ring
gives the right and left neighbour, ``bipartite_exponential`` the log-hop peers at ring
offsets +-1, +-3, +-5, +-9, ... of the AD-PSGD paper, ``complete`` every passive. Edges that
join two participants of the same role are not used. Peers are listed by ring distance,
clockwise first (+1, -1, +3, -3, ...): ``pattern=fixed`` cycles through that list, one peer
per averaging, and ``pattern=random`` draws from it uniformly.

One averaging of a uniformly random active-passive edge has ``E[W] = I - Lap/(2|E|)``, so
:func:`pairwise_rho` is AD-PSGD's per-event ``rho`` for the graph (docs/algorithms.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import ConfigError
from .base import Topology
from .spectral import pairwise_rho as rho_of_edges


def is_active(index: int) -> bool:
    """Even participants start averagings; odd ones answer."""
    return index % 2 == 0


def _ring_order(active: int, peer: int, n: int) -> tuple[int, bool]:
    clockwise = (peer - active) % n
    return min(clockwise, n - clockwise), clockwise > n - clockwise


def active_passive_edges(topology: Topology, n: int) -> list[tuple[int, int]]:
    """The topology's undirected edges ``(i, j)``, ``i < j``, that join an active and a
    passive (raises ConfigError for a graph AD-PSGD cannot draw peers from)."""
    topology.check_size(n)
    if topology.time_varying:
        raise ConfigError("topology", f"{topology.name} draws a new graph every step; AD-PSGD "
                          "pairs over a fixed graph", "topology=ring (or bipartite_exponential, "
                          "complete); for random peers use algo.pattern=random")
    return [(i, j) for i, j in topology.pairwise_edges(n) if is_active(i) != is_active(j)]


def passive_peers(topology: Topology, n: int) -> dict[int, list[int]]:
    """Every active's passive neighbours in ring order (see the module docstring)."""
    peers: dict[int, list[int]] = {i: [] for i in range(n) if is_active(i)}
    for i, j in active_passive_edges(topology, n):
        active, passive = (i, j) if is_active(i) else (j, i)
        peers[active].append(passive)
    for active, listed in peers.items():
        if not listed and n > 1:
            raise ConfigError("topology", f"{topology.name} gives active participant {active} "
                              f"of {n} no passive neighbour (AD-PSGD pairs even with odd "
                              "participants)", "topology=ring or topology=bipartite_exponential")
        listed.sort(key=lambda p, a=active: _ring_order(a, p, n))
    groups = _components(n, [(a, p) for a, listed in peers.items() for p in listed])
    if groups > 1:  # e.g. a torus with rows of even length: its vertical edges join equals
        raise ConfigError("topology", f"{topology.name}'s edges between actives (even) and "
                          f"passives (odd) split the {n} participants into {groups} groups "
                          "that never average with each other", "topology=ring or "
                          "topology=bipartite_exponential")
    return peers


def _components(n: int, edges: list[tuple[int, int]]) -> int:
    """How many connected groups ``edges`` make of ``n`` vertices."""
    root = list(range(n))

    def find(v: int) -> int:
        while root[v] != v:
            root[v] = root[root[v]]
            v = root[v]
        return v

    for i, j in edges:
        root[find(i)] = find(j)
    return len({find(v) for v in range(n)})


def peer_schedule(pattern: str, peers: list[int], seed: int, active: int
                  ) -> Callable[[int], int]:
    """The passive of this active's k-th averaging: a function of k alone, so that a resumed
    run continues the schedule where the checkpoint left it."""
    if pattern == "fixed":
        return lambda k: peers[k % len(peers)]
    return lambda k: peers[int(np.random.default_rng([seed, active, k]).integers(len(peers)))]


def pairwise_rho(topology: Topology, n: int) -> float:
    """AD-PSGD's per-event rho: one averaging on a uniformly random active-passive edge."""
    return rho_of_edges(active_passive_edges(topology, n), n)
