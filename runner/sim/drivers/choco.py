"""CHOCO-SGD under the simulator (runner/algos/choco.py): every stacked learner compresses
with the algorithm's own ``compress`` and the same random draws as its rank, and mixes in
its neighbours' messages in the same order. The messages' sizes (the time they take, the
bytes counted as sent) are the compressed ones."""

from __future__ import annotations

from typing import Any

import torch

from ...algos.choco import compress, draws, message_bytes, mix_in_
from ...topology import TOPOLOGIES
from ..lockstep import LockstepDriver
from ..registry import SIM_DRIVERS


@SIM_DRIVERS.register("choco")
class ChocoDriver(LockstepDriver):
    """x <- x - gamma d; q = Q(x - xhat); xhat += q; s += sum_j W[j,i] q_j;
    x += consensus (s - xhat)."""

    def __init__(self, sim):
        super().__init__(sim)
        cfg = sim.cfg
        topology = TOPOLOGIES.get(cfg.topology.name)(cfg.topology, seed=cfg.seed)
        self.columns = [topology.in_weights(i, self.n) for i in range(self.n)]  # W's
        self.cfg, self.seed = cfg.algo, cfg.seed

    def setup(self):
        self.public = torch.zeros_like(self.sim.x)
        self.mixed = torch.zeros_like(self.sim.x)
        self.nbytes = message_bytes(self.sim.x[0], self.cfg, self.sim.wire)

    def step(self, step, batches, counts, global_count):
        self.apply(self.local_gradients(batches, counts, global_count))
        self.compute_all(step, counts)
        sent_at = self.sim.clocks.t.copy()  # after the step, as the ranks send
        x = self.sim.x
        with torch.no_grad():
            q = torch.empty_like(x)
            for i in range(self.n):
                message, q[i] = compress(x[i] - self.public[i], self.cfg,
                                         draws(self.seed, i, step, 0), self.sim.wire)
            peers = []
            for i, weights in enumerate(self.columns):
                mine = sorted(p for p in weights if p != i)
                mix_in_(x[i], self.public[i], self.mixed[i], q[i], weights[i],
                        [(weights[p], q[p]) for p in mine], self.cfg.gamma)
                peers.append(mine)
        self.sim.clocks.receive(peers, sent_at, self.nbytes)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "public": self.public, "mixed": self.mixed}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.public, self.mixed = state["public"], state["mixed"]
