"""The algorithm interface: hooks around one shared training loop.

The trainer (runner/trainer/loop.py) owns the loop; an algorithm only decides what happens to
gradients and parameters at fixed points of each step::

    before_forward(step)          # e.g. post a non-blocking model exchange
    loss = recipe.loss(...) * gradient_weight(local, global)
    before_backward(step)
    loss.backward()               # gradient hooks installed in setup() may fire here
    after_backward(step)          # gradients are local; synchronise or hand them over
    apply_update(optimizer)       # default: optimizer.step()
    after_step(step)              # e.g. gossip, periodic averaging

plus ``milestone_reached()`` before each evaluation, checkpoint or preemption check,
``pause()``/``resume()`` around evaluation and checkpoints, ``finish()`` (shutdown protocol:
no rank may exit while a peer still waits on it; called before the final evaluation, so that
the model scored last is the model saved), ``state_dict()``/
``load_state_dict()`` for checkpoints (called between steps, after ``pause()``, on every rank
at the same milestone: communication still in flight there is completed and stored, so a
resumed run continues exactly where the checkpoint was taken) and ``shared_update_group()``
(the ranks that must skip a non-finite step together). Class attributes describe capabilities
so that the trainer and the CLI never special-case an algorithm by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from omegaconf import DictConfig

from ..comm import Communicator, Seat, Seated, World
from ..config.section import Section
from ..errors import ConfigError
from ..lazy import torch
from ..runlog.timers import Timers

# An algorithm that averages every so many steps and does so fewer times than this in a whole
# run is hardly what its name says: the run is warned (check_run_length).
FEW_AVERAGINGS = 3


class Reduction(NamedTuple):
    """A setting (``overrides`` of the algorithm's run) in which it ends with the parameters
    of the run that ``reference`` configures (SSGD unless it says otherwise)."""

    overrides: tuple[str, ...]
    reference: tuple[str, ...] = ("algo=ssgd",)


@dataclass
class AlgoConfig(Section):
    name: str = ""


@dataclass
class TrainContext(Seated):
    cfg: DictConfig  # the whole validated run config
    seat: Seat  # the world and its communicators (all ranks; this node's), moved as one
    device: torch.device
    timers: Timers
    param_buffers: list[torch.Tensor] = field(default_factory=list)  # the model, flat
    # Samples of every rank at the current step, as if all ranks moved in lockstep (updated
    # by the trainer before each step): exact weights for short last batches.
    step_counts: list[int] = field(default_factory=list)
    steps_per_epoch: int = 0  # lockstep steps in one pass over the training set
    run_dir: Path = Path(".")

    @property
    def node_comm(self) -> Communicator:
        return self.seat.node_comm


def wire_dtype(cfg: DictConfig) -> torch.dtype | None:
    """``comm.exchange_dtype`` as a torch dtype; None when unset or equal to the model's."""
    name = getattr(cfg.comm, "exchange_dtype", None)  # absent from configs saved before it
    if name is None or name == getattr(cfg.trainer, "dtype", None):
        return None
    return getattr(torch, name)  # float32, bfloat16 or float16 (run_schema.py checks)


def sample_weight(count: int, members: int, total: int) -> float:
    """``c * m / C``: the factor on a member's mean loss that makes the plain mean over the
    ``members`` of a group the mean over all ``total`` samples of their step (one rule for
    lockstep ranks, a super learner's ranks and the simulator's learners)."""
    return count * members / total if total else 0.0


class Algorithm:
    """One algorithm: what happens to gradients and parameters at the loop's hooks.

    Example::

        from dataclasses import dataclass

        from runner.algos import ALGORITHMS, AlgoConfig, Algorithm

        @dataclass
        class PeriodicAveragingConfig(AlgoConfig):
            period: int = 4

        # Local SGD steps; every ``period`` steps x_i <- (1/n) sum_j x_j.
        @ALGORITHMS.register("periodic_averaging")  # conf/algo/periodic_averaging.yaml
        class PeriodicAveraging(Algorithm):
            Config = PeriodicAveragingConfig

            def setup(self, model, optimizer):
                super().setup(model, optimizer)
                self.averagings = 0

            def after_step(self, step):
                if step % self.cfg.period == 0:
                    with self.timers.time("comm"):
                        for flat in self.ctx.param_buffers:  # the model, flat, in place
                            flat.copy_(self.comm.allreduce_(flat.clone(), op="mean"))
                    self.averagings += 1

            def stats(self):
                return {"averagings": self.averagings}

            def state_dict(self):
                return {"averagings": self.averagings}

            def load_state_dict(self, state):
                self.averagings = state["averagings"]

    Lockstep by default: every rank takes the same steps, gradients are weighted by sample
    count (:meth:`gradient_weight`), and the trainer counts global samples exactly. The full
    walk-through (the YAML, the simulator's driver, the tests) is docs/adding-an-algorithm.md.
    """

    Config: ClassVar[type] = AlgoConfig
    # Capabilities.
    identical_replicas: ClassVar[bool] = False  # every rank holds the same model after a step
    asynchronous: ClassVar[bool] = False  # ranks progress at their own pace
    # Takes its part of a checkpoint's consistent cut without meeting the others
    # (capture_state, captured_state_dict): the checkpoint is written beside training.
    background_checkpoints: ClassVar[bool] = False
    uses_topology: ClassVar[bool] = False
    # Survives a lost learner under launcher.elastic (runner/elastic/membership.py): lockstep
    # steps that can be undone, or asynchronous ones whose exchange in flight is dropped
    # (check_peers()), and continue_after_loss() for what must go on.
    elastic: ClassVar[bool] = False
    # Its nodes are part of the algorithm (hadpsgd's super learners): an elastic job's
    # survivors keep the nodes they were launched in, rather than being grouped by machine.
    keeps_nodes: ClassVar[bool] = False
    # Why launcher=sim cannot run this algorithm, when it has no driver in runner/sim/drivers/
    # (the simulator's error line says it; tests/test_sim_coverage.py asks every algorithm for
    # one or the other).
    no_simulator_because: ClassVar[str | None] = None
    # Settings in which it computes what another algorithm does, by case name: the invariants
    # its docstring states, as runs (tests/test_equivalence_mpi.py trains each on 4 ranks in
    # float64 with plain SGD and requires the other's parameters, to 1e-9). Read from the
    # class itself, not inherited.
    reduces_to: ClassVar[dict[str, Reduction]] = {}

    def __init__(self, cfg: Any, ctx: TrainContext):
        self.cfg = cfg
        self.ctx = ctx
        # comm.exchange_dtype: what models (and the pieces of them) travel in between
        # learners; None: the model's dtype (runner/comm/communicator.py).
        self.wire = wire_dtype(ctx.cfg)
        self.world = ctx.world
        self.comm = ctx.comm
        self.timers = ctx.timers

    @classmethod
    def build(cls, cfg: Any, ctx: TrainContext) -> Algorithm:
        """The algorithm object for ``cfg`` (a variant may pick another class)."""
        return cls(cfg, ctx)

    @classmethod
    def check_world(cls, run_cfg: DictConfig) -> None:
        """Raise ConfigError before ranks start when the world shape cannot work."""

    @classmethod
    def check_survivors(cls, run_cfg: DictConfig, world: World) -> None:
        """Raise ConfigError when the learners of ``world`` (an elastic job's, after a loss)
        cannot go on."""
        from omegaconf import OmegaConf

        cls.check_world(OmegaConf.merge(run_cfg, {"launcher": {"nprocs": world.size}}))

    @classmethod
    def averaging_period(cls, cfg: Any) -> tuple[int, str] | None:
        """For a lockstep algorithm whose learners average only every so many steps: those
        steps and the key that spaces them (``(50, "algo.period")``). None when the learners
        communicate at every step."""
        return None

    @classmethod
    def check_run_length(cls, cfg: Any, steps_per_epoch: int, epochs: int) -> str | None:
        """Refuse a run of ``epochs`` of lockstep steps too short for one averaging (it would
        report an averaged model that never was: ConfigError); a warning when it averages
        fewer than ``FEW_AVERAGINGS`` times, or never because its period is 0 (asked for);
        None otherwise."""
        period = cls.averaging_period(cfg)
        if period is None:
            return None
        every, key = period
        setting, steps = f"{key}={every}", steps_per_epoch * epochs
        if every == 0:  # asked for: a baseline of learners that train alone
            return (f"{setting}: {cls.registered_name} never averages the learners: each trains "
                    "alone and the run's model is no average of theirs")
        averagings = steps // every
        if averagings >= FEW_AVERAGINGS:
            return None
        length = (f"this run has {steps} steps ({epochs} epoch(s) of {steps_per_epoch}; "
                  "the steps per epoch shrink as ranks or the batch grow)")
        fewer = max(1, steps // FEW_AVERAGINGS)
        fix = (f"{key}={fewer} or less, or more trainer.epochs (each "
               "averaging is a round of communication)")
        if averagings == 0:
            raise ConfigError(key, f"{cls.registered_name} averages the "
                              f"learners every {every} steps, but {length}: they would never "
                              "average", fix)
        return (f"{setting}: {cls.registered_name} averages the learners every {every} steps "
                f"and {length}: only {averagings} averaging(s) in the whole run; "
                f"{fix}")

    @classmethod
    def topology_ignored(cls, run_cfg: DictConfig) -> str | None:
        """Why this algorithm, as configured, has no use for ``topology`` (the command line
        refuses a ``topology=`` it would silently drop); None when it follows it."""
        if cls.uses_topology:
            return None
        return f"{cls.registered_name} averages over every rank with an allreduce"

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def gradient_weight(self, local_count: int, global_count: int) -> float:
        """Factor on this rank's mean loss.

        Lockstep algorithms weight by sample count, ``c_i * n / C``, so that a plain mean over
        ranks (of gradients or of models) is the mean over every sample of the step: 1 when all
        batches are full, exact for a short last batch. Asynchronous ones have no global step
        and use their own batch mean.
        """
        if self.asynchronous:
            return 1.0
        return sample_weight(local_count, self.world.size, global_count)

    def global_samples(self, local_samples: int, lockstep_samples: int) -> float:
        """Global samples consumed so far, as this rank knows it.

        Lockstep algorithms know it exactly (``lockstep_samples``: every rank knows every
        shard). Asynchronous ones estimate it; the trainer evaluates and stops when this
        crosses sample boundaries, so the estimate must never decrease.
        """
        return lockstep_samples

    def sync_global_samples(self, exact: int) -> None:
        """At each evaluation the trainer shares the exact global count (asynchronous ones
        correct their estimate with it)."""

    def before_forward(self, step: int) -> None:
        pass

    def before_backward(self, step: int) -> None:
        pass

    def after_backward(self, step: int) -> None:
        pass

    def apply_update(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def after_step(self, step: int) -> None:
        pass

    def milestone_reached(self, samples: int) -> None:
        """This rank reached the milestone at ``samples`` global samples and is about to act
        on it (asynchronous algorithms tell their peers, whose estimates may lag)."""

    def pause(self) -> None:
        """Quiesce background communication (evaluation, checkpoints)."""

    def resume(self) -> None:
        pass

    def finish(self) -> None:
        """Complete outstanding communication; return only when no peer still needs us."""

    def stats(self) -> dict[str, float]:
        """Extra per-rank numbers for TensorBoard and summary.json (staleness, exchanges...)."""
        return {}

    def heard_counts(self, samples: list[int], stamps: list[float]) -> None:
        """Every rank's exact sample count as of its stamp (``time.time()``), told by a
        collective beside training (any thread): asynchronous algorithms correct their
        estimates of the global count with it."""

    def copy_parameters(self) -> list[torch.Tensor]:
        """Copies of the flat parameters an evaluation scores, as they are now, between two
        steps (an evaluation beside training scores them while training goes on:
        trainer.eval_in_background)."""
        return [flat.detach().clone() for flat in self.ctx.param_buffers]

    def shared_update_group(self) -> Communicator | None:
        """Ranks that apply the same update (an averaged gradient) and must therefore skip a
        step together when one of them sees a non-finite loss (``trainer.on_nonfinite=
        skip_batch``), or their replicas would part; None: each rank decides alone."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """This rank's algorithm state for a checkpoint: tensors and plain Python values."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def capture_state(self) -> Any:
        """This rank's part of a checkpoint's consistent cut, taken now between two steps
        without waiting for anyone (``background_checkpoints`` algorithms only); it becomes
        the checkpoint's algorithm state through :meth:`captured_state_dict`."""
        raise NotImplementedError(f"{type(self).__name__} meets for its checkpoints")

    def captured_state_dict(self, capture: Any) -> dict[str, Any]:
        """What :meth:`state_dict` would have returned at the capture, once nothing in flight
        can change it any more (any thread; it may wait for that)."""
        raise NotImplementedError(f"{type(self).__name__} meets for its checkpoints")

    def close(self) -> None:
        """Remove what :meth:`setup` installed on the model (gradient hooks): the object is
        being replaced (launcher.elastic, after a learner was lost)."""

    def check_peers(self) -> None:
        """Raise what went wrong in communication running beside training (an asynchronous
        algorithm's gossip), before a step starts (launcher.elastic). Nothing by default."""

    def before_undoable_step(self, step: int) -> Any:
        """launcher.elastic, lockstep: what step ``step`` is about to change of this object's
        own state, beyond the model and the optimizer that the trainer's snapshot keeps
        (runner/elastic/membership.py), for :meth:`undo_step` to put back when a learner is
        lost during the step. Nothing by default."""
        return None

    def undo_step(self, saved: Any) -> None:
        """Put back what :meth:`before_undoable_step` returned: the step did not complete on
        every learner, and the survivors take it again from where it started."""

    def continue_after_loss(self, previous: Algorithm) -> None:
        """Take over from ``previous``, the object of the same algorithm before a learner was
        lost (launcher.elastic; runner/elastic/membership.py): this one is built for the survivors,
        after every rank undid the step in flight; ``previous``'s communication in flight is
        lost with its communicators. Counters and phases that must go on are copied here;
        by default there are none."""

    def continue_after_join(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` after spares joined (launcher.elastic; runner/elastic/
        spares.py): this learner's own :meth:`state_dict` from before, a joining spare's its
        donor's. This object is built for the larger world; state that belongs to the old
        one (a neighbour's copy, a message in flight) must not be loaded. By default the whole
        state is."""
        self.load_state_dict(state)

    def heard_samples(self) -> list[float]:
        """Asynchronous and elastic: every rank's samples trained, as this rank last heard
        them (a lost learner is taken to have trained that much: runner/elastic/
        membership.py). Lockstep learners know the count exactly and are never asked."""
        raise NotImplementedError(f"{type(self).__name__} is asynchronous and elastic: it must "
                                  "say what it heard of the others' samples (heard_samples)")

    def start_joiners_at_the_mean(self, comm: Any, joining: bool, counted: bool) -> None:
        """Asynchronous and elastic, collective over ``comm`` (the learners after spares
        joined): where a joining spare's model starts (``joining``: this rank is one;
        ``counted``: this survivor stands for its participant). By default a joiner keeps its
        donor's state, loaded already (runner/elastic/spares.py)."""

    def load_merged_state(self, state: dict[str, Any], step: int, epoch: float) -> None:
        """Start from the mean over a checkpoint's ranks of their ``state_dict()`` (floating
        tensors averaged, the rest old rank 0's) in a job with another number of ranks,
        at ``step`` and ``epoch`` (runner/checkpoint/resize.py). Every replica starts from the same
        averaged model, so by default the algorithm starts afresh; one whose state holds the
        model, or counters that must go on, overrides this."""
