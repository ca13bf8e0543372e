"""The optimizer's parameter groups, shared by the trainer and by algorithms that step flat
master copies of the model (AD-PSGD, H-ADPSGD).

``optim.no_decay_norm_bias=true`` exempts normalisation weights and every bias from weight
decay (decaying a BatchNorm scale or a bias only shrinks what the next layer undoes, and
large-batch recipes train better without it). The exemption must mean the same thing for
every algorithm, so there is one place that decides which parameter belongs to which group
(:func:`parameter_groups`) and one that carries those groups over to flat buffers laid out
like the model (:func:`flat_param_groups`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..comm.buffers import flat_slices

# Modules whose weights are per-channel scales: BatchNorm, InstanceNorm (both _NormBase),
# GroupNorm, LayerNorm, RMSNorm.
NORM_MODULES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._NormBase, nn.GroupNorm,
                                             nn.LayerNorm, nn.RMSNorm)


def parameter_groups(model: nn.Module, weight_decay: float, no_decay_norm_bias: bool
                     ) -> list[dict[str, Any]]:
    """Groups for ``torch.optim.SGD``: one group with ``weight_decay`` for everything, or,
    with ``no_decay_norm_bias``, a decayed group and a group with weight decay 0 holding the
    parameters of normalisation layers and every parameter named ``bias``."""
    if not no_decay_norm_bias:
        return [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    decay: list[nn.Parameter] = []
    exempt: list[nn.Parameter] = []
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:  # a shared parameter belongs to its first owner's group
                continue
            seen.add(id(param))
            (exempt if isinstance(module, NORM_MODULES) or name == "bias" else decay).append(
                param)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": exempt, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def flat_param_groups(param_groups: list[dict[str, Any]], params: list[nn.Parameter],
                      masters: list[torch.Tensor], gradients: list[torch.Tensor]
                      ) -> list[dict[str, Any]]:
    """``param_groups`` (an optimizer's, over ``params``) re-expressed over flat buffers.

    ``masters`` and ``gradients`` are laid out like ``flatten_parameters(params)``. Each
    group's parameters become Parameters that are views of ``masters`` (with ``.grad`` views
    of ``gradients``), with every hyperparameter of the group kept, so an optimizer built on
    the result updates ``masters`` exactly as the original optimizer would update ``params``.
    Neighbouring parameters of one group share a view: with a single group, each view is a
    whole buffer.
    """
    where = dict(zip(map(id, params), flat_slices(params)))
    groups = []
    for group in param_groups:
        runs: list[list[int]] = []  # [buffer, start, stop], merged when contiguous
        for index, start, stop in sorted(where[id(p)] for p in group["params"]):
            if runs and runs[-1][0] == index and runs[-1][2] == start:
                runs[-1][2] = stop
            else:
                runs.append([index, start, stop])
        views = []
        for index, start, stop in runs:
            view = nn.Parameter(masters[index][start:stop], requires_grad=False)
            view.grad = gradients[index][start:stop]
            views.append(view)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": views})
    return groups


def _unguarded(method: Any) -> Any:
    """The function under torch's no-compile guard (the guard keeps it as ``__wrapped__``)."""
    return getattr(method, "__wrapped__", method)


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` that never imports ``torch._dynamo``: the optimizer of every rank.

    torch guards ``step``, ``zero_grad``, ``add_param_group``, ``state_dict`` and
    ``load_state_dict`` against torch.compile tracing them, and each guard imports
    torch._dynamo on its first call: about 3 s of CPU per rank, a third of a rank's start on
    a 2-core machine, spent before its first step. No rank compiles an optimizer
    (``trainer.compile`` compiles the model's forward and backward only), so these methods
    run unguarded here: the same update, state and hooks (step pre/post hooks, the profiler's
    record_function) as torch's SGD. Step runs under ``torch.no_grad()``, as torch's guard
    does for a non-differentiable optimizer. tests/test_optim.py checks both the equality and
    the import.
    """

    add_param_group = _unguarded(torch.optim.Optimizer.add_param_group)
    zero_grad = _unguarded(torch.optim.Optimizer.zero_grad)
    state_dict = _unguarded(torch.optim.Optimizer.state_dict)
    load_state_dict = _unguarded(torch.optim.Optimizer.load_state_dict)
    _update = _unguarded(torch.optim.SGD.step)

    def step(self, closure: Any = None) -> Any:
        with torch.no_grad():
            return self._update(closure)
