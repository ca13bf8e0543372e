"""Randomized ring: a fresh ring order every step (docs/algorithms.md, Randomized ring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from omegaconf import DictConfig

from ..config.section import require
from .base import Topology
from .graphs import Ring
from .registry import TOPOLOGIES


@dataclass
class RandomRingConfig(Topology.Config):
    name: str = "random_ring"
    seed: Optional[int] = None  # permutation seed; null: the run's top-level seed

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.seed is None or self.seed >= 0, f"{prefix}.seed",
                f"must be >= 0 or null, got {self.seed}", f"{prefix}.seed=null")


def permutation_average(m: np.ndarray) -> np.ndarray:
    """``E[P^T M P]`` over uniformly random permutation matrices ``P``.

    Every diagonal entry becomes the mean of ``diag(M)`` and every off-diagonal entry the mean
    of the off-diagonal entries of ``M``.
    """
    n = m.shape[0]
    if n == 1:
        return m.astype(np.float64, copy=True)
    trace = float(np.trace(m))
    off = (float(m.sum()) - trace) / (n * (n - 1))
    return np.full((n, n), off) + (trace / n - off) * np.eye(n)


@TOPOLOGIES.register("random_ring")
class RandomRing(Topology):
    """At step ``k`` every rank computes the same ``pi_k`` from ``(seed, k)`` (no messages):
    ``pi_k = numpy.random.default_rng([seed, k]).permutation(n)``, ranks sit on a ring in that
    order and average with their two ring neighbours, weights 1/3::

        pos = index of i in pi_k; left = pi_k[pos - 1]; right = pi_k[(pos + 1) mod n]
        x_i <- (x_left + x_i + x_right) / 3            W_k = P_k^T W_ring P_k

    ``n <= 3`` follows :class:`~runner.topology.graphs.Ring` (``n = 2``: weights 1/2).
    Closed forms (uniform random permutation, ``n >= 3``)::

        E[W]       = (1/3) I + (2/(3(n-1))) (1 1^T - I)
        E[W^T W]   = (1/3) I + (2/(3(n-1))) (1 1^T - I)
        rho        = 1/3 - 2/(3(n-1)),   1 - rho = 2n/(3(n-1)) -> 2/3

    (both are :func:`permutation_average` of the fixed ring's ``W`` and ``W^T W``).
    """

    Config = RandomRingConfig
    time_varying = True

    def __init__(self, cfg: Any = None, seed: int = 0):
        super().__init__(cfg, seed)
        own = self.cfg.seed is not None
        if own:
            self.seed = int(self.cfg.seed)
        require(self.seed >= 0, "topology.seed" if own else "seed",
                f"random_ring needs a seed >= 0, got {self.seed}",
                "topology.seed=0" if own else "seed=0")
        self._ring = Ring()
        self._cached: tuple[int, int, np.ndarray, np.ndarray] | None = None

    def permutation(self, n: int, step: int) -> np.ndarray:
        """``pi_step``: ring position ``a`` holds rank ``pi_step[a]``."""
        return self._order(n, step)[0]

    def _order(self, n: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        cached = self._cached  # read once: safe if a communication thread asks concurrently
        if cached is None or cached[:2] != (n, step):
            perm = np.random.default_rng([self.seed, step]).permutation(n)
            position = np.empty(n, dtype=np.int64)
            position[perm] = np.arange(n)
            cached = self._cached = (n, step, perm, position)
        return cached[2], cached[3]

    def neighbours(self, rank: int, n: int, step: int = 0) -> tuple[int, int]:
        """``(left, right)`` of ``rank`` on the ring of ``step`` (equal for ``n = 2``)."""
        self._check_rank(rank, n)
        perm, position = self._order(n, step)
        pos = position[rank]
        return int(perm[(pos - 1) % n]), int(perm[(pos + 1) % n])

    def _in_weights(self, rank: int, n: int, step: int) -> dict[int, float]:
        perm, position = self._order(n, step)
        at_positions = self._ring.in_weights(int(position[rank]), n)
        return dict(sorted((int(perm[a]), w) for a, w in at_positions.items()))

    def expected_mixing(self, n: int) -> np.ndarray:
        return permutation_average(self._ring.mixing_matrix(n))

    def expected_gram(self, n: int) -> np.ndarray:
        w = self._ring.mixing_matrix(n)
        return permutation_average(w.T @ w)
