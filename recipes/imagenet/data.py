"""ImageNet in torchvision's ImageFolder layout: file lists, transforms, decoding, batches.

Loader workers decode JPEGs with Pillow and apply the standard augmentation (random-resized
crop and horizontal flip for training; resize and center crop for evaluation), and return
**uint8** images: a quarter of the bytes of float32 to collate, pin and copy to the GPU. The
recipe converts and normalises them on the device (recipe.py).

A file that cannot be decoded does not raise inside a worker (where the error would come back
as a traceback wall without the file's name): it comes back as a :class:`BadImage` in the
batch, and the main process decides: one-line error naming the file, or count and skip
(``recipe.data.skip_bad``). Counting in the main process is also what makes the count right:
a counter inside a worker process is invisible to the trainer.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from PIL import Image

from runner.lazy import torch

# torchvision's ImageFolder suffixes (checked lower-case).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# The usual ImageNet channel statistics, in the 0..255 units of the uint8 images.
MEAN_255 = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD_255 = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# What Pillow raises for unreadable, truncated or absurdly large files.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


class BadImage(NamedTuple):
    path: str
    reason: str


class CropBox(NamedTuple):
    top: int
    left: int
    height: int
    width: int


class EncodedImage(NamedTuple):
    """A JPEG file's bytes and the augmentation drawn for it, decoded later on the GPU."""
    path: str
    data: torch.Tensor  # uint8, the whole file
    box: CropBox
    flip: bool


class EncodedImages(NamedTuple):
    """A batch's encoded files, concatenated (one buffer to pin), with their crop boxes."""
    paths: list[str]
    data: torch.Tensor  # uint8, every file one after the other
    sizes: list[int]
    boxes: list[CropBox]
    flips: list[bool]


class ImageBatch(NamedTuple):
    images: torch.Tensor  # uint8, N x 3 x H x W (decoded by the loader workers)
    labels: torch.Tensor  # int64: the N decoded images' labels, then the encoded files'
    bad: tuple[BadImage, ...]  # files of this batch that could not be decoded (left out)
    encoded: EncodedImages | None = None  # recipe.loader=gpu: files to decode on the device


def pack_encoded(items: list[EncodedImage]) -> EncodedImages:
    return EncodedImages([item.path for item in items], torch.cat([item.data for item in items]),
                         [len(item.data) for item in items], [item.box for item in items],
                         [item.flip for item in items])


def class_folders(split_dir: Path) -> list[str]:
    """The sub-folder names of ``split_dir``, sorted: class index i is the i-th (WNIDs sort
    in the same order as ImageNet's usual class indices)."""
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


def list_images(split_dir: Path, classes: list[str]) -> list[tuple[str, int]]:
    """(path, class index) of every image under ``split_dir/<class>/`` (sub-folders
    included), in a fixed order, so that every rank indexes the same list."""
    samples = []
    for index, name in enumerate(classes):
        folder = split_dir / name
        if not folder.is_dir():
            continue
        for root, dirs, files in os.walk(folder, followlinks=True):
            dirs.sort()
            samples.extend((os.path.join(root, f), index) for f in sorted(files)
                           if f.lower().endswith(IMAGE_SUFFIXES))
    return samples


# torchvision is imported where the transforms are built, not when the command line is checked
# (importing it costs seconds).
def train_transform(image_size: int, min_crop_scale: float) -> Callable[[Any], torch.Tensor]:
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(image_size, scale=(min_crop_scale, 1.0),
                                            antialias=True),
                       v2.RandomHorizontalFlip(), v2.PILToTensor()])


def eval_transform(image_size: int, resize: int) -> Callable[[Any], torch.Tensor]:
    from torchvision.transforms import v2

    return v2.Compose([v2.Resize(resize, antialias=True), v2.CenterCrop(image_size),
                       v2.PILToTensor()])


def decode_rgb(path: str) -> Image.Image:
    """The whole file through Pillow, as RGB (CMYK and grey converted)."""
    with Image.open(path) as image:
        return image.convert("RGB")


class PillowImage:
    """``recipe.loader=pil`` (and every loader's evaluation): Pillow decodes the whole file,
    torchvision's transform crops and resizes it."""

    def __init__(self, transform: Callable[[Any], torch.Tensor]):
        self.transform = transform

    def __call__(self, path: str) -> torch.Tensor:
        return torch.as_tensor(self.transform(decode_rgb(path)))


class ImageFiles:
    """Decoded, transformed images as uint8 CHW tensors (or, for recipe.loader=gpu, the files'
    bytes with their augmentation drawn), or :class:`BadImage`. ``load`` maps a path to what
    the worker returns (recipes/imagenet/loaders.py). A map-style dataset (``__len__`` and
    ``__getitem__`` are all a DataLoader needs), not a subclass of torch's ``Dataset``, so that
    importing the recipe does not import torch."""

    def __init__(self, samples: list[tuple[str, int]],
                 load: Callable[[str], torch.Tensor | EncodedImage]):
        self.samples, self.load = samples, load

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor | EncodedImage, int] | BadImage:
        path, label = self.samples[index]
        try:
            return self.load(path), label
        except DECODE_ERRORS as ex:
            message = str(ex).replace(f"'{path}'", "").replace(path, "").strip(" :")
            return BadImage(path, f"{type(ex).__name__}: {message}")


def collate_images(samples: list[tuple[torch.Tensor | EncodedImage, int] | BadImage],
                   image_size: int) -> ImageBatch:
    """Stack the decoded images, pack the encoded files (decoded on the device later); the
    undecodable ones travel on as ``bad``."""
    good = [s for s in samples if not isinstance(s, BadImage)]
    bad = tuple(s for s in samples if isinstance(s, BadImage))
    decoded = [(image, label) for image, label in good if isinstance(image, torch.Tensor)]
    encoded = [(image, label) for image, label in good if isinstance(image, EncodedImage)]
    if decoded:
        images = torch.stack([image for image, _ in decoded])
    else:
        images = torch.empty((0, 3, image_size, image_size), dtype=torch.uint8)
    labels = torch.tensor([label for _, label in decoded + encoded], dtype=torch.long)
    return ImageBatch(images, labels, bad,
                      pack_encoded([image for image, _ in encoded]) if encoded else None)


@functools.lru_cache(maxsize=8)
def _channel_stats(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std as 1 x 3 x 1 x 1 tensors on ``device``, made once (not a copy per step)."""
    return (torch.tensor(MEAN_255, device=device, dtype=dtype).view(1, 3, 1, 1),
            torch.tensor(STD_255, device=device, dtype=dtype).view(1, 3, 1, 1))


def normalize_on_device(images: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 images (already on their device) -> normalised ``dtype`` images."""
    mean, std = _channel_stats(images.device, dtype)
    return images.to(dtype).sub_(mean).div_(std)
