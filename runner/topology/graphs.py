"""Fixed circulant topologies: ring, complete, exponential (directed and undirected), and the
bipartite exponential graph of AD-PSGD (docs/algorithms.md, Topologies and spectral gap).

Each is described by its in-neighbour offsets: learner ``i`` mixes ``x_i`` with
``x_{(i + o) mod n}`` for every offset ``o``, with the same weight ``1/(k+1)`` on itself and on
each of its ``k`` *distinct* in-neighbours (an offset that lands on an already listed rank, or
on ``i`` itself, adds nothing). Such a ``W`` is circulant, hence doubly stochastic; it is
symmetric when the offsets are closed under negation.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Topology, circulant_weights, size_error
from .registry import TOPOLOGIES


class Circulant(Topology):
    """``W[(j + o) mod n, j] = 1/(k+1)`` for the ``k`` distinct offsets ``o`` of :meth:`offsets`."""

    def offsets(self, n: int) -> list[int]:
        """In-neighbour offsets for ``n`` learners (may repeat modulo ``n``)."""
        raise NotImplementedError

    def _in_weights(self, rank: int, n: int, step: int) -> dict[int, float]:
        return circulant_weights(rank, n, self.offsets(n))


def powers_of_two_below(n: int) -> list[int]:
    """``[1, 2, 4, ...]``: every ``2^t < n``."""
    out, power = [], 1
    while power < n:
        out.append(power)
        power *= 2
    return out


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@dataclass
class RingConfig(Topology.Config):
    name: str = "ring"


@TOPOLOGIES.register("ring")
class Ring(Circulant):
    """Ring: ``x_i <- (x_{i-1} + x_i + x_{i+1}) / 3`` (``W = (I + S + S^T)/3``, docs/algorithms.md).

    Small rings use uniform weights over self plus *distinct* neighbours: ``n = 3`` is the
    complete graph (all 1/3); ``n = 2`` uses ``W = [[1/2, 1/2], [1/2, 1/2]]`` (the left and
    right neighbour are the same rank, which is sent one message and weighted 1/2, as
    docs/algorithms.md, D-PSGD); ``n = 1`` is ``W = [[1]]``.
    Eigenvalues ``1/3 + (2/3) cos(2 pi j/n)``; gap ``(2/3)(1 - cos(2 pi/n))`` for ``n >= 4``.
    """

    Config = RingConfig

    def offsets(self, n: int) -> list[int]:
        return [-1, 1]


@dataclass
class CompleteConfig(Topology.Config):
    name: str = "complete"


@TOPOLOGIES.register("complete")
class Complete(Circulant):
    """Complete graph: ``W = J``, every weight ``1/n``; every learner gets the exact average.

    Eigenvalues 1 and 0: spectral gap 1, ``rho = 0``.
    """

    Config = CompleteConfig

    def offsets(self, n: int) -> list[int]:
        return list(range(1, n))


@dataclass
class ExponentialConfig(Topology.Config):
    name: str = "exponential"


@TOPOLOGIES.register("exponential")
class Exponential(Circulant):
    """Static directed exponential graph (as in SGP), ``n = 2^m``.

    Learner ``i`` mixes itself with its in-neighbours ``i - 2^t``, ``t = 0..m-1``, weight
    ``1/(m+1)`` each, and sends to ``i + 2^t``. ``W`` is circulant (normal, not symmetric);
    eigenvalues ``(1 + sum_t omega^(j 2^t))/(m+1)`` with ``omega = e^(2 pi i/n)``; spectral gap
    ``2/(m+1)`` (mode ``j = n/2``). ``n`` must be a power of two.
    """

    Config = ExponentialConfig
    directed = True

    def check_size(self, n: int) -> None:
        super().check_size(n)
        if not is_power_of_two(n):
            lower = 1 << (n.bit_length() - 1)
            raise size_error(self, n, "the directed exponential graph needs a power of two",
                             f"use n={lower} or n={2 * lower}, or topology=exponential_undirected")

    def offsets(self, n: int) -> list[int]:
        return [-p for p in powers_of_two_below(n)]

    def out_peers(self, rank: int, n: int, step: int = 0) -> list[int]:
        """Ranks ``rank + 2^t`` (mod ``n``), sorted."""
        self._check_rank(rank, n)
        return sorted({(rank + p) % n for p in powers_of_two_below(n)} - {rank})


@dataclass
class ExponentialUndirectedConfig(Topology.Config):
    name: str = "exponential_undirected"


@TOPOLOGIES.register("exponential_undirected")
class ExponentialUndirected(Circulant):
    """Undirected exponential graph: ``i`` linked to ``i +- 2^t`` for every ``2^t < n``.

    Uniform weights over self plus distinct neighbours (degree 3, 5, 7, 11, 13 for
    ``n = 4, 8, 16, 64, 128``; ``n = 4`` is the complete graph). Symmetric; any ``n`` works.
    """

    Config = ExponentialUndirectedConfig

    def offsets(self, n: int) -> list[int]:
        return [s * p for p in powers_of_two_below(n) for s in (1, -1)]


@dataclass
class BipartiteExponentialConfig(Topology.Config):
    name: str = "bipartite_exponential"


@TOPOLOGIES.register("bipartite_exponential")
class BipartiteExponential(Circulant):
    """AD-PSGD's bipartite exponential graph (docs/algorithms.md, Peer patterns), ``n`` even.

    Ring offsets ``+-1`` and ``+-(2^m + 1)`` for ``m = 1, 2, ...`` while ``2^m + 1 <= n - 1``,
    i.e. 1, 3, 5, 9, 17, 33, 65: all odd, so every edge joins an even (active) and an odd
    (passive) participant (runner/topology/pairing.py); with ``algo=adpsgd`` each active
    cycles through these peers, one per averaging. As a mixing matrix: uniform weights over self
    plus distinct neighbours (symmetric). ``n = 8, 16`` give the complete bipartite graph.
    """

    Config = BipartiteExponentialConfig

    def check_size(self, n: int) -> None:
        super().check_size(n)
        if n % 2:
            raise size_error(self, n, "actives (even) and passives (odd) must pair up",
                             f"use an even n, e.g. n={n + 1}")

    def peer_offsets(self, n: int) -> list[int]:
        """Positive offsets ``1, 3, 5, 9, ...`` (``2^m + 1 <= n - 1``); peers are ``i +- o``."""
        return [1] + [p + 1 for p in powers_of_two_below(n - 1) if p >= 2]

    def offsets(self, n: int) -> list[int]:
        return [s * o for o in self.peer_offsets(n) for s in (1, -1)]
