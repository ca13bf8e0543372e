"""Spectral quantities of mixing matrices (docs/algorithms.md, Topologies and spectral gap).

Definitions (``J = (1/n) 1 1^T``, ``W`` doubly stochastic, ``X <- X W``):

* ``SLEM(W)``: second-largest eigenvalue modulus, ``max_{k>=2} |lambda_k(W)|`` (0 for n = 1).
* ``spectral_gap(W) = 1 - sigma_max(W (I - J))``: one minus the worst contraction of the
  deviation from the mean in one step; equals ``1 - SLEM(W)`` for normal ``W`` (symmetric or
  circulant, i.e. every topology in this package).
* ``rho_from_gram(G)``: largest ``|eigenvalue|`` of ``(I - J) G (I - J)``; with ``G = E[W^T W]``
  it is AD-PSGD's ``rho``: ``E||x_{k+1}(I - J)||^2 <= rho ||x_k(I - J)||^2``.

:func:`summarize` reports, per topology and ``n``:

* fixed ``W``: ``spectral_gap = 1 - SLEM(W)`` and ``rho = SLEM(W^T W)`` (``= SLEM(W)^2`` for
  symmetric ``W``, D-PSGD's ``rho``);
* time-varying ``W_k``: ``spectral_gap = 1 - SLEM(E[W])`` and
  ``rho = rho_from_gram(E[W^T W])`` (AD-PSGD's ``rho``).

AD-PSGD's pairwise averaging of learners ``i, j`` is ``W_k = I - (e_i - e_j)(e_i - e_j)^T / 2``,
a projection (``W_k^T W_k = W_k``); on a uniformly random edge of a graph ``G`` with ``|E|``
edges, ``E[W_k] = I - Lap(G) / (2|E|)`` and ``1 - rho = a(G) / (2|E|)`` per event (``a``: the
second-smallest Laplacian eigenvalue).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .base import Topology


def centering(n: int) -> np.ndarray:
    """``I - J``: removes the mean of the models."""
    return np.eye(n) - np.full((n, n), 1.0 / n)


def _eigenvalue_moduli(m: np.ndarray) -> np.ndarray:
    if np.allclose(m, m.T, rtol=0.0, atol=1e-14):
        values = np.linalg.eigvalsh((m + m.T) / 2)
    else:
        values = np.linalg.eigvals(m)
    return np.sort(np.abs(values))[::-1]


def slem(w: np.ndarray) -> float:
    """Second-largest eigenvalue modulus of ``w`` (0 for a 1 x 1 matrix)."""
    w = np.asarray(w, dtype=np.float64)
    if w.shape[0] < 2:
        return 0.0
    return float(_eigenvalue_moduli(w)[1])


def spectral_gap(w: np.ndarray) -> float:
    """``1 - sigma_max(W (I - J))`` (= ``1 - SLEM(W)`` for normal doubly stochastic ``W``)."""
    w = np.asarray(w, dtype=np.float64)
    return 1.0 - float(np.linalg.norm(w @ centering(w.shape[0]), 2))


def rho_from_gram(gram: np.ndarray) -> float:
    """Largest ``|eigenvalue|`` of ``(I - J) G (I - J)`` for ``G = E[W^T W]``."""
    gram = np.asarray(gram, dtype=np.float64)
    c = centering(gram.shape[0])
    projected = c @ ((gram + gram.T) / 2) @ c
    return float(np.max(np.abs(np.linalg.eigvalsh(projected))))


def pairwise_matrix(i: int, j: int, n: int) -> np.ndarray:
    """``I - (e_i - e_j)(e_i - e_j)^T / 2``: learners ``i`` and ``j`` average, others keep."""
    d = np.zeros(n)
    d[i], d[j] = 1.0, -1.0
    return np.eye(n) - 0.5 * np.outer(d, d)


def laplacian(edges: Iterable[tuple[int, int]], n: int) -> np.ndarray:
    """Graph Laplacian ``D - A`` of the undirected ``edges`` on ``n`` nodes."""
    lap = np.zeros((n, n))
    for i, j in edges:
        lap[i, i] += 1.0
        lap[j, j] += 1.0
        lap[i, j] -= 1.0
        lap[j, i] -= 1.0
    return lap


def pairwise_expected(edges: Iterable[tuple[int, int]], n: int) -> np.ndarray:
    """``E[W]`` of one averaging on a uniformly random edge: ``I - Lap / (2|E|)`` (I if none)."""
    edges = list(edges)
    if not edges:
        return np.eye(n)
    return np.eye(n) - laplacian(edges, n) / (2 * len(edges))


def pairwise_rho(edges: Iterable[tuple[int, int]], n: int) -> float:
    """Per-event ``rho`` of pairwise averaging on a random edge (``E[W^T W] = E[W]``)."""
    return rho_from_gram(pairwise_expected(edges, n))


def _clean(x: float) -> float:
    """Drop float noise below 1e-12 (so that 1 - 1e-16 prints as 1 and -0.0 as 0)."""
    return round(float(x), 12) + 0.0


def summarize(topology: Topology, n: int) -> dict:
    """``{"topology", "n", "spectral_gap", "rho"}`` for ``n`` learners (definitions above)."""
    topology.check_size(n)
    if topology.time_varying:
        gap = 1.0 - slem(topology.expected_mixing(n))
        rho = rho_from_gram(topology.expected_gram(n))
    else:
        gap = 1.0 - slem(topology.mixing_matrix(n))
        rho = slem(topology.expected_gram(n))
    return {"topology": topology.name, "n": int(n), "spectral_gap": _clean(gap),
            "rho": _clean(rho)}
