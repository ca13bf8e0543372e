"""The run configuration's schemas: the top level and the trainer, optim, comm and faults
sections (each one a dataclass with its defaults and a ``check`` for impossible values).

Each default is written here, once: conf/ holds only what a choice changes
(runner/commands/compose.py registers these schemas, and those of every algorithm, recipe,
topology and launcher, in Hydra's ConfigStore, and every YAML extends its schema). Fix hints
name the schema's default.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig

from ..errors import ConfigError
from .cluster import ClusterConfig
from .section import Section, require

# torch.compile backends for training that ship with torch (importing torch._dynamo to list
# them all would cost the command line seconds).
COMPILE_BACKENDS = ("inductor", "cudagraphs", "aot_eager", "eager")


# trainer.checkpoint_every=auto: Young's period (runner/checkpoint/period.py).
CHECKPOINT_AUTO = "auto"


def node_mtbf_h(cfg: Any) -> float | None:
    """Mean hours between failures of one node: launcher.mtbf_h, else the cluster preset's
    cluster.failures.node_mtbf_hours (None: neither is given)."""
    given = cfg.launcher.get("mtbf_h")
    if given:
        return float(given)
    failures = (cfg.get("cluster") or {}).get("failures") or {}
    preset = failures.get("node_mtbf_hours")
    return float(preset) if preset else None


@dataclass
class TrainerConfig(Section):
    epochs: int = 3
    batch_size: int = 32  # per rank
    # Also evaluate (checkpoint) every N steps' worth of samples, N x the global batch: the
    # count every rank shares, asynchronous ones too. After an epoch's short last batch a
    # point falls a step later (checkpoint_every=20 at step 21). None: epoch ends only.
    eval_every: Optional[int] = None
    eval_batch_size: int = 256
    # Score each evaluation's copy of the models in a thread while training goes on, instead
    # of meeting for it (runner/train/evaluation_beside.py; not in elastic runs). The final
    # evaluation always meets. Off by default: on a loaded machine the thread slows AD-PSGD's
    # gossip enough for its replicas to drift apart (docs/RESULTS.md).
    eval_in_background: bool = False
    num_workers: int = 0
    log_every: int = 10  # steps between TensorBoard training scalars
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "float32"  # float64 for numerical checks (equivalence tests)
    progress: bool = True  # rank 0's progress: a bar on a terminal, plain lines elsewhere
    progress_every_s: float = 30.0  # without a terminal: a progress line this often
    # The data and compute path (runner/train/data.py, runner/train/compute_path.py).
    pin_memory: bool = True  # page-locked batches, copied to a GPU asynchronously (GPU only)
    persistent_workers: bool = True  # keep the loader workers across epochs (num_workers > 0)
    # Move the next batch to the device in a background thread on its own CUDA stream while
    # the step trains (runner/train/prefetch.py); null: on a GPU where the recipe's batches
    # are prepared there (recipe=imagenet with recipe.loader=gpu), not in elastic runs.
    prefetch_to_device: Optional[bool] = None
    channels_last: bool = False  # NHWC layout for 4-D image batches
    amp: str = "none"  # none | bf16 | auto (bf16 where the GPU computes it natively)
    # torch.compile the model; null: on a GPU when the run has enough steps for compilation to
    # pay for itself (the recipe's measured break-even; recipe=imagenet sets null).
    compile: Optional[bool] = False
    compile_backend: str = "inductor"  # eager / aot_eager: check graph capture, no codegen
    cudnn_benchmark: bool = False  # let cuDNN time its kernels (fixed input shapes only)
    # Reliability (runner/checkpoint/files.py, docs/failures.md).
    # As eval_every, for checkpoints; auto: spaced by Young's rule sqrt(2 x cost x MTBF), the
    # cost measured as the run goes, the MTBF from launcher.mtbf_h (runner/checkpoint/period.py).
    checkpoint_every: Any = None
    # Take each scheduled checkpoint's state at once, without meeting, and write it in a
    # thread while training goes on (runner/checkpoint/background.py; adpsgd and hadpsgd).
    # Off by default: with no meeting the learners' estimates of the global count can run far
    # ahead on a slow network (docs/failures.md).
    checkpoint_in_background: bool = False
    keep_checkpoints: int = 2  # complete checkpoints kept in RUN_DIR/checkpoints
    on_nonfinite: str = "stop"  # NaN/Inf loss: stop (keep the last good checkpoint) | skip_batch

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.epochs >= 1, f"{prefix}.epochs", f"must be >= 1, got {self.epochs}",
                self.hint(prefix, "epochs"))
        require(self.batch_size >= 1, f"{prefix}.batch_size",
                f"must be >= 1, got {self.batch_size}", self.hint(prefix, "batch_size"))
        require(self.eval_batch_size >= 1, f"{prefix}.eval_batch_size",
                f"must be >= 1, got {self.eval_batch_size}", self.hint(prefix, "eval_batch_size"))
        require(self.eval_every is None or self.eval_every >= 1, f"{prefix}.eval_every",
                f"must be >= 1 or null, got {self.eval_every}", self.hint(prefix, "eval_every"))
        require(not (self.eval_in_background and cfg is not None
                     and cfg.launcher.get("elastic")), f"{prefix}.eval_in_background",
                "an elastic job's learners change under the evaluation thread's communicator",
                f"{prefix}.eval_in_background=false (or launcher.elastic=false)")
        require(self.num_workers >= 0, f"{prefix}.num_workers", "must be >= 0",
                self.hint(prefix, "num_workers"))
        require(self.log_every >= 1, f"{prefix}.log_every", "must be >= 1",
                self.hint(prefix, "log_every"))
        require(self.progress_every_s > 0, f"{prefix}.progress_every_s",
                f"must be > 0, got {self.progress_every_s}", self.hint(prefix, "progress_every_s"))
        require(self.device in ("auto", "cpu", "cuda"), f"{prefix}.device",
                f"must be auto, cpu or cuda, got {self.device!r}", self.hint(prefix, "device"))
        require(self.dtype in ("float32", "float64"), f"{prefix}.dtype",
                f"must be float32 or float64, got {self.dtype!r}", self.hint(prefix, "dtype"))
        require(self.amp in ("none", "bf16", "auto"), f"{prefix}.amp",
                f"must be none, bf16 or auto, got {self.amp!r}", f"{prefix}.amp=auto")
        require(self.amp != "bf16" or self.dtype == "float32", f"{prefix}.amp",
                f"bf16 autocast needs {prefix}.dtype=float32, got {self.dtype}",
                self.hint(prefix, "amp"))
        self._check_checkpoint_every(prefix, cfg)
        if self.checkpoint_in_background and cfg is not None:
            key = f"{prefix}.checkpoint_in_background"
            off = f"{key}=false"
            require(not cfg.launcher.get("elastic"), key, "an elastic job's learners change "
                    "under the writing thread", f"{off} (or launcher.elastic=false)")
            require(self.checkpoint_every != CHECKPOINT_AUTO, key, "checkpoint_every=auto "
                    "plans each checkpoint with every rank at the previous one",
                    f"{off} (or {prefix}.checkpoint_every=N steps)")
        require(self.keep_checkpoints >= 1, f"{prefix}.keep_checkpoints",
                f"must be >= 1, got {self.keep_checkpoints}", self.hint(prefix, "keep_checkpoints"))
        require(self.on_nonfinite in ("stop", "skip_batch"), f"{prefix}.on_nonfinite",
                f"must be stop or skip_batch, got {self.on_nonfinite!r}",
                self.hint(prefix, "on_nonfinite"))
        require(self.compile_backend in COMPILE_BACKENDS, f"{prefix}.compile_backend",
                f"must be one of {', '.join(COMPILE_BACKENDS)}, got {self.compile_backend!r}",
                self.hint(prefix, "compile_backend"))

    def _check_checkpoint_every(self, prefix: str, cfg: DictConfig) -> None:
        key, every, auto = f"{prefix}.checkpoint_every", self.checkpoint_every, CHECKPOINT_AUTO
        if isinstance(every, str) and every != auto:
            close = difflib.get_close_matches(every, [auto], n=1, cutoff=0.5)
            raise ConfigError(key, f"must be a number of steps >= 1, auto or null, got "
                              f"{every!r}" + (f" (did you mean {auto}?)" if close else ""),
                              f"{key}={auto}")
        steps = isinstance(every, int) and not isinstance(every, bool) and every >= 1
        require(every is None or every == auto or steps, key,
                f"must be a number of steps >= 1, auto or null, got {every!r}",
                self.hint(prefix, "checkpoint_every"))
        if every != auto or cfg is None:
            return
        require(node_mtbf_h(cfg) is not None, key, "auto spaces checkpoints by the failure "
                "rate, and none is given (launcher.mtbf_h and the cluster preset's "
                "cluster.failures.node_mtbf_hours are null)",
                "launcher.mtbf_h=HOURS (mean hours between failures of one node)")
        require(cfg.launcher.get("name") != "sim" or bool(cfg.cluster.get("storage_gbps")),
                key, "auto spaces checkpoints by their cost, which the simulator models from "
                "cluster.storage_gbps (null here)",
                "cluster.storage_gbps=GBPS (e.g. 10), or trainer.checkpoint_every=N steps")
        require(not cfg.launcher.get("elastic"), key, "an elastic job goes on without a lost "
                "learner instead of restarting from a checkpoint, and a joining learner "
                "cannot learn an auto schedule", f"{key}=N (steps) or launcher.elastic=false")


@dataclass
class OptimConfig(Section):
    lr: float = 0.1  # learning rate for a global batch of `reference_batch` samples
    reference_batch: int = 256
    scaling: str = "linear"  # linear: lr * global_batch / reference_batch; none: lr as given
    warmup_epochs: float = 0.0  # ramp from `lr` to the scaled rate over this many epochs
    # resumed with more ranks (a larger global batch, so a higher scaled rate): climb from
    # the rate the checkpoint ran at to the new one over this many epochs (0: at once)
    resize_warmup_epochs: float = 0.5
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    no_decay_norm_bias: bool = False  # no weight decay on normalisation weights and biases
    schedule: str = "constant"  # constant | step | cosine
    milestones: list[float] = field(default_factory=list)  # epochs, for schedule=step
    decay_factor: float = 0.1  # multiplier at each milestone
    clip_grad_norm: Optional[float] = None  # clip the gradient the update uses to this L2 norm

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.lr > 0, f"{prefix}.lr", f"must be > 0, got {self.lr}", self.hint(prefix, "lr"))
        require(self.reference_batch >= 1, f"{prefix}.reference_batch", "must be >= 1",
                self.hint(prefix, "reference_batch"))
        require(self.scaling in ("linear", "none"), f"{prefix}.scaling",
                f"must be linear or none, got {self.scaling!r}", self.hint(prefix, "scaling"))
        require(self.warmup_epochs >= 0, f"{prefix}.warmup_epochs", "must be >= 0",
                self.hint(prefix, "warmup_epochs"))
        require(self.resize_warmup_epochs >= 0, f"{prefix}.resize_warmup_epochs",
                "must be >= 0", self.hint(prefix, "resize_warmup_epochs"))
        require(0 <= self.momentum < 1, f"{prefix}.momentum",
                f"must be in [0, 1), got {self.momentum}", self.hint(prefix, "momentum"))
        require(not self.nesterov or self.momentum > 0, f"{prefix}.nesterov",
                "Nesterov momentum needs momentum > 0", self.hint(prefix, "momentum"))
        require(self.weight_decay >= 0, f"{prefix}.weight_decay", "must be >= 0",
                self.hint(prefix, "weight_decay"))
        require(self.schedule in ("constant", "step", "cosine"), f"{prefix}.schedule",
                f"must be constant, step or cosine, got {self.schedule!r}",
                self.hint(prefix, "schedule"))
        require(list(self.milestones) == sorted(self.milestones), f"{prefix}.milestones",
                "must be increasing", f"{prefix}.milestones=[30,60,80]")
        require(0 < self.decay_factor <= 1, f"{prefix}.decay_factor", "must be in (0, 1]",
                self.hint(prefix, "decay_factor"))
        require(self.clip_grad_norm is None or self.clip_grad_norm > 0,
                f"{prefix}.clip_grad_norm", f"must be > 0 or null, got {self.clip_grad_norm}",
                f"{prefix}.clip_grad_norm=5")


@dataclass
class CommConfig(Section):
    backend: str = "auto"  # auto (mpi on CPU, nccl on GPU) | mpi | nccl | gloo
    bucket_mb: float = 4.0  # gradient bucket size for overlapped allreduce
    timeout_s: float = 900.0  # a collective with no answer for this long ends the job
    # The MPI library's allreduce algorithm: ring (bandwidth-optimal: every link carries
    # 2(n-1)/n of the message, which MPICH's own choice fell short of across 4 hosts:
    # docs/lab.md) or auto (the library's choice, fewer steps for small messages).
    allreduce: str = "ring"
    # The dtype models travel in between learners (gossip, averaging): float32, bfloat16 or
    # float16; None: the model's own. What is received is widened before it is averaged.
    exchange_dtype: Optional[str] = None

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.exchange_dtype in (None, "float32", "bfloat16", "float16"),
                f"{prefix}.exchange_dtype",
                f"must be float32, bfloat16 or float16 (or null: the model's dtype), got "
                f"{self.exchange_dtype!r}", f"{prefix}.exchange_dtype=bfloat16")
        require(self.backend in ("auto", "mpi", "nccl", "gloo"), f"{prefix}.backend",
                f"must be auto, mpi, nccl or gloo, got {self.backend!r}",
                self.hint(prefix, "backend"))
        require(self.allreduce in ("ring", "auto"), f"{prefix}.allreduce",
                f"must be ring or auto, got {self.allreduce!r}", self.hint(prefix, "allreduce"))
        require(self.bucket_mb > 0, f"{prefix}.bucket_mb", "must be > 0",
                self.hint(prefix, "bucket_mb"))
        require(self.timeout_s > 0, f"{prefix}.timeout_s", f"must be > 0, got {self.timeout_s}",
                self.hint(prefix, "timeout_s"))


@dataclass
class StragglerConfig:
    ranks: list[int] = field(default_factory=list)  # these ranks compute `factor` times slower
    factor: float = 1.0


@dataclass
class NonfiniteLossConfig:
    ranks: list[int] = field(default_factory=list)  # these ranks' loss is NaN...
    steps: list[int] = field(default_factory=list)  # ...at these steps (tests of on_nonfinite)


@dataclass
class SigkillConfig:
    ranks: list[int] = field(default_factory=list)  # these ranks kill -9 themselves...
    step: Optional[int] = None  # ...as they start this step (tests of launcher.max_restarts)
    # Whichever rank is about to train this training-set sample kills -9 itself: a sample that
    # kills every learner it reaches (tests of an elastic job's repeated-failure rule).
    sample: Optional[int] = None
    # These ranks kill -9 themselves as an elastic job starts recovering from a loss: a
    # second loss during the recovery (tests of launcher.elastic).
    recovering_ranks: list[int] = field(default_factory=list)
    # "exit": the rank ends with exit status 1 instead of a kill -9, without its exit record,
    # as a process that MPI ended on its own does, which ULFM takes for no failure (tests of
    # an elastic job's watch on peers that end: runner/elastic/peer_exits.py).
    how: str = "kill"


@dataclass
class FaultsConfig(Section):
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    delay_s: float = 0.0  # every step of every rank sleeps a random time in [0, delay_s]
    nonfinite_loss: NonfiniteLossConfig = field(default_factory=NonfiniteLossConfig)
    sigkill: SigkillConfig = field(default_factory=SigkillConfig)
    # Every rank sleeps this long inside each checkpoint write, after writing its temporary
    # file and before renaming it: lets a test kill a rank in the middle of a write.
    checkpoint_write_delay_s: float = 0.0
    # Every rank sleeps this long in each evaluation (a slow held-out set): lets a test press
    # Ctrl-C in the middle of one.
    eval_delay_s: float = 0.0
    # launcher.respawn asks MPI to start a program that does not exist, so that starting a
    # replacement fails as it would on a broken host (tests of launcher.respawn).
    respawn_fails: bool = False

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.delay_s >= 0, f"{prefix}.delay_s", f"must be >= 0, got {self.delay_s}",
                self.hint(prefix, "delay_s"))
        nprocs = cfg.launcher.nprocs
        require(self.straggler.factor >= 1, f"{prefix}.straggler.factor",
                f"must be >= 1, got {self.straggler.factor}", f"{prefix}.straggler.factor=4")
        for key, ranks in (("straggler.ranks", self.straggler.ranks),
                           ("nonfinite_loss.ranks", self.nonfinite_loss.ranks),
                           ("sigkill.ranks", self.sigkill.ranks),
                           ("sigkill.recovering_ranks", self.sigkill.recovering_ranks)):
            bad = [r for r in ranks if not 0 <= r < nprocs]
            require(not bad, f"{prefix}.{key}", f"ranks {bad} do not exist with "
                    f"launcher.nprocs={nprocs}", f"{prefix}.{key}=[{nprocs - 1}]")
        require(self.sigkill.step is None or self.sigkill.step >= 1, f"{prefix}.sigkill.step",
                f"must be >= 1 (steps count from 1), got {self.sigkill.step}",
                f"{prefix}.sigkill.step=10")
        require(self.sigkill.how in ("kill", "exit"), f"{prefix}.sigkill.how",
                f"must be kill or exit, got {self.sigkill.how!r}", f"{prefix}.sigkill.how=kill")
        require(self.sigkill.sample is None or self.sigkill.sample >= 0,
                f"{prefix}.sigkill.sample", f"must be >= 0 (an index into the training set), "
                f"got {self.sigkill.sample}", f"{prefix}.sigkill.sample=0")
        require(self.checkpoint_write_delay_s >= 0, f"{prefix}.checkpoint_write_delay_s",
                "must be >= 0", self.hint(prefix, "checkpoint_write_delay_s"))
        require(self.eval_delay_s >= 0, f"{prefix}.eval_delay_s", "must be >= 0",
                self.hint(prefix, "eval_delay_s"))
        require(not self.respawn_fails or cfg.launcher.get("respawn"), f"{prefix}.respawn_fails",
                "makes the start of a replacement fail, and this job starts none",
                "launcher.respawn=true (or leave faults.respawn_fails out)")


@dataclass
class RunConfig:
    """The top level of a run's config; the four groups are filled by their choices."""

    seed: int = 0
    # auto: continue from the newest complete checkpoint of this run dir (hydra.run.dir=DIR),
    # or a fresh start when there is none; or the path of a checkpoint dir
    resume: Optional[str] = None
    # true: every rank starts from the average of the checkpoint's models (how to resume with
    # another launcher.nprocs)
    resume_averaged: bool = False
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    # The modelled machine of launcher=sim (conf/cluster/, runner/config/cluster.py).
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    recipe: Any = MISSING
    algo: Any = MISSING
    topology: Any = MISSING
    launcher: Any = MISSING


FIXED_SECTIONS: dict[str, type] = {
    "trainer": TrainerConfig,
    "optim": OptimConfig,
    "comm": CommConfig,
    "faults": FaultsConfig,
    "cluster": ClusterConfig,
}
