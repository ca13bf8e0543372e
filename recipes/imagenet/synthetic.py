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


# Octaves of the photo-like texture (cycles across the width); the coarse ones carry the most
# contrast, as in natural images (amplitude ~ 1/sqrt(frequency)).
OCTAVES = (4, 8, 16, 32, 64, 125, 250, 500)
PHOTO_NOISE = 14.0  # per-pixel noise (grey levels): brings q90 files near ImageNet's ~110 KB


def photo_image(index: int, classes: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """A photo-sized H x W x 3 uint8 image (``size`` wide, 3/4 as high, like ImageNet's median
    500 x 375) with detail at every scale, so that a JPEG of it costs what a photograph costs
    to decode; tinted by class so that the classes still differ."""
    width, height = size, size * 3 // 4
    pixels = np.zeros((height, width, 3), np.float32)
    for cycles in OCTAVES:
        coarse = rng.normal(0, 1, (max(2, height * cycles // width), cycles, 3))
        smooth = [np.asarray(Image.fromarray(coarse[..., c].astype(np.float32)).resize(
            (width, height), Image.BICUBIC)) for c in range(3)]
        pixels += np.stack(smooth, -1) * 70 * (4 / cycles) ** 0.5
    tint = np.array(colorsys.hsv_to_rgb(index / classes, 0.6, 0.8)) * 255
    pixels += tint + rng.normal(0, PHOTO_NOISE, pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _write_image(job: tuple[Path, int, int, int, int, bool]) -> None:
    path, k, classes, size, seed, photos = job
    rng = np.random.default_rng(seed)
    make = photo_image if photos else class_image
    Image.fromarray(make(k, classes, rng, size)).save(path, quality=90)


def write_fake_imagenet(root: Path, classes: int = 4, train_per_class: int = 40,
                        val_per_class: int = 10, size: int = 48, seed: int = 0,
                        loose_val: bool = False, photos: bool = False,
                        processes: int = 1) -> FakeImageNet:
    """Write ``root/train/<wnid>/*.JPEG`` and the validation images (sorted into
    ``root/val/<wnid>/``, or loose with a devkit in ``root/devkit``). ``photos``: photo-sized
    images of realistic detail (:func:`photo_image`, ``size`` wide) instead of the small
    patterned ones, written by ``processes`` processes."""
    if photos:
        return _write_photos(root, classes, train_per_class, val_per_class, size, seed,
                             loose_val, processes)
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


def _write_photos(root: Path, classes: int, train_per_class: int, val_per_class: int,
                  size: int, seed: int, loose_val: bool, processes: int) -> FakeImageNet:
    """As write_fake_imagenet, with photo-like images, each from its own random stream (so that
    they can be written in parallel and the tree is the same for any ``processes``)."""
    rng = np.random.default_rng(seed)
    wnids = [f"n{(k + 1) * 1_000_003:08d}" for k in range(classes)]
    ids = {wnid: int(i) + 1 for wnid, i in zip(wnids, rng.permutation(classes))}
    order = rng.permutation(np.repeat(np.arange(classes), val_per_class))
    jobs = []
    for k, wnid in enumerate(wnids):
        (root / "train" / wnid).mkdir(parents=True, exist_ok=True)
        jobs += [(root / "train" / wnid / f"{wnid}_{j}.JPEG", k) for j in range(train_per_class)]
    for number, k in enumerate(order, 1):
        folder = root / "val" if loose_val else root / "val" / wnids[k]
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((folder / IMAGE_NAME.format(number), int(k)))
    work = [(path, k, classes, size, seed * 1_000_003 + n, True)
            for n, (path, k) in enumerate(jobs)]
    if processes > 1:
        from multiprocessing import get_context

        with get_context("fork").Pool(processes) as pool:
            pool.map(_write_image, work, chunksize=16)
    else:
        for job in work:
            _write_image(job)
    val_labels = [ids[wnids[k]] for k in order]
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
