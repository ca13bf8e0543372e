"""Every registered algorithm runs under launcher=sim, or says why it cannot: a driver in
runner/sim/drivers/ registered under its name, or ``no_simulator_because`` on its class (which the
simulator's error line then gives)."""

from __future__ import annotations

import pytest

from runner.algos import ALGORITHMS, Algorithm
from runner.errors import ConfigError
from runner.sim.drivers import SIM_DRIVERS
from runner.sim.engine import build_driver


def uncovered() -> list[str]:
    return [name for name in ALGORITHMS.names()
            if name not in SIM_DRIVERS and not (ALGORITHMS.get(name).no_simulator_because
                                                or "").strip()]


def test_every_algorithm_has_a_driver_or_an_explained_opt_out():
    assert uncovered() == []
    # Only registered algorithms have drivers (a driver for a removed algorithm is dead code).
    assert set(SIM_DRIVERS.names()) <= set(ALGORITHMS.names())


def test_an_algorithm_without_either_is_found_and_an_opt_out_is_named(monkeypatch):
    """The check itself, and the line a user gets for an algorithm that opted out."""
    class Unsimulated(Algorithm):
        pass

    monkeypatch.setitem(ALGORITHMS._entries, "unsimulated", Unsimulated)
    assert uncovered() == ["unsimulated"]
    monkeypatch.setattr(Unsimulated, "no_simulator_because",
                        "its exchanges depend on wall-clock timing")
    assert uncovered() == []

    class Sim:
        class cfg:
            class algo:
                name = "unsimulated"

    with pytest.raises(ConfigError) as error:
        build_driver(Sim)
    assert "its exchanges depend on wall-clock timing" in str(error.value)
