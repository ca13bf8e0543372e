"""Training algorithms, one module each, registered by name (``algo=NAME``)."""

from ..registry import Registry
from .base import AlgoConfig, Algorithm, TrainContext

ALGORITHMS: Registry[Algorithm] = Registry("algorithm", "runner.algos.all")

__all__ = ["ALGORITHMS", "Algorithm", "AlgoConfig", "TrainContext"]
