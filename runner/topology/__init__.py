"""Mixing topologies for decentralized SGD, registered by name (``topology=NAME``).

``TOPOLOGIES.get(name)(cfg, seed=run_seed)`` gives a :class:`Topology`; its docstring lists the
API (``check_size``, ``mixing_matrix``, ``in_weights``, ``out_peers``, ``expected_mixing``,
``expected_gram``, ``pairwise_edges``). :mod:`runner.topology.spectral` computes spectral gaps
and ``rho`` (docs/algorithms.md, Topologies and spectral gap). Importing this package
registers every topology.
"""

from typing import Any

from . import graphs, random_ring, torus  # noqa: F401 - they register
from .base import Topology
from .registry import TOPOLOGIES


def build(cfg: Any, seed: int = 0) -> Topology:
    """The topology named by ``cfg.name`` (or ``cfg["name"]``, or a plain name string)."""
    if isinstance(cfg, str):
        return TOPOLOGIES.get(cfg)(None, seed=seed)
    name = cfg["name"] if hasattr(cfg, "__getitem__") else cfg.name
    return TOPOLOGIES.get(name)(cfg, seed=seed)


__all__ = ["TOPOLOGIES", "Topology", "build"]
