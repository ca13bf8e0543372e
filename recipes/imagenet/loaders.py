"""How JPEG files become training crops: ``recipe.loader`` = pil | simplejpeg | gpu | hybrid |
auto.

Every loader gives the same augmentation (torchvision's RandomResizedCrop: a box of ``scale`` =
(min_crop_scale, 1) of the area and aspect ratio in (3/4, 4/3), log-uniform, ten tries, else
the centred crop of the clamped ratio; resized to ``image_size`` with antialiased bilinear
filtering; then a horizontal flip with probability 1/2). They differ in where the work is done:

* ``pil``: Pillow decodes the whole file in a loader worker and torchvision's transforms crop
  and resize it (the reference; what the recipe always did).
* ``simplejpeg``: libjpeg-turbo through simplejpeg, in a loader worker. The crop box is drawn
  from the file's header first, so that the file is decoded at 1/2, 1/4 or 1/8 of its size
  (libjpeg's scaling in the DCT) whenever the box at that scale is still at least
  ``image_size`` on both sides: an output is never made from fewer pixels than it has. The
  downscaling of those factors is then the IDCT's instead of the bilinear filter's (the only
  difference from ``pil``); the crop and resize run on uint8 tensors.
* ``gpu``: the loader workers only read the file and draw the crop box and flip from its header;
  the main process decodes the batch on the GPU (nvJPEG, through ``torchvision.io.decode_jpeg``
  with ``device='cuda'``), and crops, resizes and flips there. Files nvJPEG cannot take (not a
  JPEG, CMYK) are decoded by the worker on the CPU as with ``simplejpeg``/``pil``, and a batch
  whose GPU decode fails is decoded file by file, so an undecodable file is still named.
* ``hybrid``: both at once. Each file goes to the GPU with probability ``recipe.gpu_share``
  and is decoded by a loader worker (simplejpeg, else Pillow) otherwise, so that the CPU
  workers and the GPU's JPEG decoder each take the share they can keep up with. The coin is
  Python's ``random`` (seeded per worker by the DataLoader), not torch's stream, so each file's
  crop and flip are the draws every other loader makes for it.

Evaluation (resize the shorter side, centre crop) decodes on the CPU with the fastest CPU
decoder present, whatever the training loader: held-out numbers do not depend on the choice.
``auto``: ``gpu`` when the run trains on a CUDA device whose torchvision decodes JPEG there,
else ``simplejpeg`` when installed, else ``pil`` (docs/imagenet.md; measured in
docs/RESULTS.md).
"""

from __future__ import annotations

import functools
import io
import math
import os
import random
from typing import Any

import numpy as np
from PIL import Image

from runner.errors import UserError
from runner.lazy import torch

from .data import DECODE_ERRORS, CropBox, EncodedImage, EncodedImages

LOADERS = ("auto", "pil", "simplejpeg", "gpu", "hybrid")
ON_THE_GPU = ("gpu", "hybrid")  # loaders that decode (some) files on the training GPU
RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's aspect-ratio range
CROP_TRIES = 10
SCALE_FACTORS = (8, 4, 2)  # libjpeg's power-of-two IDCT scalings (others are slower there)
# Cores per rank from which loader=auto decodes on the CPU rather than the GPU: ResNet-50 takes
# about 4,500 images/s eager in bf16 on an H200; a simplejpeg worker crops 300-340 per core on
# the slow CI machine, 269-454 on the H200's (docs/RESULTS.md).
CPU_DECODE_CORES = 8


def has_simplejpeg() -> bool:
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def gpu_decodes_jpeg(device_index: int) -> bool:
    """Whether torchvision decodes a JPEG on this CUDA device (built with nvJPEG), tried once."""
    try:
        from torchvision.io import decode_jpeg, encode_jpeg

        probe = encode_jpeg(torch.zeros((3, 16, 16), dtype=torch.uint8))
        decode_jpeg([probe], device=f"cuda:{device_index}")
    except (RuntimeError, ImportError, AssertionError):  # no nvJPEG, no driver, no CUDA build
        return False
    return True


def cores_per_rank(ranks_on_host: int) -> float:
    """The CPU cores this rank's loader workers can count on: the cores this process may run
    on, shared by the ranks of its host."""
    return len(os.sched_getaffinity(0)) / max(1, ranks_on_host)


def resolve_loader(name: str, device: torch.device | None, ranks_on_host: int = 1) -> str:
    """``recipe.loader`` made concrete for a run training on ``device`` with ``ranks_on_host``
    ranks on this machine. ``auto``: simplejpeg workers where a rank has at least
    ``CPU_DECODE_CORES`` cores (on the H200 with 16 cores they kept up with ResNet-50 in the
    one measurement so far, at least 0.79 of the synthetic batch's rate, while decoding on the
    GPU took it to 0.85: docs/RESULTS.md); with fewer, the GPU decodes; on a CPU, simplejpeg
    when installed, else Pillow."""
    cuda = device is not None and device.type == "cuda"
    if name == "auto":
        fast_cpu = "simplejpeg" if has_simplejpeg() else "pil"
        if (cuda and cores_per_rank(ranks_on_host) < CPU_DECODE_CORES
                and gpu_decodes_jpeg(device.index or 0)):
            return "gpu"
        return fast_cpu
    if name == "simplejpeg" and not has_simplejpeg():
        raise UserError("recipe.loader=simplejpeg but simplejpeg is not installed",
                        "pip install simplejpeg, or set recipe.loader=auto")
    if name in ON_THE_GPU:
        if not cuda:
            raise UserError(f"recipe.loader={name} decodes on the training GPU, but this run "
                            f"trains on {device.type if device is not None else 'the CPU'}",
                            "set trainer.device=cuda, or recipe.loader=auto")
        if not gpu_decodes_jpeg(device.index or 0):
            raise UserError(f"recipe.loader={name}: this torchvision cannot decode JPEG on the "
                            "GPU (built without nvJPEG)", "set recipe.loader=auto")
    return name


def crop_box(height: int, width: int, min_scale: float) -> CropBox:
    """RandomResizedCrop's box for an image of this size, from torch's random stream (a loader
    worker's own, seeded by the DataLoader)."""
    area = height * width
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(CROP_TRIES):
        target = area * torch.empty(1).uniform_(min_scale, 1.0).item()
        ratio = math.exp(torch.empty(1).uniform_(*log_ratio).item())
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,)).item())
            left = int(torch.randint(0, width - w + 1, (1,)).item())
            return CropBox(top, left, h, w)
    ratio = width / height  # fallback: the centred crop of the clamped ratio
    if ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif ratio > RATIO[1]:
        h, w = height, round(height * RATIO[1])
    else:
        h, w = height, width
    return CropBox((height - h) // 2, (width - w) // 2, h, w)


def coin_flip() -> bool:
    return bool(torch.rand(1).item() < 0.5)


def resized_crop(image: torch.Tensor, box: CropBox, size: int, flip: bool) -> torch.Tensor:
    """uint8 C x H x W -> the box resized to size x size (antialiased bilinear), flipped."""
    from torchvision.transforms.v2 import functional as TF

    out = TF.resized_crop(image, box.top, box.left, box.height, box.width, [size, size],
                          antialias=True)
    return TF.horizontal_flip(out) if flip else out


class SimpleJpegTrain:
    """Read, draw the augmentation from the header, decode at the smallest scale the crop
    allows (simplejpeg), crop, resize, flip: a uint8 3 x S x S tensor. Files that are not
    baseline/progressive RGB-able JPEGs (PNG, CMYK) go through ``fallback`` (Pillow)."""

    def __init__(self, image_size: int, min_crop_scale: float, fallback: Any):
        self.size, self.min_scale, self.fallback = image_size, min_crop_scale, fallback

    def __call__(self, path: str) -> torch.Tensor:
        import simplejpeg

        with open(path, "rb") as f:
            data = f.read()
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:  # not a JPEG at all: Pillow knows the other formats
            return self.fallback(path)
        if colorspace not in ("RGB", "YCbCr", "Gray"):  # CMYK/YCCK: libjpeg makes no RGB
            return self.fallback(path)
        box = crop_box(height, width, self.min_scale)
        factor = next((f for f in SCALE_FACTORS
                       if min(box.height, box.width) >= f * self.size), 1)
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB",
                                        min_height=-(-height // factor),
                                        min_width=-(-width // factor))
        image = torch.from_numpy(pixels).permute(2, 0, 1)
        scale_y, scale_x = pixels.shape[0] / height, pixels.shape[1] / width
        scaled = CropBox(min(int(box.top * scale_y), pixels.shape[0] - 1),
                         min(int(box.left * scale_x), pixels.shape[1] - 1),
                         max(1, round(box.height * scale_y)), max(1, round(box.width * scale_x)))
        return resized_crop(image, scaled, self.size, coin_flip())


class EncodedTrain:
    """For ``loader=gpu``: the file's bytes plus its crop box and flip, drawn from the header
    (read by Pillow without decoding). Files nvJPEG does not take are finished here instead."""

    def __init__(self, image_size: int, min_crop_scale: float, fallback: Any):
        self.size, self.min_scale, self.fallback = image_size, min_crop_scale, fallback

    def __call__(self, path: str) -> torch.Tensor | EncodedImage:
        with Image.open(path) as image:  # the header only
            jpeg = image.format == "JPEG" and image.mode in ("RGB", "L")
            width, height = image.size
        if not jpeg:
            return self.fallback(path)
        from torchvision.io import read_file

        box = crop_box(height, width, self.min_scale)
        return EncodedImage(path, read_file(path), box, coin_flip())


class HybridTrain:
    """For ``loader=hybrid``: a file for the GPU (``on_gpu``'s bytes and draws) with
    probability ``gpu_share``, else decoded here (``on_cpu``). The coin comes from Python's
    ``random``, so torch's stream, and with it the file's crop and flip, is untouched."""

    def __init__(self, on_cpu: Any, on_gpu: Any, gpu_share: float):
        self.on_cpu, self.on_gpu, self.gpu_share = on_cpu, on_gpu, gpu_share

    def __call__(self, path: str) -> torch.Tensor | EncodedImage:
        return (self.on_gpu if random.random() < self.gpu_share else self.on_cpu)(path)


def decode_on_gpu(encoded: EncodedImages, device: torch.device, size: int
                  ) -> tuple[torch.Tensor, list[tuple[int, str]]]:
    """The batch's files decoded on ``device`` (one nvJPEG call), each cropped, resized and
    flipped there (``resized_crops``): float32 N' x 3 x S x S in 0..255, and (index, reason)
    of each file that nothing could decode (left out of the N' images). A file the GPU refuses
    is decoded by Pillow on the CPU; only if Pillow fails too is it undecodable."""
    from torchvision.io import ImageReadMode, decode_jpeg

    files = list(torch.split(encoded.data, encoded.sizes))
    cuda = device.type == "cuda"
    # torchvision allocates the decoded images on this stream but decodes on a stream of its
    # own that does not wait for this one (nvJPEG's hardware engine ignores stream order in
    # any case): memory freed here while queued kernels still read it, such as the previous
    # batch's crops, can be handed to the decoder and overwritten. Seen as a NaN loss on an
    # H200 after a few hundred batches. Waiting for this stream's work first closes the gap;
    # it stalls only the thread that prepares batches, never the training stream.
    if cuda:
        torch.cuda.current_stream(device).synchronize()
    try:
        images = decode_jpeg(files, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:  # one bad file fails the batch: find it, file by file
        images = [decode_one(data, device) for data in files]
    if cuda:
        # nvJPEG copies the files from their pinned buffer asynchronously; the buffer goes
        # back to the pinned-memory cache (and to the next batch) when this batch is dropped.
        torch.cuda.current_stream(device).synchronize()
    failed = [(index, image) for index, image in enumerate(images) if isinstance(image, str)]
    kept = [index for index, image in enumerate(images) if not isinstance(image, str)]
    out = resized_crops([images[i] for i in kept], [encoded.boxes[i] for i in kept],
                        [encoded.flips[i] for i in kept], size,
                        torch.float16 if cuda else torch.float32)
    return out.to(device), failed  # (on the CPU if no file could be decoded)


# Images up to this many pixels high and wide are resampled together in one zero-padded canvas
# (batch x 3 x this^2 values at most); larger ones, rare in ImageNet, one by one.
CANVAS_SIDE = 1024
ALIGN = 8  # the canvas's sides are padded to a multiple of this: float16 products on tensor cores


def resized_crops(images: list[torch.Tensor], boxes: list[CropBox], flips: list[bool],
                  size: int, dtype: torch.dtype | None = None,
                  canvas_side: int = CANVAS_SIDE) -> torch.Tensor:
    """Each uint8 3 x H x W image's box resized to ``size`` x ``size`` by torch's antialiased
    bilinear filter (``interpolate(..., antialias=True)``'s weights), flipped where asked:
    float32 N x 3 x S x S in 0..255.

    The filter is separable, so each crop's resampling is two matrix products, columns then
    rows, with the filter's weights as matrices (zero outside the box; a flip reverses the
    column matrix's rows). The batch's images are padded into one canvas (a nested tensor's
    padding: no Python per image) and resampled by two batched products in ``dtype``
    (float32 unless given): a few kernels for the batch, where a crop, resize and flip per
    image took more of the training step beside it (docs/RESULTS.md). float16 (the GPU's
    choice) holds every grey level exactly and the weights to 2^-11: its pixels are within a
    quarter of a grey level of float32's."""
    out = torch.empty((len(images), 3, size, size), dtype=torch.float32,
                      device=images[0].device if images else "cpu")
    together = [i for i, image in enumerate(images) if max(image.shape[1:]) <= canvas_side]
    for i in sorted(set(range(len(images))) - set(together)):
        box = boxes[i]
        crop = images[i][:, box.top:box.top + box.height, box.left:box.left + box.width]
        resized = torch.nn.functional.interpolate(crop[None].float(), size=(size, size),
                                                  mode="bilinear", antialias=True)[0]
        out[i] = resized.flip(-1) if flips[i] else resized
    if not together:
        return out
    device, count, dtype = out.device, len(together), dtype or torch.float32
    group = [images[i] for i in together]
    height = -(-max(image.shape[1] for image in group) // ALIGN) * ALIGN
    width = -(-max(image.shape[2] for image in group) // ALIGN) * ALIGN
    canvas = torch.nested.nested_tensor(group).to_padded_tensor(
        0, output_size=(count, 3, height, width)).to(dtype)
    picked = [boxes[i] for i in together]
    rows = filter_matrices([b.top for b in picked], [b.height for b in picked], size, height,
                           device).to(dtype)
    columns = filter_matrices([b.left for b in picked], [b.width for b in picked], size, width,
                              device, flips=[flips[i] for i in together]).to(dtype)
    wide = torch.bmm(canvas.view(count, 3 * height, width), columns.transpose(1, 2))
    resized = torch.matmul(rows[:, None], wide.view(count, 3, height, size))  # N x 3 x S x S
    if count == len(images):
        out.copy_(resized)
    else:
        out[torch.tensor(together, device=device)] = resized.float()
    return out


def filter_matrices(starts: list[int], lengths: list[int], size: int, span: int,
                    device: torch.device, flips: list[bool] | None = None) -> torch.Tensor:
    """float32 N x ``size`` x ``span``: row i of matrix n holds the weights by which output
    pixel i of an antialiased bilinear resize of input pixels starts[n] .. starts[n] +
    lengths[n] - 1 to ``size`` pixels takes input pixels 0..span-1 (zero outside that range).
    As torch's ``antialias=True``: a triangle of half-width max(1, scale) input pixels around
    the output pixel's centre, normalised to sum to 1, where scale = length / size."""
    def column(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)[:, None, None]

    start, length = column(starts), column(lengths)
    scale = length / size
    half_width = scale.clamp(min=1.0)
    centre = scale * (torch.arange(size, device=device, dtype=torch.float32)[:, None] + 0.5)
    position = torch.arange(span, device=device, dtype=torch.float32) - start  # in the box
    weights = (1 - ((position + 0.5 - centre) / half_width).abs()).clamp(min=0)
    weights = weights * ((position >= 0) & (position < length))
    weights = weights / weights.sum(dim=-1, keepdim=True)
    if flips is not None:
        flipped = torch.tensor(flips, dtype=torch.bool, device=device)[:, None, None]
        weights = torch.where(flipped, weights.flip(1), weights)
    return weights


def decode_one(data: torch.Tensor, device: torch.device) -> torch.Tensor | str:
    """One file on the GPU, else by Pillow on the CPU; the reason, if neither can."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        pass
    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
            rgb = image.convert("RGB")
    except DECODE_ERRORS as ex:
        return f"{type(ex).__name__}: {ex}"
    return torch.from_numpy(np.array(rgb)).permute(2, 0, 1).to(device)
