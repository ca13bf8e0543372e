"""One simulated run: N learners in this process, in the virtual time of a modelled cluster.

The run is built from the same parts as a real rank's (runner/trainer/loop.py): the recipe's
datasets, model and metric; the shards (runner/train/data.py: learner i reads exactly the batches
rank i would); the learning-rate schedule and the milestones in global samples; the evaluator
(averaged model and learner 0's own); the run log (TensorBoard, metrics.jsonl, summary.json)
and ``checkpoints/final_rank0.pt``. What differs is who runs the algorithm: a driver over the
stacked models (runner/sim/drivers/) calling the algorithm's own rule functions, and clocks
in virtual seconds (runner/sim/clocks.py, runner/sim/cluster.py). ``wall_s`` and the time
split are seconds on the modelled cluster; ``host_s`` is what the simulation took here.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ..algos import ALGORITHMS
from ..algos.base import wire_dtype
from ..checkpoint.checkpointer import Checkpointer
from ..checkpoint.period import AutoPeriod
from ..comm.communicator import Communicator
from ..comm.seat import Seat
from ..comm.traffic import traffic_report
from ..comm.world import World, mpi
from ..config.run_schema import CHECKPOINT_AUTO as AUTO
from ..errors import ConfigError, UserError, warn_user
from ..recipe import RECIPES
from ..runlog.console import ProgressBar, evaluation_postfix
from ..runlog.summary import build_summary
from ..runlog.throughput import Throughput
from ..runlog.timers import Timers
from ..runlog.writer import RunLog
from ..train.compute_path import ComputePath
from ..train.data import BatchFetcher, ShardedBatches
from ..train.evaluation import Evaluator
from ..train.lr_schedule import LRSchedule
from ..train.milestones import CHECKPOINT, EVALUATE, Milestone, Milestones
from ..train.nonfinite import nonfinite_error
from ..train.rng import seed_everything
from .clocks import Clocks
from .cluster import ClusterModel, ComputeModel, resolved
from .drivers import SIM_DRIVERS  # importing the package registers every driver
from .failures import NodeFailures
from .stacked import StackedLearners, StackedSGD

log = logging.getLogger("adpsgd")


class SimData:
    """Learner i's batch at step k of its epoch e: the batch rank i of n would read."""

    def __init__(self, dataset: Any, recipe: Any, compute: ComputePath, n: int,
                 batch_size: int, seed: int):
        self.dataset, self.recipe, self.compute = dataset, recipe, compute
        self.shards = ShardedBatches(len(dataset), 0, n, batch_size, seed)
        self.tensors = getattr(dataset, "tensors", None)  # TensorDataset: index directly
        self._orders: OrderedDict[int, np.ndarray] = OrderedDict()

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders[epoch] = self.shards.pass_order(epoch)
            while len(self._orders) > 4:
                self._orders.popitem(last=False)
        return self._orders[epoch]

    def indices(self, learner: int, epoch: int, k: int) -> np.ndarray:
        shard = self._order(epoch)[learner::self.shards.size]
        b = self.shards.batch_size
        return shard[k * b:(k + 1) * b]

    def batch(self, learner: int, epoch: int, k: int) -> tuple[Any, int]:
        """(the batch on the model's device and dtype, its size); (None, 0) when empty."""
        idx = self.indices(learner, epoch, k)
        if len(idx) == 0:
            return None, 0
        if self.tensors is not None:
            host = tuple(t[torch.from_numpy(idx)] for t in self.tensors)
        else:
            host = self.recipe.collate([self.dataset[int(i)] for i in idx])
        return self.compute.batch(self.recipe, host), len(idx)


def build_driver(sim: Any):
    """The driver for ``sim.cfg.algo`` (a driver's ``build`` may pick a variant)."""
    name = sim.cfg.algo.name
    if name not in SIM_DRIVERS:
        why = ALGORITHMS.get(name).no_simulator_because if name in ALGORITHMS else None
        raise ConfigError("algo", f"launcher=sim has no model of algo={name}"
                          + (f" ({why})" if why else ""),
                          f"use one of {', '.join(SIM_DRIVERS.names())} (or launcher=local)")
    return SIM_DRIVERS.get(name).build(sim)


def plain(section: Any) -> Any:
    """A typed config section as its dataclass (attribute reads at Python speed)."""
    return OmegaConf.to_object(section) if isinstance(section, DictConfig) else section


def virtual_time(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 3600 else f"{seconds / 3600:.3g} h"


class Simulation:
    def __init__(self, cfg: DictConfig, run_dir: str | Path,
                 progress_stream: TextIO | None = None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.progress_stream = progress_stream
        self.host_start = time.perf_counter()
        tcfg, o = cfg.trainer, plain(cfg.optim)
        self.n = cfg.launcher.nprocs
        self.procs_per_node = cfg.launcher.procs_per_node or cfg.cluster.gpus_per_node or 1
        self.recipe = RECIPES.get(cfg.recipe.name)(cfg.recipe)
        self.train_set, eval_set = self.recipe.datasets()
        if len(eval_set) == 0:
            raise UserError(f"recipe {cfg.recipe.name}: the held-out set has no samples",
                            "point the recipe at a non-empty evaluation set")
        self.dtype = getattr(torch, tcfg.dtype)
        device = torch.device("cpu")
        seed_everything(cfg.seed)  # the same initial model as every real rank
        self.model = self.recipe.build_model().to(device=device, dtype=self.dtype)
        self.compute = ComputePath.from_config(tcfg, device)
        self.data = SimData(self.train_set, self.recipe, self.compute, self.n,
                            tcfg.batch_size, cfg.seed)
        self.build_schedule(len(self.train_set))
        self.check_run_length()
        self.driver = build_driver(self)
        self.models = self.driver.model_count  # rows of x: learners, or super learners
        self.learners = StackedLearners(self.model, self.recipe.loss, self.models)
        self.x = self.learners.x
        # launcher.model_bytes times the exchanges for a model of that size while this one
        # learns: a small model's steps with a large one's communication.
        self.set_message_sizes(float(cfg.launcher.get("model_bytes") or self.learners.nbytes))
        self.optimizer = StackedSGD(self.learners, self.model, o.momentum, o.nesterov,
                                    o.weight_decay, o.no_decay_norm_bias)
        self.driver.setup()
        self.comm = Communicator(mpi().COMM_SELF, "mpi", name="self")
        loading = dict(num_workers=0, persistent_workers=False, pin_memory=False)
        alone = World(rank=0, size=1, local_rank=0, local_size=1, node=0, num_nodes=1)
        self.evaluator = Evaluator(  # scores the models it is given, in this one process
            self.recipe, self.model, list(self.model.parameters()), self.compute,
            Seat(alone, self.comm, self.comm),
            BatchFetcher(eval_set, self.recipe.collate, **loading),
            ShardedBatches(len(eval_set), 0, 1, tcfg.eval_batch_size, cfg.seed, shuffle=False),
            self.run_dir)
        # The whole simulation is one process: its checkpoint is one file (rank0.pt) that
        # holds every learner, in a checkpoint of the job's launcher.nprocs ranks.
        self.world = World(rank=0, size=self.n, local_rank=0, local_size=self.procs_per_node,
                           node=0, num_nodes=-(-self.n // self.procs_per_node))
        self.checkpointer = Checkpointer(cfg, self.run_dir, Seat(self.world, self.comm, self.comm),
                                         Timers(), progress_stream)
        self.history: list[dict[str, Any]] = []
        self.host_before = 0.0  # host seconds of the sessions before a resume
        self.host_eval_s = 0.0
        self.resumed_from, saved = self.checkpointer.resolve(len(self.train_set))
        if self.resumed_from:
            self._restore(saved)
        self.throughput = Throughput(self.clocks.now(), self.samples)  # in virtual seconds
        # A resumed run continues the same TensorBoard run and metrics.jsonl.
        self.runlog = RunLog(self.run_dir, cfg, self.recipe.primary_metric,
                             resume_at=(self.step, self.samples) if self.resumed_from else None)
        if self.resumed_from:
            self.runlog.rewrite_metrics(self.history)

    def set_message_sizes(self, model_nbytes: float) -> None:
        """Between learners models travel in comm.exchange_dtype (``nbytes``); inside a super
        learner in their own dtype (``node_nbytes``). The arithmetic stays in the model's
        dtype: the time and the bytes are the lower precision's, the rounding is not
        simulated."""
        self.node_nbytes = model_nbytes
        self.wire = wire_dtype(self.cfg)
        self.nbytes = model_nbytes * (self.wire.itemsize / self.dtype.itemsize
                                      if self.wire else 1.0)

    def check_run_length(self) -> None:
        """What a real run's ranks refuse or warn, before simulating: an algorithm that
        averages every N steps in a run of fewer (Algorithm.check_run_length)."""
        short = ALGORITHMS.get(self.cfg.algo.name).check_run_length(
            self.cfg.algo, self.steps_per_epoch, self.cfg.trainer.epochs)
        if short:
            log.warning("%s", short)
            warn_user(short, self.progress_stream)

    def build_schedule(self, train_size: int) -> None:
        """What the drivers' clocks read (shared with the timing-only simulation): the
        cluster and compute models, the clocks, the learning-rate schedule and the milestones
        of an epoch of ``train_size`` samples."""
        cfg, tcfg = self.cfg, self.cfg.trainer
        self.steps_per_epoch = self.data.shards.steps_per_epoch
        # Plain dataclasses, not DictConfig: the schedule reads them at every step.
        self.cluster_cfg = cluster_cfg = resolved(plain(cfg.cluster))
        self.cluster = ClusterModel(cluster_cfg, self.n, self.procs_per_node)
        self.compute_model = ComputeModel(cluster_cfg.compute, cfg.recipe.name, self.n,
                                          cfg.seed, list(cfg.faults.straggler.ranks),
                                          cfg.faults.straggler.factor)
        self.clocks = Clocks(self.n, self.cluster)
        global_batch = self.n * tcfg.batch_size
        self.schedule = LRSchedule(plain(cfg.optim), global_batch, train_size, tcfg.epochs)
        auto = tcfg.checkpoint_every == AUTO  # planned as the run goes (setup_failures)
        self.milestones = Milestones(train_size, tcfg.epochs, global_batch, tcfg.eval_every,
                                     None if auto else tcfg.checkpoint_every, None,
                                     epoch_checkpoints=not auto)
        self.auto_checkpoints = (AutoPeriod.of(cfg, global_batch, self.milestones.budget)
                                 if auto else None)
        self.checkpoint_periods: list[dict[str, Any]] = []
        self.samples = 0  # global samples consumed
        self.step = 0  # lockstep steps (asynchronous: steps of learner 0)
        self.losses: list[float] = []
        self.lr = self.schedule.lr_at(0)

    # ---- what drivers call ---------------------------------------------------------------
    def gradients(self, models: torch.Tensor, learners, batches: list, counts: list[int]
                  ) -> torch.Tensor:
        """Gradients ``[k, P]`` of learners ``learners`` at ``models`` (one row each); their
        losses feed the logged training loss; a non-finite one ends the run as on a rank."""
        learners = list(learners)
        grads, losses = self.learners.gradients(models, learners, batches, counts)
        self._record_losses(learners, counts, losses)
        return grads

    def weighted_gradient(self, model: torch.Tensor, batches: list, counts: list[int],
                          weights: torch.Tensor) -> torch.Tensor:
        """``sum_i weights[i] g_i`` ``[P]`` of every learner at the one ``model`` ``[P]``
        (identical replicas), losses as :meth:`gradients` records them."""
        learners = list(range(self.n))
        grad, losses = self.learners.weighted_gradient(model, learners, batches, counts,
                                                       weights)
        self._record_losses(learners, counts, losses)
        return grad

    def replicate_row(self, source: int) -> None:
        """Every learner's model and momentum become learner ``source``'s."""
        self.optimizer.copy_row(self.x, source)

    def _record_losses(self, learners: list[int], counts: list[int], losses: torch.Tensor
                       ) -> None:
        scored = torch.tensor([c > 0 for c in counts], dtype=torch.bool)
        if bool(scored.any()):
            if not bool(torch.isfinite(losses[scored]).all()):
                bad = [learners[j] for j in range(len(learners))
                       if counts[j] and not bool(torch.isfinite(losses[j]))]
                raise nonfinite_error("non-finite training loss", self.step, bad, None)
            self.losses.append(float(losses[scored].mean()))

    def apply_update(self, rows: torch.Tensor | None, grads: torch.Tensor, lr: torch.Tensor,
                     decay_at: torch.Tensor | None = None) -> None:
        clip = self.cfg.optim.clip_grad_norm
        if clip:  # per learner, as torch.nn.utils.clip_grad_norm_ on each rank
            norms = grads.norm(dim=1, keepdim=True)
            grads = grads * torch.clamp(clip / (norms + 1e-6), max=1.0)
        self.optimizer.step(self.x, rows, grads, lr, decay_at)

    def compute_seconds(self, step: int, counts: list[int],
                        learners: list[int] | None = None) -> np.ndarray:
        learners = range(self.n) if learners is None else learners
        return np.array([self.compute_model.step_s(i, step, counts[j], float(self.clocks.t[i]))
                         + self.clocks.network_cpu_s(i) for j, i in enumerate(learners)])

    def batches(self, epoch: int, k: int, learners: list[int] | None = None
                ) -> tuple[list, list[int]]:
        learners = range(self.n) if learners is None else learners
        pairs = [self.data.batch(i, epoch, k) for i in learners]
        return [b for b, _ in pairs], [c for _, c in pairs]

    # ---- the run -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        shown = self.cfg.trainer.progress
        self.progress = ProgressBar(self.progress_stream if shown else None,
                                    self.milestones.budget, self.samples,
                                    f"{self.cfg.algo.name} x{self.n} (sim)",
                                    self.cfg.trainer.progress_every_s, "host samples/s")
        final_scored = False
        self.setup_failures()
        while not self.milestones.done:
            point = self.milestones.points[self.milestones.passed]
            met = self.meets_at(point)
            self.driver.advance_to(point.samples, met)
            if self.handled_failure():
                continue
            self.progress.update(self.samples)
            self.log_training()
            while (milestone := self.milestones.due(self.samples)) is not None:
                if not met and self.meets_at(milestone, passed=True):
                    self.milestones.rearm()  # due too, and met: the next round meets for it
                    break
                if milestone.kind == EVALUATE:
                    if milestone.final:
                        self.driver.finish()
                    if milestone.final or not self.milestones.another_due(EVALUATE,
                                                                          self.samples):
                        self.evaluate()
                        final_scored = final_scored or milestone.final
                elif milestone.kind == CHECKPOINT and not self.checkpoint_milestone():
                    break  # a node failed during the write: the run went back
            self.throughput.restart(self.clocks.now(), self.samples)  # writes are no training
        if not final_scored:
            self.driver.finish()
        self.progress.close()
        return self.finalize()

    def meets_at(self, point: Milestone, passed: bool = False) -> bool:
        """Whether the learners meet at this milestone, as real ranks do: at every one, but an
        evaluation beside training (trainer.eval_in_background) that no checkpoint follows at
        the same count (``passed``: ``point`` is the milestone just passed)."""
        if not self.cfg.trainer.eval_in_background or point.kind != EVALUATE or point.final:
            return True
        return self.milestones.checkpoint_next_at(point.samples, 0 if passed else 1)

    # ---- node failures and restarts (cluster.failures, cluster.storage_gbps) ----------------
    def setup_failures(self) -> None:
        """The failures to come, a checkpoint's write time and the state a restart goes back
        to (the run's start until a checkpoint is complete). Called by run(): the model's
        size is known then."""
        cluster, o = self.cluster_cfg, plain(self.cfg.optim)
        failures = cluster.failures
        nodes = -(-self.n // self.procs_per_node)
        self.failures = NodeFailures(
            failures.node_mtbf_hours * 3600 if failures.node_mtbf_hours else None, nodes,
            list(failures.at_s), self.cfg.seed)
        # Every learner writes its model, and its momentum if it has one, at once.
        written = self.n * self.node_nbytes * (2 if o.momentum else 1)
        self.checkpoint_s = (written * 8 / (cluster.storage_gbps * 1e9)
                             if cluster.storage_gbps else 0.0)
        self.checkpoints_written_s = 0.0
        if self.auto_checkpoints:  # the same rule as real ranks, on the modelled write
            first = self.auto_checkpoints.first(self.samples)
            if first is not None:
                self.milestones.add_checkpoint(first)
        self.restarts: list[dict[str, Any]] = []
        self.membership: list[dict[str, Any]] = []  # launcher.elastic: the learners lost
        self.nodes_lost = 0
        elastic = self.cfg.launcher.elastic
        self.standing = self.snapshot() if failures.any and not elastic else None
        # An elastic job's drivers stop at the failure (the others go on from there).
        self.stop_at = self.failures.next_at() if elastic else math.inf

    def snapshot(self) -> dict[str, Any]:
        """Everything a restart from the newest checkpoint goes back to, copied."""
        return copy.deepcopy(self._state())

    def checkpoint_milestone(self) -> bool:
        """A checkpoint: its write in virtual time (every learner paused), then its files and
        the state restarts go back to. False when a node failed before it was complete: the
        run went back to the one before."""
        if self.checkpoint_s:
            self.clocks.wait_until(self.clocks.now(), "idle")
            self.clocks.advance(self.checkpoint_s, "idle")
            self.checkpoints_written_s += self.checkpoint_s
        if self.handled_failure():
            return False
        self.write_checkpoint()
        if self.auto_checkpoints:
            self.plan_next_checkpoint()
        if self.standing is not None:
            self.standing = self.snapshot()
        return True

    def plan_next_checkpoint(self) -> None:
        """trainer.checkpoint_every=auto (runner/checkpoint/period.py): Young's period after
        this checkpoint, from its modelled write and the virtual training seconds so far (what
        failures cost left out)."""
        lost = sum(r["lost_s"] + r["seconds_down"] for r in self.restarts)
        training_s = self.clocks.now() - self.checkpoints_written_s - lost
        point, record = self.auto_checkpoints.next(self.samples, self.checkpoint_s,
                                                   self.samples / max(training_s, 1e-12))
        self.checkpoint_periods.append(record)
        if point is not None:
            self.milestones.add_checkpoint(point)

    def write_checkpoint(self) -> None:
        self.save_checkpoint("scheduled")

    def handled_failure(self) -> bool:
        """Whether a node failed before the clocks' present; if so, the job went back to the
        newest checkpoint as a restarted job does: everything since is lost, and training
        starts again restart_s after the failure. What the run computed past the failure
        is discarded, so checking at milestones rather than steps changes nothing.
        (launcher.elastic: runner/sim/timing.py goes on without the node instead.)"""
        at = self.failures.next_at()
        if self.clocks.now() < at:
            return False
        down_s = self.cluster_cfg.failures.restart_s
        _, node = self.failures.take(resumes_at=at + down_s)
        state = self.standing["simulator"]
        since = float(state["clocks"]["t"].max())
        # Samples at the failure, between the checkpoint's and now's at a steady rate.
        reached = state["samples"] + (self.samples - state["samples"]) * min(1.0, max(
            0.0, (at - since) / max(self.clocks.now() - since, 1e-12)))
        cause = (f"node {node} failed at random (cluster.failures.node_mtbf_hours)"
                 if node is not None else "a node was killed (cluster.failures.at_s)")
        if len(self.restarts) >= self.cfg.launcher.max_restarts:
            raise UserError(
                f"{cause} at virtual {virtual_time(at)}, {int(reached)} samples in, and the "
                f"job may restart only launcher.max_restarts={self.cfg.launcher.max_restarts} "
                "time(s)", "allow more restarts (launcher.max_restarts=N), as a job on that "
                "cluster would need")
        self.rebuild_driver()
        host_before = self.host_before  # this process's time goes on
        self.load_state(copy.deepcopy(self.standing))
        self.host_before = host_before
        self.clocks.wait_until(at + down_s, "idle")
        self.driver.resume_at(at + down_s)
        self.restarts.append({
            "cause": cause, "at_samples": int(reached),
            "resumed_from_samples": int(state["samples"]), "failed_at_virtual_s": at,
            "seconds_down": down_s, "lost_s": at - since})
        log.info("restart %d: %s at virtual %.6g s; back to %d samples (%.6g s of training "
                 "lost, %.6g s down)", len(self.restarts), cause, at, state["samples"],
                 at - since, down_s)
        self.went_back()
        return True

    def rebuild_driver(self) -> None:
        """A fresh driver (nothing in flight), as a restarted job starts."""
        self.driver = build_driver(self)
        self.driver.setup()

    def went_back(self) -> None:
        """After a restart: the run log forgets what came after the checkpoint."""
        self.runlog.restart_at(self.step, self.samples)
        self.runlog.rewrite_metrics(self.history)
        self.throughput.restart(self.clocks.now(), self.samples)

    def failures_summary(self) -> dict[str, Any]:
        """What failures cost the run (summary.json ``failures``); {} without any."""
        if not self.cluster_cfg.failures.any and not self.checkpoint_s:
            return {}
        return {"nodes_fail": self.cluster_cfg.failures.any, "restarts": len(self.restarts),
                "nodes_lost": self.nodes_lost,
                "lost_s": sum(r["lost_s"] for r in self.restarts),
                "down_s": sum(r["seconds_down"] for r in self.restarts),
                "checkpoint_s": self.checkpoint_s,
                "checkpoints_written_s": self.checkpoints_written_s,
                "checkpoint_periods": (self.checkpoint_periods if self.auto_checkpoints
                                       else None),
                "goodput_samples_per_s": self.samples / max(self.clocks.now(), 1e-12)}

    def save_checkpoint(self, reason: str) -> None:
        """Every learner's state at a milestone (asynchronous ones have nothing in flight)."""
        self.checkpointer.save(self.samples, self.step, self.samples / len(self.train_set),
                               reason, self._state)

    def _state(self) -> dict[str, Any]:
        return {"simulator": {
            "x": self.x, "buffers": self.learners.buffers,
            "optimizer": self.optimizer.state_dict(), "clocks": self.clocks.state_dict(),
            "driver": self.driver.state_dict(), "samples": self.samples, "step": self.step,
            "lr": self.lr, "last_milestone": self.milestones.last_passed(),
            "host_s": self.host_before + time.perf_counter() - self.host_start},
            "history": self.history}

    def _restore(self, saved: dict[str, Any] | None) -> None:
        if saved is None or "simulator" not in saved:
            raise UserError(f"checkpoint {self.resumed_from.path} was written by real ranks, "
                            "not by the simulator", "resume it with the launcher that wrote "
                            "it, or start a new run dir (hydra.run.dir=NEW_DIR)")
        self.load_state(saved)
        log.info("resumed from %s: step %d, %d samples", self.resumed_from.path, self.step,
                 self.samples)

    def load_state(self, saved: dict[str, Any]) -> None:
        state = saved["simulator"]
        self.x.copy_(state["x"])
        for name, value in state["buffers"].items():
            self.learners.buffers[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        self.clocks.load_state_dict(state["clocks"])
        self.driver.load_state_dict(state["driver"])
        self.samples, self.step, self.lr = state["samples"], state["step"], state["lr"]
        last = state["last_milestone"]
        self.milestones.resume_after(tuple(last) if last is not None else None)
        self.history = list(saved.get("history", []))
        self.host_before = float(state["host_s"])

    def log_training(self) -> None:
        if not self.losses:
            return
        mean = float(np.mean(self.losses))
        self.losses = []
        now = self.clocks.now()
        rate = self.throughput.read(now, self.samples)  # the modelled cluster's seconds
        self.runlog.scalars({"train/loss": mean, "train/lr": self.lr,
                             "train/virtual_s": now, "train/samples_per_s": rate}, self.step)
        self.progress.update(self.samples, loss=f"{mean:.4f}", lr=f"{self.lr:.4g}")

    def _fill(self, row: torch.Tensor, buffers: dict[str, torch.Tensor]) -> None:
        self.learners.load_row(self.model, row)
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                b.copy_(buffers[name].to(b.dtype) if b.is_floating_point()
                        else buffers[name][0])

    def evaluate(self) -> None:
        started = time.perf_counter()
        final = self.milestones.done
        stacked = self.learners.buffers
        mean_buffers = {k: (v.mean(0) if v.is_floating_point() else v) for k, v in
                        stacked.items()}
        self._fill(self.x.mean(0), mean_buffers)
        results = self.evaluator.score(True, final, consensus=False).results
        if not self.driver.identical_replicas:
            self._fill(self.x[0], {k: v[0] if v.is_floating_point() else v
                                   for k, v in stacked.items()})
            results["eval_rank0"] = self.evaluator.score(True, False,
                                                         consensus=False).results["eval"]
        consensus = float((self.x - self.x.mean(0)).double().pow(2).sum()) / self.models
        epoch = self.samples / len(self.train_set)
        where = {"epoch": round(epoch, 4), "step": self.step, "samples": self.samples,
                 "wall_s": round(self.clocks.now(), 3), "lr": self.lr,
                 "train_s": round(self.clocks.now(), 3)}  # virtual time is training alone
        reports = self.rank_reports()
        shown = reports if self.n <= 16 else []  # per-learner TensorBoard cards stay readable
        self.history += self.runlog.record_evaluation(results, consensus, shown, where,
                                                      self.evaluator.examples)
        self.progress.update(self.samples, force=True, **evaluation_postfix(results))
        log.info("eval at epoch %.2f (virtual %.1f s): %s", epoch, self.clocks.now(),
                 {s: {k: round(v, 4) for k, v in m.items()} for s, m in results.items()})
        self.host_eval_s += time.perf_counter() - started

    def rank_reports(self) -> list[dict[str, Any]]:
        stats = self.driver.stats()
        steps = self.driver.steps_per_learner()
        return [{"time": {**{k: float(v[i]) for k, v in self.clocks.seconds.items()},
                          "data": 0.0, "eval": 0.0},
                 "algo": stats[i], "steps": int(steps[i]), "skipped_batches": 0,
                 "milestones": 0, "bytes_sent": sent} for i, sent in enumerate(
                     self.traffic_reports(steps))]

    def traffic_reports(self, steps: list[int]) -> list[dict[str, Any]]:
        """Each learner's bytes sent (runner/comm/traffic.py's report) after ``steps``."""
        return [traffic_report({k: v[i] for k, v in self.clocks.sent.items()}, int(steps[i]))
                for i in range(self.n)]

    def finalize(self) -> dict[str, Any]:
        self._fill(self.x[0], {k: v[0] for k, v in self.learners.buffers.items()})
        self.checkpointer.save_final(self.model, self.step)
        digests = self.driver.digests()
        host_s = self.host_before + time.perf_counter() - self.host_start
        last = self.checkpointer.last
        run = {"steps": self.step, "samples": int(self.samples), "train_s": self.clocks.now(),
               "wall_s": self.clocks.now(), "checkpoint": str(last) if last else None,
               "resumed_from": str(self.resumed_from.path) if self.resumed_from else None,
               "restarts": self.restarts}  # of the modelled job (cluster.failures)
        summary = build_summary("completed", self.cfg, self.world, run, self.history,
                                self.rank_reports(), digests, self.recipe,
                                [self.recipe.rank_report()])
        summary.update({"launcher": "sim", "cluster": self.cfg.cluster.name,
                        "virtual_s": self.clocks.now(), "host_s": host_s,
                        "exchange_bytes": self.nbytes,
                        **({"failures": f} if (f := self.failures_summary()) else {}),
                        "host_eval_s": self.host_eval_s,
                        "learner_steps_per_host_s": float(
                            sum(self.driver.steps_per_learner())) / max(host_s, 1e-9)})
        self.runlog.finish(summary)
        self.comm.close()
        return summary

