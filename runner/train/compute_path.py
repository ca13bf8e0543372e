"""The compute path: how a batch reaches the model and how the model runs on the device.

Options (``trainer.*``), all recipe- and algorithm-agnostic:

* ``channels_last``: 4-D floating input batches in NHWC layout. Convolution kernels (cuDNN,
  oneDNN) are fastest in NHWC, and a channels-last input makes them choose it. Parameters stay
  in the contiguous flat buffers that every algorithm communicates (runner/comm/buffers.py);
  the kernels read the weights in either layout.
* ``amp``: forward passes under ``torch.autocast`` in bfloat16 (``auto``: where the GPU
  computes it natively; a CPU without bf16 units emulates it, ~9x slower on AVX2). The backward
  pass, the gradients, the flat buffers and the optimizer stay in float32, and bfloat16 has
  float32's exponent range, so no loss scaling is needed.
* ``compile``: ``torch.compile`` on the model in place (``nn.Module.compile``), so parameter
  names, checkpoints and the flat buffers are unchanged.
* ``cudnn_benchmark``: cuDNN times its convolution kernels for each new input shape and keeps
  the fastest; right for fixed-size images, wasteful for variable-length batches.

Batches move with ``non_blocking`` copies (Recipe.to_device) from pinned host memory
(``trainer.pin_memory``, see runner/train/data.py). benchmarks/bench_imagenet.py uses this same
class, so the benchmark measures the path that trains.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import UserError
from .prefetch import DevicePrefetch, OnDevice

AMP_CHOICES = ("none", "bf16", "auto")


def resolve_device(name: str, host_rank: int) -> torch.device:
    """``trainer.device`` for the rank with this index among its machine's ranks: the
    machine's visible GPUs are dealt round-robin, so more ranks than GPUs share them."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    require_a_visible_gpu()
    index = host_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def require_a_visible_gpu() -> None:
    """``trainer.device=cuda``: refused where no GPU is visible. The local launcher asks
    before its ranks start; each rank asks again on its own host."""
    if not torch.cuda.is_available():
        raise UserError("trainer.device=cuda but no GPU is visible", "use trainer.device=auto")


def device_record(device: torch.device) -> str:
    """How summary.json names a rank's device: ``cpu`` or ``cuda:0 (NVIDIA H100 80GB HBM3)``."""
    if device.type != "cuda":
        return device.type
    return f"{device} ({torch.cuda.get_device_name(device)})"


def amp_dtype(amp: str, device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """The autocast dtype for ``trainer.amp`` on ``device``; None: no autocast."""
    if amp == "none" or dtype != torch.float32:
        return None
    if amp == "bf16":
        return torch.bfloat16
    native = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.bfloat16 if native else None


def to_channels_last(batch: Any) -> Any:
    """``batch`` with every 4-D floating tensor in channels-last layout (tuples, lists and
    dicts are walked; anything else is returned as is)."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 4 and batch.is_floating_point():
            return batch.contiguous(memory_format=torch.channels_last)
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple
        return type(batch)(*(to_channels_last(item) for item in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_channels_last(item) for item in batch)
    if isinstance(batch, dict):
        return {key: to_channels_last(value) for key, value in batch.items()}
    return batch


def should_compile(setting: bool | None, device: torch.device, steps: int,
                   pays_after: int | None) -> bool:
    """``trainer.compile``: as set, or (null) on a GPU when the run's ``steps`` per rank reach
    the recipe's break-even ``pays_after`` (compilation time / time saved per step, measured:
    docs/RESULTS.md), so that short runs do not wait a minute or more for a compiler."""
    if setting is not None:
        return setting
    return device.type == "cuda" and pays_after is not None and steps >= pays_after


@dataclass
class ComputePath:
    device: torch.device
    dtype: torch.dtype = torch.float32
    amp: torch.dtype | None = None  # autocast dtype
    channels_last: bool = False
    compile: bool = False
    compile_backend: str = "inductor"
    cudnn_benchmark: bool = False

    @classmethod
    def from_config(cls, tcfg: Any, device: torch.device, steps: int = 0,
                    compile_pays_after: int | None = None) -> ComputePath:
        """From a validated ``trainer`` section, for a run of ``steps`` steps per rank on a
        recipe whose compilation pays after ``compile_pays_after`` steps (None: unmeasured)."""
        dtype = getattr(torch, tcfg.dtype)
        compile_now = should_compile(tcfg.compile, device, steps, compile_pays_after)
        return cls(device=device, dtype=dtype, amp=amp_dtype(tcfg.amp, device, dtype),
                   channels_last=tcfg.channels_last, compile=compile_now,
                   compile_backend=tcfg.compile_backend, cudnn_benchmark=tcfg.cudnn_benchmark)

    def prepare_model(self, model: nn.Module) -> None:
        """Compile in place when asked (lazily: the first forward pass compiles); set cuDNN's
        kernel timing (a process-wide switch)."""
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = self.cudnn_benchmark
        if self.compile:
            model.compile(backend=self.compile_backend)

    def copy_model(self, model: nn.Module) -> nn.Module:
        """A deep copy that runs its own weights. A compiled module's compiled call is bound
        to the original module and a deep copy would keep calling it, so the copy is compiled
        afresh."""
        clone = copy.deepcopy(model)
        if getattr(model, "_compiled_call_impl", None) is not None:
            clone._compiled_call_impl = None
            self.prepare_model(clone)
        return clone

    def batch(self, recipe: Any, batch: Any) -> Any:
        """Move a host batch to the device (the recipe's to_device, non-blocking) and give
        its images the configured layout."""
        if isinstance(batch, OnDevice):  # moved already (trainer.prefetch_to_device)
            return batch.value
        batch = recipe.to_device(batch, self.device, self.dtype)
        return to_channels_last(batch) if self.channels_last else batch

    @contextlib.contextmanager
    def batches(self, recipe: Any, host_batches: Iterator[Any], prefetch: bool
                ) -> Iterator[Iterator[Any]]:
        """The host batches, or (``prefetch``) the same batches moved to the device a batch
        ahead by a background thread (runner/train/prefetch.py). Leaving the block stops that
        thread before the loader is iterated again."""
        if not prefetch:
            yield host_batches
            return
        staged = DevicePrefetch(host_batches, lambda host: self.batch(recipe, host), self.device)
        try:
            yield staged
        finally:
            staged.close()

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for forward passes: autocast in the configured dtype, or nothing."""
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp)
