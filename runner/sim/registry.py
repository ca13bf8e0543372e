"""The simulator's drivers by algorithm name: ``SIM_DRIVERS.register(NAME)`` on the class that
runs that algorithm over stacked models, one module each in runner/sim/drivers/."""

from __future__ import annotations

from ..config.registry import Registry

SIM_DRIVERS: Registry = Registry("simulated algorithm")
