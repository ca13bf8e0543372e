"""Configuration schemas and validation.

Hydra composes ``conf/``; :func:`validate` then merges every section into its dataclass schema
(so a typo or a wrong type is an error naming the key) and runs each schema's ``check`` for
impossible values. Algorithm, recipe and launcher schemas live next to their implementations and
are found through the registries.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from .errors import ConfigError, one_line


class Section:
    """Mixin for schema dataclasses: ``check`` raises ConfigError for impossible values."""

    def check(self, prefix: str, cfg: DictConfig) -> None:
        return None


# conf/launcher/slurm.yaml derives the number of ranks: nprocs = ${multiply:nodes,procs_per_node}
# (0 when a factor is null: the launcher's check then names the missing key).
if not OmegaConf.has_resolver("multiply"):
    OmegaConf.register_new_resolver(
        "multiply", lambda a, b: 0 if a is None or b is None else int(a) * int(b))


def require(condition: bool, key: str, problem: str, fix: str) -> None:
    if not condition:
        raise ConfigError(key, problem, fix)


# torch.compile backends for training that ship with torch (importing torch._dynamo to list
# them all would cost the command line seconds).
COMPILE_BACKENDS = ("inductor", "cudagraphs", "aot_eager", "eager")


@dataclass
class TrainerConfig(Section):
    epochs: int = 3
    batch_size: int = 32  # per rank
    eval_every: Optional[int] = None  # also evaluate every N steps (None: epoch ends only)
    eval_batch_size: int = 256
    num_workers: int = 0
    log_every: int = 10  # steps between TensorBoard training scalars
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "float32"  # float64 for numerical checks (equivalence tests)
    progress: bool = True  # tqdm bar from rank 0
    # The data and compute path (runner/data.py, runner/accel.py).
    pin_memory: bool = True  # page-locked batches, copied to a GPU asynchronously (GPU only)
    persistent_workers: bool = True  # keep the loader workers across epochs (num_workers > 0)
    channels_last: bool = False  # NHWC layout for 4-D image batches
    amp: str = "none"  # none | bf16 | auto (bf16 where the GPU computes it natively)
    compile: bool = False  # torch.compile the model
    compile_backend: str = "inductor"  # eager / aot_eager: check graph capture, no codegen
    cudnn_benchmark: bool = False  # let cuDNN time its kernels (fixed input shapes only)
    # Reliability (runner/checkpoint.py, docs/failures.md).
    checkpoint_every: Optional[int] = None  # also checkpoint every N steps (None: epoch ends)
    keep_checkpoints: int = 2  # complete checkpoints kept in RUN_DIR/checkpoints
    on_nonfinite: str = "stop"  # NaN/Inf loss: stop (keep the last good checkpoint) | skip_batch

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.epochs >= 1, f"{prefix}.epochs", f"must be >= 1, got {self.epochs}",
                f"{prefix}.epochs=3")
        require(self.batch_size >= 1, f"{prefix}.batch_size",
                f"must be >= 1, got {self.batch_size}", f"{prefix}.batch_size=32")
        require(self.eval_batch_size >= 1, f"{prefix}.eval_batch_size",
                f"must be >= 1, got {self.eval_batch_size}", f"{prefix}.eval_batch_size=256")
        require(self.eval_every is None or self.eval_every >= 1, f"{prefix}.eval_every",
                f"must be >= 1 or null, got {self.eval_every}", f"{prefix}.eval_every=null")
        require(self.num_workers >= 0, f"{prefix}.num_workers", "must be >= 0",
                f"{prefix}.num_workers=0")
        require(self.log_every >= 1, f"{prefix}.log_every", "must be >= 1",
                f"{prefix}.log_every=10")
        require(self.device in ("auto", "cpu", "cuda"), f"{prefix}.device",
                f"must be auto, cpu or cuda, got {self.device!r}", f"{prefix}.device=auto")
        require(self.dtype in ("float32", "float64"), f"{prefix}.dtype",
                f"must be float32 or float64, got {self.dtype!r}", f"{prefix}.dtype=float32")
        require(self.amp in ("none", "bf16", "auto"), f"{prefix}.amp",
                f"must be none, bf16 or auto, got {self.amp!r}", f"{prefix}.amp=auto")
        require(self.amp != "bf16" or self.dtype == "float32", f"{prefix}.amp",
                f"bf16 autocast needs {prefix}.dtype=float32, got {self.dtype}",
                f"{prefix}.amp=none")
        require(self.checkpoint_every is None or self.checkpoint_every >= 1,
                f"{prefix}.checkpoint_every", f"must be >= 1 or null, got {self.checkpoint_every}",
                f"{prefix}.checkpoint_every=null")
        require(self.keep_checkpoints >= 1, f"{prefix}.keep_checkpoints",
                f"must be >= 1, got {self.keep_checkpoints}", f"{prefix}.keep_checkpoints=2")
        require(self.on_nonfinite in ("stop", "skip_batch"), f"{prefix}.on_nonfinite",
                f"must be stop or skip_batch, got {self.on_nonfinite!r}",
                f"{prefix}.on_nonfinite=stop")
        require(self.compile_backend in COMPILE_BACKENDS, f"{prefix}.compile_backend",
                f"must be one of {', '.join(COMPILE_BACKENDS)}, got {self.compile_backend!r}",
                f"{prefix}.compile_backend=inductor")


@dataclass
class OptimConfig(Section):
    lr: float = 0.1  # learning rate for a global batch of `reference_batch` samples
    reference_batch: int = 256
    scaling: str = "linear"  # linear: lr * global_batch / reference_batch; none: lr as given
    warmup_epochs: float = 0.0  # ramp from `lr` to the scaled rate over this many epochs
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    no_decay_norm_bias: bool = False  # no weight decay on normalisation weights and biases
    schedule: str = "constant"  # constant | step | cosine
    milestones: list[float] = field(default_factory=list)  # epochs, for schedule=step
    decay_factor: float = 0.1  # multiplier at each milestone
    clip_grad_norm: Optional[float] = None  # clip the gradient the update uses to this L2 norm

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.lr > 0, f"{prefix}.lr", f"must be > 0, got {self.lr}", f"{prefix}.lr=0.1")
        require(self.reference_batch >= 1, f"{prefix}.reference_batch", "must be >= 1",
                f"{prefix}.reference_batch=256")
        require(self.scaling in ("linear", "none"), f"{prefix}.scaling",
                f"must be linear or none, got {self.scaling!r}", f"{prefix}.scaling=linear")
        require(self.warmup_epochs >= 0, f"{prefix}.warmup_epochs", "must be >= 0",
                f"{prefix}.warmup_epochs=0")
        require(0 <= self.momentum < 1, f"{prefix}.momentum",
                f"must be in [0, 1), got {self.momentum}", f"{prefix}.momentum=0.9")
        require(not self.nesterov or self.momentum > 0, f"{prefix}.nesterov",
                "Nesterov momentum needs momentum > 0", f"{prefix}.momentum=0.9")
        require(self.weight_decay >= 0, f"{prefix}.weight_decay", "must be >= 0",
                f"{prefix}.weight_decay=0")
        require(self.schedule in ("constant", "step", "cosine"), f"{prefix}.schedule",
                f"must be constant, step or cosine, got {self.schedule!r}",
                f"{prefix}.schedule=constant")
        require(list(self.milestones) == sorted(self.milestones), f"{prefix}.milestones",
                "must be increasing", f"{prefix}.milestones=[30,60,80]")
        require(0 < self.decay_factor <= 1, f"{prefix}.decay_factor", "must be in (0, 1]",
                f"{prefix}.decay_factor=0.1")
        require(self.clip_grad_norm is None or self.clip_grad_norm > 0,
                f"{prefix}.clip_grad_norm", f"must be > 0 or null, got {self.clip_grad_norm}",
                f"{prefix}.clip_grad_norm=5")


@dataclass
class CommConfig(Section):
    backend: str = "auto"  # auto (mpi on CPU, nccl on GPU) | mpi | nccl | gloo
    bucket_mb: float = 4.0  # gradient bucket size for overlapped allreduce
    timeout_s: float = 900.0  # a collective with no answer for this long ends the job

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.backend in ("auto", "mpi", "nccl", "gloo"), f"{prefix}.backend",
                f"must be auto, mpi, nccl or gloo, got {self.backend!r}",
                f"{prefix}.backend=auto")
        require(self.bucket_mb > 0, f"{prefix}.bucket_mb", "must be > 0",
                f"{prefix}.bucket_mb=4")
        require(self.timeout_s > 0, f"{prefix}.timeout_s", f"must be > 0, got {self.timeout_s}",
                f"{prefix}.timeout_s=900")


@dataclass
class TopologyConfig(Section):
    name: str = "ring"


@dataclass
class StragglerConfig:
    ranks: list[int] = field(default_factory=list)  # these ranks compute `factor` times slower
    factor: float = 1.0


@dataclass
class NonfiniteLossConfig:
    ranks: list[int] = field(default_factory=list)  # these ranks' loss is NaN...
    steps: list[int] = field(default_factory=list)  # ...at these steps (tests of on_nonfinite)


@dataclass
class FaultsConfig(Section):
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    delay_s: float = 0.0  # every step of every rank sleeps a random time in [0, delay_s]
    nonfinite_loss: NonfiniteLossConfig = field(default_factory=NonfiniteLossConfig)
    # Every rank sleeps this long inside each checkpoint write, after writing its temporary
    # file and before renaming it: lets a test kill a rank in the middle of a write.
    checkpoint_write_delay_s: float = 0.0

    def check(self, prefix: str, cfg: DictConfig) -> None:
        require(self.delay_s >= 0, f"{prefix}.delay_s", f"must be >= 0, got {self.delay_s}",
                f"{prefix}.delay_s=0")
        nprocs = cfg.launcher.nprocs
        require(self.straggler.factor >= 1, f"{prefix}.straggler.factor",
                f"must be >= 1, got {self.straggler.factor}", f"{prefix}.straggler.factor=4")
        for key, ranks in (("straggler", self.straggler.ranks),
                           ("nonfinite_loss", self.nonfinite_loss.ranks)):
            bad = [r for r in ranks if not 0 <= r < nprocs]
            require(not bad, f"{prefix}.{key}.ranks", f"ranks {bad} do not exist with "
                    f"launcher.nprocs={nprocs}", f"{prefix}.{key}.ranks=[{nprocs - 1}]")
        require(self.checkpoint_write_delay_s >= 0, f"{prefix}.checkpoint_write_delay_s",
                "must be >= 0", f"{prefix}.checkpoint_write_delay_s=0")


FIXED_SECTIONS: dict[str, type] = {
    "trainer": TrainerConfig,
    "optim": OptimConfig,
    "comm": CommConfig,
    "faults": FaultsConfig,
}


def _registries() -> dict[str, Any]:
    from recipes import RECIPES

    from .algos import ALGORITHMS
    from .launch import LAUNCHERS
    from .topology import TOPOLOGIES

    return {"recipe": RECIPES, "algo": ALGORITHMS, "topology": TOPOLOGIES,
            "launcher": LAUNCHERS}


def _resume_keys(plain: dict[str, Any]) -> dict[str, Any]:
    """The top-level ``resume`` (null, auto or a checkpoint dir) and ``resume_averaged``."""
    resume = plain.pop("resume", None)
    if resume is not None and (not isinstance(resume, str) or not resume.strip()):
        raise ConfigError("resume", f"must be null, auto or the path of a checkpoint dir, got "
                          f"{resume!r}", "resume=auto")
    averaged = plain.pop("resume_averaged", False)
    if not isinstance(averaged, bool):
        raise ConfigError("resume_averaged", f"must be true or false, got {averaged!r}",
                          "resume_averaged=true")
    return {"resume": resume, "resume_averaged": averaged}


def _known_keys(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def leaf_keys(section: DictConfig) -> list[str]:
    """The keys of ``section`` that hold values, not sub-sections (what an example can set)."""
    return [str(k) for k, v in section.items() if not isinstance(v, DictConfig)]


def section_given_a_value(prefix: str, keys: list[str], value: Any = None) -> ConfigError:
    """The error for a whole section set to one value (``optim=adam``: optim is a section of
    keys, not a config group to choose from); ``keys`` are its own keys, for the example."""
    got = "" if value is None else f" (got {value!r})"
    example = f"{prefix}.{keys[0]}=..." if keys else f"{prefix}.KEY=..."
    return ConfigError(prefix, f"is a section of keys, not a value{got}",
                       f"set its keys one by one, e.g. {example} (adpsgd-run --cfg job lists "
                       "them)")


def _typed_section(prefix: str, schema: type, node: Any) -> DictConfig:
    """Merge ``node`` into ``schema``; turn OmegaConf's errors into one line naming the key."""
    base = OmegaConf.structured(schema)
    if node is not None and not isinstance(node, dict):  # OmegaConf would raise a traceback
        raise section_given_a_value(prefix, leaf_keys(base), node)
    try:
        merged = OmegaConf.merge(base, node if node is not None else {})
    except ConfigKeyError as ex:
        key = str(ex.key) if getattr(ex, "key", None) is not None else "?"
        close = difflib.get_close_matches(key, _known_keys(schema), n=1)
        fix = f"{prefix}.{close[0]}=..." if close else (
            f"remove it; known keys: {', '.join(_known_keys(schema))}")
        raise ConfigError(f"{prefix}.{key}", "unknown key", fix) from None
    except ValidationError as ex:
        key = f"{prefix}.{ex.full_key}" if ex.full_key else prefix
        declared = {f.name: f.type for f in dataclasses.fields(schema)}.get(str(ex.key))
        problem = one_line(ex.msg).split(" full_key:")[0]
        fix = f"{key}=<{declared}>" if declared else f"give {key} a value of the right type"
        raise ConfigError(key, problem, fix) from None
    except OmegaConfBaseException as ex:
        raise ConfigError(prefix, one_line(ex.msg if hasattr(ex, "msg") else ex),
                          "check the override") from None
    return merged


def validate(cfg: DictConfig) -> DictConfig:
    """Return a resolved, typed copy of the composed config, or raise ConfigError."""
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as ex:
        raise ConfigError(str(getattr(ex, "full_key", "config")), one_line(ex),
                          "fix the interpolation") from None
    assert isinstance(plain, dict)
    typed: dict[str, Any] = {}
    seed = plain.pop("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError("seed", f"must be an integer, got {seed!r}", "seed=0")
    typed["seed"] = seed
    typed.update(_resume_keys(plain))

    for section, schema in FIXED_SECTIONS.items():
        typed[section] = _typed_section(section, schema, plain.pop(section, None))
    for section, registry in _registries().items():
        node = plain.pop(section, None) or {}
        name = node.get("name")
        if name not in registry:
            raise ConfigError(f"{section}.name", f"unknown {registry.kind} {name!r}",
                              f"choose {section}=NAME with NAME one of: "
                              f"{', '.join(registry.names())}")
        typed[section] = _typed_section(section, registry.get(name).Config, node)
    for extra_key, value in plain.items():
        # Sections owned by later features (e.g. faults) validate themselves; anything else
        # is a typo at the top level.
        if extra_key not in EXTRA_SECTIONS:
            close = difflib.get_close_matches(extra_key, [*typed, *EXTRA_SECTIONS], n=1)
            raise ConfigError(extra_key, "unknown top-level key",
                              f"did you mean {close[0]}?" if close else "remove it")
        typed[extra_key] = _typed_section(extra_key, EXTRA_SECTIONS[extra_key], value)

    result = OmegaConf.create(typed)
    for section, node in typed.items():
        if isinstance(node, DictConfig):
            OmegaConf.to_object(node).check(section, result)
    algo_cls = _registries()["algo"].get(result.algo.name)
    algo_cls.check_world(result)
    OmegaConf.set_struct(result, True)
    return result


# Optional top-level sections registered by features that are not part of every run.
EXTRA_SECTIONS: dict[str, type] = {}
