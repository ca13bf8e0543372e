"""The lockstep algorithms under the simulator: SSGD, D-PSGD, local SGD, DaSGD, delay-by-one.

Every learner takes step k together (the trainer's lockstep: same step count, the same batch
of its shard as on a real rank). Each driver applies its algorithm's rule to the stacked
models with the functions the MPI classes call (runner/algos/*.py: ``mix_``, ``merge_``,
``step_kind``, ``launch_due``...), and keeps each learner's virtual clock: compute from the
cluster's compute model, communication from its network model. A learner that waits for a
slower one is idle; the transfer time it cannot hide is communication. Collectives (an
allreduce) become a mean over the learner dimension.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..algos.base import sample_weight
from ..algos.dasgd import launch_due, merge_, merge_due
from ..algos.delay_by_one import matching_partner
from ..algos.delay_by_one import mix_ as delay_mix_
from ..algos.dpsgd import mix_
from ..algos.local_sgd import AVERAGE, SYNCHRONOUS, average_models_, step_kind
from ..comm.buffers import parameter_digest
from ..comm.communicator import ring_bytes
from ..topology import TOPOLOGIES
from .registry import SIM_DRIVERS


def rows_to_their_mean_(x: torch.Tensor) -> torch.Tensor:
    """Every learner's allreduce of its row, at once: each row becomes the rows' mean."""
    return x.copy_(x.mean(0, keepdim=True).expand_as(x))


class LockstepDriver:
    """Runs lockstep steps; subclasses implement :meth:`step` (the update and the clocks)."""

    identical_replicas = False
    asynchronous = False

    def __init__(self, sim: Any):
        self.sim = sim
        self.n = sim.n
        self.model_count = sim.n  # one model per learner
        self.position = (0, 0)  # (epoch, batch) of the next step

    @classmethod
    def build(cls, sim: Any) -> LockstepDriver:
        return cls(sim)

    def setup(self) -> None:
        """Called once the stacked models exist."""

    def advance_to(self, target: int) -> None:
        """Take lockstep steps until the global sample count reaches ``target`` (the next
        milestone), as the trainer's loop does."""
        sim = self.sim
        steps = sim.steps_per_epoch
        while sim.samples < target:
            epoch, k = self.position
            batches, counts = sim.batches(epoch, k)
            global_count = sim.data.shards.global_count(k)
            sim.step += 1
            sim.lr = sim.schedule.lr_at(sim.samples)
            self.step(sim.step, batches, counts, global_count)
            sim.samples += global_count
            # An elastic job lost a node in this step (stop_at is finite only then): the step
            # is dropped, its batch dealt again.
            if sim.stop_at < math.inf and sim.clocks.now() >= sim.stop_at:
                sim.samples -= global_count
                sim.step -= 1
                return
            self.position = (epoch, k + 1) if k + 1 < steps else (epoch + 1, 0)

    def resume_at(self, now: float) -> None:
        """A restarted job trains again at ``now``: the clocks say it already."""

    def continue_from(self, samples: int, steps: list[int]) -> None:
        """An elastic timing run that lost learners goes on after ``samples``: the next step
        is the new shards' step that holds the epoch's next sample (the samples before it in
        that step are counted again: less than a step's)."""
        shards = self.sim.data.shards
        epoch, within = divmod(int(samples), shards.n_items)
        k = within // (shards.size * shards.batch_size)
        self.position = (epoch, k) if k < shards.steps_per_epoch else (epoch + 1, 0)

    def steps_per_learner(self) -> list[int]:
        return [self.sim.step] * self.n

    def digests(self) -> list[tuple[int, str]]:
        """(node, digest of the parameters) per learner, as summary.json compares them."""
        ppn = self.sim.procs_per_node
        return [(i // ppn, parameter_digest([self.sim.x[i]])) for i in range(self.n)]

    def stats(self) -> list[dict[str, float]]:
        return [{} for _ in range(self.n)]

    def finish(self) -> None:
        """Complete what is in flight (before the final evaluation)."""

    def state_dict(self) -> dict[str, Any]:
        """What decides this driver's future (subclasses add theirs), for a checkpoint."""
        return {"position": list(self.position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = tuple(state["position"])

    def step(self, step: int, batches: list, counts: list[int], global_count: int) -> None:
        raise NotImplementedError

    # ---- pieces shared by the drivers ----------------------------------------------------
    def weights(self, counts: list[int], global_count: int) -> torch.Tensor:
        """Each learner's factor on its mean loss, as on a real rank: c_i n / C."""
        return torch.tensor([sample_weight(c, self.n, global_count) for c in counts],
                            dtype=self.sim.dtype)

    def local_gradients(self, batches: list, counts: list[int], global_count: int
                        ) -> torch.Tensor:
        x = self.sim.x
        grads = self.sim.gradients(x, range(self.n), batches, counts)
        if all(c * self.n == global_count for c in counts):  # full batches: every weight is 1
            return grads
        return grads * self.weights(counts, global_count).unsqueeze(1)

    def apply(self, grads: torch.Tensor) -> None:
        self.sim.apply_update(None, grads, torch.full((self.n,), self.sim.lr, dtype=torch.float64))

    def compute_all(self, step: int, counts: list[int]) -> np.ndarray:
        """Each learner's compute seconds for this step, added to its clock and split."""
        seconds = self.sim.compute_seconds(step, counts)
        self.sim.clocks.advance(seconds, "compute")
        return seconds

    def allreduce_together(self) -> None:
        """A blocking allreduce of one model's bytes over every learner: all wait for the last
        (idle), then the collective's time (comm)."""
        clocks = self.sim.clocks
        clocks.wait_until(clocks.t.max(), "idle")
        clocks.advance(self.sim.cluster.allreduce_s(list(range(self.n)), self.sim.nbytes),
                       "comm")
        self.count_allreduce()

    def count_allreduce(self) -> None:
        """Every learner's share of an allreduce of one model (runner/comm/traffic.py)."""
        if self.n > 1:
            self.sim.clocks.count_sent("world/allreduce", ring_bytes(self.sim.nbytes, self.n))


@SIM_DRIVERS.register("ssgd")
class SSGDDriver(LockstepDriver):
    """x <- x - gamma * mean_i(c_i n / C g_i): the averaged gradient applied on every row."""

    identical_replicas = True

    def step(self, step, batches, counts, global_count):
        # The rows are equal, so the learners' weighted gradients are summed in one backward
        # pass at row 0 (the allreduce's mean, by linearity); row 0 alone is stepped and
        # copied to the others (its momentum too).
        sim = self.sim
        weights = self.weights(counts, global_count) / self.n
        mean = sim.weighted_gradient(sim.x[0], batches, counts, weights)
        sim.apply_update(torch.tensor([0]), mean.unsqueeze(0),
                         torch.tensor([sim.lr], dtype=torch.float64))
        sim.replicate_row(0)
        self.compute_all(step, counts)
        self.allreduce_together()


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


@SIM_DRIVERS.register("local_sgd")
class LocalSGDDriver(SSGDDriver):
    """Synchronous SGD up to the switch, then local steps and a model average every period."""

    def __init__(self, sim):
        super().__init__(sim)
        cfg = sim.cfg.algo
        self.switch_step = round(cfg.switch_epoch * sim.steps_per_epoch)
        self.period = cfg.period
        self.synced = True
        self.averagings = 0

    @property
    def identical_replicas(self):  # type: ignore[override]
        return self.synced

    def step(self, step, batches, counts, global_count):
        kind = step_kind(step, self.switch_step, self.period)
        if kind == SYNCHRONOUS:
            super().step(step, batches, counts, global_count)
            return
        self.apply(self.local_gradients(batches, counts, global_count))
        self.compute_all(step, counts)
        self.synced = kind == AVERAGE
        if kind == AVERAGE:
            average_models_([self.sim.x], rows_to_their_mean_)
            self.allreduce_together()
            self.averagings += 1

    def stats(self):
        local = float(self.switch_step == 0 or self.sim.step > self.switch_step)
        return [{"averagings": self.averagings, "local": local} for _ in range(self.n)]

    def state_dict(self):
        return {**super().state_dict(), "synced": self.synced, "averagings": self.averagings}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.synced, self.averagings = state["synced"], state["averagings"]


@SIM_DRIVERS.register("dasgd")
class DaSGDDriver(LockstepDriver):
    """Local steps; every tau steps a snapshot is averaged in the background and merged delay
    steps later: x <- abar + (x - s)."""

    def __init__(self, sim):
        super().__init__(sim)
        self.tau, self.delay = sim.cfg.algo.tau, sim.cfg.algo.delay
        self.snapshot: torch.Tensor | None = None
        self.average: torch.Tensor | None = None
        self.launched_at = -1
        self.reduced_at = 0.0  # virtual time the pending reduction completes
        self.reduce_started = 0.0
        self.synced = True
        self.launches = self.merges = 0

    @property
    def identical_replicas(self):  # type: ignore[override]
        return self.synced

    def _merge(self) -> None:
        clocks = self.sim.clocks
        clocks.wait_until(np.full(self.n, self.reduce_started), "idle")
        clocks.wait_until(np.full(self.n, self.reduced_at), "comm")
        merge_(self.sim.x, self.snapshot, self.average)
        self.snapshot = self.average = None
        self.merges += 1

    def step(self, step, batches, counts, global_count):
        t = step - 1  # the rule counts steps from 0
        self.apply(self.local_gradients(batches, counts, global_count))
        self.compute_all(step, counts)
        self.synced = False
        if self.snapshot is not None and merge_due(t, self.launched_at, self.delay):
            self._merge()
        if launch_due(t, self.tau):
            x = self.sim.x
            self.snapshot = x.clone()
            self.average = rows_to_their_mean_(x.clone())
            self.launched_at = t
            self.launches += 1
            self.reduce_started = float(self.sim.clocks.t.max())  # the last learner launches
            self.reduced_at = self.reduce_started + self.sim.cluster.allreduce_s(
                list(range(self.n)), self.sim.nbytes)
            self.count_allreduce()
            if self.delay == 0:
                self._merge()
                self.synced = True

    def finish(self):
        if self.snapshot is not None:
            self._merge()

    def stats(self):
        return [{"launches": self.launches, "merges": self.merges} for _ in range(self.n)]

    def state_dict(self):
        return {**super().state_dict(), "launched_at": self.launched_at, "synced": self.synced,
                "launches": self.launches, "merges": self.merges,
                "snapshot": self.snapshot, "average": self.average,
                "reduced_at": self.reduced_at, "reduce_started": self.reduce_started}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for key in ("launched_at", "synced", "launches", "merges", "snapshot", "average",
                    "reduced_at", "reduce_started"):
            setattr(self, key, state[key])


class DelayByOneDriver(LockstepDriver):
    """Each step every learner sends x^k to its matching partner p(k) and mixes in, after its
    next gradient, the model its partner sent one step earlier: x <- (1-w) x + w y."""

    def __init__(self, sim):
        super().__init__(sim)
        self.pattern, self.seed = sim.cfg.algo.pattern, sim.cfg.seed
        self.previous: tuple[torch.Tensor, np.ndarray] | None = None  # (models, sent at)
        self.previous_partner: list[int] = []

    def step(self, step, batches, counts, global_count):
        partners = [matching_partner(self.pattern, i, self.n, step, self.seed)
                    for i in range(self.n)] if self.n > 1 else []
        sent_models = self.sim.x.clone() if self.n > 1 else None
        start = self.sim.clocks.t.copy()
        grads = self.local_gradients(batches, counts, global_count)
        self.compute_all(step, counts)
        if self.previous is not None:
            models, sent_at = self.previous
            delay_mix_(self.sim.x, models[torch.tensor(self.previous_partner)])
            self.sim.clocks.receive([[p] for p in self.previous_partner], sent_at,
                                    self.sim.nbytes)
        self.apply(grads)
        if self.n > 1:
            self.previous, self.previous_partner = (sent_models, start), partners

    def finish(self):
        """The last step's message is never mixed in, but the ranks wait for it to arrive."""
        if self.previous is not None:
            self.sim.clocks.receive([[p] for p in self.previous_partner], self.previous[1],
                                    self.sim.nbytes)
            self.previous = None

    def state_dict(self):
        if self.previous is None:
            return {**super().state_dict(), "previous": None}
        return {**super().state_dict(), "previous": self.previous[0],
                "sent_at": torch.from_numpy(self.previous[1]), "partners": self.previous_partner}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if state["previous"] is None:
            self.previous = None
        else:
            self.previous = (state["previous"], state["sent_at"].numpy().copy())
            self.previous_partner = list(state["partners"])
