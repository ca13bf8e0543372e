"""Every learner's virtual clock and where its seconds went (compute, comm, idle), and the
bytes each learner sent.

A learner's time advances by what it does (compute, a transfer it cannot hide) and by waiting:
for a slower peer (idle) or for bytes on the wire (comm). The split is the one real ranks
report (runner/runlog/timers.py), in seconds of the modelled cluster. The bytes sent are
counted under the keys real ranks use (runner/comm/traffic.py), where the drivers model a
send, with the sizes that the time model charges.

Bytes that cross between nodes while the learners compute (exchanges, gossip, a background
reduction) also cost the CPU of both ends (``cluster.cpu_s_per_mb`` for every MB sent or
received): each learner owes that CPU time, and its next step takes that much longer
(:meth:`Clocks.network_cpu_s`), on shared processors (``compute.contention``) in the same
proportion as its compute. A blocking collective's CPU is not charged: the learners wait for
it anyway, and a link's measured time includes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

KINDS = ("compute", "comm", "idle")


class Clocks:
    def __init__(self, n: int, cluster):
        self.n, self.cluster = n, cluster
        self.t = np.zeros(n)
        self.seconds = {kind: np.zeros(n) for kind in KINDS}
        self.sent: dict[str, np.ndarray] = {}  # "<communicator>/<kind>" -> bytes per learner
        # CPU seconds of network work each learner owes its next step (see network_cpu_s).
        self.cpu_owed = np.zeros(n)
        self._cpu_s_per_byte = float(cluster.cfg.cpu_s_per_mb) / 1e6
        self._cpu_factor = 1.0 + float(cluster.cfg.compute.contention)

    def crossed(self, sender: int, receiver: int, nbytes: float) -> None:
        """``nbytes`` went from ``sender`` to ``receiver``: between nodes, both ends owe the
        network stack's CPU for them."""
        if self._cpu_s_per_byte and \
                self.cluster.node_of(sender) != self.cluster.node_of(receiver):
            owed = nbytes * self._cpu_s_per_byte
            self.cpu_owed[sender] += owed
            self.cpu_owed[receiver] += owed

    def crossed_ring(self, ranks: Sequence[int], nbytes_each: float) -> None:
        """A ring over ``ranks`` (each sends ``nbytes_each`` to the next and receives as much
        from the previous): :meth:`crossed` for every hop of the ring."""
        if len(ranks) > 1:
            for i, rank in enumerate(ranks):
                self.crossed(rank, ranks[(i + 1) % len(ranks)], nbytes_each)

    def network_cpu_s(self, learner: int) -> float:
        """The CPU seconds ``learner``'s next step spends on network work it owes (wall
        seconds, on processors it shares with other learners), and nothing owed after."""
        owed, self.cpu_owed[learner] = self.cpu_owed[learner], 0.0
        return float(owed) * self._cpu_factor

    def count_sent(self, key: str, nbytes: np.ndarray | float,
                   learners: Sequence[int] | None = None) -> None:
        """``learners`` (default: every one) sent ``nbytes`` each (one number per learner
        listed, or one for all) under ``key``."""
        sent = self.sent.setdefault(key, np.zeros(self.n))
        if learners is None:
            sent += nbytes
        else:
            np.add.at(sent, np.asarray(learners, dtype=int), nbytes)

    def advance(self, seconds: np.ndarray | float, kind: str) -> None:
        """Every learner spends ``seconds`` (one per learner, or one for all) on ``kind``."""
        seconds = np.broadcast_to(np.asarray(seconds, dtype=float), (self.n,))
        self.t += seconds
        self.seconds[kind] += seconds

    def wait_until(self, target: np.ndarray | float, kind: str) -> None:
        """Learners behind ``target`` wait for it, counting the wait as ``kind``."""
        target = np.broadcast_to(np.asarray(target, dtype=float), (self.n,))
        wait = np.maximum(0.0, target - self.t)
        self.t += wait
        self.seconds[kind] += wait

    def receive(self, peers: Sequence[Sequence[int]], sent_at: np.ndarray,
                nbytes: float) -> None:
        """Learner ``i`` needs one message of ``nbytes`` from each of ``peers[i]``, sent at
        ``sent_at[j]``. A sender's messages leave together and share its interface, so each
        takes ``alpha + d_j M / B`` for ``d_j`` messages. Waiting for a sender that has not
        sent yet is idle; waiting for the bytes is comm."""
        out_degree = np.zeros(self.n, dtype=int)
        for i, listed in enumerate(peers):
            for j in listed:
                out_degree[j] += 1
                self.crossed(j, i, nbytes)
        self.count_sent("world/exchange", nbytes * out_degree)
        latest_send = np.zeros(self.n)
        arrival = np.zeros(self.n)
        for i, listed in enumerate(peers):
            latest_send[i], arrival[i] = self.t[i], self.t[i]
            for j in listed:
                at = sent_at[j] + self.cluster.transfer_s(j, i, nbytes * out_degree[j])
                if at > arrival[i]:
                    latest_send[i], arrival[i] = sent_at[j], at
        self.wait_until(latest_send, "idle")
        self.wait_until(arrival, "comm")

    def now(self) -> float:
        """The virtual time of the whole run so far: the last learner's clock."""
        return float(self.t.max())

    def state_dict(self) -> dict:
        """Tensors (checkpoints load with weights_only, which takes no numpy arrays)."""
        return {"t": torch.from_numpy(self.t.copy()),
                **{k: torch.from_numpy(v.copy()) for k, v in self.seconds.items()},
                "sent": {k: torch.from_numpy(v.copy()) for k, v in self.sent.items()},
                "cpu_owed": torch.from_numpy(self.cpu_owed.copy())}

    def load_state_dict(self, state: dict) -> None:
        self.t = state["t"].numpy().copy()
        for kind in KINDS:
            self.seconds[kind] = state[kind].numpy().copy()
        self.sent = {k: v.numpy().copy() for k, v in state.get("sent", {}).items()}
        if "cpu_owed" in state:  # checkpoints from before cluster.cpu_s_per_mb owe nothing
            self.cpu_owed = state["cpu_owed"].numpy().copy()
