"""Deterministic distortions of the 8x8 digits: more training samples from the same 1,437.

The scale studies need an epoch of tens of thousands of samples (at 128 learners of 16, one
step reads 2,048), and the 8x8 digits have 1,437 training images. Each extra sample is one
training original under a random affine map (rotation, anisotropic scale, shear, translation)
resampled bilinearly, plus a little pixel noise: the classic way of growing a small digit set
(distortions that keep the label), applied once, with a fixed seed, so that every rank and
every run sees the same training set.

Training copies are made from training originals only, and held-out copies (for a finer,
less saturated held-out metric) from held-out originals only, with another seed: no held-out
digit enters the training set in any form.
"""

from __future__ import annotations

import math

from runner.lazy import lazy_import, torch

F = lazy_import("torch.nn.functional")


# How far a distortion may go. An 8x8 digit has about 6 pixels of ink across, so one pixel of
# shift or ~15 degrees of rotation changes many pixels while a person still reads the digit.
MAX_ROTATION_RAD = math.radians(15.0)
MAX_LOG_SCALE = math.log(1.15)  # each axis scaled by a factor in [1/1.15, 1.15]
MAX_SHEAR = 0.2
MAX_SHIFT_PIXELS = 1.0
PIXEL_NOISE = 0.05  # standard deviation, on images scaled to [0, 1]


def distortions(count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` random 2x3 affine maps (``affine_grid``'s normalised coordinates)."""
    def uniform(bound: float) -> torch.Tensor:
        return (torch.rand(count, generator=generator, dtype=torch.float64) * 2 - 1) * bound

    angle, shear = uniform(MAX_ROTATION_RAD), uniform(MAX_SHEAR)
    scale_x, scale_y = uniform(MAX_LOG_SCALE).exp(), uniform(MAX_LOG_SCALE).exp()
    # affine_grid's coordinates run from -1 to 1 across the 8 pixels: a pixel is 2/8.
    shift_x, shift_y = uniform(MAX_SHIFT_PIXELS * 2 / 8), uniform(MAX_SHIFT_PIXELS * 2 / 8)
    cos, sin = angle.cos(), angle.sin()
    # rotation @ shear @ scale, then the shift
    maps = torch.stack([
        torch.stack([cos * scale_x, (cos * shear - sin) * scale_y, shift_x], dim=1),
        torch.stack([sin * scale_x, (sin * shear + cos) * scale_y, shift_y], dim=1),
    ], dim=1)
    return maps.float()


def distorted_copies(images: torch.Tensor, count: int, seed: int) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """``count`` distorted images made from ``images`` (N x 1 x 8 x 8, values in [0, 1]), and
    which original each came from. Originals are used in turns (a fresh random order each
    round), so each class keeps its share. The same arguments give the same tensors."""
    generator = torch.Generator().manual_seed(seed)
    rounds = -(-count // len(images))
    source = torch.cat([torch.randperm(len(images), generator=generator)
                        for _ in range(rounds)])[:count]
    grid = F.affine_grid(distortions(count, generator), [count, 1, 8, 8], align_corners=False)
    warped = F.grid_sample(images[source], grid, mode="bilinear", padding_mode="zeros",
                           align_corners=False)
    noise = torch.randn(warped.shape, generator=generator) * PIXEL_NOISE
    return (warped + noise).clamp_(0.0, 1.0), source
