"""Handwritten digits (scikit-learn's copy of the UCI 8x8 digits): a small CNN, top-1/top-5.

The 1,797 images ship inside scikit-learn, so this recipe runs anywhere without a download. The
held-out split is stratified and depends only on ``recipe.split_seed``. For studies that need
long epochs, ``recipe.train_size`` grows the training set with distorted copies of the
training images (digit_augment.py), and ``recipe.heldout_size`` the held-out set with
distorted copies of the held-out images: neither side ever sees the other's digits.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runner.config.section import require
from runner.errors import ConfigError, UserError
from runner.lazy import lazy_import, torch
from runner.recipe import RECIPES, Recipe, RecipeConfig

from .classification import classification_metrics, classification_sums
from .digit_augment import distorted_copies

F = lazy_import("torch.nn.functional")


@dataclass
class DigitImagesConfig(RecipeConfig):
    heldout_fraction: float = 0.2
    split_seed: int = 0
    channels: list[int] = field(default_factory=lambda: [32, 64])
    hidden: int = 128
    dropout: float = 0.0
    # Training samples: 0 keeps the training originals; more adds distorted copies of them
    # (recipes/digit_augment.py), made with augment_seed, up to this many samples in all.
    train_size: int = 0
    # Held-out samples: 0 keeps the held-out originals; more adds distorted copies of them
    # (never of a training image), for a finer and less saturated held-out metric.
    heldout_size: int = 0
    augment_seed: int = 0

    def check(self, prefix, cfg) -> None:
        require(0 < self.heldout_fraction < 1, f"{prefix}.heldout_fraction",
                f"must be in (0, 1), got {self.heldout_fraction}",
                f"{prefix}.heldout_fraction=0.2")
        require(len(self.channels) == 2 and min(self.channels) >= 1, f"{prefix}.channels",
                "needs two positive channel counts", f"{prefix}.channels=[32,64]")
        require(0 <= self.dropout < 1, f"{prefix}.dropout", "must be in [0, 1)",
                f"{prefix}.dropout=0")
        require(self.train_size >= 0, f"{prefix}.train_size",
                f"must be >= 0 (0: the training originals only), got {self.train_size}",
                f"{prefix}.train_size=40000")
        require(self.heldout_size >= 0, f"{prefix}.heldout_size",
                f"must be >= 0 (0: the held-out originals only), got {self.heldout_size}",
                f"{prefix}.heldout_size=4000")


def stratified_split(labels: np.ndarray, heldout_fraction: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, held-out), the same fraction held out of every class."""
    rng = np.random.default_rng(seed)
    train, heldout = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cut = int(round(len(members) * heldout_fraction))
        heldout.append(members[:cut])
        train.append(members[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(heldout))


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(pixels 0..16 as N x 64, labels) from the CSV that scikit-learn ships.

    Read directly: importing scikit-learn costs every rank about 2 s of start-up."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise UserError("recipe digit_images needs scikit-learn's copy of the digits",
                        "pip install scikit-learn")
    table = np.loadtxt(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz",
                       delimiter=",", dtype=np.int64)
    return table[:, :-1], table[:, -1]


def grown(images: torch.Tensor, labels: torch.Tensor, size: int, seed: int, key: str
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``images`` followed by distorted copies of them up to ``size`` samples (0: as they
    are); ``key`` names the setting in the error when ``size`` is below the originals."""
    extra = size - len(images) if size else 0
    if extra < 0:
        raise ConfigError(key, f"{size} is fewer than the {len(images)} original images it "
                          f"starts from", f"{key}=0 or >= {len(images)}")
    if not extra:
        return images, labels
    copies, source = distorted_copies(images, extra, seed)
    return torch.cat([images, copies]), torch.cat([labels, labels[source]])


@RECIPES.register("digit_images")
class DigitImages(Recipe):
    Config = DigitImagesConfig
    primary_metric = "top1"
    higher_is_better = True

    def datasets(self):
        pixels, targets = load_digits()
        images = torch.tensor(pixels, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
        labels = torch.tensor(targets, dtype=torch.long)
        train, heldout = stratified_split(targets, self.cfg.heldout_fraction,
                                          self.cfg.split_seed)
        # Normalised with the training originals' statistics, whatever the sizes add.
        mean, std = images[train].mean(), images[train].std()
        seed = self.cfg.augment_seed
        train_images, train_labels = grown(images[train], labels[train],
                                           self.cfg.train_size, seed, "recipe.train_size")
        # Another seed stream for the held-out copies (the same seed would warp held-out
        # image k exactly as training image k).
        heldout_images, heldout_labels = grown(images[heldout], labels[heldout],
                                               self.cfg.heldout_size, seed + 1_000_003,
                                               "recipe.heldout_size")
        return (torch.utils.data.TensorDataset((train_images - mean) / std, train_labels),
                torch.utils.data.TensorDataset((heldout_images - mean) / std, heldout_labels))

    def build_model(self):
        from .digit_model import DigitCNN  # a subclass of nn.Module: imports torch

        return DigitCNN(list(self.cfg.channels), self.cfg.hidden, self.cfg.dropout)

    def loss(self, model, batch):
        images, labels = batch
        return F.cross_entropy(model(images), labels)

    def eval_sums(self, model, batch):
        images, labels = batch
        return classification_sums(model(images), labels)

    def metrics(self, sums):
        return classification_metrics(sums)
