"""Training algorithms, one module each, registered by name (``algo=NAME``): importing this
package imports every module in it but the shared parts below, and each algorithm module
registers its class. A new algorithm is a new module here; no list names it."""

from __future__ import annotations

import importlib
import pkgutil

from .base import AlgoConfig, Algorithm, TrainContext
from .registry import ALGORITHMS

# The algorithms' shared parts, not algorithms (optim imports torch, which a command line's
# check must not pay for: runner/lazy.py).
SHARED_MODULES = frozenset({"base", "registry", "optim", "trace"})

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in SHARED_MODULES:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ALGORITHMS", "Algorithm", "AlgoConfig", "TrainContext"]
