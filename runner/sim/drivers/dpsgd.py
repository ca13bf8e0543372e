"""D-PSGD under the simulator (runner/algos/dpsgd.py): every row mixed with its
in-neighbours' rows by the algorithm's own ``mix_``, with the topology's weights of the step."""

from __future__ import annotations

import torch

from ...algos.dpsgd import mix_
from ...topology import TOPOLOGIES
from ..lockstep import LockstepDriver
from ..registry import SIM_DRIVERS


@SIM_DRIVERS.register("dpsgd")
class DPSGDDriver(LockstepDriver):
    """x_i <- sum_j W[j, i] x_j, with the gradient at the pre-averaging model (ordering=dpsgd)
    or after the step (step_then_average)."""

    def __init__(self, sim):
        super().__init__(sim)
        cfg = sim.cfg
        self.topology = TOPOLOGIES.get(cfg.topology.name)(cfg.topology, seed=cfg.seed)
        self.ordering = cfg.algo.ordering
        self._fixed: tuple | None = None

    def neighbours(self, step: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor,
                                                                      torch.Tensor]]]:
        """(self weights [N, 1], [(weights [N, 1], in-neighbour index [N]), ...] slots), from
        the topology's in-weights of this step (absent slots have weight 0)."""
        if self._fixed is not None:
            return self._fixed
        columns = [self.topology.in_weights(i, self.n, step) for i in range(self.n)]
        degree = max(len(c) - 1 for c in columns)
        own = torch.tensor([[c[i]] for i, c in enumerate(columns)], dtype=self.sim.dtype)
        slots = []
        for s in range(degree):
            index, weight = [], []
            for i, c in enumerate(columns):
                peers = sorted(p for p in c if p != i)
                index.append(peers[s] if s < len(peers) else i)
                weight.append(c[peers[s]] if s < len(peers) else 0.0)
            slots.append((torch.tensor(weight, dtype=self.sim.dtype).unsqueeze(1),
                          torch.tensor(index)))
        result = (own, slots)
        if not self.topology.time_varying:
            self._fixed = result
        return result

    def mix(self, step: int) -> list[list[int]]:
        own, slots = self.neighbours(step)
        x = self.sim.x
        received = [(weight, x[index]) for weight, index in slots]  # copies: x^k of each peer
        mix_(x, own, received)
        return [[int(index[i]) for weight, index in slots if float(weight[i]) > 0]
                for i in range(self.n)]

    def step(self, step, batches, counts, global_count):
        grads = self.local_gradients(batches, counts, global_count)
        start = self.sim.clocks.t.copy()
        seconds = self.compute_all(step, counts)
        if self.ordering == "dpsgd":
            peers = self.mix(step)
            self.apply(grads)
            sent_at = start  # x^k leaves as the step starts: overlaps the gradient
        else:
            self.apply(grads)
            peers = self.mix(step)
            sent_at = start + seconds
        self.sim.clocks.receive(peers, sent_at, self.sim.nbytes)
