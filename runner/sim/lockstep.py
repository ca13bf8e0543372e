"""How lockstep algorithms move under the simulator: the base of their drivers
(runner/sim/drivers/: SSGD, D-PSGD, local SGD, DaSGD, delay-by-one, SGP, CHOCO, DiLoCo).

Every learner takes step k together (the trainer's lockstep: same step count, the same batch
of its shard as on a real rank). :class:`LockstepDriver` deals the batches, computes the
gradients, applies the optimizer and keeps each learner's virtual clock: compute from the
cluster's compute model, communication from its network model. A learner that waits for a
slower one is idle; the transfer time it cannot hide is communication. A driver's ``step``
applies its algorithm's rule to the stacked models with the functions the ranks call
(runner/algos/*.py: ``mix_``, ``merge_``, ``outer_step_``, ``mix_in_``...), so the two
engines differ only in how messages move: a collective (an allreduce) becomes a mean over the
learner dimension (:func:`rows_to_their_mean_`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..algos.base import sample_weight
from ..comm.buffers import parameter_digest
from ..comm.communicator import ring_bytes


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

    def advance_to(self, target: int, meet: bool = True) -> None:
        """Take lockstep steps until the global sample count reaches ``target`` (the next
        milestone), as the trainer's loop does (lockstep learners are together at every step:
        ``meet`` changes nothing)."""
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

    def count_allreduce(self, overlapped: bool = False) -> None:
        """Every learner's share of an allreduce of one model (runner/comm/traffic.py);
        ``overlapped``: it runs while the learners compute, so the CPU it takes between nodes
        slows their steps (cluster.cpu_s_per_mb). A blocking one's CPU falls in the time the
        learners wait for it, which the link's measured time includes already."""
        if self.n > 1:
            self.sim.clocks.count_sent("world/allreduce", ring_bytes(self.sim.nbytes, self.n))
            if overlapped:
                self.sim.clocks.crossed_ring(range(self.n), ring_bytes(self.sim.nbytes, self.n))
