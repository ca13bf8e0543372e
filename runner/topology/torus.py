"""2-D torus ``p x q`` with weights 1/5 (docs/algorithms.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig

from ..config.section import require
from .base import Topology, size_error, summed_weights
from .registry import TOPOLOGIES


@dataclass
class TorusConfig(Topology.Config):
    name: str = "torus"
    rows: Optional[int] = None  # p; null: the most square grid p x q with q >= p

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.rows is None or self.rows >= 1, f"{prefix}.rows",
                f"must be >= 1 or null, got {self.rows}", f"{prefix}.rows=null")


def square_grid(n: int) -> tuple[int, int]:
    """The most square ``p x q = n`` with ``q >= p`` (``p``: largest divisor ``<= sqrt(n)``)."""
    p = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return p, n // p


@TOPOLOGIES.register("torus")
class Torus(Topology):
    """2-D torus: rank ``r = a*q + b`` sits at row ``a`` (of ``p``), column ``b`` (of ``q``).

    ``x_r <- (x_r + x_up + x_down + x_left + x_right) / 5`` with wrap-around. When a side has
    length 2 its two neighbours are the same rank and their weights add up (2/5); a side of
    length 1 (prime ``n`` with the default grid, or ``rows=1``) makes both neighbours along it
    the rank itself (self weight 3/5). Either way ``W`` stays symmetric doubly stochastic.
    Eigenvalues ``(1 + 2 cos(2 pi a/p) + 2 cos(2 pi b/q))/5``; for ``q >= 4`` the gap is
    ``(2/5)(1 - cos(2 pi/q))`` (about ``4 pi^2/(5 n)`` on a square grid); 2x2 has gap 0.4.
    The default grids for n = 4, 8, 16, 64, 128 are 2x2, 2x4, 4x4, 8x8, 8x16.
    """

    Config = TorusConfig

    def grid(self, n: int) -> tuple[int, int]:
        """``(p, q)``: ``rows`` when given, otherwise :func:`square_grid`."""
        self.check_size(n)
        rows = self.cfg.rows
        return (rows, n // rows) if rows else square_grid(n)

    def check_size(self, n: int) -> None:
        super().check_size(n)
        rows = self.cfg.rows
        if rows is not None and (rows < 1 or n % rows):
            raise size_error(self, n, f"topology.rows={rows} does not divide it",
                             f"topology.rows=null (grid {square_grid(n)[0]}x"
                             f"{square_grid(n)[1]}) or a divisor of {n}", key="topology.rows")

    def _in_weights(self, rank: int, n: int, step: int) -> dict[int, float]:
        p, q = self.grid(n)
        a, b = divmod(rank, q)
        cells = [(a, b), (a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)]
        return summed_weights(((r % p) * q + c % q, 0.2) for r, c in cells)
