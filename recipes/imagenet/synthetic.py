"""A tiny ImageNet-shaped tree of generated JPEGs, to try recipe=imagenet and the tools
without the real data (and what the tests train on).

Each class has its own colour and pattern, jittered per image, so a ResNet separates them
within a few epochs. With ``loose_val`` the validation images are written the way the official
tarball unpacks (``val/ILSVRC2012_val_00000001.JPEG`` ...) next to a devkit (ground truth and
``meta.mat``), for ``adpsgd-imagenet sort-val`` to sort. Class IDs are deliberately not in
WNID order, as in the real devkit.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from .sort_val import GROUND_TRUTH, IMAGE_NAME, META

PATTERNS = ("solid", "stripes", "checks")


@dataclass
class FakeImageNet:
    root: Path
    wnids: list[str]
    ids: dict[str, int]  # WNID -> ILSVRC2012_ID
    val_labels: list[int]  # ILSVRC2012_ID of each loose validation image, in image order


def class_image(index: int, classes: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """One H x W x 3 uint8 image of class ``index``: hue by class, pattern by class, with
    random brightness, pattern phase, noise and size (+-25%)."""
    height, width = (int(size * rng.uniform(0.75, 1.25)) for _ in range(2))
    hue = index / classes
    colour = np.array(colorsys.hsv_to_rgb(hue, 0.9, rng.uniform(0.6, 1.0)))
    y, x = np.mgrid[:height, :width]
    period = max(4, size // 6)
    shift = rng.integers(period)
    pattern = PATTERNS[index % len(PATTERNS)]
    if pattern == "stripes":
        shade = ((y + shift) // period) % 2
    elif pattern == "checks":
        shade = ((x + shift) // period + (y + shift) // period) % 2
    else:
        shade = np.zeros((height, width))
    pixels = colour[None, None, :] * (1.0 - 0.5 * shade[..., None])
    pixels += rng.normal(0, 0.04, pixels.shape)
    return (np.clip(pixels, 0, 1) * 255).astype(np.uint8)


def write_fake_imagenet(root: Path, classes: int = 4, train_per_class: int = 40,
                        val_per_class: int = 10, size: int = 48, seed: int = 0,
                        loose_val: bool = False) -> FakeImageNet:
    """Write ``root/train/<wnid>/*.JPEG`` and the validation images (sorted into
    ``root/val/<wnid>/``, or loose with a devkit in ``root/devkit``)."""
    rng = np.random.default_rng(seed)
    wnids = [f"n{(k + 1) * 1_000_003:08d}" for k in range(classes)]  # like n01440764
    ids = {wnid: int(i) + 1 for wnid, i in zip(wnids, rng.permutation(classes))}
    for k, wnid in enumerate(wnids):
        folder = root / "train" / wnid
        folder.mkdir(parents=True, exist_ok=True)
        for j in range(train_per_class):
            Image.fromarray(class_image(k, classes, rng, size)).save(
                folder / f"{wnid}_{j}.JPEG", quality=90)
    order = rng.permutation(np.repeat(np.arange(classes), val_per_class))
    val_labels = [ids[wnids[k]] for k in order]
    for number, k in enumerate(order, 1):
        name = IMAGE_NAME.format(number)
        folder = root / "val" if loose_val else root / "val" / wnids[k]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(class_image(int(k), classes, rng, size)).save(folder / name, quality=90)
    if loose_val:
        write_devkit(root / "devkit", ids, val_labels)
    return FakeImageNet(root, wnids, ids, val_labels)


def write_devkit(devkit: Path, ids: dict[str, int], val_labels: list[int]) -> None:
    """The two devkit files sort-val reads: the ground truth and meta.mat (scipy)."""
    from scipy.io import savemat

    (devkit / GROUND_TRUTH).parent.mkdir(parents=True, exist_ok=True)
    (devkit / GROUND_TRUTH).write_text("".join(f"{i}\n" for i in val_labels))
    synsets = np.array([(i, wnid) for wnid, i in ids.items()],
                       dtype=[("ILSVRC2012_ID", object), ("WNID", object)])
    savemat(str(devkit / META), {"synsets": synsets})
