"""``launcher.timing_only=true``: the schedule of a run without its data or its learning.

What a run's time is made of under the simulator (runner/sim/engine.py) depends on the model
only through its size in bytes, and on the data only through the batch sizes of every learner's
steps. So this mode keeps exactly those: ``launcher.model_bytes`` (null: the recipe's model
built on the meta device, its parameters counted at ``trainer.dtype``) and
``launcher.samples_per_epoch`` (null: :data:`SAMPLES_PER_EPOCH`, or the recipe's training set
when it is small enough to load), and runs the same drivers as a learning simulation: the
lockstep drivers' clocks (runner/sim/lockstep.py: compute from the cluster's compute model,
allreduces and transfers from its network model) and AD-PSGD/H-ADPSGD's event schedule
(runner/sim/drivers/adpsgd.py), with the same milestones (evaluations and checkpoints, where
asynchronous learners meet) and the same shard sizes (runner/train/data.py). The drivers' tensor
work runs on models of one parameter each (gradients are zeros of shape ``[k, 1]``, updates do
nothing) and the gossip schedule's operations are counted, not executed, so a projection of
ImageNet or Switchboard-2000 on a thousand learners takes seconds of host time.

It writes ``summary.json`` (status ``completed``, ``timing_only: true``): ``virtual_s`` (the
whole run on the modelled cluster), ``epoch_s`` (per epoch), ``samples_per_s``, ``step_s``
(the mean of every learner's seconds per step), ``steps_per_rank`` and the split of every
learner's time into compute, communication and idle, and prints one line with them.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from omegaconf import DictConfig

from ..errors import TooFewLearners, UserError
from ..recipe import RECIPES
from ..runlog.console import ProgressBar
from ..runlog.records import write_json_atomic
from ..runlog.summary import bytes_sent_entry
from ..train.data import ShardedBatches
from ..train.milestones import CHECKPOINT, EVALUATE
from .clocks import KINDS
from .engine import Simulation, build_driver, virtual_time

log = logging.getLogger("adpsgd")

# Training samples per epoch when launcher.samples_per_epoch is null, for recipes whose data
# is too large to count here (or absent on this machine):
# * imagenet: the ILSVRC-2012 training set, 1,281,167 images (docs/imagenet.md).
# * swb2000 / swb300: 2,000 h / 300 h of speech in utterances of 4 s on average: the
#   assumption conf/cluster/*.yaml derive their per-utterance compute times with (2.28 h x 64
#   V100 / 16 epochs of 2,000 h, x 4 s per utterance), so that time per epoch (samples x
#   seconds per sample) does not depend on it; only the steps per epoch (and so the
#   communication per epoch) do.
SAMPLES_PER_EPOCH = {
    "imagenet": 1_281_167,
    "swb2000": 2000 * 3600 // 4,
    "swb300": 300 * 3600 // 4,
}
# What a model needs that only the data would otherwise tell: ImageNet's class count (the
# recipe counts the class folders of recipe.data.root).
NUM_CLASSES = {"imagenet": 1000}


class SampleCounts:
    """The data as the drivers see it in timing mode: how many samples each learner's step
    has (the shards of runner/train/data.py: the same counts as a real rank's), and no samples."""

    def __init__(self, samples_per_epoch: int, n: int, batch_size: int, seed: int):
        self.shards = ShardedBatches(samples_per_epoch, 0, n, batch_size, seed)

    def indices(self, learner: int, epoch: int, k: int) -> range:
        return range(self.shards.local_count(learner, k))

    def batch(self, learner: int, epoch: int, k: int) -> tuple[None, int]:
        return None, self.shards.local_count(learner, k)


class CountingExecutor:
    """In place of the gossip driver's trace executor (runner/algos/trace.py): the schedule's
    operations on the models are counted and dropped."""

    def __init__(self, operations: int = 0) -> None:
        self.operations = operations
        # What the gossip driver's checkpoint state holds of its executor: nothing to keep.
        self.replica, self.rank_steps, self.samples = torch.zeros(1), [], 0

    def run(self, ops: list[list[list]]) -> None:
        for sequence in ops:
            self.operations += len(sequence)
            sequence.clear()


def model_bytes(cfg: DictConfig) -> int:
    """Bytes of one learner's parameters at ``trainer.dtype``: the recipe's model built on the
    meta device (no memory, no data), or on the CPU if it cannot be built there."""
    name = cfg.recipe.name
    recipe = RECIPES.get(name)(cfg.recipe)
    try:
        try:
            model = _build(recipe)
        except UserError:
            if name not in NUM_CLASSES or not hasattr(recipe, "num_classes"):
                raise
            recipe.num_classes = NUM_CLASSES[name]  # no data here: the dataset's classes
            model = _build(recipe)
    except UserError as ex:
        raise UserError(f"launcher.timing_only: recipe {name}'s model cannot be built without "
                        f"its data ({ex.cause})",
                        "set launcher.model_bytes=BYTES (one learner's parameters)") from None
    element = torch.empty(0, dtype=getattr(torch, cfg.trainer.dtype)).element_size()
    return sum(p.numel() for p in model.parameters()) * element


def _build(recipe: Any) -> torch.nn.Module:
    try:
        with torch.device("meta"):
            return recipe.build_model()
    except (RuntimeError, NotImplementedError, TypeError):
        return recipe.build_model()


def samples_per_epoch(cfg: DictConfig) -> int:
    """:data:`SAMPLES_PER_EPOCH` of the recipe, else the size of its training set."""
    name = cfg.recipe.name
    if name in SAMPLES_PER_EPOCH:
        return SAMPLES_PER_EPOCH[name]
    try:
        return len(RECIPES.get(name)(cfg.recipe).datasets()[0])
    except UserError as ex:
        raise UserError(f"launcher.timing_only: no known training-set size for recipe {name}, "
                        f"and its data cannot be read ({ex.cause})",
                        "set launcher.samples_per_epoch=N") from None


class TimingSimulation(Simulation):
    """A :class:`~runner.sim.engine.Simulation` without data, models or evaluations: what its
    drivers read (shard sizes, the learning-rate schedule, clocks, the cluster) is built as
    there; what they compute on is a ``[models, 1]`` matrix."""

    timing_only = True

    def __init__(self, cfg: DictConfig, run_dir: str | Path,
                 progress_stream: TextIO | None = None):
        # Not Simulation.__init__: it loads the data and stacks N models.
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.progress_stream = progress_stream
        self.host_start = time.perf_counter()
        tcfg, launcher = cfg.trainer, cfg.launcher
        self.n = launcher.nprocs  # fewer once an elastic job lost nodes
        self.launched_ids = list(range(self.n))  # each learner's number when launched
        self.procs_per_node = launcher.procs_per_node or cfg.cluster.gpus_per_node or 1
        self.dtype = getattr(torch, tcfg.dtype)
        given = launcher.get("model_bytes")
        self.set_message_sizes(float(given) if given else float(model_bytes(cfg)))
        self.samples_per_epoch = int(launcher.get("samples_per_epoch")
                                     or samples_per_epoch(cfg))
        self.data = SampleCounts(self.samples_per_epoch, self.n, tcfg.batch_size, cfg.seed)
        self.build_schedule(self.samples_per_epoch)
        self.check_run_length()
        self.rebuild_driver()
        self.host_before = 0.0

    def rebuild_driver(self) -> None:
        """A fresh driver for the job's learners now (the first, a restart's, an elastic
        job's smaller one), on models of one number each."""
        self.driver = build_driver(self)
        self.models = self.driver.model_count
        self.x = torch.zeros(self.models, 1, dtype=self.dtype)
        self.driver.setup()
        self.count_operations()

    def count_operations(self) -> None:
        """The gossip schedule's operations are counted, not run (a restart's driver goes on
        counting: the lost work's operations were scheduled too)."""
        counted = getattr(self, "executor", None)
        self.executor = None
        if hasattr(self.driver, "executor"):
            self.executor = self.driver.executor = CountingExecutor(
                counted.operations if counted else 0)


    # ---- what drivers call: no tensor work -------------------------------------------------
    def gradients(self, models: torch.Tensor, learners, batches: list, counts: list[int]
                  ) -> torch.Tensor:
        return torch.zeros(len(counts), 1, dtype=self.dtype)

    def weighted_gradient(self, model, batches, counts, weights) -> torch.Tensor:
        return torch.zeros(1, dtype=self.dtype)

    def apply_update(self, rows, grads, lr, decay_at=None) -> None:
        pass

    def replicate_row(self, source: int) -> None:
        pass

    # ---- restarts (cluster.failures): the schedule's state, no files ------------------------
    def _state(self) -> dict[str, Any]:
        return {"simulator": {
            "clocks": self.clocks.state_dict(), "driver": self.driver.state_dict(),
            "samples": self.samples, "step": self.step, "lr": self.lr,
            "last_milestone": self.milestones.last_passed(), "host_s": 0.0}}

    def load_state(self, saved: dict[str, Any]) -> None:
        state = saved["simulator"]
        self.clocks.load_state_dict(state["clocks"])
        self.driver.load_state_dict(state["driver"])
        self.samples, self.step, self.lr = state["samples"], state["step"], state["lr"]
        last = state["last_milestone"]
        self.milestones.resume_after(tuple(last) if last is not None else None)

    def write_checkpoint(self) -> None:
        """Timed (cluster.storage_gbps), not written."""

    # ---- launcher.elastic: the others go on without a failed node -------------------------
    def handled_failure(self) -> bool:
        if not self.cfg.launcher.elastic:
            return super().handled_failure()
        if self.clocks.now() < self.failures.next_at():
            return False
        self.go_on_without_a_node()
        return True

    def go_on_without_a_node(self) -> None:
        """The failed node's learners leave; the others train again recovery_s after the
        failure as a job of fewer learners (its collectives, shards and global batch), from
        the samples done before the step in flight, which was dropped (an asynchronous
        learner's step and exchange in flight are lost). A job left with fewer than
        launcher.min_learners ends with one line."""
        cfg, recovery_s = self.cfg, self.cluster_cfg.failures.recovery_s
        at, drawn = self.failures.take(self.clocks.now() + recovery_s, node_leaves=True)
        nodes = -(-self.n // self.procs_per_node)
        node = drawn if drawn is not None else nodes - 1  # an explicit kill: the last node
        lost = list(range(node * self.procs_per_node,
                          min(self.n, (node + 1) * self.procs_per_node)))
        survivors = [i for i in range(self.n) if i not in lost]
        if len(survivors) < cfg.launcher.min_learners:
            raise TooFewLearners(
                f"node {node} failed at virtual {virtual_time(at)}, {int(self.samples)} "
                f"samples in, and {len(survivors)} learner(s) would remain, fewer than "
                f"launcher.min_learners={cfg.launcher.min_learners}",
                "a lower launcher.min_learners, or spare capacity the job can lose")
        # As real elastic runs list them: one event per learner, named as launched (the
        # survivors are numbered afresh in the smaller job).
        ids = self.launched_ids
        self.membership += [{"event": "lost", "learner": ids[i],
                             "host": f"node{ids[i] // self.procs_per_node}",
                             "at_samples": int(self.samples), "virtual_s": at,
                             "remain": len(survivors)} for i in lost]
        self.launched_ids = [ids[i] for i in survivors]
        self.nodes_lost += 1
        old_clocks, old_steps = self.clocks, self.driver.steps_per_learner()
        done = (self.samples, self.step, self.lr, self.milestones.last_passed())
        self.n = len(survivors)
        self.data = SampleCounts(self.samples_per_epoch, self.n, cfg.trainer.batch_size,
                                 cfg.seed)
        self.build_schedule(self.samples_per_epoch)  # the new size's cluster, clocks, batch
        self.samples, self.step, self.lr, last = done
        self.milestones.resume_after(tuple(last) if last is not None else None)
        # The survivors' clocks and counts go on; the lost learners' leave with them.
        self.clocks.t = old_clocks.t[survivors]
        self.clocks.seconds = {k: v[survivors] for k, v in old_clocks.seconds.items()}
        self.clocks.sent = {k: v[survivors] for k, v in old_clocks.sent.items()}
        self.clocks.wait_until(old_clocks.now() + recovery_s, "idle")
        self.rebuild_driver()
        self.driver.continue_from(self.samples, [old_steps[i] for i in survivors])
        self.driver.resume_at(self.clocks.now())
        self.stop_at = self.failures.next_at()
        log.info("node %d lost at virtual %.6g s (%d samples): %d learners go on", node, at,
                 self.samples, self.n)

    def went_back(self) -> None:
        """No run log to rewind."""

    # ---- the run -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """The run's milestones as Simulation.run meets them, without evaluating."""
        milestones = self.milestones
        progress = ProgressBar(self.progress_stream if self.cfg.trainer.progress else None,
                               milestones.budget, 0,
                               f"{self.cfg.algo.name} x{self.n} (timing)",
                               self.cfg.trainer.progress_every_s, "host samples/s")
        finished = False
        self.setup_failures()
        while not milestones.done:
            point = milestones.points[milestones.passed]
            met = self.meets_at(point)
            self.driver.advance_to(point.samples, met)
            if self.handled_failure():
                finished = False
                continue
            progress.update(self.samples)
            while (milestone := milestones.due(self.samples)) is not None:
                if not met and self.meets_at(milestone, passed=True):
                    milestones.rearm()  # due too, and met: the next round meets for it
                    break
                if milestone.kind == EVALUATE and milestone.final:
                    self.driver.finish()
                    finished = True
                elif milestone.kind == CHECKPOINT and not self.checkpoint_milestone():
                    break  # a node failed during the write: the run went back
        if not finished:
            self.driver.finish()
        progress.close()
        return self.finalize()

    def finalize(self) -> dict[str, Any]:
        cfg = self.cfg
        host_s = time.perf_counter() - self.host_start
        virtual_s = self.clocks.now()
        steps = [int(s) for s in self.driver.steps_per_learner()]
        epochs = self.samples / self.samples_per_epoch
        seconds = {kind: self.clocks.seconds[kind] for kind in KINDS}
        total = sum(float(v.sum()) for v in seconds.values())
        per_step = self.clocks.t / np.maximum(np.asarray(steps, dtype=float), 1.0)
        stats = self.driver.stats()
        summary = {
            "status": "completed", "timing_only": True, "launcher": "sim",
            "cluster": cfg.cluster.name, "algo": cfg.algo.name, "recipe": cfg.recipe.name,
            "nprocs": cfg.launcher.nprocs, "learners_at_end": self.n,
            "procs_per_node": self.procs_per_node,
            "batch_size": cfg.trainer.batch_size, "epochs": cfg.trainer.epochs,
            "samples_per_epoch": self.samples_per_epoch, "model_bytes": self.node_nbytes,
            "exchange_bytes": self.nbytes,
            "steps": self.step, "samples": int(self.samples),
            "virtual_s": virtual_s, "wall_s": virtual_s, "train_s": virtual_s,
            "epoch_s": virtual_s / max(epochs, 1e-12),
            "samples_per_s": self.samples / max(virtual_s, 1e-12),
            "step_s": float(per_step.mean()),
            **{f"{kind}_s": float(v.mean()) for kind, v in seconds.items()},
            "time_split": {kind: float(v.sum()) / max(total, 1e-12)
                           for kind, v in seconds.items()},
            "per_rank": [{kind: float(seconds[kind][i]) for kind in KINDS}
                         for i in range(self.n)],
            "steps_per_rank": steps,
            "bytes_sent": bytes_sent_entry(self.traffic_reports(steps)),
            "algo_stats": {name: [s.get(name) for s in stats]
                           for name in sorted({k for s in stats for k in s})},
            "final": {},
            "host_s": host_s,
            "learner_steps_per_host_s": sum(steps) / max(host_s, 1e-9),
        }
        if self.executor is not None:
            summary["schedule_operations"] = self.executor.operations
        if failures := self.failures_summary():
            summary["failures"] = failures
            summary["restarts"] = self.restarts
            summary["membership"] = self.membership
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.run_dir / "summary.json", summary)
        print(one_line(summary), flush=True)  # (not logged too: the CLI echoes logs)
        return summary


def one_line(s: dict[str, Any]) -> str:
    split = s["time_split"]
    return (f"timing: {s['algo']} x{s['nprocs']} on {s['cluster']} ({s['recipe']}, "
            f"{s['samples_per_epoch']:,} samples/epoch, batch {s['batch_size']}, "
            f"{s['model_bytes'] / 1e6:.1f} MB model): {s['epoch_s']:.3g} s per epoch "
            f"({s['epoch_s'] / 3600:.2f} h; {s['virtual_s']:.3g} s for {s['epochs']} epoch(s)), "
            f"{s['samples_per_s']:.0f} modelled samples/s, {1000 * s['step_s']:.1f} ms per step; "
            f"compute {100 * split['compute']:.0f}% comm {100 * split['comm']:.0f}% "
            f"idle {100 * split['idle']:.0f}%{failures_phrase(s)}; host {s['host_s']:.1f} s")


def failures_phrase(s: dict[str, Any]) -> str:
    """What failures and checkpoints cost, for the one line; empty without them."""
    f = s.get("failures")
    if not f:
        return ""
    if not f["nodes_fail"]:
        restarts = ""
    elif f["nodes_lost"]:
        restarts = f"; {f['nodes_lost']} node(s) lost, {s['learners_at_end']} learners went on"
    else:
        restarts = (f"; {f['restarts']} restart(s): {f['lost_s']:.3g} s of training lost, "
                    f"{f['down_s']:.3g} s down")
    return f"{restarts}; checkpoints {f['checkpoints_written_s']:.3g} s"
