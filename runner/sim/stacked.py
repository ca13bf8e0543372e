"""N learners' models as stacked tensors: one flat ``[N, P]`` parameter matrix, gradients of
many learners in one vectorized call, and SGD applied to chosen rows.

Row ``i`` of :attr:`StackedLearners.x` is learner ``i``'s model, laid out like the one flat
parameter buffer of a real rank (runner/comm/buffers.py). Gradients come from
``torch.func.vmap`` over ``torch.func.grad_and_value`` of the recipe's own loss
(``functional_call`` on one module), so N learners cost about one model at N times the batch
rather than N Python loops of small kernels. Learners whose batches differ in size (the short
last batch of an epoch) are evaluated in separate calls, one per size, so every learner's
gradient is its own batch mean exactly as on a real rank. A model that ``vmap`` cannot batch
(an operator without a batching rule) falls back to one call per learner, with a log line.

:class:`StackedSGD` applies ``torch.optim.SGD``'s update (momentum, Nesterov, weight decay per
parameter group) row by row, with a learning rate per row: asynchronous learners read the
schedule at different points.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from ..algos.optim import parameter_groups

log = logging.getLogger("adpsgd")


class _LossOf(nn.Module):
    """The recipe's loss as a module, so that ``functional_call`` can swap in a learner's
    parameters (names gain the prefix ``model.``)."""

    def __init__(self, loss: Callable[[nn.Module, Any], torch.Tensor], model: nn.Module):
        super().__init__()
        self.loss, self.model = loss, model

    def forward(self, batch: Any) -> torch.Tensor:
        return self.loss(self.model, batch)


class StackedLearners:
    """``n`` copies of ``model`` (all starting from its current weights)."""

    def __init__(self, model: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor], n: int,
                 chunk: int = 256):
        params = list(model.named_parameters())
        dtypes = {p.dtype for _, p in params}
        if len(dtypes) != 1:
            raise ValueError("the simulator needs one parameter dtype, got "
                             f"{sorted(map(str, dtypes))}")
        self.n, self.model, self.chunk = n, model, max(1, chunk)
        self.names = [name for name, _ in params]
        self.shapes = [p.shape for _, p in params]
        sizes = [p.numel() for _, p in params]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.size = self.offsets[-1]  # P
        first = torch.cat([p.detach().reshape(-1) for _, p in params])
        self.x = first.unsqueeze(0).repeat(n, 1)  # [N, P]
        self.buffers = {name: b.detach().unsqueeze(0).repeat(n, *[1] * b.dim())
                        for name, b in model.named_buffers()}
        self._module = _LossOf(loss, model)
        self._vmap_ok = True

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of one learner's model (what an exchange sends)."""
        return self.size * self.x.element_size()

    def views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter tensors ``[len(rows), *shape]`` of the given rows of ``rows``."""
        return {f"model.{name}": rows[:, a:b].reshape(rows.shape[0], *shape)
                for name, shape, a, b in zip(self.names, self.shapes, self.offsets,
                                             self.offsets[1:])}

    def flat(self, grads: dict[str, torch.Tensor], count: int) -> torch.Tensor:
        return torch.cat([grads[f"model.{name}"].reshape(count, -1) for name in self.names], 1)

    def load_row(self, model: nn.Module, row: torch.Tensor) -> None:
        """Copy one row (or a mean row) into an ordinary module with the same layout."""
        with torch.no_grad():
            for p, a, b in zip(model.parameters(), self.offsets, self.offsets[1:]):
                p.copy_(row[a:b].view_as(p))

    def gradients(self, models: torch.Tensor, learners: Sequence[int],
                  batches: Sequence[Any], counts: Sequence[int]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(gradients ``[k, P]``, losses ``[k]``) of ``k`` learners at ``models`` (``[k, P]``),
        learner ``learners[j]`` on ``batches[j]`` with ``counts[j]`` samples (0: no batch,
        gradient 0, loss NaN). Learners of equal count share vectorized calls."""
        k = len(learners)
        losses = torch.full((k,), float("nan"), dtype=torch.float64)
        by_count = _by_count(counts)
        if k <= self.chunk and len(by_count) == 1 and len(next(iter(by_count.values()))) == k:
            g, loss = self._group(models, list(learners), list(batches))  # the common case
            return g, loss.detach().double()
        grads = torch.zeros(k, self.size, dtype=self.dtype)
        for members in by_count.values():
            for start in range(0, len(members), self.chunk):
                part = members[start:start + self.chunk]
                index = torch.tensor(part)
                g, loss = self._group(models[index], [learners[j] for j in part],
                                      [batches[j] for j in part])
                grads[index] = g
                losses[index] = loss.detach().double()
        return grads, losses

    def weighted_gradient(self, model: torch.Tensor, learners: Sequence[int],
                          batches: Sequence[Any], counts: Sequence[int], weights: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """(``sum_j weights[j] g_j`` ``[P]``, losses ``[k]``) when every learner computes at the
        same ``model`` (``[P]``): SSGD's replicas. By linearity this is the gradient of the
        weighted sum of the learners' own losses (each its batch's mean, its own dropout and
        batch statistics, as under :meth:`gradients`), taken in one backward pass with the
        weights shared, so N learners cost one model at N times the batch instead of N models'
        memory traffic. Falls back to :meth:`gradients` where vmap cannot batch the model."""
        k = len(learners)
        losses = torch.full((k,), float("nan"), dtype=torch.float64)
        total = torch.zeros(self.size, dtype=self.dtype)
        by_count = _by_count(counts)
        for members in by_count.values():
            for start in range(0, len(members), self.chunk):
                part = members[start:start + self.chunk]
                index = torch.tensor(part)
                batch = [batches[j] for j in part]
                shared = self._shared(model, [learners[j] for j in part], batch,
                                      weights[index]) if self._vmap_ok else None
                if shared is None:  # one gradient per learner, then their weighted sum
                    g, loss = self._group(model.expand(len(part), -1),
                                          [learners[j] for j in part], batch)
                    shared = (weights[index].to(g.dtype) @ g, loss)
                total += shared[0]
                losses[index] = shared[1].detach().double()
        return total, losses

    def _shared(self, model: torch.Tensor, learners: list[int], batches: list[Any],
                weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        try:
            stacked = _stack(batches)
        except RuntimeError:  # padded sequences of different lengths
            return None
        buffers = self._rows_of_buffers(learners)
        params = {name: t[0] for name, t in self.views(model.unsqueeze(0)).items()}

        def weighted_loss(params, bufs, batch, w):
            def one(bufs_j, batch_j):
                return functional_call(self._module, (params, bufs_j), (batch_j,))

            values = vmap(one, randomness="different")(bufs, batch)
            return (values * w).sum(), values

        try:
            g, values = torch.func.grad(weighted_loss, has_aux=True)(
                params, buffers, stacked, weights.to(self.dtype))
        except (RuntimeError, NotImplementedError) as ex:
            self._vmap_failed(ex)
            return None
        self._store_buffers(learners, buffers)
        return torch.cat([g[f"model.{name}"].reshape(-1) for name in self.names]), values

    def _group(self, models: torch.Tensor, learners: list[int], batches: list[Any]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        k = len(learners)
        buffers = self._rows_of_buffers(learners)
        try:  # learners' batches of padded sequences differ in length: one call each
            stacked = _stack(batches)
        except RuntimeError:
            stacked = None

        def loss(params, bufs, batch):
            return functional_call(self._module, (params, bufs), (batch,))

        if self._vmap_ok and stacked is not None:
            try:
                g, value = vmap(grad_and_value(loss), randomness="different")(
                    self.views(models), buffers, stacked)
                self._store_buffers(learners, buffers)
                return self.flat(g, k), value
            except (RuntimeError, NotImplementedError) as ex:
                self._vmap_failed(ex)
        return self._one_by_one(models, learners, batches, buffers)

    def _rows_of_buffers(self, learners: list[int]) -> dict[str, torch.Tensor]:
        """The learners' buffers (BatchNorm statistics), named as functional_call wants them."""
        index = torch.tensor(learners)
        return {f"model.{name}": b[index] for name, b in self.buffers.items()}

    def _vmap_failed(self, ex: Exception) -> None:
        self._vmap_ok = False
        log.info("simulator: vmap cannot batch this model (%s); one call per learner",
                 str(ex).splitlines()[0][:160])

    def _one_by_one(self, models: torch.Tensor, learners: list[int], batches: list[Any],
                    buffers: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain autograd, one learner at a time, on the module itself (any model: also one
        torch.func cannot transform, such as cuDNN/packed LSTMs)."""
        model, grads, values = self.model, [], []
        params = list(model.parameters())
        named_buffers = dict(model.named_buffers())
        for j in range(len(learners)):
            self.load_row(model, models[j])
            with torch.no_grad():
                for name, b in named_buffers.items():
                    b.copy_(buffers[f"model.{name}"][j])
            for p in params:
                p.grad = None
            value = self._module(batches[j])
            value.backward()
            grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                                    .reshape(-1) for p in params]))
            values.append(value.detach())
            for name, b in named_buffers.items():
                buffers[f"model.{name}"][j] = b
        self._store_buffers(learners, buffers)
        return torch.stack(grads), torch.stack(values)

    def _store_buffers(self, learners: list[int], buffers: dict[str, torch.Tensor]) -> None:
        """Running statistics updated in the forward pass (BatchNorm) go back to their rows."""
        index = torch.tensor(learners)
        for name, stacked in self.buffers.items():
            stacked[index] = buffers[f"model.{name}"]


def _by_count(counts: Sequence[int]) -> dict[int, list[int]]:
    """Positions of the learners with a batch, grouped by its size (equal sizes stack)."""
    groups: dict[int, list[int]] = {}
    for j, c in enumerate(counts):
        if c > 0:
            groups.setdefault(int(c), []).append(j)
    return groups


def _stack(batches: list[Any]) -> Any:
    """Learners' batches (same structure, same sizes) stacked along a new leading dim."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(batches)
    if isinstance(first, (tuple, list)):
        return type(first)(_stack([b[i] for b in batches]) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: _stack([b[key] for b in batches]) for key in first}
    raise TypeError(f"cannot stack batches of type {type(first).__name__}")


class StackedSGD:
    """``torch.optim.SGD`` on rows of a ``[N, P]`` matrix (dampening 0), one learning rate per
    row. Weight decay follows the trainer's parameter groups (``optim.no_decay_norm_bias``),
    as a per-column vector; ``decay_at`` takes it at another point (AD-PSGD: the read the
    gradient was computed at)."""

    def __init__(self, learners: StackedLearners, model: nn.Module, momentum: float,
                 nesterov: bool, weight_decay: float, no_decay_norm_bias: bool):
        self.momentum, self.nesterov = momentum, nesterov
        decay = torch.zeros(learners.size, dtype=learners.dtype)
        where = {id(p): (a, b) for p, a, b in zip(model.parameters(), learners.offsets,
                                                  learners.offsets[1:])}
        for group in parameter_groups(model, weight_decay, no_decay_norm_bias):
            for p in group["params"]:
                a, b = where[id(p)]
                decay[a:b] = group["weight_decay"]
        self.decay = decay if bool(decay.any()) else None
        self.buf = torch.zeros_like(learners.x) if momentum else None

    def step(self, x: torch.Tensor, rows: torch.Tensor | None, grads: torch.Tensor,
             lr: torch.Tensor, decay_at: torch.Tensor | None = None) -> None:
        """Update ``x[rows]`` (all rows when None) with ``grads`` (one row per updated row) at
        learning rates ``lr`` (one per updated row)."""
        d = grads  # consumed: updated in place (the caller's gradients are scratch)
        if self.decay is not None:
            at = decay_at if decay_at is not None else (x if rows is None else x[rows])
            d.addcmul_(self.decay, at)
        if self.buf is not None:
            if rows is None:
                self.buf.mul_(self.momentum).add_(d)
                buf = self.buf
            else:
                buf = self.buf.index_select(0, rows).mul_(self.momentum).add_(d)
                self.buf.index_copy_(0, rows, buf)
            d = d.add_(buf, alpha=self.momentum) if self.nesterov else buf
        rates = lr.to(x.dtype)
        # Rows are updated in place (index_add_), not gathered and scattered back: at many
        # learners each pass over [k, P] is what a step costs.
        if bool((rates == rates[0]).all()):  # one rate (lockstep): a scalar, no [k, P] product
            if rows is None:
                x.add_(d, alpha=-float(rates[0]))
            else:
                x.index_add_(0, rows, d, alpha=-float(rates[0]))
        elif rows is None:
            x.sub_(rates.unsqueeze(1) * d)
        else:
            x.index_add_(0, rows, rates.unsqueeze(1) * d, alpha=-1.0)

    def copy_row(self, x: torch.Tensor, source: int) -> None:
        """Every row of ``x`` and of the momentum becomes row ``source``'s (identical
        replicas updated once)."""
        for matrix in (x, self.buf):
            if matrix is not None:
                matrix.copy_(matrix[source].expand_as(matrix))

    def state_dict(self) -> dict[str, Any]:
        return {"momentum_buffer": self.buf}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.buf is not None and state.get("momentum_buffer") is not None:
            self.buf.copy_(state["momentum_buffer"])
