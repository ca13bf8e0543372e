"""CHOCO-SGD: decentralized SGD with compressed gossip (docs/algorithms.md, CHOCO-SGD).

Each learner i keeps, besides its model x_i, a public copy xhat_i that its neighbours also
track, and s_i = sum_j W[j,i] xhat_j over its in-neighbours and itself (the topology's fixed,
symmetric W). Step t, with Q the compression (``algo.compression``)::

    x_i    <- x_i - gamma_t * d_i(x_i)                        the optimizer's step
    q_i     = Q(x_i - xhat_i)                                  sent to every neighbour
    xhat_i <- xhat_i + q_i
    s_i    <- s_i + W[i,i] q_i + sum_j W[j,i] q_j              the neighbours' q_j received
    x_i    <- x_i + consensus * (s_i - xhat_i)                 consensus = algo.gamma

xhat and s start at 0, so the first message is the model itself, compressed. What Q leaves out
of x_i - xhat_i is not lost: it stays in the difference and is sent later (error feedback by
construction). Compressions of a flat buffer v of d numbers (:func:`compress`):

* ``identity``: v (d numbers);
* ``topk``: the k = ceil(ratio d) entries of largest magnitude (k indices and k values);
* ``randomk``: k entries drawn uniformly without replacement, not rescaled (k indices and
  values);
* ``qsgd``: ||v|| sign(v_j) l_j / s with l_j in {0..s} rounded at random so that E[l_j] =
  s |v_j| / ||v||, divided by 1 + min(d / s^2, sqrt(d) / s) (s = ``levels``; one norm and d
  signed levels of one byte);
* ``sign``: (||v||_1 / d) sign(v) (one scale and d bits).

The values sent (identity, top-k and random-k; the scale of qsgd and sign) travel in
``comm.exchange_dtype`` when it is set; Q(v) is then the rounded message, the same on both
ends. The random draws come from a generator seeded by (run seed, learner, step, buffer), so
the simulator draws the same ones.

Invariants: with identity compression and consensus 1 the run is D-PSGD with
``ordering=step_then_average`` over the same topology (tests/test_equivalence_mpi.py, to
1e-10). The messages' sizes are what the compression sends; the communicator counts them
where they are sent (summary.json's ``bytes_sent``).
Momentum stays local. Checkpoints hold xhat and s; a resumed run with another number of
learners starts them at 0 again, and so do the survivors of a lost learner (launcher.elastic),
and the learners when spares join: the lost neighbour's public copy is gone (or a new one
comes) and the topology's W is rebuilt for the new world, so s_i = sum_j W[j,i] xhat_j holds
for the new W only from xhat = s = 0, where the next message is each model, compressed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..config.section import require
from ..errors import ConfigError
from ..lazy import torch
from ..topology import TOPOLOGIES
from .base import AlgoConfig, Algorithm, Reduction
from .registry import ALGORITHMS

COMPRESSIONS = ("identity", "topk", "randomk", "qsgd", "sign")


@dataclass
class ChocoConfig(AlgoConfig):
    name: str = "choco"
    compression: str = "topk"  # identity, topk, randomk, qsgd or sign
    ratio: float = 0.01  # topk, randomk: the share of the entries sent
    levels: int = 127  # qsgd: quantization levels s (at most 127: one byte with the sign)
    gamma: float = 0.5  # the consensus step

    def check(self, prefix, cfg):
        require(self.compression in COMPRESSIONS, f"{prefix}.compression",
                f"must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}",
                f"{prefix}.compression=topk")
        require(0 < self.ratio <= 1, f"{prefix}.ratio", f"must be in (0, 1], got {self.ratio}",
                f"{prefix}.ratio=0.01")
        require(1 <= self.levels <= 127, f"{prefix}.levels",
                f"must be between 1 and 127, got {self.levels}", f"{prefix}.levels=127")
        require(0 < self.gamma <= 1, f"{prefix}.gamma", f"must be in (0, 1], got {self.gamma}",
                f"{prefix}.gamma=0.5")


def kept(d: int, cfg: ChocoConfig) -> int:
    """How many of ``d`` entries top-k and random-k send."""
    return max(1, math.ceil(cfg.ratio * d))


def draws(seed: int, learner: int, step: int, buffer: int) -> torch.Generator:
    """The generator of one compression: the same on a rank and in the simulator."""
    return torch.Generator().manual_seed(
        ((seed * 1_000_003 + learner) * 1_000_003 + step) * 101 + buffer)


def compress(v: torch.Tensor, cfg: ChocoConfig, generator: torch.Generator,
             wire: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the message as bytes, its decoded value Q(v)) for a flat buffer ``v``; ``wire``: the
    dtype of the values sent (None: ``v``'s)."""
    d, wire = v.numel(), wire or v.dtype
    if cfg.compression == "identity":
        sent = v.to(wire)
        return sent.contiguous().view(torch.uint8), sent.to(v.dtype)
    if cfg.compression in ("topk", "randomk"):
        k = kept(d, cfg)
        if cfg.compression == "topk":
            index = v.abs().topk(k, sorted=False).indices.sort().values
        else:
            # Drawn on the CPU (the same draws on a GPU, on a CPU and in the simulator).
            index = torch.randperm(d, generator=generator)[:k].sort().values.to(v.device)
        values = v[index].to(wire)
        decoded = torch.zeros_like(v).index_put_((index,), values.to(v.dtype))
        message = torch.cat([values.contiguous().view(torch.uint8),  # first: aligned views
                             index.to(torch.int32).view(torch.uint8)])
        return message, decoded
    if cfg.compression == "qsgd":
        s = cfg.levels
        norm = v.norm()
        scaled = v.abs() / norm * s if norm > 0 else torch.zeros_like(v)
        floor = scaled.floor()
        coins = torch.rand(d, generator=generator, dtype=v.dtype).to(v.device)
        level = floor + (coins < scaled - floor)
        signed = (level * v.sign()).to(torch.int8)
        scale = (norm / s / (1 + min(d / s**2, math.sqrt(d) / s))).to(wire)
        message = torch.cat([scale.reshape(1).view(torch.uint8), signed.view(torch.uint8)])
        return message, signed.to(v.dtype) * scale.to(v.dtype)
    # sign: one scale and d bits
    scale = (v.abs().sum() / d).to(wire)
    bits = (v >= 0).to(torch.uint8)
    padded = torch.cat([bits, bits.new_zeros(-d % 8)]).view(-1, 8)
    shifts = torch.arange(8, dtype=torch.uint8, device=v.device)
    packed = (padded << shifts).sum(1, dtype=torch.uint8)
    message = torch.cat([scale.reshape(1).view(torch.uint8), packed])
    scale = scale.to(v.dtype)
    return message, torch.where(v >= 0, scale, -scale)


def decode(message: torch.Tensor, like: torch.Tensor, cfg: ChocoConfig,
           wire: torch.dtype | None = None) -> torch.Tensor:
    """The value of a received ``message`` (what :func:`compress` returned second)."""
    wire = wire or like.dtype
    d, size = like.numel(), wire.itemsize
    message = message.to(like.device)
    if cfg.compression == "identity":
        return message.view(wire).to(like.dtype)
    if cfg.compression in ("topk", "randomk"):
        k = kept(d, cfg)
        values = message[:k * size].view(wire).to(like.dtype)
        index = message[k * size:].clone().view(torch.int32).long()  # clone: 4-byte aligned
        return torch.zeros_like(like).index_put_((index,), values)
    scale = message[:size].view(wire)[0].to(like.dtype)
    if cfg.compression == "qsgd":
        return message[size:].view(torch.int8).to(like.dtype) * scale
    shifts = torch.arange(8, dtype=torch.uint8, device=message.device)
    bits = (message[size:].unsqueeze(1) >> shifts) & 1
    positive = bits.flatten()[:d].bool()
    return torch.where(positive, scale, -scale)


def message_bytes(like: torch.Tensor, cfg: ChocoConfig, wire: torch.dtype | None = None
                  ) -> int:
    """Bytes of one message for a flat buffer like ``like``, its values in ``wire``."""
    d, size = like.numel(), (wire or like.dtype).itemsize
    k = kept(d, cfg)
    return {"identity": d * size, "topk": k * (4 + size), "randomk": k * (4 + size),
            "qsgd": size + d, "sign": size + math.ceil(d / 8)}[cfg.compression]


def mix_in_(x: torch.Tensor, public: torch.Tensor, mixed: torch.Tensor, q: torch.Tensor,
            own_weight: float, received: Iterable[tuple[float, torch.Tensor]], gamma: float
            ) -> None:
    """One learner's update after it sent ``q = Q(x - xhat)``, in place (both engines)::

        xhat <- xhat + q;  s <- s + W[i,i] q + sum_j W[j,i] q_j;  x <- x + gamma (s - xhat)

    ``received``: the (W[j,i], q_j) of its in-neighbours, in ascending order of j; an iterable,
    so that a rank waits for its messages only once its own part is added."""
    public.add_(q)
    mixed.add_(q * own_weight)
    for weight, theirs in received:
        mixed.add_(theirs * weight)
    x.add_((mixed - public) * gamma)


def check_topology(topology, key: str = "topology") -> None:
    if topology.time_varying or topology.directed:
        raise ConfigError(key, f"choco keeps its neighbours' public copies, so it needs a "
                          f"fixed, undirected topology; {topology.name} is "
                          f"{'time-varying' if topology.time_varying else 'directed'}",
                          "topology=ring (or torus, exponential_undirected, complete)")


@ALGORITHMS.register("choco")
class Choco(Algorithm):
    Config = ChocoConfig
    uses_topology = True
    elastic = True
    reduces_to = {"choco-identity-consensus-1-is-dpsgd": Reduction(
        ("algo.compression=identity", "algo.gamma=1", "topology=ring", "optim.momentum=0.9"),
        ("algo=dpsgd", "topology=ring", "algo.ordering=step_then_average",
         "optim.momentum=0.9"))}

    @classmethod
    def check_world(cls, run_cfg):
        topology = TOPOLOGIES.get(run_cfg.topology.name)(run_cfg.topology, seed=run_cfg.seed)
        check_topology(topology)
        try:
            topology.check_size(run_cfg.launcher.nprocs)
        except ConfigError as error:
            raise ConfigError("launcher.nprocs", f"{error.cause.split(': ', 1)[-1]} "
                              f"(topology={topology.name})", error.fix) from None

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        run_cfg = self.ctx.cfg
        topology = TOPOLOGIES.get(run_cfg.topology.name)(run_cfg.topology, seed=run_cfg.seed)
        rank, size = self.comm.rank, self.comm.size
        self.weights = topology.in_weights(rank, size)
        self.peers = sorted(p for p in self.weights if p != rank)
        self.x = self.ctx.param_buffers
        self.public = [torch.zeros_like(flat) for flat in self.x]  # xhat_i
        self.mixed = [torch.zeros_like(flat) for flat in self.x]  # s_i
        # Where the model is: the communicator stages a GPU inbox through pinned host memory.
        self._inbox = [{p: torch.empty(message_bytes(flat, self.cfg, self.wire),
                                       dtype=torch.uint8, device=flat.device)
                        for p in self.peers} for flat in self.x]
        self.seed = run_cfg.seed

    def after_step(self, step):
        rank = self.comm.rank
        with self.timers.time("comm"), torch.no_grad():
            for b, (x, public, mixed, inbox) in enumerate(zip(self.x, self.public, self.mixed,
                                                             self._inbox)):
                message, q = compress(x - public, self.cfg, draws(self.seed, rank, step, b),
                                      self.wire)
                handle = self.comm.exchange_(message, self.peers, inbox)
                mix_in_(x, public, mixed, q, self.weights[rank], self._arrivals(handle, x),
                        self.cfg.gamma)

    def _arrivals(self, handle, like: torch.Tensor) -> Iterator[tuple[float, torch.Tensor]]:
        """The in-neighbours' (W[j,i], q_j), decoded once their messages have arrived."""
        received = handle.wait()
        for peer in self.peers:
            yield self.weights[peer], decode(received[peer], like, self.cfg, self.wire)

    def continue_after_join(self, state):
        # The topology is rebuilt for the larger world: xhat and s start at 0 (setup's), as
        # after a loss.
        pass

    def state_dict(self):
        return {"public": [t.clone() for t in self.public],
                "mixed": [t.clone() for t in self.mixed]}

    def load_state_dict(self, state):
        for mine, saved in zip(self.public, state["public"]):
            mine.copy_(saved)
        for mine, saved in zip(self.mixed, state["mixed"]):
            mine.copy_(saved)
