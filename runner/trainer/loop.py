"""The one training loop shared by every algorithm.

Per step: fetch this rank's shard batch, set the learning rate from global samples seen,
forward/backward, and let the algorithm act at its hooks (runner/algos/base.py). Evaluations,
checkpoints and preemption checks are milestones in global samples that every rank meets in
the same order (runner/train/milestones.py). The loop's parts live in runner/train/ (data,
compute path, evaluation, schedule, counters, faults, NaN handling), what a checkpoint holds
in runner/checkpoint/, and what rank 0 writes (TensorBoard, metrics.jsonl, summary.json) in
runner/runlog/.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from omegaconf import DictConfig

from ..algos import ALGORITHMS, TrainContext
from ..algos.optim import SGD, parameter_groups
from ..checkpoint.checkpointer import Checkpointer
from ..checkpoint.period import AutoPeriod
from ..checkpoint.preemption import StopAgreement
from ..checkpoint.resize import RESIZED
from ..comm import Communicator, Seat, Seated, World
from ..comm.buffers import broadcast_model, flatten_parameters
from ..config.run_schema import CHECKPOINT_AUTO as AUTO
from ..elastic.membership import EpochLedger, Membership, elastic_step, lost_samples
from ..errors import UserError, warn_user
from ..recipe import RECIPES
from ..runlog.console import ProgressBar
from ..runlog.records import record_training_again
from ..runlog.throughput import Throughput
from ..runlog.timers import Timers
from ..runlog.writer import RunLog
from ..train.compute_path import ComputePath
from ..train.data import BatchFetcher, ShardedBatches
from ..train.evaluation import Evaluator
from ..train.faults import FaultInjector
from ..train.lr_schedule import LRSchedule
from ..train.milestones import Milestones
from ..train.nonfinite import BatchSkipper, nonfinite_error
from ..train.rng import rank_seed, seed_everything
from ..train.run_state import RunState
from .meetings import Meetings
from .rank_state import restore_rank_state
from .regroup import regroup
from .report import gather_summary

log = logging.getLogger("adpsgd")


class Trainer(Meetings, Seated):
    def __init__(self, cfg: DictConfig, run_dir: str | Path, world: World, comm: Communicator,
                 node_comm: Communicator, device: torch.device,
                 progress_stream: TextIO | None = None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        # Every part that talks to the other learners reads the world and its communicators
        # here; a regroup (launcher.elastic) moves the seat and them with it.
        self.seat = Seat(world, comm, node_comm)
        self.progress_stream = progress_stream
        self.timers = Timers()
        tcfg, o = cfg.trainer, cfg.optim
        self.recipe = RECIPES.get(cfg.recipe.name)(cfg.recipe)
        self.recipe.place(device, world.host_size)
        self.train_set, eval_set = self.recipe.datasets()
        if len(eval_set) == 0:
            raise UserError(f"recipe {cfg.recipe.name}: the held-out set has no samples",
                            "point the recipe at a non-empty evaluation set")
        # Identical initial models: same seed everywhere, then rank 0's copy wins anyway.
        seed_everything(cfg.seed)
        self.model = self.recipe.build_model().to(device=device, dtype=getattr(torch,
                                                                               tcfg.dtype))
        self.param_buffers = flatten_parameters(self.model.parameters())
        with comm.traffic.aside():  # set-up, not training traffic
            broadcast_model(self.model, self.param_buffers, comm)
        self.checkpointer = Checkpointer(cfg, self.run_dir, self.seat, self.timers,
                                         progress_stream)
        self.resumed_from, resume_state = self.checkpointer.resolve(len(self.train_set))
        # Per rank from here on (a resized resume: fresh streams from its sample count).
        seed_everything(rank_seed(cfg.seed, world.rank, resume_state["trainer"]["samples"]
                                  if resume_state and RESIZED in resume_state else 0))
        self.ctx = TrainContext(cfg=cfg, seat=self.seat, device=device, timers=self.timers,
                                param_buffers=self.param_buffers, run_dir=self.run_dir)
        self.deal(ShardedBatches(len(self.train_set), world.rank, world.size, tcfg.batch_size,
                                 cfg.seed))
        self.compute = ComputePath.from_config(tcfg, device,
                                               self.shards.steps_per_epoch * tcfg.epochs,
                                               self.recipe.compile_pays_after_steps)
        if tcfg.compile is None and world.is_main:
            log.info("trainer.compile=null: %s", "compiling the model" if self.compute.compile
                     else "not compiling (too short a run, or no GPU)")
        self.compute.prepare_model(self.model)
        self.optimizer = SGD(
            parameter_groups(self.model, o.weight_decay, o.no_decay_norm_bias), lr=o.lr,
            momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)
        # An averaging every N steps against a run of fewer: refused (every rank raises the
        # same error), or a warning when it happens only once or twice.
        short = ALGORITHMS.get(cfg.algo.name).check_run_length(
            cfg.algo, self.shards.steps_per_epoch, tcfg.epochs)
        if short and world.is_main:
            log.warning("%s", short)
            warn_user(short, progress_stream)
        self.build_algorithm()
        self._build_loaders(eval_set, device)
        self.set_up_beside()
        self.schedule = self.schedule_for_the_world()
        self.milestones = self.milestones_for_the_world()
        self.faults = FaultInjector(cfg.faults, world.rank, cfg.seed)
        self.ledger = None if self.algo.asynchronous else EpochLedger(len(self.train_set))
        self.state = RunState()
        self.skipper = (BatchSkipper(self.model, self.state, world.rank,
                                     lambda: self.checkpointer.last)
                        if tcfg.on_nonfinite == "skip_batch" else None)
        self.milestone_waits = 0  # evaluations and checkpoints met (see _meet)
        # This process's first step is taken (a spare: it stands by): its start-up, which no
        # learner survives a loss in, is over (its heartbeat says so: runlog/liveness.py).
        self.past_start_up = False
        self.stop_status: str | None = None  # preempted or stopped (checkpoint/preemption.py)
        if self.resumed_from:
            restore_rank_state(self, resume_state)
        if world.is_main:  # after a restart (launcher.max_restarts): the run trains again
            record_training_again(self.run_dir)
        self.lr = self.schedule.lr_at(self.state.samples)
        # A resumed run continues the same TensorBoard run: events past the checkpoint
        # (written after it by the interrupted session) are dropped.
        resume_at = (self.state.step, self.state.samples) if self.resumed_from else None
        self.runlog = (RunLog(self.run_dir, cfg, self.recipe.primary_metric,
                              resume_at=resume_at) if world.is_main else None)
        if self.runlog and self.resumed_from:
            self.runlog.rewrite_metrics(self.state.history)
        self.plan_first_checkpoint()

    def _build_loaders(self, eval_set: Any, device: torch.device) -> None:
        """The training batches' fetcher, whether they are prefetched to the device, and the
        held-out set's evaluator."""
        tcfg, world = self.cfg.trainer, self.world
        loading = dict(num_workers=tcfg.num_workers, persistent_workers=tcfg.persistent_workers,
                       pin_memory=tcfg.pin_memory and device.type == "cuda")
        self.fetch = BatchFetcher(self.train_set, self.recipe.collate, **loading)
        # Default: where the recipe's to_device works on a GPU, except in elastic runs (a
        # regrouping rebuilds the loader that the prefetching thread would be reading).
        prefetch = tcfg.prefetch_to_device
        self.prefetch = (device.type == "cuda" and self.recipe.prefetches_to_device()
                         and not self.cfg.launcher.get("elastic") if prefetch is None
                         else prefetch)
        self.evaluator = Evaluator(
            self.recipe, self.model, self.param_buffers, self.compute, self.seat,
            BatchFetcher(eval_set, self.recipe.collate, **loading),
            ShardedBatches(len(eval_set), world.rank, world.size, tcfg.eval_batch_size,
                           self.cfg.seed, shuffle=False), self.run_dir)

    # ---- what depends on the world: built here, at the start and at a regroup alike ------
    def deal(self, shards: ShardedBatches) -> None:
        """Train on ``shards`` (the training set dealt to this world) from now on."""
        self.shards = shards
        self.ctx.steps_per_epoch = shards.steps_per_epoch

    def build_algorithm(self) -> None:
        """A new algorithm object for the seat's world, set up on the model."""
        self.algo = ALGORITHMS.get(self.cfg.algo.name).build(self.cfg.algo, self.ctx)
        self.algo.setup(self.model, self.optimizer)
        self.paused = False  # algo.pause() has run and algo.resume() not yet (see _meet)
        self.algo_finished = False  # algo.finish() has run (see _finish_algorithm)

    def schedule_for_the_world(self) -> LRSchedule:
        """The learning-rate schedule of the world's global batch."""
        return LRSchedule(self.cfg.optim, self.world.size * self.cfg.trainer.batch_size,
                          len(self.train_set), self.cfg.trainer.epochs)

    def agree_on_stops(self) -> None:
        """A stop agreement (preemption, Ctrl-C) among the world's learners."""
        self.stop = StopAgreement(self.comm.mpi_comm, self.world.rank, self.comm.timeout_s)

    # ---- training --------------------------------------------------------------------
    def milestones_for_the_world(self) -> Milestones:
        tcfg = self.cfg.trainer
        auto = tcfg.checkpoint_every == AUTO  # planned as the run goes
        return Milestones(len(self.train_set), tcfg.epochs, self.world.size * tcfg.batch_size,
                          tcfg.eval_every, None if auto else tcfg.checkpoint_every,
                          stop_check_every=1,  # the agreement spaces its checks
                          epoch_checkpoints=not auto)

    def plan_first_checkpoint(self) -> None:
        """trainer.checkpoint_every=auto: the session's first checkpoint, which measures the
        cost the next ones are spaced by (runner/checkpoint/period.py)."""
        tcfg = self.cfg.trainer
        self.auto_checkpoints = (AutoPeriod.of(self.cfg, self.world.size * tcfg.batch_size,
                                               self.milestones.budget)
                                 if tcfg.checkpoint_every == AUTO else None)
        self.checkpoint_periods: list[dict[str, Any]] = []  # how each next one was chosen
        if self.auto_checkpoints:
            first = self.auto_checkpoints.first(self.state.samples)
            if first is not None:
                self.milestones.add_checkpoint(first)

    def run(self) -> dict[str, Any]:
        """Train until the global sample count reaches ``epochs`` passes over the data, or
        until a graceful stop (runner/checkpoint/preemption.py: SIGUSR1/SIGTERM checkpoint with
        status "preempted", Ctrl-C with status "stopped"; a stop while the ranks were starting
        ends the run before its first step). Lockstep algorithms know that count exactly;
        asynchronous ones estimate it, so fast ranks take more steps than slow ones (each
        cycles through its own shard). Milestones are collective and met in the same order
        by every rank. A resumed run starts at the checkpoint's epoch and batch."""
        state, shown = self.state, self.world.is_main and self.cfg.trainer.progress
        self.progress = ProgressBar(self.progress_stream if shown else None,
                                    self.milestones.budget, state.samples,
                                    f"{self.cfg.algo.name} x{self.world.size}",
                                    self.cfg.trainer.progress_every_s)
        self.agree_on_stops()
        # Start together (set-up time differs between ranks), unless asked to stop meanwhile.
        self.stop_status = self.stop.at_start()
        first_step = state.step
        self.start_time = time.perf_counter() - state.elapsed_before
        self.throughput = Throughput(time.perf_counter(), state.samples)
        self.membership = Membership.of(self)  # None unless launcher.elastic; spares wait
        if self.membership is not None and self.membership.waiting:  # a spare not needed
            return {}
        self.evaluate_owed(self.owed_at_resume)
        epoch, first = state.position
        while not (self.milestones.done or self.stop_status):
            batches = self.shards.epoch_batches(epoch)
            steps = len(batches)  # a partial pass after a resize has fewer (runner/train/data.py)
            with self.compute.batches(self.recipe, self.fetch.iterate(batches[first:]),
                                      self.prefetch) as stream:
                for k in range(first, steps):
                    with self.timers.time("data"):
                        batch = next(stream)
                    # A learner lost (launcher.elastic): the step is undone, the rest dealt
                    # again.
                    if not elastic_step(self.membership, self._advance, batch, batches[k],
                                        epoch, k, steps) or self.milestones.done or \
                            self.stop_status:
                        break
            epoch, first = state.position
        if self.stop_status and state.step > first_step:
            self.save_checkpoint(self.stop_status)
        self.close_beside()
        self.stop.close()
        self._finish_algorithm()
        self.progress.close()
        return self.finalize(self.stop_status or "completed")

    def _advance(self, batch: Any, indices: np.ndarray, epoch: int, k: int, steps: int) -> None:
        """Step ``k`` of the ``steps`` of ``epoch`` on ``batch`` (the samples ``indices``):
        train, count, log, and act on the milestones it reaches."""
        state = self.state
        self.ctx.step_counts = self.shards.counts(k, epoch)
        global_count = self.shards.global_count(k, epoch)
        self.faults.crash_on(indices)
        self.train_step(batch, len(indices), global_count)
        self.past_start_up = True
        state.lockstep_samples += global_count
        seen = self.algo.global_samples(state.local_samples, state.lockstep_samples)
        if self.algo.asynchronous:  # the learners' own counts: lost ones' samples apart
            seen += lost_samples(self.membership)
        state.samples = max(state.samples, int(seen))
        state.position = (epoch, k + 1) if k + 1 < steps else (epoch + 1, 0)
        if self.ledger is not None:
            self.ledger.record(indices, epoch, k == steps - 1, self.comm)
        if state.step % self.cfg.trainer.log_every == 0 or k == steps - 1:
            self.log_training()
        self.progress.update(state.samples)
        self._pass_milestones()

    def train_step(self, batch: Any, local_count: int, global_count: int) -> None:
        state, algo, skipper = self.state, self.algo, self.skipper
        state.step += 1
        self.faults.crash(state.step)
        self.lr = self.schedule.lr_at(state.samples)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        self.optimizer.zero_grad(set_to_none=False)  # keep gradient views of flat buckets
        algo.before_forward(state.step)
        loss = None
        with self.timers.time("compute"):
            if batch is not None:
                if skipper:
                    skipper.before_forward()
                batch = self.compute.batch(self.recipe, batch)
                started = time.perf_counter()
                with self.compute.autocast():
                    loss = self.faults.poison(self.recipe.loss(self.model, batch), state.step)
                weight = algo.gradient_weight(local_count, global_count)
                algo.before_backward(state.step)
                (loss * weight).backward()
                self.faults.straggle(started)
            else:
                algo.before_backward(state.step)
            self.faults.jitter()
        algo.after_backward(state.step)
        if not (skipper and skipper.skips(loss, algo.shared_update_group())):
            with self.timers.time("compute"):
                if loss is not None:
                    state.add_loss(loss)
                if self.cfg.optim.clip_grad_norm:
                    # After after_backward: for SSGD this is the averaged gradient, the same
                    # on every rank, so clipping keeps the replicas identical.
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                   self.cfg.optim.clip_grad_norm)
                algo.apply_update(self.optimizer)
        algo.after_step(state.step)
        state.local_samples += local_count

    def log_training(self) -> None:
        """Rank 0's running mean loss, the rate and the throughput since the last log."""
        mean_loss = self.state.take_mean_loss()
        if mean_loss is None:
            return
        if not np.isfinite(mean_loss):
            raise nonfinite_error("non-finite training loss", self.state.step,
                                  [self.world.rank], self.checkpointer.last)
        rate = self.throughput.read(time.perf_counter(), self.state.samples)
        if self.runlog:
            self.runlog.scalars({"train/loss": mean_loss, "train/lr": self.lr,
                                 "train/samples_per_s": rate}, self.state.step)
        self.progress.update(self.state.samples, loss=f"{mean_loss:.4f}", lr=f"{self.lr:.4g}")

    def regroup(self, world: World, comm: Communicator, node_comm: Communicator,
                partial: tuple[int, np.ndarray] | None, algo_state: dict[str, Any] | None = None,
                rate: float | None = None, own: tuple[int, np.ndarray] | None = None) -> None:
        """Go on with the learners of ``world`` (launcher.elastic): runner/trainer/regroup.py."""
        regroup(self, world, comm, node_comm, partial, algo_state, rate, own)

    # ---- summary -------------------------------------------------------------------------
    def finalize(self, status: str = "completed") -> dict[str, Any]:
        """summary.json (status ``completed``, or ``preempted``/``stopped`` after a graceful
        stop), the final model (rank 0, completed runs), TensorBoard's hparams; collective."""
        summary = gather_summary(self, status)
        self.comm.barrier()
        return summary
