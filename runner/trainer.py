"""The one training loop shared by every algorithm.

Per step: fetch this rank's shard batch, set the learning rate from global samples seen,
forward/backward, and let the algorithm act at its hooks (runner/algos/base.py). Held-out
evaluation runs at every epoch end (and every ``trainer.eval_every`` steps): each rank evaluates
a strided shard of the held-out set and one reduction of the recipe's sums gives exact global
metrics. Rank 0 writes TensorBoard, metrics.jsonl and summary.json.

Evaluations, checkpoints (runner/checkpointing.py) and preemption checks (runner/preemption.py)
are milestones in global samples that every rank meets in the same order
(runner/milestones.py). A non-finite loss stops the job at the next log or checkpoint, before
a poisoned model can be saved (``trainer.on_nonfinite=stop``), or drops that step's update on
the ranks that share it (``skip_batch``; one device sync per step).
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from recipes import RECIPES

from .accel import ComputePath
from .algos import ALGORITHMS, TrainContext
from .checkpointing import Checkpointing
from .comm import Communicator, World
from .comm.buffers import flatten, flatten_parameters, unflatten
from .data import BatchFetcher, ShardedBatches
from .errors import UserError
from .milestones import CHECKPOINT, EVALUATE, STOP_CHECK, Milestones
from .optim import parameter_groups
from .preemption import STOP_CHECK_STEPS, STOPPED, StopAgreement
from .reporting import RunLog
from .schedule import LRSchedule
from .timers import Timers

log = logging.getLogger("adpsgd")
# skip_batch gives up when this many steps in a row were non-finite: the model diverges.
MAX_CONSECUTIVE_SKIPS = 10


def resolve_device(name: str, local_rank: int) -> torch.device:
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("trainer.device=cuda but no GPU is visible", "use trainer.device=auto")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def parameter_digest(buffers: list[torch.Tensor]) -> str:
    """SHA-256 of the exact bytes of a model's flat parameter buffers."""
    digest = hashlib.sha256()
    for flat in buffers:
        digest.update(flat.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class Trainer(Checkpointing):
    def __init__(self, cfg: DictConfig, run_dir: str | Path, world: World, comm: Communicator,
                 node_comm: Communicator, device: torch.device,
                 progress_stream: TextIO | None = None):
        self.cfg, self.run_dir, self.world, self.comm = cfg, Path(run_dir), world, comm
        self.device = device
        self.progress_stream = progress_stream
        self.timers = Timers()
        tcfg = cfg.trainer

        self.recipe = RECIPES.get(cfg.recipe.name)(cfg.recipe)
        self.train_set, self.eval_set = self.recipe.datasets()
        if len(self.eval_set) == 0:
            raise UserError(f"recipe {cfg.recipe.name}: the held-out set has no samples",
                            "point the recipe at a non-empty evaluation set")

        # Identical initial models: same seed everywhere, then rank 0's copy wins anyway.
        seed_everything(cfg.seed)
        self.dtype = getattr(torch, tcfg.dtype)
        self.model = self.recipe.build_model().to(device=device, dtype=self.dtype)
        self.param_buffers = flatten_parameters(self.model.parameters())
        self._broadcast_model()
        self.resumed_from = self._resolve_resume()
        if self.resumed_from and cfg.resume_averaged:
            self._load_averaged_model(self.resumed_from)
        # Running statistics (BatchNorm) stay local in training; evaluations average them.
        self._running_stats = any(b.is_floating_point() for b in self.model.buffers())
        # From here on, randomness (dropout, augmentation) differs per rank.
        seed_everything(cfg.seed + 1_000_003 * (world.rank + 1))
        self.compute = ComputePath.from_config(tcfg, device)
        self.compute.prepare_model(self.model)

        o = cfg.optim
        self.optimizer = torch.optim.SGD(
            parameter_groups(self.model, o.weight_decay, o.no_decay_norm_bias), lr=o.lr,
            momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)
        self.shards = ShardedBatches(len(self.train_set), world.rank, world.size,
                                     tcfg.batch_size, cfg.seed)
        self.ctx = ctx = TrainContext(cfg=cfg, world=world, comm=comm, node_comm=node_comm,
                                      device=device, timers=self.timers,
                                      param_buffers=self.param_buffers,
                                      steps_per_epoch=self.shards.steps_per_epoch)
        self.algo = ALGORITHMS.get(cfg.algo.name).build(cfg.algo, ctx)
        self.algo.setup(self.model, self.optimizer)

        self.eval_shards = ShardedBatches(len(self.eval_set), world.rank, world.size,
                                          tcfg.eval_batch_size, cfg.seed, shuffle=False)
        loading = dict(num_workers=tcfg.num_workers, persistent_workers=tcfg.persistent_workers,
                       pin_memory=tcfg.pin_memory and device.type == "cuda")
        self.fetch = BatchFetcher(self.train_set, self.recipe.collate, **loading)
        self.eval_fetch = BatchFetcher(self.eval_set, self.recipe.collate, **loading)
        self.schedule = LRSchedule(o, world.size * tcfg.batch_size, len(self.train_set),
                                   tcfg.epochs)
        self.milestones = Milestones(len(self.train_set), tcfg.epochs,
                                     world.size * tcfg.batch_size, tcfg.eval_every,
                                     tcfg.checkpoint_every, STOP_CHECK_STEPS)
        self._eval_model: torch.nn.Module | None = None
        self.step = 0
        self.samples = 0  # global samples consumed, as this rank knows it (see run())
        self.lockstep_samples = 0  # the same if every rank advances in lockstep
        self.local_samples = 0  # this rank's own
        self.position = (0, 0)  # (local epoch, index of the next batch in it)
        self.elapsed_before = 0.0  # training time of the sessions before a resume
        straggler = cfg.faults.straggler
        self.slowdown = straggler.factor if world.rank in straggler.ranks else 1.0
        self.delays = random.Random(cfg.seed * 7919 + world.rank)  # for faults.delay_s
        nan = cfg.faults.nonfinite_loss
        self.poisoned_steps = set(nan.steps) if world.rank in nan.ranks else set()
        self._loss_sum: torch.Tensor | float = 0.0
        self._loss_steps = 0
        self.skipped_batches = 0
        self.milestone_waits = 0  # evaluations and checkpoints met (see _meet)
        self.algo_finished = False  # algo.finish() has run (see _finish_algorithm)
        self._consecutive_skips = 0
        self.history: list[dict[str, Any]] = []
        self.last_checkpoint: Path | None = None
        self.stop_status: str | None = None  # preempted or stopped (runner/preemption.py)
        if self.resumed_from:
            self._restore(self.resumed_from)
        self.lr = self.schedule.lr_at(self.samples)
        # A resumed run continues the same TensorBoard run: events past the checkpoint's step
        # (written after it by the interrupted session) are purged.
        purge = self.step + 1 if self.resumed_from else None
        self.runlog = RunLog(self.run_dir, purge_step=purge) if world.is_main else None
        if self.runlog and self.resumed_from:
            self.runlog.rewrite_metrics(self.history)

    def _broadcast_model(self) -> None:
        """Every rank takes rank 0's weights and floating buffers."""
        for flat in self.param_buffers:
            self.comm.broadcast_(flat, root=0)
        for buf in self.model.buffers():
            if buf.is_floating_point() and buf.is_contiguous():
                self.comm.broadcast_(buf, root=0)

    # ---- training --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Train until the global sample count reaches ``epochs`` passes over the data, or
        until a graceful stop (runner/preemption.py: SIGUSR1/SIGTERM checkpoint with summary
        status "preempted", Ctrl-C with status "stopped"; a stop requested while the ranks
        were starting ends the run before its first step, with nothing to checkpoint).

        Lockstep algorithms know that count exactly and every rank takes the same steps.
        Asynchronous ones estimate it, so fast ranks take more steps than slow ones (each
        cycles through its own shard); evaluations, checkpoints and preemption checks are
        collective and happen when the count crosses a milestone, which every rank does in
        the same order. A resumed run starts at the checkpoint's epoch and batch.
        """
        tcfg = self.cfg.trainer
        steps = self.shards.steps_per_epoch
        budget = self.milestones.budget
        self.progress = None
        if self.world.is_main and tcfg.progress and self.progress_stream is not None:
            from tqdm import tqdm

            self.progress = tqdm(total=budget, initial=min(self.samples, budget),
                                 file=self.progress_stream, unit="sample", unit_scale=True,
                                 dynamic_ncols=True,
                                 desc=f"{self.cfg.algo.name} x{self.world.size}")
        self.stop = StopAgreement(self.comm.mpi_comm, self.world.rank, self.cfg.comm.timeout_s)
        # Start together (set-up time differs between ranks), unless asked to stop meanwhile.
        self.stop_status = self.stop.at_start()
        first_step = self.step
        self.start_time = time.perf_counter() - self.elapsed_before
        self._last_log = (time.perf_counter(), self.samples)
        epoch, first = self.position
        while not (self.milestones.done or self.stop_status):
            batches = self.shards.epoch_batches(epoch)
            stream = self.fetch.iterate(batches[first:])
            for k in range(first, steps):
                with self.timers.time("data"):
                    batch = next(stream)
                self.ctx.step_counts = self.shards.counts(k)
                self.train_step(batch, len(batches[k]), self.shards.global_count(k))
                self.lockstep_samples += self.shards.global_count(k)
                seen = self.algo.global_samples(self.local_samples, self.lockstep_samples)
                self.samples = max(self.samples, int(seen))
                self.position = (epoch, k + 1) if k + 1 < steps else (epoch + 1, 0)
                if self.step % tcfg.log_every == 0 or k == steps - 1:
                    self.log_training()
                if self.progress:
                    self.progress.update(min(self.samples, budget) - self.progress.n)
                self._pass_milestones()
                if self.milestones.done or self.stop_status:
                    break
            epoch, first = self.position
        if self.stop_status and self.step > first_step:
            self.save_checkpoint(self.stop_status)
        self.stop.close()
        self._finish_algorithm()
        if self.progress:
            self.progress.close()
        return self.finalize(self.stop_status or "completed")

    def _pass_milestones(self) -> None:
        """Act on every milestone the sample count has reached, in order (an evaluation makes
        an asynchronous count exact, which may reach further ones)."""
        while (milestone := self.milestones.due(self.samples)) is not None:
            if milestone.kind != STOP_CHECK:  # the collective ones: every rank waits there
                self.algo.milestone_reached(milestone.samples)
            if milestone.kind == EVALUATE and milestone.final:
                self._meet()
                if self.samples < milestone.samples:  # an estimate ran ahead: train on
                    self.milestones.rearm()
                    self._leave()
                    return
                self._finish_algorithm()  # nothing may change the model after it is scored
                self.evaluate(final=True, met=True)
            elif milestone.kind == EVALUATE:
                self.evaluate()
            elif milestone.kind == CHECKPOINT:
                self.save_checkpoint("scheduled")
            elif reason := self.stop.check():
                log.info("stop requested (%s): checkpointing at step %d",
                         "Ctrl-C" if reason == STOPPED else "SIGUSR1/SIGTERM", self.step)
                self.stop_status = reason
                return

    def _meet(self) -> None:
        """Before a collective milestone (evaluation, checkpoint): quiesce the algorithm and
        agree on the exact global sample count. The time spent here is waiting for the
        slowest rank to reach the milestone (idle), also kept apart as milestone_wait."""
        with self.timers.time("idle"), self.timers.time("milestone_wait"):
            if not self.algo_finished:
                self.algo.pause()
            self._sync_samples()
        self.milestone_waits += 1

    def _leave(self) -> None:
        """After a collective milestone: the algorithm goes on (unless it has finished)."""
        if not self.algo_finished:
            self.algo.resume()

    def _finish_algorithm(self) -> None:
        """End the algorithm's communication (collective, once): at the final evaluation, or
        after the loop when a stop came first."""
        if not self.algo_finished:
            self.algo.finish()
            self.algo_finished = True

    def _sync_samples(self) -> None:
        """Every rank learns the exact global count (asynchronous ranks only estimate it)."""
        self.samples = int(self.comm.allreduce_numbers([self.local_samples])[0])
        self.algo.sync_global_samples(self.samples)

    def train_step(self, batch: Any, local_count: int, global_count: int) -> None:
        self.step += 1
        self.lr = self.schedule.lr_at(self.samples)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        self.optimizer.zero_grad(set_to_none=False)  # keep gradient views of flat buckets
        self.algo.before_forward(self.step)
        skipping = self.cfg.trainer.on_nonfinite == "skip_batch"
        loss = None
        with self.timers.time("compute"):
            if batch is not None:
                if skipping:  # a skipped step must not leave its BatchNorm statistics behind
                    saved = [b.clone() for b in self.model.buffers() if b.is_floating_point()]
                batch = self.compute.batch(self.recipe, batch)
                started = time.perf_counter()
                with self.compute.autocast():
                    loss = self.recipe.loss(self.model, batch)
                if self.step in self.poisoned_steps:  # injected fault (faults.nonfinite_loss)
                    loss = loss * float("nan")
                weight = self.algo.gradient_weight(local_count, global_count)
                self.algo.before_backward(self.step)
                (loss * weight).backward()
                if self.slowdown > 1:  # injected straggler: the same work, `factor` x slower
                    time.sleep((self.slowdown - 1) * (time.perf_counter() - started))
            else:
                self.algo.before_backward(self.step)
            if self.cfg.faults.delay_s:  # injected jitter
                time.sleep(self.delays.uniform(0, self.cfg.faults.delay_s))
        self.algo.after_backward(self.step)
        skip = skipping and self._nonfinite_update(loss)
        with self.timers.time("compute"):
            if skip:
                if batch is not None:
                    floats = [b for b in self.model.buffers() if b.is_floating_point()]
                    for buf, before in zip(floats, saved):
                        buf.copy_(before)
            else:
                if loss is not None:
                    # Summed on the device: reading it every step would synchronise a GPU.
                    self._loss_sum = self._loss_sum + loss.detach()
                    self._loss_steps += 1
                if self.cfg.optim.clip_grad_norm:
                    # After after_backward: for SSGD this is the averaged gradient, the same
                    # on every rank, so clipping keeps the replicas identical.
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                   self.cfg.optim.clip_grad_norm)
                self.algo.apply_update(self.optimizer)
        self.algo.after_step(self.step)
        self.local_samples += local_count

    def _nonfinite_update(self, loss: torch.Tensor | None) -> bool:
        """skip_batch: whether this step's update must be dropped because the loss or the
        gradient it would apply is not finite (one device sync). Ranks that apply the same
        averaged update decide together, so their replicas stay identical."""
        checks = [torch.isfinite(p.grad).all() for p in self.model.parameters()
                  if p.grad is not None]
        if loss is not None:
            checks.append(torch.isfinite(loss.detach()).all())
        bad = bool(checks) and not bool(torch.stack(checks).all())
        group = self.algo.shared_update_group()
        if group is not None and group.size > 1:
            bad = bool(group.allreduce_numbers([float(bad)], op="max")[0])
        if not bad:
            self._consecutive_skips = 0
            return False
        self.skipped_batches += 1
        self._consecutive_skips += 1
        log.warning("non-finite loss or gradient at step %d: update skipped (%d so far)",
                    self.step, self.skipped_batches)
        if self._consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
            raise self._nonfinite_error(f"{MAX_CONSECUTIVE_SKIPS} steps in a row had a "
                                        "non-finite loss or gradient")
        return True

    def _nonfinite_error(self, what: str, ranks: list[int] | None = None) -> UserError:
        """The one line for a diverged run: where, and how to continue from the last good
        checkpoint (none is ever written of a non-finite model)."""
        where = (f"continue from the last good checkpoint ({self.last_checkpoint}) with "
                 "resume=auto" if self.last_checkpoint else "start again")
        ranks = ranks or [self.world.rank]
        on = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        return UserError(f"{what} at step {self.step} on {on}",
                         f"lower optim.lr or raise optim.warmup_epochs, then {where}")

    def _refuse_nonfinite_state(self) -> None:
        """Before a checkpoint: a non-finite loss since the last log, or non-finite weights,
        end the job here, so that the checkpoint on disk stays the last good one."""
        flags = [torch.isfinite(flat).all() for flat in self.param_buffers]
        if isinstance(self._loss_sum, torch.Tensor):
            flags.append(torch.isfinite(self._loss_sum))
        elif not math.isfinite(self._loss_sum):
            flags.append(torch.tensor(False))
        poisoned = bool(flags) and not bool(torch.stack([f.cpu() for f in flags]).all())
        # Checkpoints are collective: agree, so that the job says it once, naming every rank.
        ranks = [r for r, bad in enumerate(self.comm.allgather_objects(poisoned)) if bad]
        if ranks:
            error = self._nonfinite_error("non-finite training loss or weights", ranks)
            error.quiet = not self.world.is_main  # rank 0 prints it for everyone
            raise error

    def log_training(self) -> None:
        """Rank 0's running mean loss, the rate and the throughput since the last log."""
        if self._loss_steps == 0:
            return
        mean_loss = float(self._loss_sum) / self._loss_steps
        if not math.isfinite(mean_loss):
            raise self._nonfinite_error("non-finite training loss")
        self._loss_sum, self._loss_steps = 0.0, 0
        now = time.perf_counter()
        rate = (self.samples - self._last_log[1]) / max(now - self._last_log[0], 1e-9)
        self._last_log = (now, self.samples)
        if self.runlog:
            self.runlog.scalars({"train/loss": mean_loss, "train/lr": self.lr,
                                 "train/samples_per_s": rate}, self.step)
        if self.progress:
            self.progress.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{self.lr:.4g}")

    # ---- evaluation --------------------------------------------------------------------
    def _scratch_model(self) -> torch.nn.Module:
        """A second model for evaluating averaged or broadcast weights (flat, like ours)."""
        if self._eval_model is None:
            self._eval_model = self.compute.copy_model(self.model)
            self._eval_params = flatten_parameters(self._eval_model.parameters())
        return self._eval_model

    def _fill_scratch(self, reduce, weights: bool = True) -> torch.nn.Module:
        """Copy our weights and buffers into the scratch model, then ``reduce`` each flat
        parameter buffer (unless ``weights`` is false) and the floating buffers in place."""
        target = self._scratch_model()
        for src, dst in zip(self.param_buffers, self._eval_params):
            dst.copy_(src)
            if weights:
                reduce(dst)
        floats = [b for b in target.buffers() if b.is_floating_point()]
        for mine, theirs in zip(self.model.buffers(), target.buffers()):
            theirs.copy_(mine)
        if floats:  # running statistics (BatchNorm) travel as one message too
            flat = flatten(floats)
            reduce(flat)
            for buf, value in zip(floats, unflatten(flat, floats)):
                buf.copy_(value)
        return target

    def _evaluate_model(self, model: torch.nn.Module, show_examples: bool = False,
                        decode_split: str | None = None) -> dict[str, float]:
        """Global metrics of ``model`` on the held-out set (each rank scores its shard); with
        ``decode_split``, rank 0 also writes every hypothesis to ``decode/``."""
        was_training = model.training
        model.eval()
        sums: dict[str, float] = {}
        decoded: list[tuple[str, str, str]] = []
        with torch.no_grad():
            for batch in self.eval_fetch.iterate(self.eval_shards.epoch_batches(0)):
                if batch is None:
                    continue
                batch = self.compute.batch(self.recipe, batch)
                with self.compute.autocast():
                    for key, value in self.recipe.eval_sums(model, batch).items():
                        sums[key] = sums.get(key, 0.0) + float(value)
                    if show_examples and self.runlog:  # decoded samples of rank 0's shard
                        self._log_examples(self.recipe.examples(model, batch))
                        show_examples = False
                    if decode_split:
                        decoded += self.recipe.decode(model, batch)
        model.train(was_training)
        if decode_split:
            self._write_decoded(decode_split, self.comm.gather_objects(decoded))
        total: dict[str, float] = {}
        for part in self.comm.allgather_objects(sums):
            for key, value in part.items():
                total[key] = total.get(key, 0.0) + value
        return self.recipe.metrics(total)

    def _write_decoded(self, split: str, parts: list | None) -> None:
        """decode/<split>.hyp.txt and .ref.txt: Kaldi text files of every held-out sample,
        for adpsgd-score or sclite."""
        rows = sorted(row for part in parts or [] for row in part)
        if not self.runlog or not rows:
            return
        out = self.run_dir / "decode"
        out.mkdir(exist_ok=True)
        for suffix, column in (("ref", 1), ("hyp", 2)):
            (out / f"{split}.{suffix}.txt").write_text(
                "".join(f"{row[0]} {row[column]}".rstrip() + "\n" for row in rows))

    def _log_examples(self, examples: list[tuple[str, str, str]]) -> None:
        """TensorBoard text panel: reference against hypothesis (markdown table)."""
        if not examples or not self.runlog:
            return
        rows = [f"| {utt} | {ref} | {hyp} |" for utt, ref, hyp in examples]
        self.runlog.text("eval/examples", "\n".join(
            ["| utterance | reference | hypothesis |", "|---|---|---|", *rows]), self.step)

    def consensus_distance(self) -> float:
        """Xi = (1/n) sum_i ||x_i - xbar||^2 over all parameters (algorithms.md §0.2)."""
        local = 0.0
        for flat in self.param_buffers:
            mean = self.comm.allreduce_(flat.detach().clone(), op="mean")
            local += float((flat.detach() - mean).double().pow(2).sum())
        return float(self.comm.allreduce_numbers([local])[0]) / self.world.size

    def evaluate(self, final: bool = False, met: bool = False) -> None:
        """Score the model(s) on the held-out set (collective); ``met``: the ranks have met
        at this milestone already (see :meth:`_meet`)."""
        if not met:
            self._meet()
        if not final and self.milestones.another_due(EVALUATE, self.samples):
            # The exact count (the same on every rank now) passed the next evaluation too:
            # score the model once, there, rather than twice in a row.
            self._leave()
            return
        with self.timers.time("eval"):
            results: dict[str, dict[str, float]] = {}
            mean = lambda t: self.comm.allreduce_(t, op="mean")  # noqa: E731
            if self.algo.identical_replicas and not self._running_stats:
                averaged = self.model
            elif self.algo.identical_replicas:
                # The same weights everywhere, but BatchNorm statistics are each rank's own
                # (they stay local in training): score one model, with their mean.
                averaged = self._fill_scratch(mean, weights=False)
            else:
                # The averaged model (what the theory analyses), then rank 0's own model.
                averaged = self._fill_scratch(mean)
            results["eval"] = self._evaluate_model(averaged, show_examples=True,
                                                   decode_split="eval" if final else None)
            if not self.algo.identical_replicas:
                results["eval_rank0"] = self._evaluate_model(
                    self._fill_scratch(lambda t: self.comm.broadcast_(t, root=0)))
            consensus = self.consensus_distance()
            per_rank = self.comm.gather_objects(self._rank_report())
        self._leave()
        if not self.runlog:
            return
        wall = time.perf_counter() - self.start_time
        epoch = self.samples / len(self.train_set)
        for split, metrics in results.items():
            record = {"epoch": round(epoch, 4), "step": self.step, "samples": self.samples,
                      "wall_s": round(wall, 3), "split": split, **metrics,
                      "consensus_distance": consensus, "lr": self.lr}
            self.history.append(record)
            self.runlog.evaluation(record)
            self.runlog.scalars({f"{split}/{k}": v for k, v in metrics.items()}, self.step)
        self.runlog.scalars({"consensus/distance": consensus}, self.step)
        assert per_rank is not None
        for rank, report in enumerate(per_rank):
            self.runlog.scalars({f"time/{name}_s/rank{rank}": value
                                 for name, value in report["time"].items()}, self.step)
            self.runlog.scalars({f"algo/{name}/rank{rank}": value
                                 for name, value in report["algo"].items()}, self.step)
        log.info("eval at epoch %.2f step %d: %s", epoch, self.step,
                 {s: {k: round(v, 4) for k, v in m.items()} for s, m in results.items()})

    # ---- summary -------------------------------------------------------------------------
    def _rank_report(self) -> dict[str, Any]:
        return {"time": {**self.timers.snapshot(), "comm_busy": self.comm.busy_s},
                "algo": self.algo.stats(), "steps": self.step,
                "skipped_batches": self.skipped_batches, "milestones": self.milestone_waits}

    def finalize(self, status: str = "completed") -> dict[str, Any]:
        """summary.json (status ``completed``, or ``preempted``/``stopped`` after a graceful
        stop, whose final metrics are those of the last evaluation so far)."""
        seconds = self.timers.seconds
        elapsed = time.perf_counter() - self.start_time - seconds["eval"] - seconds["checkpoint"]
        train_time = self.comm.allreduce_numbers([elapsed], op="max")[0]
        local_samples = self.comm.allreduce_numbers([self.local_samples])[0]
        digests = self.comm.gather_objects((self.world.node,
                                            parameter_digest(self.param_buffers)))
        recipe_reports = self.comm.gather_objects(self.recipe.rank_report())
        per_rank = self.comm.gather_objects(self._rank_report())
        summary: dict[str, Any] = {}
        if self.world.is_main:
            assert per_rank is not None
            if status == "completed":
                self._save_final_model()
            evals = [r for r in self.history if r["split"] == "eval"]
            final = {k: v for k, v in (evals[-1] if evals else {}).items()
                     if k not in ("epoch", "step", "samples", "wall_s", "split")}
            times = [report["time"] for report in per_rank]
            means = {name: float(np.mean([t.get(name, 0.0) for t in times]))
                     for name in ("compute", "comm", "idle", "data", "eval", "checkpoint",
                                  "comm_busy", "milestone_wait")}
            algo_stats = [report["algo"] for report in per_rank]
            summary = {
                "status": status,
                "algo": self.cfg.algo.name,
                "recipe": self.cfg.recipe.name,
                "nprocs": self.world.size,
                "procs_per_node": self.world.local_size,
                "epochs": self.cfg.trainer.epochs,
                "steps": self.step,
                "samples": int(local_samples),
                "train_s": train_time,
                "wall_s": time.perf_counter() - self.start_time,
                "samples_per_s": local_samples / max(train_time, 1e-9),
                "final": final,
                self.recipe.primary_metric: final.get(self.recipe.primary_metric),
                "consensus_distance": final.get("consensus_distance"),
                # Bitwise comparison of every rank's final parameters.
                "replicas_identical": len({d for _, d in digests or []}) == 1,
                # The same inside every (real or emulated) node: hadpsgd's super learners.
                "node_replicas_identical": len(set(digests or [])) == self.world.num_nodes,
                "compute_s": means["compute"],
                "comm_s": means["comm"],
                "idle_s": means["idle"],
                "data_s": means["data"],
                "eval_s": means["eval"],
                "comm_busy_s": means["comm_busy"],
                "per_rank": times,
                "steps_per_rank": [report["steps"] for report in per_rank],
                "checkpoint_s": means["checkpoint"],
                # Waiting at evaluations and checkpoints for the other ranks (part of idle_s).
                "milestone_wait_s": means["milestone_wait"],
                "milestones": per_rank[0]["milestones"],
                # The newest checkpoint, and the one this session resumed from (if any).
                "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
                "resumed_from": str(self.resumed_from.path) if self.resumed_from else None,
                # Steps whose update was dropped for a non-finite loss (skip_batch).
                "skipped_batches": [report["skipped_batches"] for report in per_rank],
                # Algorithm-specific numbers per rank (exchanges, staleness...), and means.
                "algo_stats": {name: [stats.get(name) for stats in algo_stats]
                               for name in sorted({k for st in algo_stats for k in st})},
            }
            summary.update(self.recipe.summary_entries(recipe_reports or []))
            if "eval_rank0" in {r["split"] for r in self.history}:
                summary["final_rank0"] = [r for r in self.history
                                          if r["split"] == "eval_rank0"][-1]
            hparams = {"algo": self.cfg.algo.name, "recipe": self.cfg.recipe.name,
                       "nprocs": self.world.size, "batch_size": self.cfg.trainer.batch_size,
                       "lr": self.cfg.optim.lr, "epochs": self.cfg.trainer.epochs,
                       "seed": self.cfg.seed}
            assert self.runlog is not None
            if status == "completed":
                self.runlog.hparams(hparams, {k: v for k, v in final.items()
                                              if isinstance(v, (int, float))})
            self.runlog.summary(summary)
            self.runlog.close()
        self.comm.barrier()
        return summary

    def _save_final_model(self) -> None:
        path = self.run_dir / "checkpoints" / "final_rank0.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "step": self.step,
                    "config": OmegaConf.to_container(self.cfg)}, path)
