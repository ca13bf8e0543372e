"""Held-out sums and metrics shared by the image-classification recipes (top-1, top-5).

Sums, not means, so that every rank can score a shard and one reduction gives the exact
global numbers (runner/recipe.py).
"""

from __future__ import annotations

from runner.lazy import lazy_import, torch

F = lazy_import("torch.nn.functional")


def topk_hits(logits: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...]) -> torch.Tensor:
    """For each k, how many rows have their label among the k highest logits (a k above the
    number of classes counts every row), as a tensor on the logits' device."""
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices.eq(labels[:, None])
    return torch.stack([top[:, :k].any(dim=1).sum() for k in ks])


def classification_sums(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``loss_sum`` (cross-entropy in at least float32), ``count``, ``top1_correct`` and
    ``top5_correct`` of one batch, read from the device in one transfer."""
    if len(labels) == 0:
        return {"loss_sum": 0.0, "count": 0.0, "top1_correct": 0.0, "top5_correct": 0.0}
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 under autocast
    loss_sum = F.cross_entropy(wide, labels, reduction="sum")
    values = torch.cat([loss_sum[None], topk_hits(logits, labels, (1, 5)).to(loss_sum.dtype)])
    loss, top1, top5 = values.tolist()
    return {"loss_sum": loss, "count": float(len(labels)), "top1_correct": top1,
            "top5_correct": top5}


def classification_metrics(sums: dict[str, float]) -> dict[str, float]:
    """``loss`` (mean), ``top1`` and ``top5`` (percentages) from global sums."""
    n = max(sums["count"], 1.0)
    return {"loss": sums["loss_sum"] / n, "top1": 100.0 * sums["top1_correct"] / n,
            "top5": 100.0 * sums["top5_correct"] / n}
