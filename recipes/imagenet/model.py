"""torchvision's ResNets, randomly initialised (nothing is downloaded)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

# torchvision.models.resnet's builders; listed here so that validating a command line does
# not import torchvision.models (tests/test_imagenet_recipe.py checks the list).
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
           "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2")


def build_resnet(arch: str, num_classes: int, zero_init_residual: bool) -> nn.Module:
    """``arch`` with ``num_classes`` outputs. ``zero_init_residual`` starts the scale of the
    last BatchNorm of every residual block at 0, so each block begins as the identity, which
    keeps the first large-batch steps stable (GOYAL; the SGP reference code does the same)."""
    import torchvision.models

    if arch not in RESNETS:
        raise ValueError(f"unknown ResNet {arch!r}")
    builder = getattr(torchvision.models, arch)
    return builder(weights=None, num_classes=num_classes, zero_init_residual=zero_init_residual)
