"""recipe=imagenet: a torchvision ResNet on an ImageFolder tree, top-1 and top-5.

``recipe.data.root`` holds ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG`` (``adpsgd-imagenet
sort-val`` puts the official validation images in that layout). Class i is the i-th training
folder in sorted order; validation folders must be a subset. The optimisation schedule
(GOYAL: lr 0.1 per 256 images scaled linearly, 5 warmup epochs, x0.1 at 30/60/80 of 90) is
set in conf/recipe/imagenet.yaml through the runner's optim section; docs/imagenet.md covers
data layout, presets and the data path.
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from runner.config.section import require
from runner.errors import UserError
from runner.lazy import lazy_import, torch
from runner.recipe import RECIPES, Recipe, RecipeConfig

from ..classification import classification_metrics, classification_sums
from .data import (
    IMAGE_SUFFIXES,
    BadImage,
    ImageBatch,
    ImageFiles,
    PillowImage,
    class_folders,
    collate_images,
    eval_transform,
    list_images,
    normalize_on_device,
    train_transform,
)
from .loaders import (
    LOADERS,
    ON_THE_GPU,
    EncodedTrain,
    HybridTrain,
    SimpleJpegTrain,
    decode_on_gpu,
    has_simplejpeg,
    resolve_loader,
)
from .model import RESNETS, build_resnet

F = lazy_import("torch.nn.functional")

log = logging.getLogger("adpsgd")
SORT_FIX = "adpsgd-imagenet sort-val {val} --devkit DEVKIT_DIR (docs/imagenet.md)"
SKIPPED_LISTED = 100  # summary.json names at most this many skipped files


@dataclass
class ImageNetDataConfig:
    root: Optional[str] = None  # holds <train>/<wnid>/*.JPEG and <val>/<wnid>/*.JPEG
    train: str = "train"
    val: str = "val"
    skip_bad: bool = False  # count and skip undecodable images instead of stopping


@dataclass
class ResNetConfig:
    arch: str = "resnet50"  # any torchvision ResNet: resnet18 ... wide_resnet101_2
    zero_init_residual: bool = True  # last BatchNorm scale of each residual block starts at 0


@dataclass
class ImageNetConfig(RecipeConfig):
    name: str = "imagenet"
    data: ImageNetDataConfig = field(default_factory=ImageNetDataConfig)
    model: ResNetConfig = field(default_factory=ResNetConfig)
    image_size: int = 224  # training crop; evaluation center-crops the same size
    eval_resize: Optional[int] = None  # shorter side before the center crop; None: size/0.875
    min_crop_scale: float = 0.08  # smallest crop area (fraction) of the random-resized crop
    label_smoothing: float = 0.0
    # Who decodes the training JPEGs: pil | simplejpeg | gpu | hybrid | auto
    # (recipes/imagenet/loaders.py)
    loader: str = "auto"
    # loader=hybrid: the share of the training files decoded on the GPU, the rest by the loader
    # workers. 0.3: on the H200 (16 cores) the workers crop about 4,300 images/s beside the
    # training, and the compiled step wants 6,400 (docs/RESULTS.md).
    gpu_share: float = 0.3

    def check(self, prefix, cfg):
        close = difflib.get_close_matches(str(self.loader), LOADERS, n=1)
        require(self.loader in LOADERS, f"{prefix}.loader",
                f"unknown loader {self.loader!r} (one of {', '.join(LOADERS)})",
                f"did you mean {prefix}.loader={close[0]}?" if close
                else f"{prefix}.loader=auto")
        require(not (self.loader in ON_THE_GPU and cfg.trainer.device == "cpu"),
                f"{prefix}.loader",
                f"loader={self.loader} decodes on the training GPU, but trainer.device=cpu",
                f"{prefix}.loader=auto")
        require(0 < self.gpu_share < 1, f"{prefix}.gpu_share",
                f"must be between 0 and 1, got {self.gpu_share} (0: {prefix}.loader=simplejpeg, "
                f"1: {prefix}.loader=gpu)", f"{prefix}.gpu_share=0.3")
        require(self.model.arch in RESNETS, f"{prefix}.model.arch",
                f"unknown ResNet {self.model.arch!r} (torchvision has {', '.join(RESNETS)})",
                f"{prefix}.model.arch=resnet50")
        require(self.image_size >= 16, f"{prefix}.image_size",
                f"must be >= 16, got {self.image_size}", f"{prefix}.image_size=224")
        require(self.eval_resize is None or self.eval_resize >= self.image_size,
                f"{prefix}.eval_resize", f"must be >= {prefix}.image_size={self.image_size}",
                f"{prefix}.eval_resize=null")
        require(0 < self.min_crop_scale <= 1, f"{prefix}.min_crop_scale",
                f"must be in (0, 1], got {self.min_crop_scale}", f"{prefix}.min_crop_scale=0.08")
        require(0 <= self.label_smoothing < 1, f"{prefix}.label_smoothing",
                f"must be in [0, 1), got {self.label_smoothing}", f"{prefix}.label_smoothing=0.1")


@RECIPES.register("imagenet")
class ImageNet(Recipe):
    Config = ImageNetConfig
    primary_metric = "top1"
    higher_is_better = True
    # ResNet-50, batch 256, bf16 on an H100: 81 s to compile, then 48.1 instead of 66.7 ms per
    # step (docs/RESULTS.md): 81 / 0.0186 = 4,355 steps.
    compile_pays_after_steps = 4_400

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.skipped: set[str] = set()  # undecodable files met by this rank (main process)
        self.num_classes = 0
        self.loader = ""  # recipe.loader made concrete by datasets()

    # ---- data ---------------------------------------------------------------------------
    def split_dirs(self) -> tuple[Path, Path]:
        data = self.cfg.data
        if not data.root:
            raise UserError("recipe imagenet needs recipe.data.root",
                            "add recipe.data.root=DIR, a folder holding train/<wnid>/*.JPEG "
                            "and val/<wnid>/*.JPEG (docs/imagenet.md)")
        root = Path(data.root).expanduser()
        if not root.is_dir():
            raise UserError(f"ImageNet data dir {root} does not exist",
                            "point recipe.data.root at the folder holding train/ and val/")
        dirs = root / data.train, root / data.val
        for key, path in zip(("train", "val"), dirs):
            if not path.is_dir():
                raise UserError(f"ImageNet data dir {root} has no {path.name}/ folder",
                                f"put the images in {path}/<wnid>/, or set "
                                f"recipe.data.{key}=NAME")
        return dirs

    def check_data(self) -> None:
        """Folder-level checks only (listing 1.28M files belongs to the ranks)."""
        train_dir, val_dir = self.split_dirs()
        train_classes = class_folders(train_dir)
        if not train_classes:
            raise UserError(f"{train_dir} has no class folders",
                            f"put the training images in {train_dir}/<wnid>/*.JPEG")
        val_classes = class_folders(val_dir)
        loose = sum(1 for entry in os.scandir(val_dir)
                    if entry.is_file() and entry.name.lower().endswith(IMAGE_SUFFIXES))
        if loose:  # unsorted, or a sort that was interrupted: they would be left out
            where = "next to its class folders" if val_classes else "but no class folders"
            raise UserError(f"{val_dir} holds {loose} images {where}",
                            "sort them by class with " + SORT_FIX.format(val=val_dir))
        if not val_classes:
            raise UserError(f"{val_dir} has no class folders",
                            f"put the validation images in {val_dir}/<wnid>/*.JPEG")
        unknown = sorted(set(val_classes) - set(train_classes))
        if unknown:
            raise UserError(f"{len(unknown)} class folder(s) of {val_dir} are not in "
                            f"{train_dir} (e.g. {unknown[0]})",
                            "use the same WNID folder names for train and val")

    def datasets(self):
        self.check_data()
        train_dir, val_dir = self.split_dirs()
        classes = class_folders(train_dir)
        self.num_classes = len(classes)
        c = self.cfg
        resize = c.eval_resize or round(c.image_size / 0.875)
        self.loader = resolve_loader(c.loader, self.device, self.ranks_on_host)
        pillow = PillowImage(train_transform(c.image_size, c.min_crop_scale))
        on_cpu = (SimpleJpegTrain(c.image_size, c.min_crop_scale, pillow)
                  if self.loader != "pil" and has_simplejpeg() else pillow)
        on_gpu = EncodedTrain(c.image_size, c.min_crop_scale, pillow)
        load_train = {"pil": pillow, "simplejpeg": on_cpu, "gpu": on_gpu,
                      "hybrid": HybridTrain(on_cpu, on_gpu, c.gpu_share)}[self.loader]
        splits = []
        for path, load in ((train_dir, load_train),
                           (val_dir, PillowImage(eval_transform(c.image_size, resize)))):
            samples = list_images(path, classes)
            if not samples:
                raise UserError(f"{path} holds no images",
                                f"put JPEG files in {path}/<wnid>/")
            splits.append(ImageFiles(samples, load))
        return splits[0], splits[1]

    def prefetches_to_device(self):
        return self.loader in ON_THE_GPU  # the batch's GPU decode overlaps the step before

    def collate(self, samples):
        return collate_images(samples, self.cfg.image_size)

    def to_device(self, batch: ImageBatch, device, dtype):
        """uint8 images to the device (non-blocking from pinned memory), normalised there.
        Runs in the main process for every batch, so it is where undecodable files surface:
        an error naming the file, or (``skip_bad``) a note and a count."""
        for bad in batch.bad:
            self._undecodable(bad)
        images = batch.images.to(device, non_blocking=True)
        labels = batch.labels.to(device, non_blocking=True)
        if batch.encoded is not None:  # loader=gpu or hybrid: decode, crop and resize here
            decoded, failed = decode_on_gpu(batch.encoded, device, self.cfg.image_size)
            for index, reason in failed:
                self._undecodable(BadImage(batch.encoded.paths[index], reason))
            images = torch.cat([images.float(), decoded]) if len(images) else decoded
            if failed:
                keep = torch.ones(len(labels), dtype=torch.bool)
                keep[[len(batch.images) + index for index, _ in failed]] = False
                labels = labels[keep.to(device)]
        return normalize_on_device(images, dtype), labels

    def _undecodable(self, bad: BadImage) -> None:
        if not self.cfg.data.skip_bad:
            raise UserError(f"cannot decode image {bad.path} ({bad.reason})",
                            "replace or delete the file, or set recipe.data.skip_bad=true to "
                            "count and skip unreadable images")
        if bad.path not in self.skipped:
            log.warning("skipping undecodable image %s (%s)", bad.path, bad.reason)
            self.skipped.add(bad.path)

    def rank_report(self):
        return sorted(self.skipped)

    def summary_entries(self, reports):
        skipped = sorted(set().union(*[set(r or ()) for r in reports]))
        return {"skipped_images": len(skipped), "skipped_image_files": skipped[:SKIPPED_LISTED],
                "loader": self.loader or resolve_loader(self.cfg.loader, self.device,
                                                        self.ranks_on_host)}

    # ---- model and metric ------------------------------------------------------------------
    def build_model(self):
        if not self.num_classes:
            self.num_classes = len(class_folders(self.split_dirs()[0]))
        return build_resnet(self.cfg.model.arch, self.num_classes,
                            self.cfg.model.zero_init_residual)

    def loss(self, model, batch):
        images, labels = batch
        if len(labels) == 0:  # every image of this batch was skipped: a zero gradient
            return torch.stack([p.sum() for p in model.parameters()]).sum() * 0.0
        return F.cross_entropy(model(images), labels, label_smoothing=self.cfg.label_smoothing)

    def eval_sums(self, model, batch):
        images, labels = batch
        if len(labels) == 0:
            return classification_sums(images.new_zeros((0, 1)), labels)
        return classification_sums(model(images), labels)

    def metrics(self, sums):
        return classification_metrics(sums)
