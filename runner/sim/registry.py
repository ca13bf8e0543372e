"""The simulator's drivers by algorithm name: ``SIM_DRIVERS.register(NAME)`` on the class that
runs that algorithm over stacked models (runner/sim/lockstep.py, runner/sim/asynchronous.py)."""

from __future__ import annotations

from ..config.registry import Registry

SIM_DRIVERS: Registry = Registry("simulated algorithm")
