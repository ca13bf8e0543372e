"""Local SGD and post-local SGD under the simulator (runner/algos/local_sgd.py): the
algorithm's own ``step_kind`` says what each step does, ``average_models_`` averages."""

from __future__ import annotations

from ...algos.local_sgd import AVERAGE, SYNCHRONOUS, average_models_, step_kind
from ..lockstep import rows_to_their_mean_
from ..registry import SIM_DRIVERS
from .ssgd import SSGDDriver


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
