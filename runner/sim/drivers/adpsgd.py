"""AD-PSGD and H-ADPSGD under the simulator: the asynchrony is what the modelled cluster's
schedule makes it.

Participants (learners; hadpsgd: super learners of ``procs_per_node`` ranks) never wait for
each other. Each step a participant reads its model, its ranks compute (their times from the
compute model; a super learner then averages its members' gradients with a node allreduce,
so it waits for its slowest member, and broadcasts the control values and, after an
averaging, the leader's model as the real algorithm does) and it applies the update. After
each of its steps an active participant starts one averaging with its next passive peer
(runner/topology/pairing.py, the schedule real ranks follow); a passive serves one request at
a time, in arrival order. Both ends snapshot their models when the averaging starts and merge
when the bytes have crossed (latency plus size over bandwidth; between nodes every transfer
shares its node's interface with the others in flight). Which passive an active meets, when,
and how stale a gradient is follow from these times alone.

The schedule emits each participant's operations (runner/algos/trace.py), which the trace
executor applies to the stacked models. At a milestone (evaluation, checkpoint) participants
finish their step and stop, averagings in flight complete, and everyone resumes together, as
real ranks do. With ``launcher.replay=DIR`` the operations come from a real run's recorded
trace instead, and the run ends with that run's model.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

from ...algos.adpsgd import ADPSGD
from ...algos.trace import APPLY, MERGE, READ, SNAP, TraceExecutor, read_traces
from ...comm.buffers import parameter_digest
from ...comm.communicator import ring_bytes
from ...comm.pairwise import header_nbytes
from ...topology.pairing import is_active, passive_peers, peer_schedule
from ..event_queue import EventQueue
from ..network import SharedChannel
from ..registry import SIM_DRIVERS
from .delay_by_one import DelayByOneDriver

CONTROL_BYTES = 64  # a pickled flag or sample count (bcast_object)


@SIM_DRIVERS.register("hadpsgd")
@SIM_DRIVERS.register("adpsgd")
class GossipDriver:
    identical_replicas = False
    asynchronous = True

    @classmethod
    def build(cls, sim: Any):
        if sim.cfg.algo.get("delay_by_one"):
            return DelayByOneDriver(sim)
        return cls(sim)

    def __init__(self, sim: Any):
        self.sim = sim
        self.n = n = sim.n
        cfg = sim.cfg
        size = sim.procs_per_node if cfg.algo.name == "hadpsgd" else 1
        size = min(size, n)
        self.model_count = count = -(-n // size)
        self.members = [list(range(s * size, min(n, (s + 1) * size))) for s in range(count)]
        self.node_of_rank = np.repeat(np.arange(count), size)[:n]
        self.peers = passive_peers(ADPSGD.topology(cfg), count) if count > 1 else {}
        self.next_peer = {a: peer_schedule(cfg.algo.pattern, listed, cfg.seed, a)
                          for a, listed in self.peers.items()}
        self.replay = cfg.launcher.get("replay")

    def setup(self) -> None:
        sim, count = self.sim, self.model_count
        self.executor = TraceExecutor(sim, self.members)
        self.ops: list[list[list]] = [[] for _ in range(count)]
        self.queue = EventQueue()
        nodes = int(sim.cluster.node_of(self.n - 1)) + 1
        # Each node's link, both ways: a message leaves on its sender's and enters on its
        # receiver's (either may be the slower one: cluster.node_bandwidth_factor).
        self.nic = [SharedChannel(self.queue, sim.cluster.node_link(node))
                    if nodes > 1 else None for node in range(nodes)]
        self.nic_in = [SharedChannel(self.queue, sim.cluster.node_link(node))
                       if nodes > 1 else None for node in range(nodes)]
        self.steps = np.zeros(count, dtype=int)
        self.version = np.zeros(count, dtype=int)  # merges into x: staleness is counted in it
        self.read_version = np.zeros(count, dtype=int)
        self.staleness: list[list[int]] = [[] for _ in range(count)]
        self.exchanges = np.zeros(count, dtype=int)
        self.pair_count: dict[tuple[int, int], int] = {}
        self.ticks = np.zeros(count, dtype=int)
        self.gossiping = np.zeros(count, dtype=bool)  # an active with an averaging under way
        self.serving = np.zeros(count, dtype=bool)
        self.waiting_requests: list[deque] = [deque() for _ in range(count)]
        self.in_flight = 0
        self.stopped = np.zeros(count, dtype=bool)  # finished its step at a milestone
        self.computing = np.zeros(count, dtype=bool)
        self.meeting = False
        self.started = False
        self.target = 0
        self.meet_at_target = True
        self.busy_s = np.zeros(count)

    # ---- the engine's interface ----------------------------------------------------------
    def advance_to(self, target: int, meet: bool = True) -> None:
        """Run the schedule until the global count reaches ``target``; ``meet``: there every
        participant finishes its step and stops, and the averagings in flight complete (a
        milestone the learners meet at), else they train on (an evaluation beside training:
        its models are those of the moment the count reached it)."""
        sim = self.sim
        if self.replay:
            self._replay()
            return
        self.target, self.meet_at_target = target, meet
        self.meeting = False
        self.stopped[:] = False
        for s in range(self.model_count):
            if not self.computing[s]:
                self._start_step(s)
        # (An elastic job stops at a node's failure: runner/sim/timing.py goes on without it.)
        if not meet:
            self.queue.run_while(lambda: sim.samples < target and self.queue.now < sim.stop_at)
            self.executor.run(self.ops)
            return
        self.queue.run_while(lambda: not self._met() and self.queue.now < sim.stop_at)
        # At the milestone everyone waits for the last to finish its step (idle), as real
        # ranks do, and restarts together.
        sim.clocks.wait_until(self.queue.now, "idle")
        self.executor.run(self.ops)

    def continue_from(self, samples: int, steps: list[int]) -> None:
        """An elastic timing run that lost learners goes on with the survivors' step counts
        (their data positions)."""
        self.steps = np.asarray(steps, dtype=int)[:self.model_count].copy()
        self.sim.step = int(self.steps[0])

    def resume_at(self, now: float) -> None:
        """A restarted job trains again at ``now`` (virtual seconds)."""
        self.queue.now = max(self.queue.now, now)

    def _met(self) -> bool:
        return (self.meeting and bool(self.stopped.all()) and self.in_flight == 0
                and not any(self.waiting_requests))

    def finish(self) -> None:
        """Nothing is in flight after a milestone: the models are final."""

    def steps_per_learner(self) -> list[int]:
        return [int(self.steps[self.node_of_rank[r]]) for r in range(self.n)]

    def digests(self) -> list[tuple[int, str]]:
        return [(int(self.node_of_rank[r]),
                 parameter_digest([self.sim.x[self.node_of_rank[r]]])) for r in range(self.n)]

    def stats(self) -> list[dict[str, float]]:
        out = []
        for r in range(self.n):
            s = int(self.node_of_rank[r])
            stale = self.staleness[s] or [0]
            out.append({"exchanges": float(self.exchanges[s] + self._served(s)),
                        "staleness_mean": float(np.mean(stale)),
                        "staleness_max": float(np.max(stale)),
                        "gossip_busy_s": float(self.busy_s[s])})
        return out

    def _served(self, s: int) -> int:
        if is_active(s):
            return 0
        return sum(c for (a, p), c in self.pair_count.items() if p == s)

    # ---- the schedule ----------------------------------------------------------------------
    def _start_step(self, s: int) -> None:
        sim = self.sim
        if self.meeting:
            self.stopped[s] = True
            return
        now = self.queue.now
        self.ops[s].append([READ])
        # A super learner's leader broadcasts its x to the node when an averaging changed it
        # since the last step's read (runner/algos/adpsgd.py, _refresh_replica).
        changed = self.version[s] != self.read_version[s]
        self.read_version[s] = self.version[s]
        lr = sim.schedule.lr_at(sim.samples)
        sim.lr = lr
        members = self.members[s]
        k = int(self.steps[s])
        steps = sim.steps_per_epoch
        counts = [len(sim.data.indices(r, k // steps, k % steps)) for r in members]
        seconds = np.array([sim.compute_model.step_s(r, k + 1, c, now)
                            + sim.clocks.network_cpu_s(r) for r, c in zip(members, counts)])
        slowest = float(seconds.max())
        node_reduce = self._node_comm_s(members, changed)
        clocks = sim.clocks
        for r, c in zip(members, seconds):
            clocks.t[r] = now + slowest + node_reduce
            clocks.seconds["compute"][r] += c
            clocks.seconds["idle"][r] += slowest - c
            clocks.seconds["comm"][r] += node_reduce
        self.computing[s] = True
        self.queue.after(slowest + node_reduce, lambda: self._end_step(s, lr, sum(counts)))

    def _node_comm_s(self, members: list[int], changed: bool) -> float:
        """A super learner's collectives of one step (none for one member), counted as sent:
        the allreduce of the gradients, two control broadcasts (whether x changed; the
        leader's count of global samples) and, when an averaging changed x, the broadcast of
        x by the leader."""
        if len(members) <= 1:
            return 0.0
        cluster, nbytes = self.sim.cluster, self.sim.node_nbytes
        clocks = self.sim.clocks
        clocks.count_sent("node/allreduce", ring_bytes(nbytes, len(members)), members)
        if changed:
            clocks.count_sent("node/broadcast", nbytes, members[:1])
        return (cluster.allreduce_s(members, nbytes)
                + 2 * cluster.broadcast_s(members, CONTROL_BYTES)
                + (cluster.broadcast_s(members, nbytes) if changed else 0.0))

    def _end_step(self, s: int, lr: float, samples: int) -> None:
        sim = self.sim
        self.computing[s] = False
        self.ops[s].append([APPLY, lr])
        self.staleness[s].append(int(self.version[s] - self.read_version[s]))
        self.steps[s] += 1
        if s == 0:
            sim.step = int(self.steps[0])
        sim.samples += samples
        if sim.samples >= self.target and self.meet_at_target:
            self.meeting = True
        if s in self.next_peer:
            self.ticks[s] += 1
            self._try_gossip(s)
        self._start_step(s)

    def _try_gossip(self, a: int) -> None:
        if self.gossiping[a] or self.ticks[a] == 0 or self.meeting:
            return
        self.ticks[a] -= 1
        p = self.next_peer[a](int(self.exchanges[a]))
        self.exchanges[a] += 1
        self.gossiping[a] = True
        self.in_flight += 1
        if self.serving[p]:
            self.waiting_requests[p].append(a)
        else:
            self._serve(p, a)

    def _serve(self, p: int, a: int) -> None:
        sim = self.sim
        self.serving[p] = True
        k = self.pair_count.get((a, p), 0)
        self.pair_count[(a, p)] = k + 1
        key = [a, p, k]
        self.ops[a].append([SNAP, *key])
        self.ops[p].append([SNAP, *key])
        started = self.queue.now
        ranks = (self.members[a][0], self.members[p][0])
        sim.clocks.count_sent("world/gossip", self._gossip_message_bytes(), ranks)
        for sender, receiver in (ranks, ranks[::-1]):  # both snapshots cross
            sim.clocks.crossed(sender, receiver, self._gossip_message_bytes())
        nodes = [int(sim.cluster.node_of(r)) for r in ranks]
        done = lambda: self._exchanged(a, p, key, started)  # noqa: E731
        if nodes[0] == nodes[1] or self.nic[nodes[0]] is None:
            self.queue.after(sim.cluster.transfer_s(ranks[0], ranks[1], sim.nbytes), done)
            return
        left = [4]

        def one_side() -> None:
            left[0] -= 1
            if left[0] == 0:
                done()

        for sender, receiver in (nodes, nodes[::-1]):  # both snapshots cross at once
            self.nic[sender].send(sim.nbytes, one_side)
            self.nic_in[receiver].send(sim.nbytes, one_side)

    def _exchanged(self, a: int, p: int, key: list, started: float) -> None:
        self.ops[a].append([MERGE, *key])
        self.ops[p].append([MERGE, *key])
        self.version[a] += 1
        self.version[p] += 1
        elapsed = self.queue.now - started
        self.busy_s[a] += elapsed
        self.busy_s[p] += elapsed
        self.gossiping[a] = False
        self.serving[p] = False
        self.in_flight -= 1
        if self.waiting_requests[p]:
            self._serve(p, self.waiting_requests[p].popleft())
        self._try_gossip(a)

    # ---- checkpoints (taken at milestones: nothing is in flight) ---------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"now": self.queue.now, "steps": torch.from_numpy(self.steps.copy()),
                "version": torch.from_numpy(self.version.copy()),
                "staleness": self.staleness, "exchanges": torch.from_numpy(self.exchanges),
                "pairs": [[a, p, c] for (a, p), c in self.pair_count.items()],
                "ticks": torch.from_numpy(self.ticks.copy()),
                "busy_s": torch.from_numpy(self.busy_s.copy()),
                "replica": self.executor.replica, "rank_steps": self.executor.rank_steps,
                "executed_samples": self.executor.samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.queue.now = float(state["now"])
        for key in ("steps", "version", "exchanges", "ticks", "busy_s"):
            setattr(self, key, state[key].numpy().copy())
        self.read_version = self.version.copy()
        self.staleness = [list(s) for s in state["staleness"]]
        self.pair_count = {(a, p): c for a, p, c in state["pairs"]}
        self.executor.replica.copy_(state["replica"])
        self.executor.rank_steps = list(state["rank_steps"])
        self.executor.samples = int(state["executed_samples"])

    def _gossip_message_bytes(self) -> float:
        """What each end of an averaging sends: its snapshot and its progress table, as the
        ranks' runner/comm/pairwise.py does."""
        return self.sim.nbytes + header_nbytes(len(self.members))

    # ---- replaying a real run's trace ----------------------------------------------------
    def _count_replayed(self, ops: list[list[list]]) -> None:
        """The bytes the recorded run sent, from its operations: a snapshot goes to the peer
        with the progress table; a super learner's every step averages the gradients over
        its node, and a read after an averaging broadcasts the leader's x."""
        clocks, node_nbytes = self.sim.clocks, self.sim.node_nbytes
        for members, sequence in zip(self.members, ops):
            merged = False
            for op in sequence:
                if op[0] == SNAP:
                    clocks.count_sent("world/gossip", self._gossip_message_bytes(), members[:1])
                elif op[0] == MERGE:
                    merged = True
                elif len(members) > 1 and op[0] == APPLY:
                    clocks.count_sent("node/allreduce", ring_bytes(node_nbytes, len(members)),
                                      members)
                elif len(members) > 1 and op[0] == READ:
                    if merged:
                        clocks.count_sent("node/broadcast", node_nbytes, members[:1])
                    merged = False

    def _replay(self) -> None:
        sim = self.sim
        if self.started:
            return
        self.started = True
        ops = read_traces(self.replay, self.model_count)
        self._count_replayed(ops)
        self.steps = np.array([sum(1 for op in seq if op[0] == APPLY) for seq in ops])
        self.version = np.array([sum(1 for op in seq if op[0] == MERGE) for seq in ops])
        self.executor.run(ops)
        sim.samples = max(self.executor.samples, sim.milestones.budget)
        sim.step = int(self.steps[0])
