"""The recipe interface, and the registry of recipes by name: what the trainer needs from a
task.

A recipe builds its datasets and model and knows how to compute the training loss and the
held-out metric. Metrics are computed from *sums* (errors, counts, loss sums) so that every rank
can evaluate a shard of the held-out set and one allreduce gives the exact global numbers.
Recipes know nothing of algorithms, and the runner knows no recipe by name: the ``recipes``
package registers its own in :data:`RECIPES` when imported, which the commands and the worker
do (tests/test_imports.py keeps every other runner module off it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .config.registry import Registry
from .config.section import Section
from .lazy import torch

if TYPE_CHECKING:
    from torch.utils.data import Dataset


@dataclass
class RecipeConfig(Section):
    name: str = ""


class Recipe(ABC):
    """Data, model and metric of one task.

    Example::

        from dataclasses import dataclass

        import torch
        from torch.utils.data import TensorDataset

        from runner.recipe import RECIPES, Recipe, RecipeConfig

        @dataclass
        class TwoBlobsConfig(RecipeConfig):
            samples: int = 512

        @RECIPES.register("two_blobs")  # conf/recipe/two_blobs.yaml: name: two_blobs
        class TwoBlobs(Recipe):
            Config = TwoBlobsConfig
            primary_metric, higher_is_better = "top1", True

            def datasets(self):
                g = torch.Generator().manual_seed(0)
                y = torch.randint(0, 2, (self.cfg.samples,), generator=g)
                x = torch.randn(self.cfg.samples, 2, generator=g) + 2.0 * y[:, None]
                return TensorDataset(x[:400], y[:400]), TensorDataset(x[400:], y[400:])

            def build_model(self):
                return torch.nn.Linear(2, 2)

            def loss(self, model, batch):
                x, y = batch
                return torch.nn.functional.cross_entropy(model(x), y)

            def eval_sums(self, model, batch):
                x, y = batch
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
                return {"loss_sum": loss.item(), "count": len(y),
                        "correct": (logits.argmax(1) == y).sum().item()}

            def metrics(self, sums):
                return {"loss": sums["loss_sum"] / sums["count"],
                        "top1": 100.0 * sums["correct"] / sums["count"]}

    Every rank builds the same datasets and model; the trainer shards the data, seeds the
    model identically everywhere and reduces ``eval_sums`` over the ranks before ``metrics``.
    """

    Config: ClassVar[type] = RecipeConfig
    # The metric that summarises a run, and whether higher is better (top1) or lower (wer).
    primary_metric: ClassVar[str] = "loss"
    higher_is_better: ClassVar[bool] = False
    # Steps per rank after which torch.compile has paid for its compilation on a GPU
    # (trainer.compile=null); None: not measured, never compiled unless asked.
    compile_pays_after_steps: ClassVar[int | None] = None

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.device: torch.device | None = None
        self.ranks_on_host = 1

    def prefetches_to_device(self) -> bool:
        """Whether ``to_device`` does enough work (decoding on the GPU, say) that the trainer
        should run it a batch ahead in a background thread when ``trainer.prefetch_to_device``
        is left null. Asked after :meth:`datasets`."""
        return False

    def place(self, device: torch.device, ranks_on_host: int = 1) -> None:
        """The device this rank trains on and how many ranks share its machine, told before
        :meth:`datasets` (a recipe may prepare its batches on the device, e.g. decode images
        on the GPU, where the machine's cores are too few to do it)."""
        self.device, self.ranks_on_host = device, ranks_on_host

    def check_data(self) -> None:
        """Raise UserError (one line: what is missing and how to prepare it) before ranks start."""

    def prepare_stages(self) -> list[tuple[str, Callable[[], None]]]:
        """Named steps that build caches (generated corpora, features), in order. Each must
        be cheap to rerun when its output is in place; ``adpsgd-prepare --stage/--stop-stage``
        runs a range of them."""
        return []

    def prepare(self) -> None:
        """Run every preparation stage, once, in the launching process, before any rank
        starts; ranks only read what it built."""
        for _, stage in self.prepare_stages():
            stage()

    @abstractmethod
    def datasets(self) -> tuple[Dataset, Dataset]:
        """(train, held-out) datasets; every rank gets the same, the trainer shards them."""

    @abstractmethod
    def build_model(self) -> torch.nn.Module: ...

    def collate(self, samples: list[Any]) -> Any:
        return torch.utils.data.default_collate(samples)

    def to_device(self, batch: Any, device: torch.device, dtype: torch.dtype) -> Any:
        """Move a batch to the device; floating tensors take the model's dtype."""
        return tuple(t.to(device, dtype if t.is_floating_point() else None, non_blocking=True)
                     for t in batch)

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """Training loss averaged over the batch."""

    @abstractmethod
    def eval_sums(self, model: torch.nn.Module, batch: Any) -> dict[str, float]:
        """Summable held-out statistics of one batch; must include ``loss_sum`` and ``count``."""

    @abstractmethod
    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Final metrics (``loss`` and the recipe's own, e.g. ``top1``) from global sums."""

    def rank_report(self) -> Any:
        """This rank's contribution to summary.json (picklable, e.g. data problems met in the
        main process); the trainer gathers every rank's at the end."""
        return None

    def summary_entries(self, reports: list[Any]) -> dict[str, Any]:
        """summary.json entries made from every rank's :meth:`rank_report` (on rank 0)."""
        return {}

    def decode(self, model: torch.nn.Module, batch: Any) -> list[tuple[str, str, str]]:
        """(id, reference, hypothesis) of every sample of a held-out batch, for recipes whose
        output is text; the trainer writes the final evaluation's to ``decode/``. None by
        default."""
        return []

    def examples(self, model: torch.nn.Module, batch: Any) -> list[tuple[str, str, str]]:
        """A few (id, reference, hypothesis) rows for TensorBoard's text panel; none by
        default."""
        return []


RECIPES: Registry[Recipe] = Registry("recipe", filled_by="the recipes package")
