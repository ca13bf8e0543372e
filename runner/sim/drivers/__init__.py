"""The simulator's drivers, one module per algorithm: importing this package imports every
module in it, and each registers its driver with ``SIM_DRIVERS.register(NAME)``
(runner/sim/registry.py), as an algorithm registers itself. A new algorithm's driver is a new
module here; no list names it."""

from __future__ import annotations

import importlib
import pkgutil

from ..registry import SIM_DRIVERS

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["SIM_DRIVERS"]
