"""The topology interface: who mixes with whom, and with which weights (docs/algorithms.md).

Convention (docs/algorithms.md): one averaging step is ``X <- X W`` with ``X = [x_0 .. x_{n-1}]``,
so learner ``j`` becomes ``sum_i W[i, j] x_i``. Column ``j`` of ``W`` holds the weights learner
``j`` mixes with (its *in-weights*); row ``i`` lists the learners that need ``x_i`` (its
*out-peers*). Every ``W`` built here is doubly stochastic (``W >= 0``, rows and columns sum to 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from ..config.section import Section, require
from ..errors import ConfigError


@dataclass
class TopologyConfig(Section):
    """The schema every topology's extends: its name (and, per topology, its parameters)."""

    name: str = "ring"


def coerce_config(schema: type[TopologyConfig], cfg: Any) -> TopologyConfig:
    """Return ``cfg`` as an instance of ``schema``.

    Accepts ``None`` (defaults), an instance of ``schema``, or a mapping such as the validated
    ``topology`` DictConfig section; unknown keys are a ConfigError naming ``topology.KEY``.
    """
    if isinstance(cfg, schema):
        return cfg
    if cfg is None:
        return schema()
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    elif not isinstance(cfg, Mapping):  # another dataclass, e.g. the base TopologyConfig
        cfg = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    values = dict(cfg)
    known = {f.name for f in fields(schema)}
    for key in values:
        require(key in known, f"topology.{key}", "unknown key",
                f"remove it; known keys: {', '.join(sorted(known))}")
    return schema(**values)


def uniform_weights(rank: int, peers: Iterable[int]) -> dict[int, float]:
    """Weight ``1/(k+1)`` on ``rank`` and on each of its ``k`` distinct peers (self excluded)."""
    distinct = {int(p) for p in peers} - {rank}
    weight = 1.0 / (len(distinct) + 1)
    return {peer: weight for peer in sorted(distinct | {rank})}


def summed_weights(pairs: Iterable[tuple[int, float]]) -> dict[int, float]:
    """Add up the weights of repeated peers (``[(3, .2), (3, .2)]`` gives ``{3: .4}``)."""
    total: dict[int, float] = {}
    for peer, weight in pairs:
        total[int(peer)] = total.get(int(peer), 0.0) + weight
    return dict(sorted(total.items()))


def circulant_weights(rank: int, n: int, offsets: Iterable[int]) -> dict[int, float]:
    """Uniform weights over ``rank`` and its distinct in-neighbours ``(rank + o) mod n``."""
    return uniform_weights(rank, ((rank + o) % n for o in offsets))


class Topology:
    """A (possibly time-varying) mixing pattern for ``n`` learners.

    Public API (other modules call exactly this):

    * ``Topology(cfg=None, seed=0)``: ``cfg`` is this class's ``Config`` (a
      :class:`TopologyConfig` with ``name`` plus the topology's parameters), a
      mapping or DictConfig of the same keys, or ``None`` for the defaults. ``seed`` is the run
      seed; only random patterns use it.
    * ``check_size(n)``: raise :class:`runner.errors.ConfigError` (key ``topology.name`` or a
      parameter key) when ``n`` learners cannot form this topology.
    * ``mixing_matrix(n, step=0)``: ``W`` (``n x n`` float64, ``X <- X W``) of that step.
    * ``in_weights(rank, n, step=0)``: column ``rank`` of ``W`` without zeros,
      ``{peer: weight}`` including ``rank`` itself; ``x_rank <- sum_p weight[p] * x_p``.
    * ``out_peers(rank, n, step=0)``: sorted ranks other than ``rank`` that need ``x_rank`` at
      that step (nonzeros of row ``rank``).
    * ``expected_mixing(n)``: ``E[W]``; ``expected_gram(n)``: ``E[W^T W]`` (``W`` and
      ``W^T W`` for fixed topologies, closed forms for random ones).
    * ``pairwise_edges(n)``: undirected edges ``(i, j)``, ``i < j``, of the support of
      ``E[W]``: the graph that AD-PSGD's pairwise averaging draws from
      (:func:`runner.topology.spectral.pairwise_rho`).
    * class attributes ``time_varying`` (``W`` depends on ``step``) and ``directed``
      (``W`` is not symmetric, so in- and out-peers differ).

    Subclasses implement :meth:`_in_weights` and, when ``n`` can be impossible,
    :meth:`check_size`; everything else derives from them.
    """

    Config: ClassVar[type[TopologyConfig]] = TopologyConfig
    time_varying: ClassVar[bool] = False
    directed: ClassVar[bool] = False
    registered_name: ClassVar[str] = ""

    def __init__(self, cfg: Any = None, seed: int = 0):
        self.cfg = coerce_config(type(self).Config, cfg)
        self.seed = int(seed)

    @property
    def name(self) -> str:
        return self.registered_name or self.cfg.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cfg!r}, seed={self.seed})"

    # -- to implement -------------------------------------------------------------------------
    def _in_weights(self, rank: int, n: int, step: int) -> dict[int, float]:
        """Column ``rank`` of ``W`` (``n`` already checked)."""
        raise NotImplementedError

    def check_size(self, n: int) -> None:
        """Raise ConfigError when ``n`` learners cannot form this topology (base: ``n >= 1``)."""
        require(isinstance(n, (int, np.integer)) and n >= 1, "topology.name",
                f"{self.name} needs at least one learner, got n={n}", "use n >= 1")

    # -- derived API ----------------------------------------------------------------------------
    def _check_rank(self, rank: int, n: int) -> None:
        self.check_size(n)
        if not 0 <= rank < n:
            raise ValueError(f"rank {rank} is outside 0..{n - 1}")

    def in_weights(self, rank: int, n: int, step: int = 0) -> dict[int, float]:
        """``{peer: W[peer, rank]}`` for the nonzero entries of column ``rank`` (self included)."""
        self._check_rank(rank, n)
        return self._in_weights(rank, n, step)

    def out_peers(self, rank: int, n: int, step: int = 0) -> list[int]:
        """Sorted ranks ``j != rank`` with ``W[rank, j] > 0``: they need ``x_rank`` at ``step``."""
        self._check_rank(rank, n)
        if not self.directed:  # symmetric W: out-peers are the in-peers
            return sorted(p for p in self._in_weights(rank, n, step) if p != rank)
        return [j for j in range(n) if j != rank and rank in self._in_weights(j, n, step)]

    def mixing_matrix(self, n: int, step: int = 0) -> np.ndarray:
        """``W`` of ``step``, ``n x n`` float64: ``W[i, j]`` is the weight of ``x_i`` in ``x_j``."""
        self.check_size(n)
        w = np.zeros((n, n), dtype=np.float64)
        for j in range(n):
            for i, weight in self._in_weights(j, n, step).items():
                w[i, j] = weight
        return w

    def expected_mixing(self, n: int) -> np.ndarray:
        """``E[W]``; for a fixed topology simply ``W``."""
        if self.time_varying:
            raise NotImplementedError(f"{type(self).__name__} must give E[W] in closed form")
        return self.mixing_matrix(n)

    def expected_gram(self, n: int) -> np.ndarray:
        """``E[W^T W]``; for a fixed topology simply ``W^T W``."""
        if self.time_varying:
            raise NotImplementedError(f"{type(self).__name__} must give E[W^T W] in closed form")
        w = self.mixing_matrix(n)
        return w.T @ w

    def pairwise_edges(self, n: int) -> list[tuple[int, int]]:
        """Undirected edges ``(i, j)``, ``i < j``, where ``E[W][i, j]`` or ``E[W][j, i]`` > 0."""
        support = self.expected_mixing(n) > 0
        support = support | support.T
        return [(i, j) for i in range(n) for j in range(i + 1, n) if support[i, j]]


def size_error(topology: Topology, n: int, problem: str, fix: str,
               key: str = "topology.name") -> ConfigError:
    """A ConfigError for ``n`` learners that ``topology`` cannot arrange."""
    return ConfigError(key, f"{topology.name} cannot use n={n}: {problem}", fix)
