"""D-PSGD: synchronous decentralized parallel SGD (docs/algorithms.md, D-PSGD).

Update on rank i at step k with the mixing matrix W_k of ``topology`` (X <- X W)::

    ordering=dpsgd (default, the paper's):
        x_i^{k+1/2} = sum_j W_k[j,i] x_j^k
        x_i^{k+1}   = x_i^{k+1/2} - gamma * g_i(x_i^k)      # gradient at the pre-averaging model
    ordering=step_then_average (adapt, then combine):
        x_i^{k+1}   = sum_j W_k[j,i] (x_j^k - gamma * g_j(x_j^k))

With the paper's ordering the exchange of x^k runs on the communication thread while the
gradient is computed, and a rank waits only for its neighbours' models of the same step. With
``step_then_average`` the exchange follows the optimizer step (no overlap); on the complete
graph (W = J) with plain SGD it is exactly SSGD. Momentum and weight decay stay local
(docs/algorithms.md, Notation and conventions). Each flat parameter buffer travels as one
message per neighbour.

Invariants: W doubly stochastic keeps the mean of the models' averaging part; with learning
rate 0 the consensus distance shrinks by at least SLEM(W)^2 per step.

Checkpoints: every exchange completes within its step and W_k is a function of (seed, k)
(randomized topologies too), so the model, the optimizer and the trainer's step counter are
the whole state.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.section import require
from ..errors import ConfigError
from ..lazy import torch
from ..topology import TOPOLOGIES
from .base import AlgoConfig, Algorithm, Reduction
from .registry import ALGORITHMS


@dataclass
class DPSGDConfig(AlgoConfig):
    name: str = "dpsgd"
    # dpsgd: average while the gradient is computed (the paper's order); step_then_average:
    # optimizer step, then average (W = J gives SSGD)
    ordering: str = "dpsgd"

    def check(self, prefix, cfg):
        require(self.ordering in ("dpsgd", "step_then_average"), f"{prefix}.ordering",
                f"must be dpsgd or step_then_average, got {self.ordering!r}",
                f"{prefix}.ordering=dpsgd")


def mix_(x: torch.Tensor, self_weight, received) -> torch.Tensor:
    """The mixing step in place: ``x <- w_self x + sum_j w_j y_j`` for ``received`` pairs
    ``(w_j, y_j)``. Weights are numbers (one rank) or columns ``[N, 1]`` (the simulator's
    stacked learners, one row each): both engines call this."""
    x.mul_(self_weight)
    for weight, y in received:
        x.add_(y * weight)
    return x


def _fits(topology, n: int) -> bool:
    try:
        topology.check_size(n)
        return True
    except ConfigError:
        return False


class Gossip:
    """One synchronous mixing step x_i <- sum_j W[j,i] x_j over flat buffers."""

    def __init__(self, topology, comm, buffers: list[torch.Tensor],
                 wire: torch.dtype | None = None):
        """``wire``: the dtype the models travel in (None: their own)."""
        self.topology, self.comm, self.buffers, self.wire = topology, comm, buffers, wire
        self._pool: list[list[torch.Tensor]] = [[] for _ in buffers]

    def _receive_buffers(self, index: int, peers: list[int]) -> dict[int, torch.Tensor]:
        pool = self._pool[index]
        while len(pool) < len(peers):
            pool.append(torch.empty_like(self.buffers[index]))
        return dict(zip(peers, pool))

    def start(self, step: int):
        """Post the exchange of this step; returns what :meth:`finish` needs."""
        rank, size = self.comm.rank, self.comm.size
        weights = self.topology.in_weights(rank, size, step)
        peers = sorted(p for p in weights if p != rank)
        out = self.topology.out_peers(rank, size, step)
        handles = [self.comm.exchange_(flat, out, self._receive_buffers(i, peers), self.wire)
                   for i, flat in enumerate(self.buffers)]
        return weights, handles

    def finish(self, pending) -> None:
        weights, handles = pending
        rank = self.comm.rank
        for flat, handle in zip(self.buffers, handles):
            received = handle.wait()
            with torch.no_grad():
                mix_(flat, weights[rank], [(weights[peer], buf) for peer, buf in received.items()])


@ALGORITHMS.register("dpsgd")
class DPSGD(Algorithm):
    Config = DPSGDConfig
    uses_topology = True
    elastic = True
    reduces_to = {"dpsgd-complete-graph": Reduction(
        ("topology=complete", "algo.ordering=step_then_average"))}

    @classmethod
    def check_world(cls, run_cfg):
        nprocs = run_cfg.launcher.nprocs
        topology = TOPOLOGIES.get(run_cfg.topology.name)(run_cfg.topology)
        try:
            topology.check_size(nprocs)
        except ConfigError as error:  # the topology speaks of n; the user sets launcher.nprocs
            sizes = [n for n in range(max(1, nprocs - 8), nprocs + 9) if n != nprocs
                     and _fits(topology, n)]
            near = min(sizes, key=lambda n: (abs(n - nprocs), -n), default=None)
            fix = f"launcher.nprocs={near}" if near else error.fix
            raise ConfigError("launcher.nprocs", f"{error.cause.split(': ', 1)[-1]} "
                              f"(topology={topology.name})", fix) from None

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        run_cfg = self.ctx.cfg
        topology = TOPOLOGIES.get(run_cfg.topology.name)(run_cfg.topology, seed=run_cfg.seed)
        self.gossip = Gossip(topology, self.comm, self.ctx.param_buffers, self.wire)
        self._pending = None

    def before_forward(self, step):
        if self.cfg.ordering == "dpsgd":
            self._pending = self.gossip.start(step)  # overlaps forward and backward

    def after_backward(self, step):
        if self._pending is not None:
            with self.timers.time("comm"):
                self.gossip.finish(self._pending)
            self._pending = None

    def after_step(self, step):
        if self.cfg.ordering == "step_then_average":
            with self.timers.time("comm"):
                self.gossip.finish(self.gossip.start(step))
