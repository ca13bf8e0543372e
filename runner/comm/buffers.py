"""Contiguous flat buffers for parameters and gradients.

Communicating one message per tensor is slow (latency per message dominates for the many small
tensors of a network), so parameters and gradients live in a few contiguous buffers and every
collective or point-to-point exchange sends whole buffers.

* :func:`flatten_parameters` moves every parameter's storage into one flat tensor per dtype
  and device, so that the model itself *is* a view of the buffer.
* :class:`GradientBuckets` gives each parameter a ``.grad`` that is a view into a bucket of
  about ``bucket_bytes``; buckets are filled in reverse registration order, which is roughly
  the order in which backward produces gradients.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..lazy import torch


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Copy ``tensors`` into one new contiguous 1-D tensor (all must share dtype and device)."""
    if not tensors:
        return torch.empty(0)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``like`` (inverse of :func:`flatten`)."""
    needed = sum(t.numel() for t in like)
    if needed != flat.numel():
        raise ValueError(f"flat buffer has {flat.numel()} elements, tensors need {needed}")
    views, offset = [], 0
    for t in like:
        views.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return views


def _groups(params: Iterable[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Parameters grouped by (dtype, device), in order: the layout of every flat buffer."""
    groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault((p.dtype, p.device), []).append(p)
    return list(groups.values())


def flat_slices(params: Iterable[torch.nn.Parameter]) -> list[tuple[int, int, int]]:
    """Where each parameter lies in the buffers of :func:`flatten_parameters` (and
    :func:`flatten_gradients`) called on the same parameters: ``(buffer index, start, stop)``
    per parameter, in the given order."""
    params = list(params)
    where: dict[int, tuple[int, int, int]] = {}
    for index, members in enumerate(_groups(params)):
        offset = 0
        for p in members:
            where[id(p)] = (index, offset, offset + p.numel())
            offset += p.numel()
    return [where[id(p)] for p in params]


def flatten_gradients(params: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Give every parameter a ``.grad`` that is a view of a flat buffer laid out exactly like
    :func:`flatten_parameters`' buffers, so that an optimizer over the flat parameters can use
    these buffers as gradients."""
    buffers = []
    for members in _groups(params):
        flat = torch.zeros(sum(p.numel() for p in members), dtype=members[0].dtype,
                           device=members[0].device)
        for p, view in zip(members, unflatten(flat, members)):
            p.grad = view
        buffers.append(flat)
    return buffers


def flatten_parameters(params: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Rebind parameters to views of flat buffers (one per dtype/device); return the buffers.

    After this call, writing into a returned buffer changes the parameters and vice versa, so a
    whole model can be sent, received or averaged as a handful of messages.
    """
    buffers = []
    for members in _groups(params):
        flat = flatten(members)
        for p, view in zip(members, unflatten(flat, members)):
            p.data = view
        buffers.append(flat)
    return buffers


class GradientBuckets:
    """Gradient storage in contiguous buckets, with per-bucket readiness tracking.

    ``on_ready(bucket_index)`` is called (from the autograd thread) when every parameter of a
    bucket has accumulated its gradient during backward; buckets are reported strictly in index
    order so that every rank issues its collectives in the same order.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], bucket_bytes: int):
        params = [p for p in params if p.requires_grad]
        self.params = params
        self.buckets: list[torch.Tensor] = []
        self.members: list[list[torch.nn.Parameter]] = []
        current: list[torch.nn.Parameter] = []
        size = 0
        for p in reversed(params):
            if current and (size + p.numel() * p.element_size() > bucket_bytes
                            or p.dtype != current[0].dtype or p.device != current[0].device):
                self._close(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        if current:
            self._close(current)
        self._bucket_of = {id(p): i for i, ms in enumerate(self.members) for p in ms}
        self._pending = [len(ms) for ms in self.members]
        self._next_to_report = 0
        self._hooks: list = []
        self._on_ready = None

    def _close(self, members: list[torch.nn.Parameter]) -> None:
        flat = torch.zeros(sum(p.numel() for p in members), dtype=members[0].dtype,
                           device=members[0].device)
        for p, view in zip(members, unflatten(flat, members)):
            p.grad = view
        self.buckets.append(flat)
        self.members.append(members)

    def watch(self, on_ready) -> None:
        """Call ``on_ready(i)`` for bucket ``i`` once its gradients are complete in backward."""
        self._on_ready = on_ready
        for p in self.params:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._accumulated))

    def _accumulated(self, param: torch.nn.Parameter) -> None:
        index = self._bucket_of[id(param)]
        self._pending[index] -= 1
        self._report_ready()

    def _report_ready(self) -> None:
        while self._next_to_report < len(self.buckets) and self._pending[self._next_to_report] <= 0:
            index = self._next_to_report
            self._next_to_report += 1
            if self._on_ready is not None:
                self._on_ready(index)

    def flush(self) -> None:
        """End of backward: report buckets whose parameters got no gradient (unused layers)."""
        for i in range(len(self._pending)):
            self._pending[i] = 0
        self._report_ready()

    def rearm(self) -> None:
        """Reset readiness before the next backward (the trainer zeroes gradients in place)."""
        for flat, members in zip(self.buckets, self.members):
            storage = flat.untyped_storage().data_ptr()
            for p in members:
                # zero_grad(set_to_none=True) or a replaced .grad would silently detach the
                # parameter from its bucket, and its gradient would never be communicated.
                if p.grad is None or p.grad.untyped_storage().data_ptr() != storage:
                    raise RuntimeError(
                        f"gradient of a {tuple(p.shape)} parameter is no longer a bucket view; "
                        "use zero_grad(set_to_none=False)")
        self._pending = [len(ms) for ms in self.members]
        self._next_to_report = 0

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def broadcast_model(model: torch.nn.Module, buffers: list[torch.Tensor], comm) -> None:
    """Every rank takes the root's weights (the flat ``buffers``) and floating buffers
    (``comm``: a runner.comm Communicator)."""
    for flat in buffers:
        comm.broadcast_(flat, root=0)
    for buf in model.buffers():
        if buf.is_floating_point() and buf.is_contiguous():
            comm.broadcast_(buf, root=0)


def parameter_digest(buffers: list[torch.Tensor]) -> str:
    """SHA-256 of the exact bytes of a model's flat parameter buffers."""
    digest = hashlib.sha256()
    for flat in buffers:
        digest.update(flat.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with ``fn`` applied to every tensor in it (in dicts, lists and tuples, which
    are rebuilt; anything else is kept as it is)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


def detached_copy(value: Any) -> Any:
    """``value`` with every tensor in it copied: a state that training may go on changing
    once it is taken (a checkpoint written in the background)."""
    return map_tensors(value, lambda t: t.detach().clone())
